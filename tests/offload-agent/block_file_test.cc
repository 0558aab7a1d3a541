// The on-disk block format: trailer encoding, and every kind of damage detected (the checksum
// itself: crc32c_test.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <unordered_set>
#include <vector>

#include "block_file.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Key;

class BlockFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    buf_.resize(BlockFileBytes(testing::kBlock));
    std::vector<std::byte> payload = testing::Pattern(Key(7), testing::kBlock);
    std::memcpy(buf_.data(), payload.data(), payload.size());
    EncodeBlockFile(buf_.data(), testing::kBlock, fp_, Key(7));
  }
  Status Verify(const BlockKey& fp, const BlockKey& key) {
    return VerifyBlockFile(buf_.data(), testing::kBlock, fp, key);
  }
  BlockKey fp_ = testing::TestModel().Digest();
  std::vector<std::byte> buf_;
};

TEST_F(BlockFileTest, SizesArePageMultiplesWithRoomForTheTrailer) {
  EXPECT_EQ(BlockFileBytes(4000), 4096u);
  EXPECT_EQ(BlockFileBytes(4096), 8192u);
  EXPECT_EQ(BlockFileBytes(4032), 4096u);
  EXPECT_EQ(BlockFileBytes(4033), 8192u);
}

TEST_F(BlockFileTest, IntactFileVerifies) { EXPECT_TRUE(Verify(fp_, Key(7)).ok()); }

TEST_F(BlockFileTest, EveryFlippedByteIsCaught) {
  // Every payload byte and every trailer byte that carries meaning.
  for (size_t i = 0; i < testing::kBlock + kTrailerBytes; i += (i < testing::kBlock ? 97 : 1)) {
    buf_[i] ^= std::byte{0x01};
    Status s = Verify(fp_, Key(7));
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << "byte " << i;
    buf_[i] ^= std::byte{0x01};
  }
}

TEST_F(BlockFileTest, ZeroedTailLooksTorn) {
  std::memset(buf_.data() + 2048, 0, buf_.size() - 2048);
  EXPECT_NE(Verify(fp_, Key(7)).message().find("no trailer"), std::string::npos);
}

TEST_F(BlockFileTest, OtherFingerprintOrKeyIsRejected) {
  BlockKey other = testing::TestModel("mistral-7b").Digest();
  ASSERT_NE(other, fp_);
  EXPECT_NE(Verify(other, Key(7)).message().find("another model fingerprint"), std::string::npos);
  EXPECT_NE(Verify(fp_, Key(8)).message().find("another key"), std::string::npos);
}

// Keys come from callers; a relation between the halves must not make them collide. The old
// fold (hi ^ lo * C) mapped every key with hi = lo * C to the same bucket.
TEST(BlockKeyHashTest, StructuredKeysSpread) {
  constexpr uint64_t kC = 0x9E3779B97F4A7C15ULL;
  std::unordered_set<size_t> hashes;
  for (uint64_t i = 1; i <= 10000; ++i) {
    hashes.insert(BlockKeyHash{}(BlockKey{i * kC, i}));
    hashes.insert(BlockKeyHash{}(BlockKey{i, i}));
    hashes.insert(BlockKeyHash{}(BlockKey{0, i}));
  }
  EXPECT_GE(hashes.size(), 29990u);
}

TEST(FingerprintTest, EveryFieldChangesTheDigest) {
  ModelFingerprint base = testing::TestModel();
  std::vector<ModelFingerprint> variants(5, base);
  variants[0].model = "llama-3-70b";
  variants[1].revision = "rev2";
  variants[2].dtype = "fp8";
  variants[3].layout = "hnd";
  variants[4].rank = 1;
  for (const ModelFingerprint& v : variants) EXPECT_NE(v.Digest(), base.Digest());
  // Length-prefixed fields: moving a character across a boundary is another fingerprint.
  ModelFingerprint a = base, b = base;
  a.model = "ab";
  a.revision = "c";
  b.model = "a";
  b.revision = "bc";
  EXPECT_NE(a.Digest(), b.Digest());
}

TEST(BlockFileNameTest, ParsesOnlyBlockFiles) {
  BlockKey k;
  ASSERT_TRUE(ParseBlockFileName(Key(42).ToHex() + ".blk", &k));
  EXPECT_EQ(k, Key(42));
  EXPECT_FALSE(ParseBlockFileName(Key(42).ToHex() + ".123.0.tmp", &k));
  EXPECT_FALSE(ParseBlockFileName("ledger", &k));
  EXPECT_FALSE(ParseBlockFileName(std::string(32, 'G') + ".blk", &k));
}

}  // namespace
}  // namespace kvoffload
