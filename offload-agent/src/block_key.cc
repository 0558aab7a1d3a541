// BlockKey hex form and the model fingerprint digest.
#include <array>
#include <string_view>

#include "kvoffload/block_key.h"

namespace kvoffload {
namespace {

// FNV-1a, 64 bit, from a chosen offset basis; two bases give two independent halves.
uint64_t Fnv1a(std::string_view bytes, uint64_t basis) {
  uint64_t h = basis;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ULL;
  }
  return h;
}

void AppendHex(uint64_t v, std::string& out) {
  static constexpr std::string_view kDigits = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) {
    out.push_back(kDigits[(v >> shift) & 0xF]);
  }
}

void AppendField(std::string_view field, std::string& out) {
  out += std::to_string(field.size());
  out.push_back(':');
  out.append(field);
}

}  // namespace

std::string BlockKey::ToHex() const {
  std::string out;
  out.reserve(32);
  AppendHex(hi, out);
  AppendHex(lo, out);
  return out;
}

namespace {

BlockKey DigestOf(const ModelFingerprint& fp, const char* prefix, const std::string* geometry) {
  std::string canonical = prefix;
  AppendField(fp.model, canonical);
  AppendField(fp.revision, canonical);
  AppendField(fp.dtype, canonical);
  AppendField(fp.layout, canonical);
  AppendField(std::to_string(fp.rank), canonical);
  if (geometry != nullptr) AppendField(*geometry, canonical);
  return BlockKey{Fnv1a(canonical, 0xCBF29CE484222325ULL),
                  Fnv1a(canonical, 0x84222325CBF29CE4ULL)};
}

}  // namespace

BlockKey ModelFingerprint::Digest() const {
  return DigestOf(*this, "kvoffload-fingerprint-v1|", nullptr);
}

BlockKey ModelFingerprint::Scope(uint64_t block_bytes) const {
  const std::string geometry = std::to_string(block_bytes);
  return DigestOf(*this, "kvoffload-scope-v1|", &geometry);
}

}  // namespace kvoffload
