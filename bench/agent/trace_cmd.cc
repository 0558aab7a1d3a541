// `kvoffload-bench trace`: replays a trace (a generated shape, or a JSONL file with
// --trace-file) on every registered eviction policy, on Belady's OPT and on LRU told which
// blocks are never read again, at several cache sizes, and reports per-block and
// prefix-usable hit ratios (replay.h), each also as a fraction of OPT's. Cache sizes are
// block counts ("2000") or percentages of the trace's distinct blocks ("5%").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "kvoffload/eviction_policy.h"
#include "replay.h"
#include "trace.h"
#include "trace_file.h"

namespace kvoffload::bench {
namespace {

struct CacheSize {
  std::string label;  // as given: "2000" or "5%"
  size_t blocks = 0;
};

// A count above the trace's distinct blocks holds the whole trace, as that many does: it is
// replayed at `distinct` (the replay sizes its tables by the capacity, and 10^10 blocks asked
// for a 4-block trace took memory the machine does not have).
Result<std::vector<CacheSize>> ParseCacheSizes(const std::string& list, size_t distinct) {
  std::vector<CacheSize> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    const bool percent = !item.empty() && item.back() == '%';
    double blocks = 0;
    if (percent) {
      double value = 0;
      if (ParseFiniteDouble(std::string_view(item).substr(0, item.size() - 1), &value) &&
          value > 0 && value <= 100) {
        blocks = std::ceil(value / 100 * static_cast<double>(distinct));
      }
    } else {
      uint64_t count = 0;
      if (ParseU64(item, &count)) blocks = static_cast<double>(count);
    }
    if (!(blocks > 0)) {
      return Status::InvalidArgument("--cache-blocks: \"" + item +
                                     "\" is not a block count above 0 or a percentage (0-100] "
                                     "of the distinct blocks; write e.g. --cache-blocks=2000,8000 "
                                     "or 2%,5%,10%");
    }
    const double held = std::min(blocks, static_cast<double>(distinct));
    out.push_back(CacheSize{item, std::max<size_t>(1, static_cast<size_t>(held))});
  }
  if (out.empty())
    return Status::InvalidArgument("--cache-blocks: no sizes given; write e.g. 2%,5%,10%");
  return out;
}

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double Of(uint64_t hits, uint64_t opt_hits) {
  return opt_hits == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(opt_hits);
}

// A replay's two hit ratios, each also as a fraction of OPT's.
nlohmann::json Ratios(const ReplayResult& r, const ReplayResult& opt) {
  return {{"hit_ratio", r.HitRatio()},
          {"prefix_hit_ratio", r.PrefixHitRatio()},
          {"of_opt", Of(r.hits, opt.hits)},
          {"prefix_of_opt", Of(r.prefix_hits, opt.prefix_hits)}};
}

}  // namespace

int RunTrace(Flags& flags) {
  TraceOptions mixed;
  ShapeOptions shape_options;
  shape_options.seed = flags.GetU64("seed", mixed.seed);
  shape_options.requests = flags.GetU64("requests", mixed.requests);
  mixed.system_prompts = flags.GetU64("system-prompts", mixed.system_prompts);
  mixed.conversations = flags.GetU64("conversations", mixed.conversations);
  mixed.documents = flags.GetU64("documents", mixed.documents);
  mixed.zipf_s = flags.GetDouble("zipf", mixed.zipf_s);
  mixed.scan_every = flags.GetU64("scan-every", mixed.scan_every);
  mixed.scan_blocks = flags.GetU64("scan-blocks", mixed.scan_blocks);
  const std::string shape = flags.GetString("trace", "mixed");
  const std::string file = flags.GetString("trace-file", "");
  const std::string write = flags.GetString("write-trace", "");
  const std::string sizes = flags.GetString("cache-blocks", "2000,8000,32000");
  const std::string policies_flag = flags.GetString("policies", "");
  const uint64_t block_tokens = flags.GetU64("block-tokens", kMooncakeBlockTokens);
  const uint64_t labelings = flags.GetU64("labelings", 1);
  if (!flags.Done("trace")) return 2;
  if (labelings == 0) {
    std::cerr << "kvoffload-bench trace: --labelings=0: replay under at least 1 labeling (the "
                 "keys as given); write e.g. --labelings=4\n";
    return 2;
  }

  Result<Trace> made =
      file.empty() ? GenerateShape(shape, shape_options, mixed) : ReadTraceFile(file, block_tokens);
  if (!made.ok()) {
    std::cerr << "kvoffload-bench trace: " << made.status().ToString() << "\n";
    return 2;
  }
  const Trace& trace = *made;
  if (!write.empty()) {
    if (Status s = WriteTraceFile(trace, block_tokens, write); !s.ok()) {
      std::cerr << "kvoffload-bench trace: " << s.ToString() << "\n";
      return 1;
    }
  }
  const size_t accesses = TraceAccesses(trace);
  const size_t distinct = TraceDistinctBlocks(trace);
  if (distinct == 0) {
    std::cerr << "kvoffload-bench trace: " << (file.empty() ? "the generated trace" : file)
              << " holds no block (every request's hash_ids is empty): nothing to replay\n";
    return 2;
  }
  Result<std::vector<CacheSize>> caches = ParseCacheSizes(sizes, distinct);
  if (!caches.ok()) {
    std::cerr << "kvoffload-bench trace: " << caches.status().ToString() << "\n";
    return 2;
  }
  const std::vector<std::string> policies =
      policies_flag.empty() ? EvictionPolicyNames() : Split(policies_flag);
  // The same requests under other names for the keys (Relabel), for the range of what a policy
  // that samples keys by hash gets by chance of the names.
  std::vector<Trace> relabeled;
  for (uint64_t l = 1; l < labelings; ++l) relabeled.push_back(Relabel(trace, l));
  std::fprintf(stderr, "[kvoffload-bench] trace: %zu requests, %zu accesses, %zu distinct blocks\n",
               trace.size(), accesses, distinct);
  nlohmann::json out = {{"trace", file.empty() ? shape : file},
                        {"from_file", !file.empty()},
                        {"seed", shape_options.seed},
                        {"requests", trace.size()},
                        {"accesses", accesses},
                        {"distinct_blocks", distinct},
                        {"policies", policies},
                        {"labelings", labelings},
                        {"results", nlohmann::json::array()}};
  if (file.empty() && shape == "mixed") {
    out["mixed"] = {{"zipf", mixed.zipf_s},
                    {"documents", mixed.documents},
                    {"scan_every", mixed.scan_every},
                    {"scan_blocks", mixed.scan_blocks}};
  }
  const std::vector<bool> last_uses = LastUses(trace);
  Progress progress("trace replays", caches->size() * (policies.size() + 2));
  uint64_t done = 0;
  for (const CacheSize& cache : *caches) {
    const ReplayResult opt = ReplayOpt(cache.blocks, trace);
    progress.Update(++done);
    // The other offline reference: LRU told which blocks are never read again.
    Result<ReplayResult> lru_death = ReplayPolicy("lru", cache.blocks, trace, &last_uses);
    if (!lru_death.ok()) {
      std::cerr << "kvoffload-bench trace: " << lru_death.status().ToString() << "\n";
      return 2;
    }
    progress.Update(++done);
    nlohmann::json row = {
        {"cache", cache.label},
        {"cache_blocks", cache.blocks},
        {"opt", {{"hit_ratio", opt.HitRatio()}, {"prefix_hit_ratio", opt.PrefixHitRatio()}}},
        {"lru_death", Ratios(*lru_death, opt)}};
    for (const std::string& policy : policies) {
      Result<ReplayResult> r = ReplayPolicy(policy, cache.blocks, trace);
      if (!r.ok()) {
        std::cerr << "kvoffload-bench trace: " << r.status().ToString() << "\n";
        return 2;
      }
      row[policy] = Ratios(*r, opt);
      if (!relabeled.empty()) {
        // OPT and the accesses are the same under every labeling: only prefix hits vary.
        ReplayResult low = *r, high = *r;
        for (const Trace& other : relabeled) {
          Result<ReplayResult> o = ReplayPolicy(policy, cache.blocks, other);
          if (!o.ok()) {
            std::cerr << "kvoffload-bench trace: " << o.status().ToString() << "\n";
            return 2;
          }
          low.prefix_hits = std::min(low.prefix_hits, o->prefix_hits);
          high.prefix_hits = std::max(high.prefix_hits, o->prefix_hits);
        }
        row[policy]["over_labelings"] = {
            {"prefix_hit_ratio", {low.PrefixHitRatio(), high.PrefixHitRatio()}},
            {"prefix_of_opt",
             {Of(low.prefix_hits, opt.prefix_hits), Of(high.prefix_hits, opt.prefix_hits)}}};
      }
      progress.Update(++done);
    }
    out["results"].push_back(row);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace kvoffload::bench
