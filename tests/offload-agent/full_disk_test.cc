// A disk tier on a file system that really fills up (a 4 MiB tmpfs, far smaller than the tier's
// configured capacity): stores fail cleanly, the blocks that did not fit are misses, the
// counters say so, and nothing half-written is left or served. EIO and torn writes are covered
// with the FaultyDiskIo decorator in fault_test.cc; this is the kernel's own ENOSPC.
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace kvoffload {
namespace {

using namespace testing;

constexpr uint64_t kFsBytes = 4 << 20;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class SmallTmpfs {
 public:
  SmallTmpfs() {
    const std::string opts = "size=" + std::to_string(kFsBytes);
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, opts.c_str()) == 0) {
      mounted_ = true;
    } else {
      reason_ = std::string("mount -t tmpfs refused (needs root): ") + std::strerror(errno);
    }
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string reason_;
};

TEST(FullDiskTest, StoresFailCleanlyLoadsMissCountersShowIt) {
  SmallTmpfs fs;
  KVO_REQUIRE_CAPABILITY("root (to mount a small tmpfs)", fs.reason());
  // 16 MiB configured on a 4 MiB file system is sized to it (2 MiB, the rest kept free), and
  // another tenant's 3 MiB file leaves less than that: the kernel, not the ledger, says no. The
  // tenant's file goes later, to make room.
  const std::string tenant = fs.path() + "/another-tenant";
  std::ofstream(tenant) << std::string(3 << 20, 't');
  Result<std::unique_ptr<Engine>> opened = Engine::Open(Config(1, {Tier(fs.path(), 4096)}));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Engine& e = **opened;
  constexpr uint64_t kStored = 2048;  // 8 MiB of blocks
  ::testing::internal::CaptureStderr();
  for (uint64_t k = 0; k < kStored; k += 4) {
    // A store is accepted into the CPU tier; the demotion to disk is what fails. Either way the
    // job ends (no hang) and the engine keeps working.
    (void)StoreAndWait(e, Blocks::Make(k, 4));
  }
  const std::string full_log = ::testing::internal::GetCapturedStderr();
  const EngineStats stats = e.Stats();
  const TierStats& disk = stats.tiers[1];
  EXPECT_GT(disk.io_errors + stats.failed_stores + disk.dropped, 0u) << "the disk filled up";
  // Said once, when it happened, not once per block.
  EXPECT_EQ(Count(full_log, "disk0 (" + fs.path() + ") is full"), 1u) << full_log;
  EXPECT_GT(disk.blocks, 0u) << "what fitted is kept";
  EXPECT_LE(disk.used_bytes, kFsBytes);
  EXPECT_EQ(FilesUnder(fs.path(), ".tmp"), 1u) << "the slot file and no temp file besides";
  // Every block is on disk0, in the one pinned slot (the newest, not demoted yet), or counted
  // as lost by disk0: each pinned-tier victim that disk0 could not write.
  EXPECT_GT(disk.lost, 0u);
  EXPECT_EQ(disk.lost, kStored - disk.blocks - stats.tiers[0].blocks);
  EXPECT_EQ(disk.lost, stats.tiers[0].dropped) << "the pinned tier's victims nobody took";
  EXPECT_EQ(disk.lost, disk.io_errors + disk.refused);

  uint64_t exact = 0, missed = 0;
  for (uint64_t k = 0; k < kStored; ++k) {
    Blocks b = Blocks::Make(k, 1);
    Blocks out = b.Empty();
    if (e.Lookup(b.keys).prefix == 1 && LoadAndWait(e, out).ok()) {
      ASSERT_EQ(out.data[0], b.data[0]) << "key " << k << " served wrong bytes";
      ++exact;
    } else {
      ++missed;
    }
  }
  EXPECT_GT(exact, 0u);
  EXPECT_GT(missed, 0u) << "8 MiB cannot all have fitted in 4 MiB";
  EXPECT_EQ(e.Stats().loaded_blocks, exact);
  // The misses are exactly the lost blocks: the counter says how many the log's one line hid.
  // (Promoting the first hit demoted the newest block, which the full disk lost too.)
  EXPECT_EQ(missed, e.Stats().tiers[1].lost);

  // Room again (the other tenant's file goes): the tier takes stores again.
  std::filesystem::remove(tenant);
  const uint64_t errors_before = e.Stats().tiers[1].io_errors;
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(StoreAndWait(e, Blocks::Make(1'000'000, 2)).ok());
  EXPECT_TRUE(StoreAndWait(e, Blocks::Make(1'000'002, 2)).ok());
  const std::string again_log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(again_log, "disk0 (" + fs.path() + ") is writable again"), 1u) << again_log;
  EXPECT_EQ(e.Stats().tiers[1].io_errors, errors_before) << "writes succeed once there is room";
}

// A tier whose file system turns read-only under a running engine (the kernel remounts a disk
// after errors) loses every block demoted to it from then on: each is a miss, the log says so
// once, and the tier's `lost` counter says how many. Reopened on that file system, the engine
// refuses to start, naming the path and the errno, instead of opening and then dropping every
// block pushed to that tier.
TEST(FullDiskTest, ReadOnlyTierLosesBlocksCountedAndIsRefusedAtStart) {
  SmallTmpfs fs;
  KVO_REQUIRE_CAPABILITY("root (to mount a small tmpfs)", fs.reason());
  {
    auto e = Engine::Open(Config(1, {Tier(fs.path(), 64, /*persistent=*/true)}));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_TRUE(StoreAndWait(**e, Blocks::Make(0, 4)).ok());  // 0-2 on disk0, 3 pinned
    ASSERT_EQ(::mount(nullptr, fs.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0)
        << std::strerror(errno);
    constexpr uint64_t kLost = 6;
    ::testing::internal::CaptureStderr();
    // Each store demotes the block before it (3, then 4 ...): all kLost of them are lost.
    for (uint64_t k = 4; k < 4 + kLost; ++k) {
      ASSERT_TRUE(StoreAndWait(**e, Blocks::Make(k, 1)).ok()) << "the pinned tier took it";
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(Count(log, "disk0 (" + fs.path() + ") is read-only"), 1u) << log;
    const EngineStats s = (*e)->Stats();
    EXPECT_EQ(s.tiers[1].lost, kLost);
    EXPECT_EQ(s.tiers[0].dropped, kLost);
    EXPECT_EQ(s.tiers[1].blocks, 3u);
    for (uint64_t k = 3; k < 3 + kLost; ++k) {
      EXPECT_EQ((*e)->Lookup(Blocks::Make(k, 1).keys).prefix, 0u) << "key " << k;
    }
    EXPECT_EQ((*e)->Lookup(Blocks::Make(0, 3).keys).prefix, 3u) << "what was written stays";
  }
  Result<std::unique_ptr<Engine>> e = Engine::Open(Config(1, {Tier(fs.path(), 64, true)}));
  ASSERT_FALSE(e.ok()) << "a read-only tier was accepted";
  EXPECT_NE(e.status().message().find(fs.path()), std::string::npos) << e.status().ToString();
  EXPECT_NE(e.status().message().find(std::strerror(EROFS)), std::string::npos)
      << e.status().ToString();
}

// A full file system is not a reason to refuse: a persistent tier may restart full of its own
// blocks, and eviction makes room.
TEST(FullDiskTest, FullTierStillOpens) {
  SmallTmpfs fs;
  KVO_REQUIRE_CAPABILITY("root (to mount a small tmpfs)", fs.reason());
  std::error_code ec;
  for (int i = 0; i < 2048; ++i) {  // fill it to the last byte with someone else's files
    std::ofstream out(fs.path() + "/filler-" + std::to_string(i), std::ios::binary);
    const std::string chunk(64 << 10, 'x');
    out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
  Result<std::unique_ptr<Engine>> e = Engine::Open(Config(1, {Tier(fs.path(), 64, true)}));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // Nothing can be written there until the filler goes: the demoted blocks are lost, counted.
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(StoreAndWait(**e, Blocks::Make(0, 4)).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(log, "is full (the file system is out of space)"), 1u) << log;
  EXPECT_EQ((*e)->Stats().tiers[1].lost, 3u);
  EXPECT_EQ((*e)->Stats().tiers[1].blocks, 0u);
}

}  // namespace
}  // namespace kvoffload
