// The on-disk block format: CRC-32C, trailer encoding, and every kind of damage detected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "block_file.h"
#include "crc32c.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Key;

TEST(Crc32cTest, MatchesTheStandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32c(reinterpret_cast<const std::byte*>(s), 9), 0xE3069283U);
  // Continuing a checksum equals checksumming the concatenation.
  uint32_t part = Crc32c(reinterpret_cast<const std::byte*>(s), 4);
  EXPECT_EQ(Crc32c(reinterpret_cast<const std::byte*>(s) + 4, 5, part), 0xE3069283U);
  EXPECT_EQ(Crc32c(nullptr, 0), 0U);
}

// The CRC-32C examples of RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of ones,
// ascending, descending.
TEST(Crc32cTest, MatchesRfc3720Examples) {
  std::vector<std::byte> buf(32);
  auto crc = [&] { return Crc32c(buf.data(), buf.size()); };
  std::fill(buf.begin(), buf.end(), std::byte{0x00});
  EXPECT_EQ(crc(), 0x8A9136AAU);
  std::fill(buf.begin(), buf.end(), std::byte{0xFF});
  EXPECT_EQ(crc(), 0x62A8AB43U);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::byte(i);
  EXPECT_EQ(crc(), 0x46DD794EU);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::byte(31 - i);
  EXPECT_EQ(crc(), 0x113FDB5CU);
}

// The definition, one bit at a time: reflected Castagnoli polynomial, seed and result inverted.
uint32_t BitwiseCrc32c(const std::byte* data, size_t len) {
  uint32_t crc = 0xFFFFFFFFU;
  for (size_t i = 0; i < len; ++i) {
    crc ^= static_cast<uint32_t>(data[i]);
    for (int k = 0; k < 8; ++k) crc = (crc & 1U) ? (crc >> 1) ^ 0x82F63B78U : crc >> 1;
  }
  return ~crc;
}

// The library picks different kernels by length and alignment (folding large buffers, a tail
// loop for the rest): every length up to a few KiB, at every offset, agrees with the definition,
// whole and continued at an arbitrary split.
TEST(Crc32cTest, AgreesWithTheDefinitionAtEveryLengthAndAlignment) {
  std::vector<std::byte> buf(5000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::byte((i * 131 + (i >> 7)) & 0xFF);
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t len = 0; len + offset <= buf.size(); len += len < 300 ? 1 : 97) {
      const std::byte* p = buf.data() + offset;
      const uint32_t want = BitwiseCrc32c(p, len);
      ASSERT_EQ(Crc32c(p, len), want) << "offset " << offset << " len " << len;
      const size_t split = len / 3;
      ASSERT_EQ(Crc32c(p + split, len - split, Crc32c(p, split)), want)
          << "offset " << offset << " len " << len << " split " << split;
    }
  }
}

// Blocks already on disk keep verifying: these are the checksums the previous implementation
// (SSE4.2 one stream, table elsewhere) wrote for a fixed 4 KiB payload and an unaligned part
// of it.
TEST(Crc32cTest, BlocksWrittenBeforeStillVerify) {
  std::vector<std::byte> payload(4096);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte((i * 31 + 7) & 0xFF);
  EXPECT_EQ(Crc32c(payload.data(), payload.size()), 0xE1C2F7E8U);
  EXPECT_EQ(Crc32c(payload.data() + 1, 4093), 0x25C0819AU);
}

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
