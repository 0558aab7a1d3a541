// Upgrades on a persistent tier: what an older release left in the directory is read or cleanly
// discarded, never misread. The previous release named a tier's directory after the model
// fingerprint alone (ModelFingerprint::Digest) and stamped that digest in every trailer; this
// one adds the block size (ModelFingerprint::Scope). Such a tier is written here byte by byte
// as that release wrote it, independently of the current writer. Also: other format versions
// (kvoffload-v0, kvoffload-v2) and entries a version-1 reader does not know are left alone.
// That the current format reopens with hits is
// EngineTest.PersistentTierServesItsBlocksAfterRestart.
#include <sys/stat.h>
#include <sys/time.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "block_file.h"
#include "crc32c.h"
#include "test_util.h"

namespace kvoffload {
namespace {

namespace fs = std::filesystem;
using testing::Blocks;
using testing::Config;
using testing::FilesUnder;
using testing::Key;
using testing::LoadAndWait;
using testing::StoreAndWait;
using testing::TempDir;
using testing::Tier;

// The previous release's directory name for testing::TestModel(): two FNV-1a-64 hashes of
// "kvoffload-fingerprint-v1|10:llama-3-8b4:rev14:bf163:nhd1:0", without the block size.
// Computed outside this code base, so a change to the digest code cannot move it.
constexpr char kPreviousDigestHex[] = "07642e78d17f8a2471270fb30d17d015";

std::string PreviousDir(const std::string& tier) {
  return tier + "/kvoffload-v1/" + kPreviousDigestHex;
}

void Put(std::vector<std::byte>& f, size_t at, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) f[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

// One block file as the previous release wrote it (FORMAT.md version 1, its fingerprint field
// the digest without the block size): payload, 64-byte trailer, zeros to 4096.
std::vector<std::byte> PreviousBlockFile(const BlockKey& key,
                                         const std::vector<std::byte>& payload) {
  BlockKey digest;
  EXPECT_TRUE(ParseHexKey(kPreviousDigestHex, &digest));
  const size_t n = payload.size();
  std::vector<std::byte> f((n + 64 + 4095) / 4096 * 4096);
  std::memcpy(f.data(), payload.data(), n);
  std::memcpy(f.data() + n, "KVOBLK01", 8);
  Put(f, n + 8, 1, 4);
  Put(f, n + 12, 64, 4);
  Put(f, n + 16, n, 8);
  Put(f, n + 24, digest.hi, 8);
  Put(f, n + 32, digest.lo, 8);
  Put(f, n + 40, key.hi, 8);
  Put(f, n + 48, key.lo, 8);
  Put(f, n + 56, Crc32c(f.data(), n), 4);
  Put(f, n + 60, Crc32c(f.data() + n, 60), 4);
  return f;
}

void WriteFile(const std::string& path, const std::vector<std::byte>& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void SetAgeHours(const std::string& path, int hours) {
  const auto when = std::chrono::system_clock::now() - std::chrono::hours(hours);
  const timeval tv{std::chrono::system_clock::to_time_t(when), 0};
  const timeval times[2] = {tv, tv};
  ASSERT_EQ(::utimes(path.c_str(), times), 0) << path;
}

// The previous release's tier: blocks `first`.. of `n`, the lowest key the oldest, each with
// other bytes (salt 1) than the current test stores under the same keys.
void WritePreviousTier(const std::string& tier, uint64_t first, uint64_t n) {
  Blocks old = Blocks::Make(first, n, /*salt=*/1);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string path = PreviousDir(tier) + "/" + old.keys[i].ToHex() + ".blk";
    WriteFile(path, PreviousBlockFile(old.keys[i], old.data[i]));
    SetAgeHours(path, static_cast<int>(100 - i));
  }
}

std::unique_ptr<Engine> Open(const EngineConfig& c) {
  Result<std::unique_ptr<Engine>> e = Engine::Open(c);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(UpgradeTest, PreviousDigestIsTheOneTheOlderReleaseComputed) {
  EXPECT_EQ(testing::TestModel().Digest().ToHex(), kPreviousDigestHex);
  EXPECT_NE(testing::TestModel().Scope(testing::kBlock).ToHex(), kPreviousDigestHex);
}

// The same model, the same keys: the previous release's blocks are never hits and never
// delivered, count against the capacity, are the first evicted (oldest first), and are gone,
// directory included, once the tier needed their room. The current blocks stored under the
// same keys are served with their own bytes throughout.
TEST(UpgradeTest, PreviousReleaseTierIsNeverReadCountsAndGoesFirst) {
  TempDir d;
  constexpr uint64_t kOld = 4;
  constexpr uint64_t kDisk = 8;
  WritePreviousTier(d.path(), 0, kOld);
  auto e = Open(Config(1, {Tier(d.path(), kDisk, /*persistent=*/true)}));
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->Describe().find(" 0 blocks recovered"), std::string::npos) << e->Describe();

  Blocks asked = Blocks::Make(0, kOld);
  EXPECT_EQ(e->Lookup(asked.keys).prefix, 0u);
  Blocks out = asked.Empty();
  EXPECT_EQ(LoadAndWait(*e, out).code(), StatusCode::kNotFound);
  for (const auto& b : out.data) EXPECT_EQ(b, std::vector<std::byte>(testing::kBlock)) << "no byte";
  TierStats disk = e->Stats().tiers[1];
  EXPECT_EQ(disk.blocks, 0u);
  EXPECT_EQ(disk.corrupt, 0u) << "nothing was read";
  EXPECT_EQ(disk.used_bytes, kOld * testing::kSlot) << "the old files count against the tier";
  EXPECT_EQ(FilesUnder(PreviousDir(d.path())), kOld);

  // Fill the rest of the tier with current blocks under the same keys: one pinned, the first
  // four of them on disk next to the old files, which are all still there.
  Blocks current = Blocks::Make(0, kDisk - kOld + 1);
  ASSERT_TRUE(StoreAndWait(*e, current).ok());
  EXPECT_EQ(e->Stats().tiers[1].used_bytes, kDisk * testing::kSlot);
  EXPECT_EQ(FilesUnder(PreviousDir(d.path())), kOld);
  EXPECT_EQ(e->Stats().tiers[1].evictions, 0u);

  // Each further store demotes one current block into a full tier: the oldest old file goes.
  for (uint64_t i = 0; i < kOld; ++i) {
    ASSERT_TRUE(StoreAndWait(*e, Blocks::Make(kDisk - kOld + 1 + i, 1)).ok());
    for (uint64_t k = 0; k < kOld; ++k) {
      const std::string path = PreviousDir(d.path()) + "/" + Key(k).ToHex() + ".blk";
      EXPECT_EQ(fs::exists(path), k > i) << "old block " << k << " after " << i + 1 << " demotions";
    }
    EXPECT_EQ(e->Stats().tiers[1].evictions, i + 1);
    EXPECT_LE(testing::BytesUnder(d.path()), kDisk * testing::kSlot);
  }
  EXPECT_FALSE(fs::exists(PreviousDir(d.path()))) << "its emptied directory is removed too";
  disk = e->Stats().tiers[1];
  EXPECT_EQ(disk.blocks, kDisk) << "no current block was evicted while old ones were left";
  // The old files were removed, not moved down: dropped, as the metrics report them.
  EXPECT_EQ(disk.dropped, kOld);
  EXPECT_EQ(disk.used_bytes, kDisk * testing::kSlot);

  // Every current block is served with the bytes stored now, never the old ones.
  Blocks all = Blocks::Make(0, kDisk + 1);
  EXPECT_EQ(e->Lookup(all.keys).prefix, kDisk + 1);
  Blocks back = all.Empty();
  ASSERT_TRUE(LoadAndWait(*e, back).ok());
  for (size_t i = 0; i < all.keys.size(); ++i) EXPECT_EQ(back.data[i], all.data[i]) << "key " << i;
  EXPECT_EQ(e->Stats().tiers[1].corrupt, 0u);
}

// An old file under the current directory name (copied by hand, or restored from a backup)
// is refused by its trailer: a miss, removed, counted as corrupt; no byte of it is delivered.
TEST(UpgradeTest, PreviousReleaseFileUnderTheCurrentNameIsRefusedByItsTrailer) {
  TempDir d;
  WritePreviousTier(d.path(), 0, 1);
  const std::string current =
      FingerprintDir(d.path(), testing::TestModel().Scope(testing::kBlock));
  fs::create_directories(current);
  fs::copy_file(PreviousDir(d.path()) + "/" + Key(0).ToHex() + ".blk",
                BlockPath(current, Key(0)));
  auto e = Open(Config(1, {Tier(d.path(), 8, true)}));
  ASSERT_NE(e, nullptr);
  Blocks out = Blocks::Make(0, 1).Empty();
  EXPECT_EQ(LoadAndWait(*e, out).code(), StatusCode::kNotFound);
  EXPECT_EQ(out.data[0], std::vector<std::byte>(testing::kBlock));
  EXPECT_EQ(e->Stats().tiers[1].corrupt, 1u);
  EXPECT_FALSE(fs::exists(BlockPath(current, Key(0))));
  EXPECT_EQ(e->Lookup(out.keys).prefix, 0u);
}

// What a version-1 reader does not know it leaves alone: other format directories (an older
// kvoffload-v0, a future kvoffload-v2, even holding files that would verify as ours) and, under
// kvoffload-v1, names it never writes: they are not served, not counted and not removed,
// whether the tier restarts persistent, fills up, or starts empty.
TEST(UpgradeTest, UnknownVersionsAndEntriesAreIgnored) {
  TempDir d;
  const BlockKey scope = testing::TestModel().Scope(testing::kBlock);
  Blocks b = Blocks::Make(0, 6);
  std::vector<std::vector<std::byte>> files;
  for (size_t i = 0; i < b.keys.size(); ++i) {
    std::vector<std::byte> f(testing::kSlot);
    std::memcpy(f.data(), b.data[i].data(), testing::kBlock);
    EncodeBlockFile(f.data(), testing::kBlock, scope, b.keys[i]);
    files.push_back(f);
  }
  const std::string v1 = d.path() + "/kvoffload-v1/" + scope.ToHex();
  const std::vector<std::string> unknown = {
      d.path() + "/kvoffload-v0/" + scope.ToHex() + "/" + b.keys[0].ToHex() + ".blk",
      d.path() + "/kvoffload-v2/" + scope.ToHex() + "/" + b.keys[1].ToHex() + ".blk",
      d.path() + "/kvoffload-v1/not-a-fingerprint/" + b.keys[2].ToHex() + ".blk",
      v1 + "/" + b.keys[3].ToHex() + ".blk.partial",
      v1 + "/" + b.keys[4].ToHex() + ".blk/inside",  // a directory named like a block
      d.path() + "/kvoffload-v1/notes.txt"};
  for (size_t i = 0; i < unknown.size(); ++i) WriteFile(unknown[i], files[std::min<size_t>(i, 4)]);
  // A symbolic link named like a block file: version 1 writes regular files only.
  const std::string link = v1 + "/" + b.keys[5].ToHex() + ".blk";
  WriteFile(d.path() + "/elsewhere", files[5]);
  fs::create_symlink(d.path() + "/elsewhere", link);

  auto still_there = [&] {
    for (const std::string& p : unknown) EXPECT_TRUE(fs::exists(p)) << p;
    EXPECT_TRUE(fs::is_symlink(link));
  };
  {
    auto e = Open(Config(1, {Tier(d.path(), 4, true)}));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->Lookup(std::span(b.keys.data(), 1)).prefix, 0u);
    for (size_t i = 0; i < b.keys.size(); ++i) {
      EXPECT_EQ(e->Where(std::span(&b.keys[i], 1)), std::vector<int>{-1}) << "key " << i;
    }
    EXPECT_EQ(e->Stats().tiers[1].used_bytes, 0u) << "not counted";
    still_there();
    // Filling the tier evicts our own blocks, never the unknown files.
    ASSERT_TRUE(StoreAndWait(*e, Blocks::Make(100, 8)).ok());
    EXPECT_GT(e->Stats().tiers[1].evictions, 0u);
    still_there();
  }
  // Not persistent: our format directory starts empty; the other versions stay.
  auto e = Open(Config(1, {Tier(d.path(), 4)}));
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(fs::exists(unknown[0]));
  EXPECT_TRUE(fs::exists(unknown[1]));
  EXPECT_FALSE(fs::exists(unknown[2])) << "kvoffload-v1 is ours to clear";
}

}  // namespace
}  // namespace kvoffload
