// The trace generator (see trace.h). Block keys encode what they are (kind in the top byte of
// `hi`, object id below it, block index in `lo`), so a key is unique without a registry.
#include "trace.h"

#include <algorithm>
#include <cmath>

namespace kvoffload::bench {
namespace {

enum Kind : uint64_t { kSystem = 1, kConversation = 2, kDocument = 3, kScan = 4 };

BlockKey Key(Kind kind, uint64_t id, uint64_t index) {
  return BlockKey{(static_cast<uint64_t>(kind) << 56) | id, index};
}

// splitmix64: tiny, fast and identical everywhere, unlike std::*_distribution.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

struct Conversation {
  uint64_t id = 0;
  size_t system_prompt = 0;
  size_t turns_left = 0;
  size_t history_blocks = 0;
};

}  // namespace

std::vector<BlockKey> GenerateTrace(const TraceOptions& o) {
  Rng rng(o.seed);
  // Zipf CDF over documents (rank 0 most popular), sampled by binary search.
  std::vector<double> cdf(std::max<size_t>(o.documents, 1));
  double sum = 0;
  for (size_t i = 0; i < cdf.size(); ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), o.zipf_s);
    cdf[i] = sum;
  }
  for (double& c : cdf) c /= sum;

  uint64_t next_conversation = 0;
  auto new_conversation = [&] {
    return Conversation{next_conversation++, rng.Below(std::max<size_t>(o.system_prompts, 1)),
                        1 + rng.Below(std::max<size_t>(o.max_turns, 1)), 0};
  };
  std::vector<Conversation> live(std::max<size_t>(o.conversations, 1));
  for (Conversation& c : live) c = new_conversation();

  std::vector<BlockKey> trace;
  auto system_prompt = [&](size_t p) {
    for (size_t b = 0; b < o.system_prompt_blocks; ++b) trace.push_back(Key(kSystem, p, b));
  };
  uint64_t scans = 0;
  for (size_t r = 0; r < o.requests; ++r) {
    if (o.scan_every != 0 && r % o.scan_every == o.scan_every - 1) {
      for (size_t b = 0; b < o.scan_blocks; ++b) trace.push_back(Key(kScan, scans, b));
      ++scans;
    }
    if (rng.Uniform() < o.document_fraction) {
      const auto it = std::lower_bound(cdf.begin(), cdf.end(), rng.Uniform());
      const auto doc = static_cast<uint64_t>(std::min<ptrdiff_t>(
          it - cdf.begin(), static_cast<ptrdiff_t>(cdf.size()) - 1));
      system_prompt(rng.Below(std::max<size_t>(o.system_prompts, 1)));
      for (size_t b = 0; b < o.document_blocks; ++b) trace.push_back(Key(kDocument, doc, b));
      continue;
    }
    Conversation& c = live[rng.Below(live.size())];
    system_prompt(c.system_prompt);
    c.history_blocks += o.turn_blocks;  // this turn's question and answer are new blocks
    for (size_t b = 0; b < c.history_blocks; ++b) trace.push_back(Key(kConversation, c.id, b));
    if (--c.turns_left == 0) c = new_conversation();
  }
  return trace;
}

}  // namespace kvoffload::bench
