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

namespace {

// For each access of the trace in order, the index of the next access to the same block, or
// the number of accesses where there is none. One backward pass.
std::vector<size_t> NextUses(const Trace& trace) {
  std::vector<const BlockKey*> flat;
  flat.reserve(TraceAccesses(trace));
  for (const TraceRequest& req : trace) {
    for (const BlockKey& k : req.blocks) flat.push_back(&k);
  }
  const size_t n = flat.size();
  std::vector<size_t> next_use(n);
  std::unordered_map<BlockKey, size_t, BlockKeyHash> seen;
  for (size_t i = n; i-- > 0;) {
    auto [it, fresh] = seen.try_emplace(*flat[i], n);
    next_use[i] = it->second;
    it->second = i;
  }
  return next_use;
}

}  // namespace

std::vector<bool> LastUses(const Trace& trace) {
  const std::vector<size_t> next_use = NextUses(trace);
  std::vector<bool> last(next_use.size());
  for (size_t i = 0; i < next_use.size(); ++i) last[i] = next_use[i] == next_use.size();
  return last;
}

Result<ReplayResult> ReplayPolicy(std::string_view policy, size_t capacity_blocks,
                                  const Trace& trace, const std::vector<bool>* last_uses) {
  Result<std::unique_ptr<EvictionPolicy>> made = NewEvictionPolicy(policy, capacity_blocks);
  if (!made.ok()) return made.status();
  EvictionPolicy& p = **made;
  std::unordered_set<BlockKey, BlockKeyHash> resident;
  resident.reserve(capacity_blocks + 1);
  // With last_uses: blocks read for the last time, to evict before asking the policy. Which of
  // them goes first changes no hit (none is read again); one that the policy evicted already
  // is skipped when reached.
  std::vector<BlockKey> dead;
  ReplayResult r;
  size_t i = 0;
  for (const TraceRequest& req : trace) {
    bool leading = true;
    for (uint32_t position = 0; position < req.blocks.size(); ++position, ++i) {
      const BlockKey& key = req.blocks[position];
      const bool last_use = last_uses != nullptr && (*last_uses)[i];
      ++r.accesses;
      if (resident.contains(key)) {
        ++r.hits;
        if (leading) {
          ++r.prefix_hits;
          p.OnAccessAt(key, position);
        }
        if (last_use) dead.push_back(key);
        continue;
      }
      leading = false;
      p.OnInsertAt(key, position);
      resident.insert(key);
      // The new block is pinned while its data is copied in, as in a tier.
      while (resident.size() > capacity_blocks) {
        std::optional<BlockKey> victim;
        for (; !victim && !dead.empty(); dead.pop_back()) {
          if (resident.contains(dead.back())) {
            victim = dead.back();
            p.OnRemove(*victim);
          }
        }
        if (!victim) victim = p.SelectVictim([&key](const BlockKey& k) { return k == key; });
        if (!victim) return Status::Internal(std::string(policy) + " chose no victim");
        resident.erase(*victim);
      }
      // Only now: the new block was pinned while the loop above chose victims.
      if (last_use) dead.push_back(key);
    }
  }
  return r;
}

ReplayResult ReplayOpt(size_t capacity_blocks, const Trace& trace) {
  const std::vector<size_t> next_use = NextUses(trace);
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
