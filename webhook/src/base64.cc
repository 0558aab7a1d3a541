#include "webhook/base64.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvoffload::webhook {
namespace {

// Every admission answer carries its patch in base64, and OpenSSL's EVP_EncodeBlock (which this
// replaced) spent 10 instructions a byte on it: 30k of a KServe pod's admission and a quarter
// of a small pod's. No faster encoder is packaged for Debian 12 (no simdutf, no aklomp/base64),
// so this one uses AVX2 and SSSE3 where the CPU has them (every x86-64 server CPU since 2013
// and 2011) and elsewhere writes two characters per lookup in a table of the 4096 12-bit
// values. Each kind of step runs in every test of a long enough input: AVX2 takes 24 bytes at
// a time, SSSE3 a 12-byte step it leaves, the table the last few bytes.
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::array<char, 2>, 4096> kPairs = [] {
  std::array<std::array<char, 2>, 4096> pairs{};
  for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = {kAlphabet[i >> 6], kAlphabet[i & 63]};
  return pairs;
}();

void Put(char* at, uint64_t twelve_bits) { std::memcpy(at, kPairs[twelve_bits & 0xfff].data(), 2); }

// Encodes the n bytes at r (n a multiple of 3) into w.
void EncodeGroups(const unsigned char* r, size_t n, char* w) {
  // Six bytes a step, read as one big-endian word: eight are read, so two must follow.
  for (; n >= 8; n -= 6, r += 6, w += 8) {
    uint64_t x;
    std::memcpy(&x, r, sizeof x);
    if constexpr (std::endian::native == std::endian::little) x = __builtin_bswap64(x);
    Put(w, x >> 52);
    Put(w + 2, x >> 40);
    Put(w + 4, x >> 28);
    Put(w + 6, x >> 16);
  }
  for (; n >= 3; n -= 3, r += 3, w += 4) {
    const uint64_t x = (uint64_t{r[0]} << 16) | (uint64_t{r[1]} << 8) | r[2];
    Put(w, x >> 12);
    Put(w + 2, x);
  }
}

#if defined(__x86_64__)
// Wojciech Mula's SSSE3 encoding ("Base64 encoding with SIMD instructions", 2016): 12 bytes
// become 16 characters per step, the 6-bit fields moved into bytes by a shuffle and two 16-bit
// multiplies, and each field turned into its character by adding an offset that a 16-entry
// shuffle table gives per alphabet range. A fifth of the table's cost per byte.
// Encodes 12-byte steps of the n bytes at r while 16 are readable; returns the bytes done.
__attribute__((target("ssse3"))) size_t EncodeSsse3(const unsigned char* r, size_t n,
                                                    size_t readable, char* w) {
  const __m128i spread = _mm_set_epi8(10, 11, 9, 10, 7, 8, 6, 7, 4, 5, 3, 4, 1, 2, 0, 1);
  const __m128i offsets = _mm_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                        '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                        '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
  size_t done = 0;
  for (; n - done >= 12 && readable - done >= 16; done += 12, w += 16) {
    const __m128i in = _mm_shuffle_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + done)), spread);
    // Per 32-bit lane, fields a and c to the low six bits of bytes 0 and 2 (mulhi), b and d to
    // bytes 1 and 3 (mullo).
    const __m128i ac = _mm_mulhi_epu16(_mm_and_si128(in, _mm_set1_epi32(0x0fc0fc00)),
                                       _mm_set1_epi32(0x04000040));
    const __m128i bd = _mm_mullo_epi16(_mm_and_si128(in, _mm_set1_epi32(0x003f03f0)),
                                       _mm_set1_epi32(0x01000010));
    const __m128i fields = _mm_or_si128(ac, bd);
    // Table index: 0 for 26-51 (a-z), 1-12 for 52-63 (digits, '+', '/'), 13 for 0-25 (A-Z).
    __m128i index = _mm_subs_epu8(fields, _mm_set1_epi8(51));
    index = _mm_or_si128(
        index, _mm_and_si128(_mm_cmpgt_epi8(_mm_set1_epi8(26), fields), _mm_set1_epi8(13)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w),
                     _mm_add_epi8(_mm_shuffle_epi8(offsets, index), fields));
  }
  return done;
}

// The same steps on 24 bytes at a time, one 12-byte group in each 128-bit lane (AVX2's shuffle
// works within a lane, so the SSSE3 constants serve both lanes). Half the instructions per
// byte; the SSSE3 loop then takes a 12-byte step the AVX2 one leaves.
__attribute__((target("avx2"))) size_t EncodeAvx2(const unsigned char* r, size_t n,
                                                  size_t readable, char* w) {
  const __m256i spread = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10, 1,
                                          0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
  const __m256i offsets = _mm256_setr_epi8(
      'a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
      '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0, 'a' - 26, '0' - 52, '0' - 52, '0' - 52,
      '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63,
      'A', 0, 0);
  size_t done = 0;
  for (; n - done >= 24 && readable - done >= 28; done += 24, w += 32) {
    const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + done));
    const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + done + 12));
    const __m256i in = _mm256_shuffle_epi8(
        _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1), spread);
    const __m256i ac = _mm256_mulhi_epu16(_mm256_and_si256(in, _mm256_set1_epi32(0x0fc0fc00)),
                                          _mm256_set1_epi32(0x04000040));
    const __m256i bd = _mm256_mullo_epi16(_mm256_and_si256(in, _mm256_set1_epi32(0x003f03f0)),
                                          _mm256_set1_epi32(0x01000010));
    const __m256i fields = _mm256_or_si256(ac, bd);
    __m256i index = _mm256_subs_epu8(fields, _mm256_set1_epi8(51));
    index = _mm256_or_si256(index, _mm256_and_si256(_mm256_cmpgt_epi8(_mm256_set1_epi8(26), fields),
                                                    _mm256_set1_epi8(13)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w),
                        _mm256_add_epi8(_mm256_shuffle_epi8(offsets, index), fields));
  }
  return done;
}

const bool kHaveSsse3 = __builtin_cpu_supports("ssse3");
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

// Encodes the n bytes at r (a multiple of 3), of which `readable` may be read, into w.
void Encode(const unsigned char* r, size_t n, size_t readable, char* w) {
#if defined(__x86_64__)
  if (kHaveAvx2) {
    const size_t done = EncodeAvx2(r, n, readable, w);
    r += done;
    n -= done;
    readable -= done;
    w += done / 3 * 4;
  }
  if (kHaveSsse3) {
    const size_t done = EncodeSsse3(r, n, readable, w);
    r += done;
    n -= done;
    w += done / 3 * 4;
  }
#else
  (void)readable;
#endif
  EncodeGroups(r, n, w);
}

}  // namespace

void AppendBase64(std::string& out, std::string_view data) {
  out.reserve(out.size() + 4 * ((data.size() + 2) / 3));
  const auto* r = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  // Through a buffer on the stack, appended a piece at a time: growing `out` first and writing
  // in place would zero the whole answer before overwriting it.
  constexpr size_t kGroups = 256;  // 768 bytes in (64 SIMD steps), 1 KiB out
  std::array<char, 4 * kGroups> buf;
  while (n >= 3) {
    const size_t take = std::min(n / 3, kGroups) * 3;
    Encode(r, take, n, buf.data());
    out.append(buf.data(), take / 3 * 4);
    r += take;
    n -= take;
  }
  if (n > 0) {
    const uint64_t x = (uint64_t{r[0]} << 16) | (n == 2 ? uint64_t{r[1]} << 8 : 0);
    const char tail[] = {kAlphabet[x >> 18], kAlphabet[(x >> 12) & 63],
                         n == 2 ? kAlphabet[(x >> 6) & 63] : '=', '='};
    out.append(tail, 4);
  }
}

}  // namespace kvoffload::webhook
