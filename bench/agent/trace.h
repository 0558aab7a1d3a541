// KV-block access traces for hit-ratio studies. A trace is a list of requests, each the prefix
// chain of block hashes a prefix-caching engine looks up, in order (system prompt first), as
// published LLM-serving traces record them (Mooncake's `hash_ids`).
//
// Generators, each deterministic for a given seed on a given build (they use their own random
// generator and sampling, not <random>'s distributions):
//   mixed  multi-turn chats sharing a few system prompts, requests over Zipf-popular documents
//          and periodic one-time scans (long unique prompts) that flush recency-only caches;
//   chat   multi-turn chats with human think time between turns (trace_shapes.cc);
//   agent  agentic tool loops: long shared tool prefixes re-read with appended turns;
//   rag    retrieval: a system prompt, then Zipf-popular documents, then a unique question.
// Pure functions; thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_TRACE_H_
#define KVOFFLOAD_BENCH_AGENT_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/block_key.h"
#include "kvoffload/status.h"

namespace kvoffload::bench {

struct TraceRequest {
  double timestamp_ms = 0;       // arrival; 0 when the source has none
  std::vector<BlockKey> blocks;  // the prompt's prefix chain, first block first
  friend bool operator==(const TraceRequest&, const TraceRequest&) = default;
};
using Trace = std::vector<TraceRequest>;

size_t TraceAccesses(const Trace& trace);
size_t TraceDistinctBlocks(const Trace& trace);

struct TraceOptions {
  uint64_t seed = 1;
  size_t requests = 20000;
  size_t system_prompts = 8;  // shared by every chat and document request
  size_t system_prompt_blocks = 16;
  size_t conversations = 400;  // live chats at any time; a finished one is replaced
  size_t max_turns = 12;       // a chat ends after a uniform 1..max_turns turns
  size_t turn_blocks = 4;      // new blocks a turn appends (question + answer)
  size_t documents = 4000;
  size_t document_blocks = 8;
  double zipf_s = 1.0;             // document popularity exponent
  double document_fraction = 0.4;  // share of requests that read a document; the rest chat
  size_t scan_every = 2000;        // a one-time scan after this many requests (0: never)
  size_t scan_blocks = 3000;       // blocks of a scan, never seen again
};

// The mixed chat/RAG/scan trace. Each request reads its whole prefix in order (system prompt,
// then history or document); a scan is a request of its own.
Trace GenerateTrace(const TraceOptions& options);

// The shapes that mimic production traffic (trace_shapes.cc). `requests` is the trace's length.
struct ShapeOptions {
  uint64_t seed = 1;
  size_t requests = 20000;
};
Trace GenerateChatTrace(const ShapeOptions& options);
Trace GenerateAgentTrace(const ShapeOptions& options);
Trace GenerateRagTrace(const ShapeOptions& options);

// One of "mixed", "chat", "agent", "rag" (requests and seed from `options`, the rest of the
// mixed trace's knobs from `mixed`); InvalidArgument naming the known shapes otherwise.
Result<Trace> GenerateShape(const std::string& shape, const ShapeOptions& options,
                            TraceOptions mixed);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_TRACE_H_
