// Replays a trace of requests on a cache of fixed size: through one of the agent's eviction
// policies (as the engine and a tier drive it), or with Belady's OPT, the offline optimum.
//
// Two hit ratios come out of one replay:
//   per block       every resident block a request reads counts as a hit;
//   prefix-usable   only the leading run of resident blocks counts: a prefix-caching engine
//                   loads that run, and recomputes (then stores) everything after the first
//                   miss, resident or not, since a KV block is only usable behind its prefix.
// The engine's calls are modelled as it makes them, with each block's position in its request
// (eviction_policy.h): the leading run is loaded (OnAccessAt); a missing block after it is
// stored (OnInsertAt, then SelectVictim while over capacity, the new block pinned); a resident
// block after the first miss is recomputed but not stored again (the engine skips blocks it already
// holds), so the policy hears nothing about it. Pure functions; thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_REPLAY_H_
#define KVOFFLOAD_BENCH_AGENT_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvoffload/status.h"
#include "trace.h"

namespace kvoffload::bench {

struct ReplayResult {
  uint64_t accesses = 0;     // blocks read, over all requests
  uint64_t hits = 0;         // resident when read
  uint64_t prefix_hits = 0;  // resident and in the request's leading run of resident blocks
  double HitRatio() const { return Ratio(hits); }
  double PrefixHitRatio() const { return Ratio(prefix_hits); }

 private:
  double Ratio(uint64_t n) const {
    return accesses == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(accesses);
  }
};

// Unknown policy names are the factory's InvalidArgument. With `last_uses` (LastUses of the
// same trace) the replay is told which blocks are never read again: a full cache evicts one
// of those, if any is resident, before it asks the policy (OnRemove). An offline reference,
// like OPT: it shows how much of OPT's lead knowing which blocks die would give a policy,
// and so how much comes from knowing when the others come back.
Result<ReplayResult> ReplayPolicy(std::string_view policy, size_t capacity_blocks,
                                  const Trace& trace,
                                  const std::vector<bool>* last_uses = nullptr);

// For each block access of the trace, in order (request by request, each request's blocks
// in its order), whether no later access reads that block.
std::vector<bool> LastUses(const Trace& trace);

// Belady's MIN over the same engine model: on a store with a full cache, evict the resident
// block whose next read is furthest; the new block always enters (no bypass), as in the
// agent's tiers. It maximises per-block hits; its prefix-usable figure is what that schedule
// gives (MIN evicts a chain's tail before its head, since the tail is read later), a
// reference rather than a proven bound. O(n log n): next uses come from one backward pass and
// the victim from a max-heap with lazy deletion.
ReplayResult ReplayOpt(size_t capacity_blocks, const Trace& trace);

// The trace with every key renamed, the same way for each of its uses: the same requests over
// other keys (labeling 0: the keys as given). What a policy does with it differs only where
// the policy looks at key bits: the adaptive ones sample keys by hash for their miniature
// caches, so their hit ratios move with the labeling; LRU's and OPT's never do.
Trace Relabel(const Trace& trace, uint64_t labeling);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_REPLAY_H_
