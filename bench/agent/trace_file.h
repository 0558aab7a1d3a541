// Trace files: JSONL, one request a line, in the shape the Mooncake FAST'25 traces publish:
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
// `hash_ids` (required) lists the request's prompt blocks in order, one id per block; equal ids
// are the same block (in Mooncake's traces an id stands for a block and its whole prefix).
// `timestamp` (ms, optional) must not go backwards; `input_length` (tokens, optional) must be a
// non-negative integer; other fields are ignored. Blank lines are skipped.
//
// A prompt whose `input_length` is not a whole number of blocks ends in a partial block, which
// the trace lists (Mooncake's do: ids = ceil(input_length / 512)). An engine caches full blocks
// only (vLLM hashes a block once it is full, and offloads by those hashes), so the partial block
// is recomputed by every request and never stored or looked up: reading drops it.
// Pure functions apart from the file I/O; thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_TRACE_FILE_H_
#define KVOFFLOAD_BENCH_AGENT_TRACE_FILE_H_

#include <istream>
#include <ostream>
#include <string>

#include "kvoffload/status.h"
#include "trace.h"

namespace kvoffload::bench {

// `source` names the input in errors ("trace.jsonl:12: hash_ids[3]: ..."). A file's id N
// becomes BlockKey{kTraceFileKeyTag, N}. `block_tokens`: tokens a block (Mooncake: 512); a
// line whose hash_ids do not cover its input_length at that size is refused.
inline constexpr uint64_t kTraceFileKeyTag = 0x4A534F4E4C000000ULL;  // "JSONL"
inline constexpr size_t kMooncakeBlockTokens = 512;
Result<Trace> ReadTrace(std::istream& in, const std::string& source,
                        size_t block_tokens = kMooncakeBlockTokens);
Result<Trace> ReadTraceFile(const std::string& path, size_t block_tokens = kMooncakeBlockTokens);

// Writes `trace` in the same format, ids numbered from 0 in order of first use (as Mooncake's
// are) and `input_length` as blocks x block_tokens, so a generated trace can be kept and
// replayed with --trace-file.
Status WriteTrace(const Trace& trace, size_t block_tokens, std::ostream& out);
Status WriteTraceFile(const Trace& trace, size_t block_tokens, const std::string& path);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_TRACE_FILE_H_
