// Injected disk faults through the FaultyDiskIo decorator: each turns into a dropped block, a
// failed load or a miss, counted in the stats; never a crash, a leaked temp file, an exceeded
// capacity or wrong bytes.
#include <gtest/gtest.h>

#include "block_file.h"
#include "faulty_disk_io.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Blocks;
using testing::Fault;
using testing::FaultPlan;
using testing::FaultyDiskIo;
using testing::Key;
using testing::TempDir;

// Blocks of three pages (12000 bytes + trailer = 16 KiB files) so a half write is page-aligned.
constexpr size_t kBigBlock = 12000;
constexpr size_t kBigFile = 16384;

class FaultTest : public ::testing::TestWithParam<std::string> {
 public:
  void SetUp() override {
    KVO_REQUIRE_CAPABILITY("the " + GetParam() + " disk I/O backend",
                           testing::MissingDiskIo(GetParam()));
    EngineConfig c = testing::Config(1);
    c.block_bytes = kBigBlock;
    c.cpu_bytes = kBigFile;  // one pinned slot: every second store demotes to disk
    c.tiers = {DiskTierConfig{dir_.path(), "pvcRef", 8 * kBigFile, true, false}};
    c.disk_io = GetParam();
    EngineHooks hooks;
    hooks.wrap_disk_io = [plan = plan_](size_t, std::unique_ptr<DiskIo> base) {
      return std::unique_ptr<DiskIo>(std::make_unique<FaultyDiskIo>(std::move(base), plan));
    };
    Result<std::unique_ptr<Engine>> e = Engine::Open(c, hooks);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
  }

  // Stores key i with its own pattern (one block per job, so the order is strict).
  Status Store(uint64_t i) {
    std::vector<std::byte> data = testing::Pattern(Key(i), kBigBlock);
    std::vector<BlockKey> keys = {Key(i)};
    std::vector<void*> ptrs = {data.data()};
    Result<JobId> j = engine_->Store(keys, ptrs);
    return j.ok() ? engine_->Wait(*j) : j.status();
  }
  // Loads key i; on success checks the bytes.
  Status Load(uint64_t i) {
    std::vector<std::byte> data(kBigBlock, std::byte{0xEE});
    std::vector<BlockKey> keys = {Key(i)};
    std::vector<void*> ptrs = {data.data()};
    Result<JobId> j = engine_->Load(keys, ptrs);
    Status s = j.ok() ? engine_->Wait(*j) : j.status();
    if (s.ok()) {
      EXPECT_EQ(data, testing::Pattern(Key(i), kBigBlock)) << "wrong bytes for key " << i;
    } else {
      EXPECT_EQ(data, std::vector<std::byte>(kBigBlock, std::byte{0xEE})) << "partial delivery";
    }
    return s;
  }
  int Tier(uint64_t i) {
    BlockKey k = Key(i);
    LookupResult r = engine_->Lookup(std::span(&k, 1));
    return r.prefix == 0 ? kTierMiss : r.tiers[0];
  }
  TierStats Disk() { return engine_->Stats().tiers[1]; }
  TierStats Cpu() { return engine_->Stats().tiers[0]; }
  void ExpectNoTempFilesAndWithinCapacity() {
    EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "a failed write left its temp file";
    EXPECT_LE(testing::BytesUnder(dir_.path()), 8 * kBigFile);
  }

  TempDir dir_;
  std::shared_ptr<FaultPlan> plan_ = std::make_shared<FaultPlan>();
  std::unique_ptr<Engine> engine_;
};

// The demotion write of block 0 (pushed out of the one pinned slot by block 1) fails.
void DemoteBlock0WithFault(FaultTest& t, FaultPlan& plan, Fault fault) {
  ASSERT_TRUE(t.Store(0).ok());
  plan.FailWrites(fault, 1);
}

TEST_P(FaultTest, EnospcOnDemotionDropsTheBlockAndCountsIt) {
  DemoteBlock0WithFault(*this, *plan_, Fault::kEnospc);
  EXPECT_TRUE(Store(1).ok()) << "the store itself succeeded: block 1 is in the pinned tier";
  EXPECT_EQ(plan_->injected.load(), 1);
  EXPECT_EQ(Tier(0), kTierMiss) << "block 0 could not be written anywhere: dropped";
  EXPECT_EQ(Tier(1), kTierCpu);
  EXPECT_EQ(Cpu().dropped, 1u);
  EXPECT_EQ(Disk().io_errors, 1u);
  EXPECT_EQ(Disk().used_bytes, 0u) << "the reservation was given back";
  EXPECT_EQ(Load(0).code(), StatusCode::kNotFound);
  ExpectNoTempFilesAndWithinCapacity();
  // The disk works again afterwards.
  EXPECT_TRUE(Store(2).ok());
  EXPECT_EQ(Tier(1), kTierCpu + 1);
  EXPECT_TRUE(Load(1).ok());
}

TEST_P(FaultTest, EioOnDemotionDropsTheBlockAndCountsIt) {
  DemoteBlock0WithFault(*this, *plan_, Fault::kEio);
  EXPECT_TRUE(Store(1).ok());
  EXPECT_EQ(Tier(0), kTierMiss);
  EXPECT_EQ(Cpu().dropped, 1u);
  EXPECT_EQ(Disk().io_errors, 1u);
  ExpectNoTempFilesAndWithinCapacity();
}

TEST_P(FaultTest, ShortWriteNeverPublishesAPartialFile) {
  DemoteBlock0WithFault(*this, *plan_, Fault::kShortWrite);
  EXPECT_TRUE(Store(1).ok());
  EXPECT_EQ(Tier(0), kTierMiss);
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".blk"), 0u) << "half a block was published";
  EXPECT_EQ(Disk().io_errors, 1u);
  // The half that reached the file before the error is no block written: vLLM's write-bytes
  // metric showed steady throughput on a full file system while every block was lost.
  EXPECT_EQ(Disk().bytes_written, 0u);
  ExpectNoTempFilesAndWithinCapacity();
  EXPECT_TRUE(Store(2).ok());
  EXPECT_EQ(Disk().bytes_written, BlockFileBytes(kBigBlock)) << "block 1, demoted whole";
}

TEST_P(FaultTest, TornWriteReportedAsCompleteIsCaughtOnReadAndRemoved) {
  DemoteBlock0WithFault(*this, *plan_, Fault::kTornWriteReportedOk);
  EXPECT_TRUE(Store(1).ok());
  EXPECT_EQ(Tier(0), kTierCpu + 1) << "the disk claimed success, so the file was published";
  EXPECT_EQ(Load(0).code(), StatusCode::kNotFound) << "the checksum turns it into a miss";
  EXPECT_EQ(Disk().corrupt, 1u);
  EXPECT_EQ(Tier(0), kTierMiss);
  EXPECT_FALSE(std::filesystem::exists(
      BlockPath(FingerprintDir(dir_.path(), testing::TestModel().Scope(testing::kBlock)), Key(0))))
      << "the torn file is removed";
  ExpectNoTempFilesAndWithinCapacity();
}

TEST_P(FaultTest, EioOnReadFailsTheLoadButKeepsTheBlock) {
  ASSERT_TRUE(Store(0).ok());
  ASSERT_TRUE(Store(1).ok());  // block 0 now on disk
  ASSERT_EQ(Tier(0), kTierCpu + 1);
  plan_->FailReads(Fault::kEio, 1);
  Status s = Load(0);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("injected EIO"), std::string::npos);
  // Which block, from which file: the backend's message alone named neither.
  EXPECT_NE(s.message().find("read block " + Key(0).ToHex() + " from " + dir_.path()),
            std::string::npos)
      << s.message();
  EXPECT_EQ(Disk().io_errors, 1u);
  EXPECT_EQ(Tier(0), kTierCpu + 1) << "EIO may be transient: the file is kept";
  EXPECT_TRUE(Load(0).ok()) << "and read fine once the disk recovers";
  EXPECT_EQ(engine_->Stats().failed_loads, 1u);
}

TEST_P(FaultTest, EnospcOnEveryWriteKeepsTheEngineServingThePinnedTier) {
  plan_->FailWrites(Fault::kEnospc, 1000);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_TRUE(Store(i).ok());
  EXPECT_EQ(Cpu().dropped, 5u);
  EXPECT_EQ(Disk().io_errors, 5u);
  EXPECT_TRUE(Load(5).ok());
  ExpectNoTempFilesAndWithinCapacity();
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::Values("psync", "uring"));

}  // namespace
}  // namespace kvoffload
