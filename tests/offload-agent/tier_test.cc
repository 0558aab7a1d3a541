// The two tier types on their own: pinned blocks are never evicted from the pinned host tier or
// from a disk tier, a tier whose blocks are all pinned refuses a new block instead of exceeding
// its capacity, a slot still read by a copy is not reused, the pinned tier's demoter writes
// batches ahead of inserts, reads report each verified block as
// it arrives, publishing through named temp files (no O_TMPFILE) works the same, a full disk
// tier writes new blocks over its victims' files, a private tier reopened after a crash
// removes the spare and temp files the crash left, and a block file that goes between a
// persistent tier's listing and its check is counted once; names that are no block file (a
// directory, a FIFO, a link) are never hits, never hang, and are neither removed nor counted, and
// a block file the engine may not open is removed at its failed load; start-up errors name the
// configuration entry.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>
#include <utility>

#include "block_file.h"
#include "cpu_tier.h"
#include "disk_tier.h"
#include "faulty_disk_io.h"
#include "kvoffload/device.h"
#include "kvoffload/mutex.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Key;
using testing::kBlock;
using testing::kSlot;

std::unique_ptr<CpuTier> MakeCpu(size_t slots, const std::string& policy = "lru") {
  static std::unique_ptr<DeviceBackend> host = std::move(NewDeviceBackend("host")).value();
  auto pool = host->AllocatePinned(slots * kSlot);
  return std::make_unique<CpuTier>(std::move(pool).value(), kBlock,
                                   std::move(NewEvictionPolicy(policy, slots)).value());
}

void Insert(CpuTier& t, uint64_t k) {
  Result<std::byte*> slot = t.BeginInsert(Key(k));
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  std::vector<std::byte> p = testing::Pattern(Key(k), kBlock);
  std::memcpy(*slot, p.data(), kBlock);
  t.CommitInsert(Key(k), /*keep_pinned=*/false);
}

TEST(CpuTierTest, PinnedBlockIsNeverTheVictim) {
  auto t = MakeCpu(2);
  std::vector<BlockKey> evicted;
  t->SetEvictSink([&](std::span<const BlockKey> keys, std::span<std::byte* const>,
                      std::span<bool> taken) {
    evicted.insert(evicted.end(), keys.begin(), keys.end());
    std::fill(taken.begin(), taken.end(), true);
  });
  Insert(*t, 1);
  Insert(*t, 2);
  ASSERT_NE(t->Pin(Key(1)), nullptr);  // 1 is least recent but pinned (Pin also touches it)
  t->Unpin(Key(1));
  ASSERT_NE(t->Pin(Key(2)), nullptr);  // now 1 is least recent, 2 most recent and pinned
  Insert(*t, 3);
  EXPECT_EQ(evicted, std::vector<BlockKey>{Key(1)});
  Insert(*t, 4);  // 2 is pinned, so 3 goes although 2 is older
  EXPECT_EQ(evicted, (std::vector<BlockKey>{Key(1), Key(3)}));
  EXPECT_TRUE(t->Contains(Key(2)));
  t->Unpin(Key(2));
}

TEST(CpuTierTest, AllPinnedRefusesInsteadOfOverfilling) {
  auto t = MakeCpu(2);
  Insert(*t, 1);
  Insert(*t, 2);
  ASSERT_NE(t->Pin(Key(1)), nullptr);
  ASSERT_NE(t->Pin(Key(2)), nullptr);
  Result<std::byte*> slot = t->BeginInsert(Key(3));
  EXPECT_EQ(slot.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(t->Contains(Key(3)));
  EXPECT_EQ(t->Stats().blocks, 2u);
  t->Unpin(Key(1));
  EXPECT_TRUE(t->BeginInsert(Key(3)).ok()) << "room again once a pin is released";
  t->AbortInsert(Key(3));
  t->Unpin(Key(2));
}

TEST(CpuTierTest, SlotReadDuringDemotionIsReusedOnlyAfterUnpin) {
  auto t = MakeCpu(1);
  std::byte* pinned_slot = nullptr;
  t->SetEvictSink([&](std::span<const BlockKey> keys, std::span<std::byte* const> slots,
                      std::span<bool> taken) {
    ASSERT_EQ(keys.size(), 1u);
    pinned_slot = t->Pin(keys[0]);  // a load reads the block while it is being demoted
    EXPECT_EQ(pinned_slot, slots[0]);
    taken[0] = true;
  });
  Insert(*t, 1);
  // Block 1 is demoted while pinned: its slot cannot be handed to block 2 yet.
  Result<std::byte*> slot = t->BeginInsert(Key(2));
  EXPECT_EQ(slot.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(t->Contains(Key(1))) << "demoted: no longer served from this tier";
  ASSERT_NE(pinned_slot, nullptr);
  EXPECT_EQ(std::memcmp(pinned_slot, testing::Pattern(Key(1), kBlock).data(), kBlock), 0)
      << "the reader still sees its bytes";
  t->Unpin(Key(1));
  EXPECT_TRUE(t->BeginInsert(Key(2)).ok()) << "the last unpin freed the slot";
}

// DemoteAhead: a thread of the tier writes the policy's victims down in batches of at most
// `batch` before inserts need their slots, and at rest leaves at least `batch` slots free. An
// insert that finds a free slot returns while a batch is still being written; one that finds
// none demotes the next victim itself rather than wait for the batch.
TEST(CpuTierTest, DemoterWritesBatchesAheadOfInserts) {
  constexpr size_t kSlots = 8;
  constexpr size_t kBatch = 2;
  auto t = MakeCpu(kSlots);
  Mutex mu;
  CondVar changed(&mu);
  std::vector<std::vector<BlockKey>> batches;
  std::vector<std::thread::id> writers;  // the thread of each batch
  bool gate_open = false;                // sink calls wait for it
  t->SetEvictSink([&](std::span<const BlockKey> keys, std::span<std::byte* const> slots,
                      std::span<bool> taken) {
    MutexLock lock(&mu);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(std::memcmp(slots[i], testing::Pattern(keys[i], kBlock).data(), kBlock), 0);
    }
    batches.emplace_back(keys.begin(), keys.end());
    writers.push_back(std::this_thread::get_id());
    changed.SignalAll();
    while (!gate_open) changed.Wait();
    std::fill(taken.begin(), taken.end(), true);
  });
  t->DemoteAhead(kBatch);
  // 7 blocks leave 1 slot free: the demoter takes the two oldest and stays in the sink.
  for (uint64_t k = 0; k < 7; ++k) Insert(*t, k);
  {
    MutexLock lock(&mu);
    while (batches.empty()) changed.Wait();
  }
  Insert(*t, 7);  // the last free slot, taken while the batch is still being written
  // No slot free: this insert demotes block 2 (the oldest not yet in flight) on its own thread.
  std::thread inserter([&] { Insert(*t, 8); });
  {
    MutexLock lock(&mu);
    while (batches.size() < 2) changed.Wait();
    gate_open = true;
    changed.SignalAll();
  }
  const std::thread::id inserter_id = inserter.get_id();
  inserter.join();
  // The demoter goes on until at least kBatch slots are free (a bound on time, not a timed
  // assertion: on a slow machine the loop only takes longer). Once awake it refills to
  // 2 * kBatch, but an insert may have taken one of those after it went to sleep.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (t->Stats().used_bytes > (kSlots - kBatch) * kSlot &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t->StopDemoting();
  const size_t used_slots = t->Stats().used_bytes / kSlot;
  EXPECT_LE(used_slots, kSlots - kBatch);
  EXPECT_GE(used_slots, kSlots - 2 * kBatch);
  MutexLock lock(&mu);
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches[0], (std::vector<BlockKey>{Key(0), Key(1)}));
  EXPECT_EQ(batches[1], std::vector<BlockKey>{Key(2)});
  EXPECT_EQ(writers[1], inserter_id);
  std::vector<BlockKey> demoted;
  for (size_t b = 0; b < batches.size(); ++b) {
    EXPECT_GE(batches[b].size(), 1u);
    EXPECT_LE(batches[b].size(), kBatch);
    if (b != 1) {
      EXPECT_EQ(writers[b], writers[0]) << "batch " << b << " is the demoter's";
    }
    demoted.insert(demoted.end(), batches[b].begin(), batches[b].end());
  }
  EXPECT_NE(writers[0], std::this_thread::get_id());
  EXPECT_NE(writers[0], inserter_id);
  // LRU: the oldest blocks went, in order; every other block is still here.
  ASSERT_EQ(demoted.size(), 9 - used_slots);
  for (uint64_t k = 0; k < 9; ++k) {
    const bool gone = k < demoted.size();
    if (gone) {
      EXPECT_EQ(demoted[k], Key(k));
    }
    EXPECT_EQ(t->Contains(Key(k)), !gone) << "block " << k;
  }
}

class DiskTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<DiskTier> Open(size_t blocks, bool named_temp_files = false,
                                 std::shared_ptr<testing::FaultPlan> faults = nullptr,
                                 bool persistent = false, bool shared = false,
                                 const HoldSet* holds = nullptr) {
    DiskTierOptions o{"disk0", "KVOFFLOAD_TIERS[0]", testing::Tier(dir_.path(), blocks, persistent, shared), kBlock,
                      fingerprint_, "lru"};
    o.named_temp_files = named_temp_files;
    o.log = [this](const std::string& line) {
      MutexLock lock(&log_mu_);
      log_.push_back(line);
    };
    o.holds = holds;
    std::unique_ptr<DiskIo> io = std::move(NewDiskIo("psync", DiskIoOptions{})).value();
    if (faults) io = std::make_unique<testing::FaultyDiskIo>(std::move(io), faults);
    auto t = DiskTier::Open(o, std::move(io));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }
  // Stores blocks 1 and 2 in persistent tier `t` (at dir_), then puts a FIFO in place of
  // block 1's file; its path.
  std::string StoreTwoAndMakeTheFirstAFifo(DiskTier& t) {
    EXPECT_TRUE(Put(t, 1).ok());
    EXPECT_TRUE(Put(t, 2).ok());
    const std::string path =
        BlockPath(FingerprintDir(dir_.path(), testing::TestModel().Digest()), Key(1));
    EXPECT_EQ(::unlink(path.c_str()), 0);
    EXPECT_EQ(::mkfifo(path.c_str(), 0644), 0);
    return path;
  }
  Status Put(DiskTier& t, uint64_t k) {
    auto* buf = static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kSlot));
    std::vector<std::byte> p = testing::Pattern(Key(k), kBlock);
    std::memcpy(buf, p.data(), kBlock);
    EncodeBlockFile(buf, kBlock, testing::TestModel().Digest(), Key(k));
    Status s = t.Insert(Key(k), buf);
    std::free(buf);
    return s;
  }
  // Pins and reads the blocks; the indexes on_read reported, in arrival order.
  std::vector<size_t> PinAndRead(DiskTier& t, const std::vector<BlockKey>& keys,
                                 std::vector<Status>& results) {
    results.assign(keys.size(), Status::Ok());
    t.Pin(keys, results);
    std::vector<std::byte*> dsts;
    for (size_t i = 0; i < keys.size(); ++i) {
      dsts.push_back(static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kSlot)));
    }
    std::vector<size_t> arrived;
    t.ReadPinned(keys, dsts, results, [&](size_t i) {
      EXPECT_EQ(std::memcmp(dsts[i], testing::Pattern(keys[i], kBlock).data(), kBlock), 0)
          << "block " << i << " is whole when reported";
      arrived.push_back(i);
    });
    for (std::byte* d : dsts) std::free(d);
    return arrived;
  }
  void FailedWriteOverAVictimGivesItsBytesBack(bool persistent);
  // Binds the tier's directory onto itself in a mount namespace of this process's own, so
  // that Remount can make it read-only; what is missing for that ("" when it worked).
  std::string BindTierOntoItself() {
    const std::string path = dir_.path();
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount(path.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return std::strerror(errno);
    }
    return {};
  }
  // Changes a byte of block k's file in the persistent tier at dir_: a corrupt block.
  void FlipAByteOf(uint64_t k) {
    std::fstream f(BlockPath(FpDir(), Key(k)), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(100);
    f.put('\x5a');
    ASSERT_TRUE(f.good());
  }
  void Remount(unsigned long flags) {
    ASSERT_EQ(
        ::mount(nullptr, dir_.path().c_str(), nullptr, MS_REMOUNT | MS_BIND | flags, nullptr), 0)
        << std::strerror(errno);
  }
  // Two replicas fill a shared tier; its ledger goes from outside (`how`: the format directory
  // removed or moved away, or the ledger file alone removed or replaced by another file renamed
  // over it); a third starts; all three write on.
  enum class LedgerGoes { kDirRemoved, kDirMoved, kFileRemoved, kFileReplaced };
  void SharedLedgerGoesWhileReplicasRun(LedgerGoes how);
  // Whether a line the tiers logged contains `text`.
  bool Logged(const std::string& text) {
    MutexLock lock(&log_mu_);
    return std::ranges::any_of(
        log_, [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }
  std::string FpDir() const { return FingerprintDir(dir_.path(), fingerprint_); }
  testing::TempDir dir_;
  // The fingerprint of the tiers Open makes from now on (another model's replica: change it).
  BlockKey fingerprint_ = testing::TestModel().Digest();
  Mutex log_mu_;
  std::vector<std::string> log_ GUARDED_BY(log_mu_);
};

TEST_F(DiskTierTest, PinnedBlockIsNeverEvictedAndAllPinnedRefuses) {
  auto t = Open(2);
  std::vector<BlockKey> cascaded;
  t->SetEvictSink([&](const BlockKey& k, std::byte* file) {
    EXPECT_TRUE(VerifyBlockFile(file, kBlock, testing::TestModel().Digest(), k).ok());
    cascaded.push_back(k);
    return true;
  });
  ASSERT_TRUE(Put(*t, 1).ok());
  ASSERT_TRUE(Put(*t, 2).ok());
  std::vector<BlockKey> pin = {Key(1)};
  std::vector<Status> pinned(1);
  t->Pin(pin, pinned);
  ASSERT_TRUE(pinned[0].ok());
  ASSERT_TRUE(Put(*t, 3).ok());
  EXPECT_EQ(cascaded, std::vector<BlockKey>{Key(2)}) << "1 is older but pinned";
  std::vector<BlockKey> pin3 = {Key(3)};
  std::vector<Status> pinned3(1);
  t->Pin(pin3, pinned3);
  Status full = Put(*t, 4);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_LE(testing::BytesUnder(dir_.path()), 2 * kSlot);
  // Reading the pinned blocks unpins them; then there is room again.
  auto* a = static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kSlot));
  auto* b = static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kSlot));
  std::vector<std::byte*> dsts = {a};
  t->ReadPinned(pin, dsts, pinned);
  dsts = {b};
  t->ReadPinned(pin3, dsts, pinned3);
  EXPECT_TRUE(pinned[0].ok());
  EXPECT_EQ(std::memcmp(a, testing::Pattern(Key(1), kBlock).data(), kBlock), 0);
  std::free(a);
  std::free(b);
  EXPECT_TRUE(Put(*t, 4).ok());
}

// In both layouts: a slot file (a private tier that starts empty) and a file per block.
TEST_F(DiskTierTest, ReadPinnedReportsEachVerifiedBlockAndNoBadOne) {
  for (const bool slots : {true, false}) {
    SCOPED_TRACE(slots ? "slot file" : "file per block");
    auto t = Open(4, false, nullptr, /*persistent=*/!slots);
    for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(Put(*t, k).ok());
    if (slots) {
      ASSERT_TRUE(testing::DamageSlot(dir_.path(), kBlock, Key(2)));
    } else {
      const std::string bad =
          BlockPath(FingerprintDir(dir_.path(), testing::TestModel().Digest()), Key(2));
      std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
      char c = 0;
      f.seekg(100);
      f.read(&c, 1);
      f.seekp(100);
      f.put(static_cast<char>(c ^ 0x40));
    }
    std::vector<Status> results;
    std::vector<size_t> arrived = PinAndRead(*t, {Key(1), Key(2), Key(3)}, results);
    std::sort(arrived.begin(), arrived.end());
    EXPECT_EQ(arrived, (std::vector<size_t>{0, 2}));
    EXPECT_EQ(results[1].code(), StatusCode::kCorruption) << results[1].ToString();
    EXPECT_FALSE(t->Contains(Key(2))) << "the bad block is removed";
    EXPECT_EQ(t->Stats().used_bytes, 2 * kSlot) << "and its bytes given back";
    ASSERT_TRUE(Put(*t, 4).ok());
    ASSERT_TRUE(Put(*t, 5).ok()) << "its room is taken again";
    EXPECT_EQ(PinAndRead(*t, {Key(1), Key(3), Key(4), Key(5)}, results).size(), 4u);
    t.reset();
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// Where O_TMPFILE cannot be used, a block is written to a named temp file, linked, unlinked.
TEST_F(DiskTierTest, NamedTempFilesPublishTheSameAndLeaveNothingBehind) {
  auto faults = std::make_shared<testing::FaultPlan>();
  auto t = Open(4, /*named_temp_files=*/true, faults, /*persistent=*/true);
  ASSERT_TRUE(Put(*t, 1).ok());
  faults->FailWrites(testing::Fault::kEio, 1);
  EXPECT_EQ(Put(*t, 2).code(), StatusCode::kIOError);
  EXPECT_FALSE(t->Contains(Key(2)));
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "the failed write's temp file";
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".blk"), 1u);
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*t, {Key(1)}, results), std::vector<size_t>{0});
  EXPECT_EQ(t->Stats().used_bytes, kSlot) << "the failed write gave its bytes back";
}

// Inode numbers of the block files under dir.
std::set<ino_t> BlockInodes(const std::string& dir) {
  std::set<ino_t> inodes;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (e.path().extension() == ".blk" && ::stat(e.path().c_str(), &st) == 0) {
      inodes.insert(st.st_ino);
    }
  }
  return inodes;
}

// A full tier is its steady state: each new block evicts one. Its file is the victim's, renamed
// aside, overwritten in place and renamed to the new key, so the file system allocates nothing.
TEST_F(DiskTierTest, FullTierWritesNewBlocksOverItsVictimsFiles) {
  auto t = Open(4, false, nullptr, /*persistent=*/true);
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
  const std::set<ino_t> before = BlockInodes(dir_.path());
  ASSERT_EQ(before.size(), 4u);
  // A second link to each file keeps its inode alive, so that a new file can never be given a
  // freed inode's number: the same numbers below mean the same files.
  testing::TempDir keep;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path())) {
    if (e.path().extension() == ".blk") {
      std::filesystem::create_hard_link(e.path(), keep.path() + "/" + e.path().filename().string());
    }
  }
  for (uint64_t k = 5; k <= 12; ++k) ASSERT_TRUE(Put(*t, k).ok());
  EXPECT_EQ(BlockInodes(dir_.path()), before) << "the new blocks live in the victims' files";
  EXPECT_EQ(t->Stats().evictions, 8u);
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "every spare file was taken";
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot);
  for (uint64_t k = 1; k <= 8; ++k) EXPECT_FALSE(t->Contains(Key(k))) << k;
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*t, {Key(9), Key(10), Key(11), Key(12)}, results).size(), 4u)
      << "each reused file holds its new block, verified";
  for (const Status& r : results) EXPECT_TRUE(r.ok()) << r.ToString();
}

// A crash leaves the spare a write was going over (or a named temp file) behind: a private
// tier removes them when it opens again, and serves and counts its blocks alone.
TEST_F(DiskTierTest, PrivateTierReopenedAfterACrashRemovesItsTempFiles) {
  {
    auto t = Open(4, false, nullptr, /*persistent=*/true);
    for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
  }
  const std::string fp = FingerprintDir(dir_.path(), testing::TestModel().Digest());
  const std::string leftovers[] = {"spare.999999.0.tmp", Key(5).ToHex() + ".999999.1.tmp"};
  for (const std::string& name : leftovers) {
    std::ofstream(fp + "/" + name) << std::string(kSlot, 'x');
  }
  ASSERT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 2u);
  auto t = Open(4, false, nullptr, /*persistent=*/true);
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u);
  EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot);
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*t, {Key(1), Key(2), Key(3), Key(4)}, results).size(), 4u);
}

// A persistent tier reopened with a smaller capacity sheds blocks down to it once the recovered
// files are checked. Blocks held then (a lookup's holds, taken as soon as the tier serves) cannot
// be shed; the writes after their release shed them, rather than each writing over one victim's
// file and keeping the tier over its capacity for as long as the engine runs.
TEST_F(DiskTierTest, ReopenedSmallerWhileHeldShedsDownToItsCapacityOnTheNextWrites) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "private");
    {
      auto t = Open(8, false, nullptr, /*persistent=*/true, shared);
      for (uint64_t k = 1; k <= 8; ++k) ASSERT_TRUE(Put(*t, k).ok());
    }
    HoldSet holds;
    for (uint64_t k = 1; k <= 8; ++k) holds.Add(Key(k));
    auto t = Open(3, false, nullptr, /*persistent=*/true, shared, &holds);
    // A write needs a victim, and victims are chosen once the recovered files are checked:
    // this one returns after the check, refused, as every block is held.
    EXPECT_EQ(Put(*t, 9).code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(t->Stats().used_bytes, 8 * kSlot);
    for (uint64_t k = 1; k <= 8; ++k) holds.Remove(Key(k));
    ASSERT_TRUE(Put(*t, 10).ok());
    EXPECT_EQ(t->Stats().used_bytes, 3 * kSlot);
    EXPECT_EQ(t->Stats().blocks, 3u);
    ASSERT_TRUE(Put(*t, 11).ok());
    EXPECT_EQ(t->Stats().used_bytes, 3 * kSlot);
    EXPECT_EQ(testing::BytesUnder(dir_.path()), 3 * kSlot) << "the files on disk agree";
    EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "no spare file kept";
    std::vector<Status> results;
    EXPECT_EQ(PinAndRead(*t, {Key(10), Key(11)}, results).size(), 2u);
    size_t kept = 0;
    for (uint64_t k = 1; k <= 11; ++k) if (t->Contains(Key(k))) ++kept;
    EXPECT_EQ(kept, 3u);
    t.reset();
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// A shared tier that another replica filled after this one opened: its blocks are of our
// fingerprint but were never looked up here, so none was a victim, and every write of ours was
// refused for as long as we ran ("no block of ours can be evicted"). The writer now indexes the
// directory's blocks when it finds no victim, and evicts from them.
TEST_F(DiskTierTest, SharedTierFilledByAnotherReplicaAfterOpenStillTakesWrites) {
  auto a = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  {
    auto b = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
    for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*b, k).ok());
  }
  for (uint64_t k = 11; k <= 12; ++k) {
    const Status s = Put(*a, k);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_TRUE(a->Contains(Key(11)));
  EXPECT_TRUE(a->Contains(Key(12)));
  EXPECT_EQ(a->Stats().evictions, 2u);
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot)
      << "the capacity is still the two replicas' together";
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*a, {Key(11), Key(12)}, results).size(), 2u);
}

// In a shared tier, a block another replica evicted is a miss here too, even once indexed: a
// lookup reported it and the load that followed failed ("is gone").
TEST_F(DiskTierTest, SharedBlockEvictedByAnotherReplicaIsAMissHere) {
  auto a = Open(2, false, nullptr, /*persistent=*/true, /*shared=*/true);
  auto b = Open(2, false, nullptr, /*persistent=*/true, /*shared=*/true);
  ASSERT_TRUE(Put(*a, 1).ok());
  ASSERT_TRUE(Put(*a, 2).ok());
  EXPECT_TRUE(b->Contains(Key(1)));  // indexed by b now
  EXPECT_EQ(b->Stats().blocks, 1u);
  ASSERT_TRUE(Put(*a, 3).ok());      // a evicts its oldest, block 1
  EXPECT_FALSE(a->Contains(Key(1)));
  EXPECT_FALSE(b->Contains(Key(1)));
  EXPECT_EQ(b->Stats().blocks, 0u) << "forgotten, not counted";
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 2 * kSlot) << "nothing removed or freed twice";
  EXPECT_TRUE(b->Contains(Key(3)));
}

// Block files removed from outside while the tier runs (rm <fp>/*.blk): a file already gone
// frees its bytes. Before, the bytes of a block whose unlink said ENOENT were never given back
// and the tier, holding nothing, refused every write until a restart ("full ... and no block
// of ours can be evicted"). A private tier gives them back as it finds each file gone; a
// shared one, where another replica's unlink may have given them back already, recounts the
// files when it is full with nothing of ours to evict.
TEST_F(DiskTierTest, BlockFilesRemovedFromOutsideGiveTheirBytesBack) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "private");
    {
      auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
      for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
      for (const auto& e : std::filesystem::directory_iterator(FpDir())) {
        std::filesystem::remove(e.path());
      }
      std::vector<Status> results;
      EXPECT_TRUE(PinAndRead(*t, {Key(1)}, results).empty());
      EXPECT_EQ(results[0].code(), StatusCode::kNotFound);
      for (uint64_t k = 5; k <= 8; ++k) {
        const Status s = Put(*t, k);
        EXPECT_TRUE(s.ok()) << k << ": " << s.ToString();
      }
      EXPECT_EQ(t->Stats().blocks, 4u);
      EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
      EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot) << "the count and the files agree";
      EXPECT_EQ(PinAndRead(*t, {Key(5), Key(6), Key(7), Key(8)}, results).size(), 4u);
    }
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// The format directory removed from outside while the tier runs (rm -rf <tier>/kvoffload-v1):
// the next write creates it again (and says so) instead of every block being dropped as
// "No such file or directory" until a restart; the blocks that went with it give their bytes
// back as they are found gone. With and without O_TMPFILE.
TEST_F(DiskTierTest, FormatDirectoryRemovedFromOutsideIsCreatedAgain) {
  for (const bool named : {false, true}) {
    SCOPED_TRACE(named ? "named temp files" : "O_TMPFILE where it works");
    {
      auto t = Open(8, named, nullptr, /*persistent=*/true);
      ASSERT_TRUE(Put(*t, 1).ok());
      ASSERT_TRUE(Put(*t, 2).ok());
      std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
      const Status s = Put(*t, 3);
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(Logged("was removed from outside; created it again"));
      std::vector<Status> results;
      EXPECT_EQ(PinAndRead(*t, {Key(1), Key(2), Key(3)}, results), std::vector<size_t>{2});
      EXPECT_EQ(t->Stats().blocks, 1u);
      EXPECT_EQ(t->Stats().used_bytes, kSlot);
      EXPECT_EQ(testing::BytesUnder(dir_.path()), kSlot);
    }
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// A full tier whose file system turns read-only: its blocks stay, readable, and the state says
// read-only; once writable again, writes evict as before and the log says so. Before, each
// failed unlink (EROFS) dropped a good block from the index while its file and bytes stayed,
// the state said "full (no block can be evicted)", and after the remount the tier held
// nothing and took nothing. The mount is a bind of the tier onto itself in a mount namespace
// of this test process's own.
TEST_F(DiskTierTest, FullTierRemountedReadOnlyKeepsItsBlocksAndSaysSo) {
  const std::string path = dir_.path();
  KVO_REQUIRE_CAPABILITY("a mount namespace (root)", BindTierOntoItself());
  auto remount = [&](unsigned long flags) { Remount(flags); };
  {
    auto t = Open(4, false, nullptr, /*persistent=*/true);
    for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
    remount(MS_RDONLY);
    for (uint64_t k = 5; k <= 6; ++k) {
      const Status s = Put(*t, k);
      EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
      EXPECT_NE(s.message().find(std::strerror(EROFS)), std::string::npos) << s.ToString();
    }
    EXPECT_TRUE(Logged("is read-only")) << "not \"full\": nothing was evictable";
    EXPECT_FALSE(Logged(") is full"));
    EXPECT_EQ(t->Stats().blocks, 4u);
    EXPECT_EQ(t->Stats().evictions, 0u);
    std::vector<Status> results;
    EXPECT_EQ(PinAndRead(*t, {Key(1), Key(2), Key(3), Key(4)}, results).size(), 4u)
        << "every block is still here";
    remount(0);
    for (uint64_t k = 5; k <= 6; ++k) {
      const Status s = Put(*t, k);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    EXPECT_TRUE(Logged("is writable again; 2 blocks did not reach it"));
    EXPECT_EQ(t->Stats().blocks, 4u);
    EXPECT_EQ(t->Stats().evictions, 2u);
    EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
    EXPECT_EQ(testing::BytesUnder(path), 4 * kSlot);
    EXPECT_EQ(PinAndRead(*t, {Key(5), Key(6)}, results).size(), 2u);
  }
  ASSERT_EQ(::umount2(path.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

// A corrupt block whose file cannot be removed (the file system turned read-only) is a miss
// from its failed load on, and once removals work again it is the first to go when a write
// needs room, and a fresh copy of the block is taken. Before, it stayed in the policy as the
// newest block (its failed load was its last use), kept its room until everything else had
// been evicted, and every store of the block was refused ("is being removed") until then.
TEST_F(DiskTierTest, CorruptBlockThatCouldNotBeRemovedGoesFirstOnceItCan) {
  const std::string path = dir_.path();
  KVO_REQUIRE_CAPABILITY("a mount namespace (root)", BindTierOntoItself());
  {
    auto t = Open(3, false, nullptr, /*persistent=*/true);
    for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(Put(*t, k).ok());
    FlipAByteOf(1);
    Remount(MS_RDONLY);
    std::vector<Status> results;
    EXPECT_TRUE(PinAndRead(*t, {Key(1)}, results).empty());
    EXPECT_EQ(results[0].code(), StatusCode::kCorruption) << results[0].ToString();
    EXPECT_FALSE(t->Contains(Key(1)));
    EXPECT_TRUE(PinAndRead(*t, {Key(1)}, results).empty());
    EXPECT_EQ(results[0].code(), StatusCode::kNotFound) << "not read again";
    EXPECT_EQ(t->Stats().corrupt, 1u);
    Remount(0);
    ASSERT_TRUE(Put(*t, 4).ok());
    EXPECT_TRUE(t->Contains(Key(2))) << "the corrupt block went, not the oldest good one";
    EXPECT_TRUE(t->Contains(Key(3)));
    EXPECT_TRUE(t->Contains(Key(4)));
    EXPECT_EQ(testing::BytesUnder(path), 3 * kSlot);
    EXPECT_EQ(t->Stats().used_bytes, 3 * kSlot);
    // And stored again: its own copy is taken now.
    const Status s = Put(*t, 1);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(PinAndRead(*t, {Key(1)}, results).size(), 1u);
  }
  {
    // Stored again first, while it is still there: the fresh copy goes over it.
    auto t = Open(3, false, nullptr, /*persistent=*/true);
    ASSERT_TRUE(Put(*t, 5).ok());
    FlipAByteOf(5);
    Remount(MS_RDONLY);
    std::vector<Status> results;
    EXPECT_TRUE(PinAndRead(*t, {Key(5)}, results).empty());
    Remount(0);
    const Status s = Put(*t, 5);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(PinAndRead(*t, {Key(5)}, results).size(), 1u);
    // The fresh copy, held by two loads, found corrupt by the first while the second still
    // holds it: removed when the second lets go. Before, the key stayed listed as stuck from
    // the old copy, the next write that needed room removed the block under the second load,
    // and that load's unpin left an entry that refused every later store of the block.
    const BlockKey five = Key(5);
    Status first = Status::Ok();
    Status second = Status::Ok();
    t->Pin(std::span(&five, 1), std::span(&first, 1));
    t->Pin(std::span(&five, 1), std::span(&second, 1));
    ASSERT_TRUE(first.ok() && second.ok());
    FlipAByteOf(5);
    std::byte* dst = static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kSlot));
    t->ReadPinned(std::span(&five, 1), std::span(&dst, 1), std::span(&first, 1));
    EXPECT_EQ(first.code(), StatusCode::kCorruption) << first.ToString();
    for (uint64_t k = 6; k <= 8; ++k) EXPECT_TRUE(Put(*t, k).ok()) << k;
    t->ReadPinned(std::span(&five, 1), std::span(&dst, 1), std::span(&second, 1));
    EXPECT_FALSE(second.ok());
    std::free(dst);
    EXPECT_FALSE(t->Contains(five));
    const Status stored = Put(*t, 5);
    EXPECT_TRUE(stored.ok()) << stored.ToString();
    EXPECT_EQ(PinAndRead(*t, {five}, results).size(), 1u) << "stored again and read";
  }
  ASSERT_EQ(::umount2(path.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

// A shared tier's ledger damaged while engines run (truncated, or a total no tier holds) is
// recounted from the files at the next write, as at open: the tier stays within its capacity
// and keeps taking writes. Before, a truncated ledger read 0 and the tier held twice its
// capacity for good; one reading 2^40 made the engine evict all its blocks and then refuse
// every write.
TEST_F(DiskTierTest, SharedLedgerDamagedWhileOpenIsRecountedFromTheFiles) {
  const std::string ledger = dir_.path() + "/kvoffload-v1/ledger";
  for (const uint64_t damage : {uint64_t{0}, uint64_t{1} << 40}) {
    SCOPED_TRACE(damage == 0 ? "truncated" : "2^40");
    {
      auto t = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
      for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
      if (damage == 0) {
        std::filesystem::resize_file(ledger, 0);
      } else {
        std::ofstream(ledger, std::ios::binary | std::ios::in)
            .write(reinterpret_cast<const char*>(&damage), sizeof(damage));
      }
      for (uint64_t k = 5; k <= 8; ++k) {
        const Status s = Put(*t, k);
        EXPECT_TRUE(s.ok()) << k << ": " << s.ToString();
      }
      EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot) << "within the capacity";
      EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
      EXPECT_EQ(t->Stats().blocks, 4u);
    }
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// Cut short a second time within the recount interval of the first repair: the cut ledger
// read as 0 then (a recount was not due), the writes reserved against 0 and wrote a total that
// looked right, and the tier held twice its capacity for good.
TEST_F(DiskTierTest, SharedLedgerCutTwiceInARowIsRecountedBothTimes) {
  const std::string ledger = dir_.path() + "/kvoffload-v1/ledger";
  auto t = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
  std::filesystem::resize_file(ledger, 0);
  ASSERT_TRUE(Put(*t, 5).ok());
  std::filesystem::resize_file(ledger, 0);
  for (uint64_t k = 6; k <= 9; ++k) ASSERT_TRUE(Put(*t, k).ok()) << k;
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot) << "within the capacity";
  EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
}

// A shared tier's block file cut short (truncated, or left at 0 bytes by a crash without
// O_DIRECT): the open's recount counted it at its size, and removing it took a whole block
// off the ledger, which stayed low for good: two more blocks went in without an eviction and
// the files went past the capacity.
TEST_F(DiskTierTest, ASharedFileOfTheWrongSizeFreesWhatItHeld) {
  {
    auto t = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
    for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
  }
  std::filesystem::resize_file(BlockPath(FpDir(), Key(1)), 0);
  auto t = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  for (uint64_t k = 5; k <= 6; ++k) ASSERT_TRUE(Put(*t, k).ok()) << k;
  EXPECT_FALSE(t->Contains(Key(1)));
  EXPECT_LE(testing::BytesUnder(dir_.path()), 4 * kSlot) << "within the capacity";
  EXPECT_EQ(t->Stats().used_bytes, testing::BytesUnder(dir_.path()));
}

// A recount while a writer holds a written temp file it has not published yet (another replica
// opening the tier): the temp was counted as a file and again in the writer's in-flight bytes,
// and the ledger stayed a block high until a later recount. Named temp files, as on NFS.
TEST_F(DiskTierTest, ARecountCountsALiveWritersTempFileOnce) {
  auto faults = std::make_shared<testing::FaultPlan>();
  std::promise<void> written, release;
  std::shared_future<void> released = release.get_future().share();
  faults->after_writes = [&, fired = false]() mutable {
    if (std::exchange(fired, true)) return;
    written.set_value();
    released.wait();
  };
  auto a = Open(4, /*named_temp_files=*/true, faults, /*persistent=*/true, /*shared=*/true);
  std::thread writer([&] { EXPECT_TRUE(Put(*a, 1).ok()); });
  written.get_future().wait();
  auto b = Open(4, /*named_temp_files=*/true, nullptr, /*persistent=*/true, /*shared=*/true);
  release.set_value();
  writer.join();
  EXPECT_EQ(testing::BytesUnder(dir_.path()), kSlot);
  EXPECT_EQ(a->Stats().used_bytes, kSlot) << "one block, counted once";
}

// The format directory of a shared tier removed from outside while replicas run
// (rm -rf <tier>/kvoffload-v1): the ledger and the writer files went with it. Before, the
// running replicas kept counting in the removed ledger and a replica that started then counted
// in a new one, each up to the whole capacity, and nobody could give back what a replica killed
// later had in flight (its writer file was gone). Each replica now finds its ledger removed at
// its next write and moves to the one at the path (creating it), with a writer file there.
// Moved away (mv) instead of removed, the same. The ledger file alone removed (`rm`) or
// replaced (a restore renaming another in): each running replica's writer file was still
// there, so creating it again failed and the replica kept counting in the old ledger for good,
// beside the new one; it now stays with its writer file and moves to the ledger at the path.
TEST_F(DiskTierTest, SharedLedgerRemovedFromOutsideIsFollowedToTheNewOne) {
  for (const auto& [how, name] :
       {std::pair{LedgerGoes::kDirRemoved, "format directory removed"},
        std::pair{LedgerGoes::kDirMoved, "format directory moved away"},
        std::pair{LedgerGoes::kFileRemoved, "ledger file removed"},
        std::pair{LedgerGoes::kFileReplaced, "ledger file replaced"}}) {
    SCOPED_TRACE(name);
    SharedLedgerGoesWhileReplicasRun(how);
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
    std::filesystem::remove_all(dir_.path() + "/moved");
  }
}

void DiskTierTest::SharedLedgerGoesWhileReplicasRun(LedgerGoes how) {
  const std::string root = dir_.path() + "/kvoffload-v1";
  auto a = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  auto b = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  for (uint64_t k = 1; k <= 2; ++k) ASSERT_TRUE(Put(*a, k).ok());
  for (uint64_t k = 3; k <= 4; ++k) ASSERT_TRUE(Put(*b, k).ok());
  switch (how) {
    case LedgerGoes::kDirRemoved:
      std::filesystem::remove_all(root);
      break;
    case LedgerGoes::kDirMoved:
      std::filesystem::rename(root, dir_.path() + "/moved");
      break;
    case LedgerGoes::kFileRemoved:
      std::filesystem::remove(root + "/ledger");
      break;
    case LedgerGoes::kFileReplaced:
      std::ofstream(root + "/ledger.restored", std::ios::binary) << std::string(8, '\0');
      std::filesystem::rename(root + "/ledger.restored", root + "/ledger");
      break;
  }
  // A write of each running replica first, then one that starts now.
  ASSERT_TRUE(Put(*a, 5).ok());
  ASSERT_TRUE(Put(*b, 6).ok());
  auto c = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  EXPECT_TRUE(std::filesystem::exists(root + "/ledger"));
  EXPECT_EQ(testing::FilesUnder(root + "/ledger.writers", ""), 3u) << "one writer file each";
  DiskTier* replicas[] = {a.get(), b.get(), c.get()};
  for (uint64_t k = 7; k <= 30; ++k) {
    const Status s = Put(*replicas[k % 3], k);
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kResourceExhausted) << k << ": " << s.ToString();
    ASSERT_LE(testing::BytesUnder(root), 4 * kSlot) << "after block " << k;
  }
  // Each replica counts in the ledger at the path: no open ledger file of this process is
  // another (a removed one reads as "... (deleted)").
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    const bool ledger = target.find("/ledger") != std::string::npos;
    if (ledger && target.find(".writers") == std::string::npos) {
      EXPECT_EQ(target, root + "/ledger");
    }
  }
  EXPECT_EQ(c->Stats().used_bytes, testing::BytesUnder(root)) << "the ledger and the files agree";
}

// A replica of another model (or block size) fills a shared tier after this one opened: its
// blocks are foreign here, evicted first. Before, only the foreign files seen at open were
// victims, so every write of ours was refused for as long as we ran.
TEST_F(DiskTierTest, SharedTierFilledByAnotherModelAfterOpenEvictsItsBlocks) {
  auto a = Open(4, false, nullptr, /*persistent=*/false, /*shared=*/true);
  fingerprint_ = testing::TestModel("another-model").Digest();
  auto b = Open(4, false, nullptr, /*persistent=*/false, /*shared=*/true);
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*b, k).ok());
  for (uint64_t k = 11; k <= 13; ++k) {
    const Status s = Put(*a, k);
    EXPECT_TRUE(s.ok()) << k << ": " << s.ToString();
  }
  EXPECT_EQ(a->Stats().evictions, 3u);
  // Removed, not moved down: metrics report evictions less drops as blocks moved down.
  EXPECT_EQ(a->Stats().dropped, 3u);
  EXPECT_EQ(testing::BytesUnder(dir_.path()), 4 * kSlot) << "within the capacity";
  EXPECT_EQ(testing::FilesUnder(FpDir()), 1u) << "the other model's oldest went first";
  EXPECT_TRUE(b->Contains(Key(4)));
  EXPECT_FALSE(b->Contains(Key(1)));
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*a, {Key(11), Key(12), Key(13)}, results).size(), 3u);
}

// The same steady state in a slot file: the new blocks go into the victims' slots, and the file
// never grows past the tier's capacity in slots.
TEST_F(DiskTierTest, FullSlotTierWritesNewBlocksIntoItsVictimsSlots) {
  auto t = Open(4);
  for (uint64_t k = 1; k <= 12; ++k) ASSERT_TRUE(Put(*t, k).ok());
  const std::string slots = testing::SlotFileUnder(dir_.path());
  ASSERT_FALSE(slots.empty());
  EXPECT_EQ(std::filesystem::file_size(slots), 4 * kSlot);
  EXPECT_EQ(testing::FilesUnder(dir_.path()), 0u) << "no file per block";
  EXPECT_EQ(t->Stats().evictions, 8u);
  EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
  for (uint64_t k = 1; k <= 8; ++k) EXPECT_FALSE(t->Contains(Key(k))) << k;
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*t, {Key(9), Key(10), Key(11), Key(12)}, results).size(), 4u)
      << "each reused slot holds its new block, verified";
  for (const Status& r : results) EXPECT_TRUE(r.ok()) << r.ToString();
  t.reset();
  EXPECT_FALSE(std::filesystem::exists(slots)) << "a closed tier's slots go with it";
}

// A write that fails (into a victim's file or slot) gives the room back: nothing is left
// behind, and the tier has room for the next block. In both layouts.
TEST_F(DiskTierTest, FailedWriteOverAVictimsFileGivesItsBytesBack) {
  for (const bool slots : {true, false}) {
    SCOPED_TRACE(slots ? "slot file" : "file per block");
    FailedWriteOverAVictimGivesItsBytesBack(/*persistent=*/!slots);
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

void DiskTierTest::FailedWriteOverAVictimGivesItsBytesBack(bool persistent) {
  auto faults = std::make_shared<testing::FaultPlan>();
  auto t = Open(2, /*named_temp_files=*/false, faults, persistent);
  ASSERT_TRUE(Put(*t, 1).ok());
  ASSERT_TRUE(Put(*t, 2).ok());
  faults->FailWrites(testing::Fault::kEio, 1);
  EXPECT_EQ(Put(*t, 3).code(), StatusCode::kIOError);
  EXPECT_FALSE(t->Contains(Key(3)));
  EXPECT_FALSE(t->Contains(Key(1))) << "the victim went before the write";
  if (persistent) {
    EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "the spare went with the failure";
    EXPECT_EQ(testing::BytesUnder(dir_.path()), kSlot);
  }
  EXPECT_EQ(t->Stats().used_bytes, kSlot);
  ASSERT_TRUE(Put(*t, 4).ok()) << "its bytes were given back";
  std::vector<Status> results;
  EXPECT_EQ(PinAndRead(*t, {Key(2), Key(4)}, results).size(), 2u);
}

// A block file listed when a persistent tier opens but no regular file by the time the tier's
// thread checks it (another replica removed it in between) is forgotten, and its bytes are
// counted once: given back in a private tier, whose count started from the listing; not again
// in a shared one, whose count started from the files on disk. The window is made to last by
// mounting /dev/null over the file: the directory still lists a regular file, and every stat
// of its name sees a character device.
TEST_F(DiskTierTest, BlockGoneBetweenListingAndCheckIsCountedOnce) {
  // A mount namespace of this test process's own, so that the mount is never the host's.
  std::string missing;
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    missing = std::strerror(errno);
  }
  KVO_REQUIRE_CAPABILITY("a mount namespace (root)", missing);
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "private");
    {
      auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
      for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(Put(*t, k).ok());
    }
    const std::string gone =
        BlockPath(FingerprintDir(dir_.path(), testing::TestModel().Digest()), Key(2));
    ASSERT_EQ(::mount("/dev/null", gone.c_str(), nullptr, MS_BIND, nullptr), 0)
        << std::strerror(errno);
    {
      auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
      // Room for 5 and 6 needs a victim of ours, and victims are chosen only once the tier's
      // thread has checked the listed files: these stores return after that check.
      ASSERT_TRUE(Put(*t, 5).ok());
      ASSERT_TRUE(Put(*t, 6).ok());
      EXPECT_FALSE(t->Contains(Key(2)));
      EXPECT_EQ(t->Stats().blocks, 4u);
      // BytesUnder counts regular files only: the masked name is not one.
      EXPECT_EQ(t->Stats().used_bytes, testing::BytesUnder(dir_.path()))
          << "the count and the files on disk agree";
      EXPECT_EQ(t->Stats().used_bytes, 4 * kSlot);
    }
    ASSERT_EQ(::umount2(gone.c_str(), MNT_DETACH), 0) << std::strerror(errno);
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// Runs fn on a thread of its own and waits up to 10 s. Past that it fails, and opens every FIFO
// under dir for reading and writing, which lets an open blocked on one of them return, so that
// a hang fails the test instead of stopping it.
void FinishesWithoutHanging(const std::string& dir, const std::function<void()>& fn) {
  std::future<void> done = std::async(std::launch::async, fn);
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return;
  ADD_FAILURE() << "hung on a FIFO";
  std::vector<int> fds;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_fifo()) fds.push_back(::open(e.path().c_str(), O_RDWR | O_NONBLOCK));
  }
  done.wait();
  for (int fd : fds) ::close(fd);
}

// What a name planted in a fingerprint directory is.
enum class Planted { kDirectory, kFifo, kLink, kDanglingLink };

std::string PlantedName(Planted p) {
  switch (p) {
    case Planted::kDirectory: return "directory";
    case Planted::kFifo: return "FIFO";
    case Planted::kLink: return "link to a file of a block file's size";
    case Planted::kDanglingLink: return "dangling link";
  }
  return "?";
}

// Puts something that is no block file at `path`; `outside` is a directory out of the tier.
void Plant(Planted p, const std::string& path, const std::string& outside) {
  switch (p) {
    case Planted::kDirectory: ASSERT_EQ(::mkdir(path.c_str(), 0755), 0); break;
    case Planted::kFifo: ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0); break;
    case Planted::kLink: {
      const std::string target = outside + "/target";
      std::ofstream(target, std::ios::binary) << std::string(kSlot, 'x');
      ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
      break;
    }
    case Planted::kDanglingLink: ASSERT_EQ(::symlink("/nonexistent", path.c_str()), 0); break;
  }
}

// A stored block's file replaced by a FIFO while the tier runs: opening it for reading used to
// wait for a writer forever, and the engine's close behind the load. Now the load fails, the
// block is a miss from then on, and the FIFO stays (it is not ours to remove).
TEST_F(DiskTierTest, BlockFileReplacedByAFifoFailsItsLoadAndIsAMissAfter) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "private");
    auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
    const std::string path = StoreTwoAndMakeTheFirstAFifo(*t);
    std::vector<Status> results(1);
    FinishesWithoutHanging(dir_.path(), [&] { PinAndRead(*t, {Key(1)}, results); });
    EXPECT_EQ(results[0].code(), StatusCode::kFailedPrecondition) << results[0].ToString();
    EXPECT_FALSE(t->Contains(Key(1))) << "a miss from now on";
    EXPECT_EQ(t->Stats().io_errors, 1u);
    std::filesystem::file_status st = std::filesystem::symlink_status(path);
    EXPECT_TRUE(std::filesystem::is_fifo(st)) << "the FIFO stays";
    EXPECT_EQ(PinAndRead(*t, {Key(2)}, results), std::vector<size_t>{0}) << "others still load";
    if (!shared) {
      EXPECT_EQ(t->Stats().used_bytes, kSlot) << "the gone file's bytes went back";
    }
    t.reset();
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// The same FIFO found by a lookup of a shared tier (its name no longer a block file): the
// lookup unlinked it like a block another replica had evicted, though such names are left
// alone (FORMAT.md), and gave the file's bytes back to the ledger a second time.
TEST_F(DiskTierTest, SharedLookupThatFindsANameNoBlockFileLeavesItAlone) {
  auto t = Open(4, false, nullptr, /*persistent=*/true, /*shared=*/true);
  const std::string path = StoreTwoAndMakeTheFirstAFifo(*t);
  EXPECT_FALSE(t->Contains(Key(1)));
  EXPECT_TRUE(std::filesystem::is_fifo(std::filesystem::symlink_status(path))) << "it stays";
  EXPECT_TRUE(t->Contains(Key(2)));
}

// The same FIFO in place of a victim's file: renamed to a spare, the write over it waited for a
// reader forever; unlinked, it was removed. Now it is left where it is, and the write goes on.
TEST_F(DiskTierTest, FifoInPlaceOfAVictimsFileIsLeftAloneAndTheWriteGoesOn) {
  auto t = Open(2, false, nullptr, /*persistent=*/true);
  const std::string path = StoreTwoAndMakeTheFirstAFifo(*t);
  Status s;
  FinishesWithoutHanging(dir_.path(), [&] { s = Put(*t, 3); });  // evicts block 1
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::filesystem::is_fifo(std::filesystem::symlink_status(path)));
  EXPECT_FALSE(t->Contains(Key(1)));
  EXPECT_EQ(testing::FilesUnder(dir_.path(), ".tmp"), 0u) << "no spare left behind";
  ASSERT_TRUE(Put(*t, 4).ok());
  EXPECT_EQ(t->Stats().used_bytes, testing::BytesUnder(dir_.path()));
  EXPECT_LE(testing::BytesUnder(dir_.path()), 2 * kSlot);
}

// A name that is not a regular file, there before the block is stored: the store took the
// link's EEXIST for another writer's copy and reported the block stored, having written and
// reserved nothing; every load of it then failed (or hung, on a FIFO), and removing it after a
// failed load gave back bytes never reserved, so the tier's files outgrew its capacity. Now the
// block is not stored (counted as lost), it is a miss, the name stays and the capacity holds.
TEST_F(DiskTierTest, NameThatIsNoBlockFileIsNeitherStoredOverReadRemovedNorCounted) {
  testing::TempDir outside;
  for (const Planted p :
       {Planted::kDirectory, Planted::kFifo, Planted::kLink, Planted::kDanglingLink}) {
    for (const bool shared : {false, true}) {
      SCOPED_TRACE(PlantedName(p) + (shared ? ", shared" : ", private"));
      const std::string fp = FingerprintDir(dir_.path(), testing::TestModel().Digest());
      std::filesystem::create_directories(fp);
      for (uint64_t k = 1; k <= 2; ++k) Plant(p, BlockPath(fp, Key(k)), outside.path());
      auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
      FinishesWithoutHanging(dir_.path(), [&] {
        EXPECT_FALSE(t->Contains(Key(1))) << "never stored, never a hit";
        for (uint64_t k = 1; k <= 2; ++k) {
          const Status s = Put(*t, k);
          EXPECT_FALSE(s.ok()) << "stored nothing, yet reported stored";
          EXPECT_FALSE(t->Contains(Key(k)));
        }
        std::vector<Status> results;
        PinAndRead(*t, {Key(1)}, results);
        EXPECT_EQ(results[0].code(), StatusCode::kNotFound) << results[0].ToString();
        for (uint64_t k = 3; k <= 10; ++k) ASSERT_TRUE(Put(*t, k).ok());
        // Full: a private tier writes over a victim's file and renames it to the block's name,
        // which would replace the name.
        EXPECT_FALSE(Put(*t, 1).ok());
      });
      EXPECT_EQ(t->Stats().lost, 3u);
      EXPECT_EQ(t->Stats().used_bytes, 3 * kSlot) << "the victim's bytes went back";
      // BytesUnder follows a link: to the file outside the tier here.
      EXPECT_EQ(testing::BytesUnder(dir_.path()), 3 * kSlot + (p == Planted::kLink ? kSlot : 0))
          << "the capacity holds";
      for (uint64_t k = 1; k <= 2; ++k) {
        const std::filesystem::file_status st =
            std::filesystem::symlink_status(BlockPath(fp, Key(k)));
        EXPECT_NE(st.type(), std::filesystem::file_type::not_found) << "not ours to remove";
        EXPECT_FALSE(std::filesystem::is_regular_file(st));
      }
      t.reset();
      std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
    }
  }
}

// Clears the calling thread's capabilities to read any file (capabilities are per thread): a
// file of mode 000 is then unreadable to it, as to an engine that does not run as root.
std::string DropFileReadOverrideOnThisThread() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return std::strerror(errno);
  for (const int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) {
    data[cap / 32].effective &= ~(1u << (cap % 32));
  }
  return ::syscall(SYS_capset, &header, data) == 0 ? "" : std::strerror(errno);
}

// A block file the engine may not open (mode 000) failed every load of it and stayed a hit, so
// vLLM, which asserts on a failed load, went down on it again and again. Now the failed load
// removes it (a regular file by a block's name is ours) and gives its bytes back.
TEST_F(DiskTierTest, BlockFileTheEngineMayNotOpenIsRemovedAtItsFailedLoad) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "private");
    auto t = Open(4, false, nullptr, /*persistent=*/true, shared);
    ASSERT_TRUE(Put(*t, 1).ok());
    const std::string path =
        BlockPath(FingerprintDir(dir_.path(), testing::TestModel().Digest()), Key(1));
    ASSERT_EQ(::chmod(path.c_str(), 0), 0);
    std::vector<Status> results(1);
    std::string dropped;
    std::thread([&] {
      dropped = DropFileReadOverrideOnThisThread();
      if (dropped.empty()) PinAndRead(*t, {Key(1)}, results);
    }).join();
    ASSERT_EQ(dropped, "");
    EXPECT_EQ(results[0].code(), StatusCode::kFailedPrecondition) << results[0].ToString();
    EXPECT_FALSE(t->Contains(Key(1))) << "a miss from now on";
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_EQ(t->Stats().used_bytes, 0u);
    t.reset();
    std::filesystem::remove_all(dir_.path() + "/kvoffload-v1");
  }
}

// A tier of more blocks than its eviction policy indexes (tiny blocks on a large file system)
// is lowered to them and says so once, as a tier larger than its file system is: it used to
// open as is, and s3fifo threw from a store thread once its rings ran out.
TEST_F(DiskTierTest, ATierOfMoreBlocksThanItsPolicyIndexesIsLoweredToThem) {
  DiskTierOptions o{"disk0", "KVOFFLOAD_TIERS[0]",
                    testing::Tier(dir_.path(), 64, /*persistent=*/true), kBlock,
                    testing::TestModel().Digest(), "s3fifo"};
  const uint64_t asked = o.config.capacity_bytes;
  o.max_blocks = 8;
  std::vector<std::string> lines;
  o.log = [&lines](const std::string& line) { lines.push_back(line); };
  auto t = DiskTier::Open(o, std::move(NewDiskIo("psync", DiskIoOptions{})).value());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const uint64_t held = (*t)->Stats().capacity_bytes;
  EXPECT_EQ(held, asked / 64 * 8);
  for (uint64_t k = 0; k < 20; ++k) ASSERT_TRUE(Put(**t, k).ok()) << k;
  size_t resident = 0;
  for (uint64_t k = 0; k < 20; ++k) resident += (*t)->Contains(Key(k)) ? 1u : 0u;
  EXPECT_EQ(resident, 8u);
  const std::string said = "KVOFFLOAD_TIERS[0].capacityBytes=" + std::to_string(asked) +
                           " is 64 blocks, more than the eviction policy indexes (8): the tier "
                           "holds " + std::to_string(held) + " bytes";
  EXPECT_EQ(std::count(lines.begin(), lines.end(), said), 1) << ::testing::PrintToString(lines);
}

// Start-up errors about what is in the tier directory name the configuration entry and its
// path, as the others do, and say what to do about it.
TEST_F(DiskTierTest, StartUpErrorsAboutTheTiersFilesNameTheEntry) {
  auto open_tier = [&](bool shared) {
    DiskTierOptions o{"disk0", "KVOFFLOAD_TIERS[0]",
                      testing::Tier(dir_.path(), 4, /*persistent=*/true, shared), kBlock,
                      testing::TestModel().Digest(), "lru"};
    return DiskTier::Open(o, std::move(NewDiskIo("psync", DiskIoOptions{})).value()).status();
  };
  ASSERT_TRUE(std::filesystem::create_directory(dir_.path() + "/kvoffload.lock"));
  Status s = open_tier(false);
  EXPECT_NE(s.message().find("KVOFFLOAD_TIERS[0]"), std::string::npos) << s.ToString();
  EXPECT_EQ(s.message().find("must be writable"), std::string::npos)
      << "a directory there is no matter of permissions: " << s.ToString();
  std::filesystem::remove(dir_.path() + "/kvoffload.lock");
  ASSERT_TRUE(std::filesystem::create_directories(dir_.path() + "/kvoffload-v1/ledger"));
  s = open_tier(true);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("KVOFFLOAD_TIERS[0] (disk0, " + dir_.path() + ")"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace kvoffload
