// `kvoffload-bench policy`: ns per lookup (OnAccess), insert (OnInsert) and evict
// (SelectVictim) of one eviction policy holding --blocks resident blocks. The policy is filled
// first, then runs rounds of `batch` lookups, `batch` evictions and `batch` fresh inserts,
// which keep the resident count within one batch of --blocks. The first rounds are not timed:
// until twice --blocks blocks were evicted, the victims are the fill's keys in the order they
// were stored (neighbours in memory, unlike a cache that ran for a while) and the ghost lists of
// ARC and S3-FIFO are not yet full (so no eviction pays for trimming them). Timing starts in
// the steady state a serving tier is in, and no timed operation pays for a table rehash.
// Time is this thread's CPU time, read once per batch: on a shared machine wall time mostly
// measures the other tenants (the wall figure is reported too). Lookups and inserts are the
// positioned calls the engine makes, in chains of kChain blocks, so a policy that uses
// positions pays for them here: inserts one OnInsertAt per block, lookups one OnAccessBatch
// per chain, as a load's blocks in the pinned tier reach the policy (CpuTier::PinChain), or
// with --lookup-calls=each one OnAccessAt per block.
//
// --loop=N (default 0: every insert a new key) stores again keys [0, N) in a cycle, skipping
// the resident ones: a loop larger than the tier, where a block evicted comes back, as the
// sessions and documents of a tier too small for them do. Adaptive policies then leave their
// LRU mode (lirs promotes and demotes and keeps ghosts), which fresh keys never make them do.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload::bench {

int RunPolicy(Flags& flags) {
  const std::string name = flags.GetString("policy", "lru");
  const size_t blocks = flags.GetU64("blocks", 1 << 20);
  const size_t ops = flags.GetU64("ops", 2'000'000);
  const size_t batch = flags.GetU64("batch", 1024);
  const uint64_t loop = flags.GetU64("loop", 0);
  const std::string lookup_calls = flags.GetString("lookup-calls", "chain");
  if (!flags.Done("policy")) return 2;
  if (lookup_calls != "chain" && lookup_calls != "each") {
    std::cerr << "kvoffload-bench policy: --lookup-calls=" << lookup_calls
              << " is not chain or each\n";
    return 2;
  }
  const bool batched = lookup_calls == "chain";
  if (loop != 0 && loop <= blocks + batch) {
    std::cerr << "kvoffload-bench policy: --loop=" << loop << " must exceed --blocks plus --batch ("
              << blocks + batch << "), or be 0\n";
    return 2;
  }

  Result<std::unique_ptr<EvictionPolicy>> made = NewEvictionPolicy(name, blocks);
  if (!made.ok()) {
    std::cerr << "kvoffload-bench policy: " << made.status().ToString() << "\n";
    return 2;
  }
  EvictionPolicy& p = **made;
  // Real keys are hashes: `hi` is a mixed counter (splitmix64's finaliser), `lo` the counter
  // itself, so the policy can be handed back the id of a victim.
  auto key = [](uint64_t i) {
    uint64_t z = i + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return BlockKey{z ^ (z >> 31), i};
  };
  constexpr uint32_t kChain = 16;
  auto position = [](size_t i) { return static_cast<uint32_t>(i % kChain); };
  uint64_t next = 0;
  for (; next < blocks; ++next) p.OnInsertAt(key(next), position(next));

  const EvictionPolicy::IsPinned unpinned = [](const BlockKey&) { return false; };
  uint64_t warm_evictions = 0;
  const uint64_t warm_up = 2 * static_cast<uint64_t>(blocks);
  // Which ids are resident, for lookups of random resident keys: a dense array with
  // swap-remove, updated outside the timed loops. pos is indexed by id (kAbsent: not resident):
  // every id the fill, the warm-up and the timed rounds insert, or the loop's.
  constexpr uint64_t kAbsent = UINT64_MAX;
  constexpr uint64_t kPicked = UINT64_MAX - 1;
  const uint64_t id_space = loop != 0 ? loop : blocks + warm_up + ops + 2 * batch;
  std::vector<uint64_t> ids(blocks), pos(id_space, kAbsent);
  for (uint64_t i = 0; i < blocks; ++i) ids[i] = pos[i] = i;
  std::vector<uint64_t> picks(batch), victims(batch), stored(batch);
  std::vector<BlockKey> access_keys(batch), insert_keys(batch);
  std::vector<uint32_t> access_positions(batch);
  // The next id to store: a new one, or the loop's next one that is neither resident nor
  // picked for this round (kPicked, until the round's bookkeeping makes it resident).
  auto next_id = [&]() {
    if (loop == 0) return next++;
    for (;; ++next) {
      const uint64_t id = next % loop;
      if (pos[id] == kAbsent) {
        ++next;
        return id;
      }
    }
  };
  uint64_t lookup_ns = 0, insert_ns = 0, evict_ns = 0, lookups = 0, churn = 0;
  uint64_t rng = 88172645463325252ULL;  // xorshift64
  Progress progress("policy " + name + " ops", ops);
  uint64_t wall0 = NowNs();
  while (lookups + churn < ops) {
    for (uint64_t& k : picks) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      k = ids[rng % ids.size()];
    }
    for (uint64_t& id : stored) {
      id = next_id();
      pos[id] = kPicked;
    }
    for (size_t i = 0; i < batch; ++i) {
      access_keys[i] = key(picks[i]);
      access_positions[i] = position(i);
      insert_keys[i] = key(stored[i]);
    }
    const uint64_t t0 = ThreadCpuNs();
    if (batched) {
      for (size_t i = 0; i < batch; i += kChain) {
        const size_t m = std::min<size_t>(kChain, batch - i);
        p.OnAccessBatch(std::span(access_keys).subspan(i, m),
                        std::span(access_positions).subspan(i, m));
      }
    } else {
      for (size_t i = 0; i < batch; ++i) p.OnAccessAt(access_keys[i], access_positions[i]);
    }
    const uint64_t t1 = ThreadCpuNs();
    for (uint64_t& v : victims) {
      std::optional<BlockKey> victim = p.SelectVictim(unpinned);
      if (!victim) {
        std::cerr << "kvoffload-bench policy: no victim with " << p.resident() << " resident\n";
        return 1;
      }
      v = victim->lo;
    }
    const uint64_t t2 = ThreadCpuNs();
    for (size_t i = 0; i < batch; ++i) p.OnInsertAt(insert_keys[i], position(i));
    const uint64_t t3 = ThreadCpuNs();
    for (uint64_t v : victims) {
      // A victim must be a resident block, each once: anything else is a policy bug, which
      // the swap-remove below would turn into a write out of bounds.
      if (v >= pos.size() || pos[v] >= ids.size()) {
        std::cerr << "kvoffload-bench policy: " << name << " evicted block " << v
                  << ", which is not resident\n";
        return 1;
      }
      ids[pos[v]] = ids.back();
      pos[ids.back()] = pos[v];
      pos[v] = kAbsent;
      ids.pop_back();
    }
    for (const uint64_t id : stored) {
      pos[id] = ids.size();
      ids.push_back(id);
    }
    if (warm_evictions < warm_up) {
      warm_evictions += batch;
      wall0 = NowNs();
      continue;
    }
    lookup_ns += t1 - t0;
    evict_ns += t2 - t1;
    insert_ns += t3 - t2;
    lookups += batch;
    churn += 2 * batch;
    progress.Update(lookups + churn);
  }
  const auto per = [](uint64_t ns, uint64_t n) {
    return static_cast<double>(ns) / static_cast<double>(n);
  };
  const nlohmann::json out = {{"policy", name},
                              {"resident_blocks", p.resident()},
                              {"lookup_ns", per(lookup_ns, lookups)},
                              {"insert_ns", per(insert_ns, churn / 2)},
                              {"evict_ns", per(evict_ns, churn / 2)},
                              {"ops", lookups + churn},
                              {"warm_up_evictions", warm_evictions},
                              {"loop", loop},
                              {"lookup_calls", lookup_calls},
                              {"wall_ns_per_op", per(NowNs() - wall0, lookups + churn)},
                              {"clock", "thread cpu time"},
                              // What state the policy ended in (an adaptive one: which way).
                              {"state", p.DebugString()}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

// `kvoffload-bench policies`: what the benchmark scripts iterate over, so that a newly
// registered policy is measured without editing them.
int RunPolicies(Flags& flags) {
  if (!flags.Done("policies")) return 2;
  std::cout << nlohmann::json{{"policies", EvictionPolicyNames()}}.dump() << "\n";
  return 0;
}

}  // namespace kvoffload::bench
