// A synthetic KV-block access trace for hit-ratio studies: multi-turn chats that share a few
// system prompts, requests over Zipf-popular documents (RAG), and periodic one-time scans
// (long unique prompts) that flush recency-only caches. Deterministic for a given seed on a
// given build (it uses its own generator and sampling, not <random>'s distributions).
// Pure functions; thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_TRACE_H_
#define KVOFFLOAD_BENCH_AGENT_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/block_key.h"

namespace kvoffload::bench {

struct TraceOptions {
  uint64_t seed = 1;
  size_t requests = 20000;
  size_t system_prompts = 8;        // shared by every chat and document request
  size_t system_prompt_blocks = 16;
  size_t conversations = 400;       // live chats at any time; a finished one is replaced
  size_t max_turns = 12;            // a chat ends after a uniform 1..max_turns turns
  size_t turn_blocks = 4;           // new blocks a turn appends (question + answer)
  size_t documents = 4000;
  size_t document_blocks = 8;
  double zipf_s = 1.0;              // document popularity exponent
  double document_fraction = 0.4;   // share of requests that read a document; the rest chat
  size_t scan_every = 2000;         // a one-time scan after this many requests (0: never)
  size_t scan_blocks = 3000;        // blocks of a scan, never seen again
};

// Each request reads its whole prefix in order (system prompt, then history or document),
// as a prefix-caching engine looks blocks up.
std::vector<BlockKey> GenerateTrace(const TraceOptions& options);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_TRACE_H_
