// The room a disk tier leaves free on its volume, shared by the webhook (which sizes a tier it
// knows) and the agent (which sizes one the webhook could not: capacityBytes 0).
#ifndef KVOFFLOAD_TIER_HEADROOM_H_
#define KVOFFLOAD_TIER_HEADROOM_H_

#include <algorithm>
#include <cstdint>

namespace kvoffload {

// Space kept free in a tier of `size_bytes` for the file system's own use: directory entries
// (about 44 bytes a block file of at least 4 KiB, so under 1/64 of the size), the format root,
// one directory per model fingerprint, the ledger. min(size/2, 8 MiB + size/64).
constexpr uint64_t TierHeadroomBytes(uint64_t size_bytes) {
  return std::min(size_bytes / 2, (uint64_t{8} << 20) + size_bytes / 64);
}

}  // namespace kvoffload

#endif  // KVOFFLOAD_TIER_HEADROOM_H_
