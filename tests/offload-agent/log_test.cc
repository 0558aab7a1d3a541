// The engine's log: one line at start with the resolved configuration, then one line per change
// of a tier's state (full, failing, writable again), never one per block, however many blocks
// a failure touches.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "faulty_disk_io.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Fault;
using testing::FaultPlan;
using testing::FaultyDiskIo;
using testing::Key;
using testing::TempDir;

constexpr uint64_t kDiskBlocks = 64;

class LogTest : public ::testing::Test {
 public:
  void SetUp() override { Open(kDiskBlocks); }

  // One pinned slot: every store demotes the block before it to disk0.
  void Open(uint64_t disk_blocks) {
    engine_.reset();
    lines_.clear();
    EngineConfig c = testing::Config(
        1, {DiskTierConfig{dir_.path(), "emptyDir", disk_blocks * testing::kSlot, false, false}});
    EngineHooks hooks;
    hooks.wrap_disk_io = [plan = plan_](size_t, std::unique_ptr<DiskIo> base) {
      return std::unique_ptr<DiskIo>(std::make_unique<FaultyDiskIo>(std::move(base), plan));
    };
    hooks.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    };
    Result<std::unique_ptr<Engine>> e = Engine::Open(c, hooks);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
  }

  Status Store(uint64_t i) {
    std::vector<std::byte> data = testing::Pattern(Key(i), testing::kBlock);
    std::vector<BlockKey> keys = {Key(i)};
    std::vector<void*> ptrs = {data.data()};
    Result<JobId> j = engine_->Store(keys, ptrs);
    return j.ok() ? engine_->Wait(*j) : j.status();
  }

  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // Lines containing `part`.
  size_t Count(const std::string& part) {
    size_t n = 0;
    for (const std::string& l : Lines()) n += l.find(part) != std::string::npos ? 1u : 0u;
    return n;
  }
  static std::string Join(const std::vector<std::string>& lines) {
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  }

  TempDir dir_;
  std::shared_ptr<FaultPlan> plan_ = std::make_shared<FaultPlan>();
  std::mutex mu_;
  std::vector<std::string> lines_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(LogTest, StartLineNamesTheResolvedConfiguration) {
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u) << Join(lines);
  const std::string& start = lines[0];
  EXPECT_EQ(start.rfind("kvoffload: engine started: ", 0), 0u) << start;
  for (const std::string& part :
       {std::string("device host"), std::string("cpu tier 1 slots"), std::string("policy lru"),
        "disk0 " + dir_.path(), std::to_string(kDiskBlocks * testing::kSlot) + " bytes",
        std::string("O_DIRECT "), std::string("fingerprint "),
        "model " + testing::TestModel().model}) {
    EXPECT_NE(start.find(part), std::string::npos) << "no '" << part << "' in: " << start;
  }
  // The I/O backend chosen at start, with whether buffers are registered (io_uring) or the
  // pread/pwrite fallback.
  EXPECT_TRUE(start.find("uring:") != std::string::npos || start.find("psync:") != std::string::npos)
      << start;
}

TEST_F(LogTest, BurstOfFailingWritesLogsOneLineWhenItStartsAndOneWhenItEnds) {
  constexpr int kFailing = 20;
  ASSERT_TRUE(Store(0).ok());
  plan_->FailWrites(Fault::kEio, kFailing);
  // Each store demotes the block before it; the first kFailing demotions fail.
  for (uint64_t i = 1; i <= kFailing; ++i) ASSERT_TRUE(Store(i).ok());
  EXPECT_EQ(plan_->injected.load(), kFailing);
  EXPECT_EQ(engine_->Stats().tiers[1].io_errors, static_cast<uint64_t>(kFailing));
  EXPECT_EQ(engine_->Stats().tiers[1].lost, static_cast<uint64_t>(kFailing));
  EXPECT_EQ(Count("is failing"), 1u) << Join(Lines());
  EXPECT_EQ(Count("writable again"), 0u) << Join(Lines());

  // The disk heals: the next demotion succeeds and says how many blocks were lost meanwhile.
  for (uint64_t i = kFailing + 1; i <= kFailing + 5; ++i) ASSERT_TRUE(Store(i).ok());
  EXPECT_EQ(Count("is failing"), 1u) << Join(Lines());
  EXPECT_EQ(Count("writable again; " + std::to_string(kFailing) + " blocks did not reach it"), 1u)
      << Join(Lines());
  EXPECT_EQ(engine_->Stats().tiers[1].lost, static_cast<uint64_t>(kFailing)) << "none since";
  EXPECT_EQ(Count("kvoffload: engine started: "), 1u) << Join(Lines());
  EXPECT_EQ(Lines().size(), 3u) << "start, failing, writable again:\n" << Join(Lines());
}

TEST_F(LogTest, PinnedTierFullOfHeldBlocksLogsOnceAndCountsEveryRefusal) {
  ASSERT_TRUE(Store(0).ok());
  BlockKey held = Key(0);
  ASSERT_EQ(engine_->Hold(std::span(&held, 1)).prefix, 1u);
  // The one slot is held for a load: no store can evict it.
  constexpr uint64_t kRefused = 7;
  for (uint64_t i = 1; i <= kRefused; ++i) {
    EXPECT_EQ(Store(i).code(), StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(engine_->Stats().tiers[0].refused, kRefused);
  EXPECT_EQ(engine_->Stats().tiers[0].lost, 0u) << "the pinned tier's are in refused";
  EXPECT_EQ(Count("cpu tier (1 slots) is full"), 1u) << Join(Lines());

  ASSERT_TRUE(engine_->Release(std::span(&held, 1)).ok());
  ASSERT_TRUE(Store(100).ok());
  ASSERT_TRUE(Store(101).ok());
  EXPECT_EQ(Count("takes blocks again; " + std::to_string(kRefused) + " were refused"), 1u)
      << Join(Lines());
  EXPECT_EQ(Lines().size(), 3u) << "start, full, takes blocks again:\n" << Join(Lines());
}

TEST_F(LogTest, DiskTierFullOfHeldBlocksLogsOnceAndRecovers) {
  Open(2);
  // Blocks 0 and 1 fill disk0, block 2 is pinned; holding 0 and 1 leaves disk0 no victim.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(Store(i).ok());
  std::vector<BlockKey> held = {Key(0), Key(1)};
  ASSERT_EQ(engine_->Hold(held).tiers, (std::vector<int>{kTierCpu + 1, kTierCpu + 1}));
  constexpr uint64_t kLost = 5;
  // Each store demotes the block before it, which disk0 refuses: it is dropped.
  for (uint64_t i = 3; i < 3 + kLost; ++i) ASSERT_TRUE(Store(i).ok());
  EXPECT_EQ(engine_->Stats().tiers[1].refused, kLost);
  EXPECT_EQ(engine_->Stats().tiers[1].lost, kLost);
  EXPECT_EQ(engine_->Stats().tiers[0].dropped, kLost);
  EXPECT_EQ(Count("disk0 (" + dir_.path() + ") is full (no block can be evicted)"), 1u)
      << Join(Lines());

  ASSERT_TRUE(engine_->Release(held).ok());
  ASSERT_TRUE(Store(100).ok());
  EXPECT_EQ(Count("writable again; " + std::to_string(kLost) + " blocks did not reach it"), 1u)
      << Join(Lines());
  EXPECT_EQ(Lines().size(), 3u) << "start, full, writable again:\n" << Join(Lines());
}

}  // namespace
}  // namespace kvoffload
