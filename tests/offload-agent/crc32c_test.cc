// CRC-32C, the checksum of every disk block: standard check values, RFC 3720's examples, the
// bit-by-bit definition at every length and alignment, and checksums blocks already on disk
// carry. Depends on nothing but crc32c.cc and ISA-L, so that hack/check-aarch64.sh can build this
// same file for aarch64 and run it under qemu: ISA-L picks another kernel there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "crc32c.h"

namespace kvoffload {
namespace {

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

}  // namespace
}  // namespace kvoffload
