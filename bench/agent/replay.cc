// Trace replay on the agent's policies and on Belady's OPT (see replay.h).
#include "replay.h"

#include <memory>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvoffload/eviction_policy.h"
#include "rng.h"

namespace kvoffload::bench {

Result<ReplayResult> ReplayPolicy(std::string_view policy, size_t capacity_blocks,
                                  const Trace& trace) {
  Result<std::unique_ptr<EvictionPolicy>> made = NewEvictionPolicy(policy, capacity_blocks);
  if (!made.ok()) return made.status();
  EvictionPolicy& p = **made;
  std::unordered_set<BlockKey, BlockKeyHash> resident;
  resident.reserve(capacity_blocks + 1);
  ReplayResult r;
  for (const TraceRequest& req : trace) {
    bool leading = true;
    for (uint32_t position = 0; position < req.blocks.size(); ++position) {
      const BlockKey& key = req.blocks[position];
      ++r.accesses;
      if (resident.contains(key)) {
        ++r.hits;
        if (leading) {
          ++r.prefix_hits;
          p.OnAccessAt(key, position);
        }
        continue;
      }
      leading = false;
      p.OnInsertAt(key, position);
      resident.insert(key);
      // The new block is pinned while its data is copied in, as in a tier.
      while (resident.size() > capacity_blocks) {
        std::optional<BlockKey> victim =
            p.SelectVictim([&key](const BlockKey& k) { return k == key; });
        if (!victim) return Status::Internal(std::string(policy) + " chose no victim");
        resident.erase(*victim);
      }
    }
  }
  return r;
}

ReplayResult ReplayOpt(size_t capacity_blocks, const Trace& trace) {
  std::vector<const BlockKey*> flat;
  flat.reserve(TraceAccesses(trace));
  for (const TraceRequest& req : trace) {
    for (const BlockKey& k : req.blocks) flat.push_back(&k);
  }
  const size_t n = flat.size();
  const size_t never = n;  // "no next use": further than any position
  std::vector<size_t> next_use(n);
  {
    std::unordered_map<BlockKey, size_t, BlockKeyHash> seen;
    for (size_t i = n; i-- > 0;) {
      auto [it, fresh] = seen.try_emplace(*flat[i], never);
      next_use[i] = it->second;
      it->second = i;
    }
  }
  // resident: key -> its current next use. The heap may hold stale (next use, key) entries
  // from earlier reads; an entry is live only when it matches `resident`.
  std::unordered_map<BlockKey, size_t, BlockKeyHash> resident;
  std::priority_queue<std::pair<size_t, BlockKey>> heap;
  ReplayResult r;
  size_t i = 0;
  for (const TraceRequest& req : trace) {
    bool leading = true;
    for (const BlockKey& key : req.blocks) {
      ++r.accesses;
      auto it = resident.find(key);
      if (it != resident.end()) {
        ++r.hits;
        if (leading) ++r.prefix_hits;
        it->second = next_use[i];
        heap.emplace(next_use[i], key);
        ++i;
        continue;
      }
      leading = false;
      if (capacity_blocks > 0) {
        // Demand paging, as a tier does: the new block always enters, so the victim is chosen
        // among the blocks already resident.
        while (resident.size() >= capacity_blocks) {
          auto [use, victim] = heap.top();
          heap.pop();
          auto v = resident.find(victim);
          if (v != resident.end() && v->second == use) resident.erase(v);
        }
        resident.emplace(key, next_use[i]);
        heap.emplace(next_use[i], key);
      }
      ++i;
    }
  }
  return r;
}

Trace Relabel(const Trace& trace, uint64_t labeling) {
  if (labeling == 0) return trace;
  // Each half XORed with its own constant: a bijection on keys, so distinct keys stay
  // distinct, and each half goes through the key hash's own mixer, so every bit of a key's
  // hash changes.
  Rng rng(labeling);
  const uint64_t hi = rng.Next(), lo = rng.Next();
  Trace out = trace;
  for (TraceRequest& req : out) {
    for (BlockKey& key : req.blocks) key = BlockKey{key.hi ^ hi, key.lo ^ lo};
  }
  return out;
}

}  // namespace kvoffload::bench
