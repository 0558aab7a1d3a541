// JSONL trace files (see trace_file.h). nlohmann's exceptions stay in this file: every problem
// becomes an InvalidArgument naming the line, the field, the value and what to write instead.
#include "trace_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace kvoffload::bench {
namespace {

std::string Shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

Status ParseLine(const std::string& line, const std::string& where, size_t block_tokens,
                 double* last_timestamp, TraceRequest* out) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(where +
                                   ": not a JSON object; each line is one request, "
                                   "e.g. {\"timestamp\": 0, \"hash_ids\": [1, 2, 3]}");
  }
  auto ids = j.find("hash_ids");
  if (ids == j.end()) {
    return Status::InvalidArgument(where +
                                   ": hash_ids is missing; give the request's prompt "
                                   "blocks as a list of integer ids, first block first");
  }
  if (!ids->is_array()) {
    return Status::InvalidArgument(where + ": hash_ids: " + Shown(*ids) +
                                   " is not a list; write a list of integer ids such as [1, 2, 3]");
  }
  out->blocks.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const nlohmann::json& id = (*ids)[i];
    if (!id.is_number_unsigned() && !(id.is_number_integer() && id.get<int64_t>() >= 0)) {
      return Status::InvalidArgument(where + ": hash_ids[" + std::to_string(i) + "]: " + Shown(id) +
                                     " is not a non-negative integer block id");
    }
    out->blocks.push_back(BlockKey{kTraceFileKeyTag, id.get<uint64_t>()});
  }
  // A block's hash covers its whole prefix, so one request never holds it twice; a replay
  // counted the second as a hit on the request's own block. Where: sorted positions.
  std::vector<size_t> order(out->blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(out->blocks[a].lo, a) < std::pair(out->blocks[b].lo, b);
  });
  for (size_t k = 1; k < order.size(); ++k) {
    if (out->blocks[order[k]].lo == out->blocks[order[k - 1]].lo) {
      return Status::InvalidArgument(
          where + ": hash_ids[" + std::to_string(order[k]) + "]: " +
          std::to_string(out->blocks[order[k]].lo) + " is hash_ids[" +
          std::to_string(order[k - 1]) + "] again; a block's hash covers its whole prefix, so "
          "a request holds each id once");
    }
  }
  if (auto ts = j.find("timestamp"); ts != j.end()) {
    if (!ts->is_number() || !std::isfinite(ts->get<double>())) {
      return Status::InvalidArgument(
          where + ": timestamp: " + Shown(*ts) +
          " is not a number; give the arrival time in ms or leave it out");
    }
    out->timestamp_ms = ts->get<double>();
    if (out->timestamp_ms < *last_timestamp) {
      return Status::InvalidArgument(
          where + ": timestamp: " + Shown(*ts) + " is before the previous request's " +
          nlohmann::json(*last_timestamp).dump() + "; sort the file by timestamp");
    }
    *last_timestamp = out->timestamp_ms;
  }
  if (auto len = j.find("input_length"); len != j.end()) {
    if (!len->is_number_unsigned() && !(len->is_number_integer() && len->get<int64_t>() >= 0)) {
      return Status::InvalidArgument(where + ": input_length: " + Shown(*len) +
                                     " is not a non-negative integer token count");
    }
    const uint64_t tokens = len->get<uint64_t>();
    const uint64_t full = tokens / block_tokens;
    const uint64_t all = full + (tokens % block_tokens != 0 ? 1 : 0);
    if (out->blocks.size() != all) {
      return Status::InvalidArgument(
          where + ": hash_ids has " + std::to_string(out->blocks.size()) +
          " ids but input_length " + std::to_string(tokens) + " is " + std::to_string(all) +
          (all == 1 ? " block of " : " blocks of ") + std::to_string(block_tokens) +
          " tokens; give --block-tokens the trace's block size");
    }
    out->blocks.resize(full);  // the partial last block is never cached (trace_file.h)
  }
  return Status();
}

}  // namespace

Result<Trace> ReadTrace(std::istream& in, const std::string& source, size_t block_tokens) {
  if (block_tokens == 0) return Status::InvalidArgument("--block-tokens: 0 is not a block size");
  Trace trace;
  double last_timestamp = -INFINITY;
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TraceRequest req;
    if (Status s = ParseLine(line, source + ":" + std::to_string(line_no), block_tokens,
                             &last_timestamp, &req);
        !s.ok()) {
      return s;
    }
    trace.push_back(std::move(req));
  }
  if (in.bad()) return Status::IOError(source + ": read failed");
  if (trace.empty()) {
    return Status::InvalidArgument(source +
                                   ": no requests; a trace has one JSON object per line "
                                   "with a hash_ids list");
  }
  return trace;
}

Result<Trace> ReadTraceFile(const std::string& path, size_t block_tokens) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("--trace-file: cannot open \"" + path + "\"");
  return ReadTrace(in, path, block_tokens);
}

Status WriteTrace(const Trace& trace, size_t block_tokens, std::ostream& out) {
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> ids;
  for (const TraceRequest& r : trace) {
    nlohmann::json hash_ids = nlohmann::json::array();
    for (const BlockKey& k : r.blocks)
      hash_ids.push_back(ids.try_emplace(k, ids.size()).first->second);
    nlohmann::json line = {{"timestamp", std::llround(r.timestamp_ms)},
                           {"input_length", r.blocks.size() * block_tokens},
                           {"hash_ids", std::move(hash_ids)}};
    out << line.dump() << "\n";
  }
  return out ? Status() : Status::IOError("writing the trace failed");
}

Status WriteTraceFile(const Trace& trace, size_t block_tokens, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::IOError("--write-trace: cannot create \"" + path + "\"");
  if (Status s = WriteTrace(trace, block_tokens, out); !s.ok()) return s;
  out.close();
  return out ? Status() : Status::IOError("--write-trace: writing \"" + path + "\" failed");
}

}  // namespace kvoffload::bench
