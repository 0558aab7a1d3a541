// kvoffload-bench: the agent's benchmark CLI. Each subcommand is one file (trace_cmd.cc,
// bandwidth_cmd.cc, policy_cmd.cc, gpu_cmd.cc, crc_cmd.cc, scatter_cmd.cc, recovery_cmd.cc)
// and prints one JSON object on stdout; progress of long runs goes to stderr. Single-threaded
// driver code; not a library.
#ifndef KVOFFLOAD_BENCH_AGENT_CLI_H_
#define KVOFFLOAD_BENCH_AGENT_CLI_H_

#include <time.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kvoffload::bench {

// `--name=value` or `--name value`. A subcommand reads every flag it knows through Get* (with
// its default), then calls Done(), which fails on any flag nobody read: typos fail loudly
// before a long run starts.
class Flags {
 public:
  // Returns false (with `error` set) on a malformed argument list.
  bool Parse(int argc, char** argv, std::string* error);
  std::string GetString(const std::string& name, const std::string& def);
  // The Get* of numbers throw std::invalid_argument, naming the flag, on a value they cannot
  // read whole.
  uint64_t GetU64(const std::string& name, uint64_t def);
  double GetDouble(const std::string& name, double def);
  // Sizes above 0, with an optional K/M/G/T suffix (binary).
  uint64_t GetBytes(const std::string& name, uint64_t def);
  // False (and a message on stderr) when a flag was given that no Get* read.
  bool Done(std::string_view command) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> read_;
};

// Whole decimal digits within 64 bits, nothing else ("-1", " 1", "1.5" are false).
bool ParseU64(std::string_view text, uint64_t* out);
// A finite decimal number written out ("0.25", "3"), nothing else ("inf", "1e3", "0x10").
bool ParseFiniteDouble(std::string_view text, double* out);

// Rate-limited progress lines on stderr ("[kvoffload-bench disk] store 40% ...").
class Progress {
 public:
  Progress(std::string_view what, uint64_t total) : what_(what), total_(total) {}
  void Update(uint64_t done);

 private:
  std::string what_;
  uint64_t total_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

inline uint64_t ClockNs(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// This thread's CPU time: on a shared machine wall time mostly measures the other tenants.
inline uint64_t ThreadCpuNs() { return ClockNs(CLOCK_THREAD_CPUTIME_ID); }

// The CPU time of all of this process's threads, for work that spreads over helper threads.
inline uint64_t ProcessCpuNs() { return ClockNs(CLOCK_PROCESS_CPUTIME_ID); }

inline uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Subcommands: return the process exit code.
int RunTrace(Flags& flags);
int RunDisk(Flags& flags);
int RunCpu(Flags& flags);
int RunPolicy(Flags& flags);
int RunPolicies(Flags& flags);
int RunGpu(Flags& flags);
int RunCrc(Flags& flags);
int RunScatter(Flags& flags);
int RunRecovery(Flags& flags);

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_CLI_H_
