// `kvoffload-bench trace`: generates the chat/RAG/scan trace and replays it on LRU, ARC and
// Belady's OPT for several cache sizes; each policy's hit ratio is also given as a fraction
// of OPT's, the bound no online policy can beat.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "replay.h"
#include "trace.h"

namespace kvoffload::bench {

int RunTrace(Flags& flags) {
  TraceOptions o;
  o.seed = flags.GetU64("seed", o.seed);
  o.requests = flags.GetU64("requests", o.requests);
  o.system_prompts = flags.GetU64("system-prompts", o.system_prompts);
  o.conversations = flags.GetU64("conversations", o.conversations);
  o.documents = flags.GetU64("documents", o.documents);
  o.zipf_s = flags.GetDouble("zipf", o.zipf_s);
  o.scan_every = flags.GetU64("scan-every", o.scan_every);
  o.scan_blocks = flags.GetU64("scan-blocks", o.scan_blocks);
  const std::string sizes = flags.GetString("cache-blocks", "2000,8000,32000");
  if (!flags.Done("trace")) return 2;

  std::vector<size_t> caches;
  std::stringstream ss(sizes);
  for (std::string item; std::getline(ss, item, ',');) caches.push_back(std::stoull(item));

  const std::vector<BlockKey> trace = GenerateTrace(o);
  const size_t unique = std::unordered_set<BlockKey, BlockKeyHash>(trace.begin(), trace.end()).size();
  std::fprintf(stderr, "[kvoffload-bench] trace: %zu accesses, %zu distinct blocks\n",
               trace.size(), unique);
  nlohmann::json out = {{"seed", o.seed},           {"requests", o.requests},
                        {"accesses", trace.size()}, {"distinct_blocks", unique},
                        {"zipf", o.zipf_s},         {"documents", o.documents},
                        {"scan_every", o.scan_every}, {"scan_blocks", o.scan_blocks},
                        {"results", nlohmann::json::array()}};
  Progress progress("trace replays", caches.size() * 3);
  uint64_t done = 0;
  for (size_t cache : caches) {
    const ReplayResult opt = ReplayOpt(cache, trace);
    progress.Update(++done);
    nlohmann::json row = {{"cache_blocks", cache}, {"opt", opt.HitRatio()}};
    for (const char* policy : {"lru", "arc"}) {
      Result<ReplayResult> r = ReplayPolicy(policy, cache, trace);
      if (!r.ok()) {
        std::cerr << "kvoffload-bench trace: " << r.status().ToString() << "\n";
        return 1;
      }
      row[policy] = r->HitRatio();
      row[std::string(policy) + "_of_opt"] =
          opt.hits == 0 ? 0.0 : static_cast<double>(r->hits) / static_cast<double>(opt.hits);
      progress.Update(++done);
    }
    out["results"].push_back(row);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace kvoffload::bench
