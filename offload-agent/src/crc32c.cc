// CRC-32C: hardware instruction on x86-64 with SSE4.2, a byte table elsewhere.
#include "crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvoffload {
namespace {

constexpr uint32_t kPoly = 0x82F63B78U;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) ? (c >> 1) ^ kPoly : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t Crc32cTable(const std::byte* data, size_t len, uint32_t crc) {
  for (size_t i = 0; i < len; ++i) {
    crc = kTable[(crc ^ static_cast<uint32_t>(data[i])) & 0xFFU] ^ (crc >> 8);
  }
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const std::byte* data, size_t len,
                                                     uint32_t crc) {
  uint64_t c = crc;
  while (len >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    c = _mm_crc32_u64(c, word);
    data += 8;
    len -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (len > 0) {
    c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*data));
    ++data;
    --len;
  }
  return c32;
}
#endif

}  // namespace

uint32_t Crc32c(const std::byte* data, size_t len, uint32_t crc) {
  crc = ~crc;
#if defined(__x86_64__)
  static const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
  crc = kHasSse42 ? Crc32cHw(data, len, crc) : Crc32cTable(data, len, crc);
#else
  crc = Crc32cTable(data, len, crc);
#endif
  return ~crc;
}

}  // namespace kvoffload
