// Replays a block-access trace on a cache of fixed size: through one of the agent's eviction
// policies (as a tier drives it), or with Belady's OPT, the offline optimum that bounds them.
// Pure functions; thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_REPLAY_H_
#define KVOFFLOAD_BENCH_AGENT_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvoffload/block_key.h"
#include "kvoffload/status.h"

namespace kvoffload::bench {

struct ReplayResult {
  uint64_t accesses = 0;
  uint64_t hits = 0;
  double HitRatio() const {
    return accesses == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(accesses);
  }
};

// A miss inserts the block (OnInsert, then SelectVictim while over capacity), a hit is
// OnAccess: the calls a tier makes. Unknown policy names are the factory's InvalidArgument.
Result<ReplayResult> ReplayPolicy(std::string_view policy, size_t capacity_blocks,
                                  std::span<const BlockKey> trace);

// Belady's MIN: on a miss with a full cache, evict the resident block whose next use is
// furthest; the new block always enters (no bypass), as in the agent's tiers, so this is the
// bound for policies that admit every block. O(n log n): next uses come from one backward
// pass and the victim from a max-heap with lazy deletion.
ReplayResult ReplayOpt(size_t capacity_blocks, std::span<const BlockKey> trace);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_REPLAY_H_
