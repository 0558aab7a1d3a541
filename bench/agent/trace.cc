// The mixed chat/RAG/scan generator and trace helpers (see trace.h). Block keys encode what
// they are (kind in the top byte of `hi`, object id below it, block index in `lo`), so a key
// is unique without a registry.
#include "trace.h"

#include <unordered_set>

#include "rng.h"

namespace kvoffload::bench {
namespace {

enum Kind : uint64_t { kSystem = 1, kConversation = 2, kDocument = 3, kScan = 4 };

BlockKey Key(Kind kind, uint64_t id, uint64_t index) {
  return BlockKey{(static_cast<uint64_t>(kind) << 56) | id, index};
}

struct Conversation {
  uint64_t id = 0;
  size_t system_prompt = 0;
  size_t turns_left = 0;
  size_t history_blocks = 0;
};

}  // namespace

size_t TraceAccesses(const Trace& trace) {
  size_t n = 0;
  for (const TraceRequest& r : trace) n += r.blocks.size();
  return n;
}

size_t TraceDistinctBlocks(const Trace& trace) {
  std::unordered_set<BlockKey, BlockKeyHash> seen;
  for (const TraceRequest& r : trace) seen.insert(r.blocks.begin(), r.blocks.end());
  return seen.size();
}

Trace GenerateTrace(const TraceOptions& o) {
  Rng rng(o.seed);
  const Zipf zipf(o.documents, o.zipf_s);

  uint64_t next_conversation = 0;
  auto new_conversation = [&] {
    return Conversation{next_conversation++, rng.Below(o.system_prompts),
                        1 + rng.Below(o.max_turns), 0};
  };
  std::vector<Conversation> live(std::max<size_t>(o.conversations, 1));
  for (Conversation& c : live) c = new_conversation();

  Trace trace;
  auto system_prompt = [&](TraceRequest& req, size_t p) {
    for (size_t b = 0; b < o.system_prompt_blocks; ++b) req.blocks.push_back(Key(kSystem, p, b));
  };
  uint64_t scans = 0;
  for (size_t r = 0; r < o.requests; ++r) {
    if (o.scan_every != 0 && r % o.scan_every == o.scan_every - 1) {
      TraceRequest& scan = trace.emplace_back();
      for (size_t b = 0; b < o.scan_blocks; ++b) scan.blocks.push_back(Key(kScan, scans, b));
      ++scans;
    }
    TraceRequest& req = trace.emplace_back();
    if (rng.Uniform() < o.document_fraction) {
      const uint64_t doc = zipf.Sample(rng);
      system_prompt(req, rng.Below(o.system_prompts));
      for (size_t b = 0; b < o.document_blocks; ++b) req.blocks.push_back(Key(kDocument, doc, b));
      continue;
    }
    Conversation& c = live[rng.Below(live.size())];
    system_prompt(req, c.system_prompt);
    c.history_blocks += o.turn_blocks;  // this turn's question and answer are new blocks
    for (size_t b = 0; b < c.history_blocks; ++b) req.blocks.push_back(Key(kConversation, c.id, b));
    if (--c.turns_left == 0) c = new_conversation();
  }
  return trace;
}

Result<Trace> GenerateShape(const std::string& shape, const ShapeOptions& options,
                            TraceOptions mixed) {
  if (shape == "mixed") {
    mixed.seed = options.seed;
    mixed.requests = options.requests;
    return GenerateTrace(mixed);
  }
  if (shape == "chat") return GenerateChatTrace(options);
  if (shape == "agent") return GenerateAgentTrace(options);
  if (shape == "rag") return GenerateRagTrace(options);
  return Status::InvalidArgument("--trace: \"" + shape +
                                 "\" is not a known trace shape; use one of: mixed, chat, agent, "
                                 "rag (or --trace-file=FILE for a JSONL trace)");
}

}  // namespace kvoffload::bench
