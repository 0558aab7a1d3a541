// Block identity: the caller's 128-bit block hash, scoped by the model fingerprint.
// Value types only; thread-compatible.
#ifndef KVOFFLOAD_BLOCK_KEY_H_
#define KVOFFLOAD_BLOCK_KEY_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvoffload/export.h"

namespace kvoffload {

// A KV-cache block hash computed by the caller (vLLM's block hash folded to 128 bits).
struct KVOFFLOAD_EXPORT BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
  // 32 lowercase hex digits, hi first; the block's file name on disk.
  std::string ToHex() const;
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const noexcept {
    // Keys come from callers, so no simple relation between the halves may collide them all
    // (hi ^ lo * C did, for hi = lo * C): each half goes through a full 64-bit finalizer
    // (murmur3's fmix64) before they are combined.
    return static_cast<size_t>(Mix(k.hi) ^ (Mix(k.lo) * 0x9E3779B97F4A7C15ULL));
  }

 private:
  static constexpr uint64_t Mix(uint64_t x) noexcept {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
};

// What makes KV bytes meaningful: the same token hashes under another model, revision, dtype,
// layout or tensor-parallel rank are different bytes and must never be served.
struct KVOFFLOAD_EXPORT ModelFingerprint {
  std::string model;
  std::string revision;
  std::string dtype;
  std::string layout;
  int32_t rank = 0;

  // 128-bit digest of the fields (length-prefixed, so ("ab","c") != ("a","bc")). Not
  // cryptographic: it separates honest callers, it does not defend against forged files.
  BlockKey Digest() const;
  // Digest() together with the block geometry: what scopes stored blocks. An engine with
  // another block size reads other bytes at other offsets, so its blocks are never served
  // here (a tier names its directory after this and stamps it in every block file).
  BlockKey Scope(uint64_t block_bytes) const;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_BLOCK_KEY_H_
