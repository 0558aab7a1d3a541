#include "webhook/base64.h"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

namespace kvoffload::webhook {
namespace {

// Every admission answer carries its patch in base64, and OpenSSL's EVP_EncodeBlock (which this
// replaced) spent 10 instructions a byte on it: 30k of a KServe pod's admission and a quarter
// of a small pod's. No faster encoder is packaged for Debian 12 (no simdutf, no aklomp/base64),
// so this one writes two characters per lookup in a table of the 4096 12-bit values.
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::array<char, 2>, 4096> kPairs = [] {
  std::array<std::array<char, 2>, 4096> pairs{};
  for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = {kAlphabet[i >> 6], kAlphabet[i & 63]};
  return pairs;
}();

void Put(char* at, uint64_t twelve_bits) { std::memcpy(at, kPairs[twelve_bits & 0xfff].data(), 2); }

}  // namespace

void AppendBase64(std::string& out, std::string_view data) {
  const size_t at = out.size();
  out.resize(at + 4 * ((data.size() + 2) / 3));
  char* w = out.data() + at;
  const auto* r = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
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
  if (n > 0) {
    const uint64_t x = (uint64_t{r[0]} << 16) | (n == 2 ? uint64_t{r[1]} << 8 : 0);
    w[0] = kAlphabet[x >> 18];
    w[1] = kAlphabet[(x >> 12) & 63];
    w[2] = n == 2 ? kAlphabet[(x >> 6) & 63] : '=';
    w[3] = '=';
  }
}

}  // namespace kvoffload::webhook
