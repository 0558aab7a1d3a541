// One key in R, chosen by hash, for the miniature caches that adaptive policies (lru-tinylfu,
// lirs) run beside the tier: a miniature sees the sampled keys with 1/R of the capacity
// (Waldspurger et al., ATC'17), so its hit ratio predicts the tier's at a cost that vanishes
// for large tiers. Immutable once made.
#ifndef KVOFFLOAD_SRC_KEY_SAMPLER_H_
#define KVOFFLOAD_SRC_KEY_SAMPLER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kvoffload {

class KeySampler {
 public:
  // R = 2^shift: at least 2^min_shift, and grown until a miniature of a tier of `capacity`
  // blocks keeps fewer than max_blocks (so between max_blocks / 2 and max_blocks on large tiers).
  // REQUIRES: min_shift >= 1 (a shift by 64 is undefined).
  KeySampler(size_t capacity, unsigned min_shift, size_t max_blocks) : shift_(min_shift) {
    while ((capacity >> shift_) >= max_blocks) ++shift_;
  }

  // Whether the key whose hash (BlockKeyHash) is `hash` is sampled. The top bits of the hash
  // multiplied again: independent of the bits key indexes and count sketches use.
  bool Sampled(uint64_t hash) const {
    return ((hash * 0xFF51AFD7ED558CCDULL) >> (64 - shift_)) == 0;
  }
  // The capacity of a miniature of a tier of `capacity` blocks (at least 1).
  size_t Scaled(size_t capacity) const { return std::max<size_t>(1, capacity >> shift_); }

 private:
  unsigned shift_;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_KEY_SAMPLER_H_
