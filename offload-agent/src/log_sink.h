// Where the engine's log lines go: one line at start and one per change of a tier's state,
// never one per block. Lines carry no trailing newline. Thread-safe as the sink is; the default
// (an empty sink) writes each line to stderr, the serving process's log, with one write call
// so lines of concurrent threads do not interleave.
#ifndef KVOFFLOAD_SRC_LOG_SINK_H_
#define KVOFFLOAD_SRC_LOG_SINK_H_

#include <cstdio>
#include <functional>
#include <string>

namespace kvoffload {

using LogSink = std::function<void(const std::string& line)>;

inline void WriteLog(const LogSink& sink, const std::string& line) {
  if (sink) {
    sink(line);
    return;
  }
  const std::string out = line + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
}

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_LOG_SINK_H_
