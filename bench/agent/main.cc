// kvoffload-bench entry point: flag parsing, progress lines and subcommand dispatch.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cli.h"

namespace kvoffload::bench {

bool Flags::Parse(int argc, char** argv, std::string* error) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      *error = "unexpected argument \"" + arg + "\" (flags are --name=value)";
      return false;
    }
    arg = arg.substr(2);
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      values_[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      values_[arg] = argv[++i];
    } else {
      *error = "--" + arg + " needs a value";
      return false;
    }
  }
  return true;
}

std::string Flags::GetString(const std::string& name, const std::string& def) {
  read_[name] = true;
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

// Whole decimal digits only, within 64 bits: std::stoull would take "-1" (wrapping it to
// 2^64-1), " 1" and the "1" of "1.5", and read a value the caller did not mean.
bool ParseU64(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

// A finite decimal number, whole: std::stod takes " 3", "0x10", "inf" and the "3" of "3x".
bool ParseFiniteDouble(std::string_view text, double* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out,
                                         std::chars_format::fixed);
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(*out);
}

uint64_t Flags::GetU64(const std::string& name, uint64_t def) {
  const std::string v = GetString(name, "");
  uint64_t n = 0;
  if (v.empty()) return def;
  if (!ParseU64(v, &n)) {
    throw std::invalid_argument("--" + name + "=" + v + ": want a whole number");
  }
  return n;
}

double Flags::GetDouble(const std::string& name, double def) {
  const std::string v = GetString(name, "");
  double d = 0;
  if (v.empty()) return def;
  if (!ParseFiniteDouble(v, &d)) {
    throw std::invalid_argument("--" + name + "=" + v + ": want a decimal number such as 0.5");
  }
  return d;
}

uint64_t Flags::GetBytes(const std::string& name, uint64_t def) {
  const std::string v = GetString(name, "");
  if (v.empty()) return def;
  std::string_view digits = v;
  unsigned shift = 0;
  switch (v.back()) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: break;
  }
  if (shift != 0) digits.remove_suffix(1);
  uint64_t n = 0;
  if (!ParseU64(digits, &n) || n == 0 || n > (UINT64_MAX >> shift)) {
    throw std::invalid_argument("--" + name + "=" + v +
                                ": want a whole number of bytes above 0, with an optional K, M, "
                                "G or T suffix (binary: 64K is 65536)");
  }
  return n << shift;
}

bool Flags::Done(std::string_view command) const {
  for (const auto& [name, value] : values_) {
    if (read_.contains(name)) continue;
    std::cerr << "kvoffload-bench " << command << ": unknown flag --" << name << "\n";
    return false;
  }
  return true;
}

void Progress::Update(uint64_t done) {
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::seconds(2)) return;
  last_ = now;
  std::fprintf(stderr, "[kvoffload-bench] %s %llu/%llu (%.0f%%)\n", what_.c_str(),
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
               total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(total_));
}

}  // namespace kvoffload::bench

namespace {

constexpr const char* kUsage = R"(usage: kvoffload-bench SUBCOMMAND [--flag=value ...]
  trace   replay a trace on every registered policy, Belady's OPT and LRU told which blocks
          die (lru_death): per-block and prefix-usable hit ratios, each also as a fraction of
          OPT's
          --trace=mixed|chat|agent|rag (generated) or --trace-file=FILE (JSONL, hash_ids;
          --block-tokens=512, its block size: a prompt's partial last block is not cached)
          --cache-blocks=2000,8000 or 2%,5%,10% (of the distinct blocks) --policies=a,b
          --labelings=N (also replay under N-1 renamings of the keys: the range of prefix hits
          a policy that samples keys by hash gets by chance)
          --write-trace=FILE (the trace as JSONL) --requests --seed; mixed only:
          --system-prompts --conversations --documents --zipf --scan-every --scan-blocks
  disk    store/load bandwidth through the engine (host device) on one disk tier
          --dir (not tmpfs) --block-size --qd --total --disk-io=auto|uring|psync
          --state=empty|full|mixed (full: every timed store evicts; mixed: stores that
          evict and loads at once) --load-batch --load-jobs
          --store-batch --store-jobs --demote-batch (default --qd; 0: no demoter)
  cpu     store+load bandwidth of the pinned tier (host device) against memcpy
          --block-size --total --batch --jobs --reps
          --memcpy-threads (the memcpy's threads; default min(4, usable CPUs), as many as
          the host device copies with)
  policy  ns per lookup/insert/evict of a policy at --blocks resident (default 1M)
          --policy=NAME (any registered) --ops --batch --loop=N (store keys 0..N-1 again in a
          cycle instead of new ones) --lookup-calls=chain|each (one lookup call per chain of
          16, the default, or one per block)
  policies  the registered eviction policies' names
  gpu     D2H/H2D bandwidth of the cuda device against one large cudaMemcpy
          --total --sizes=16K,... --batch --reps --max-blocks
  crc     GB/s on one core of the block checksum (ISA-L CRC-32C) against the one-stream
          loop it replaced; fails if they disagree  --sizes=4K,64K,1M,16M --total --reps
  scatter memcpy of one load's bytes from pinned slots, whole blocks against each block cut
          into pieces, one per layer tensor (vLLM's layout), on --threads threads
          --block-size --blocks --pieces --threads --reps
  recovery  seconds to open an engine on a persistent tier of --blocks 4 KiB block files
          (default 1M), warm and with the kernel's caches dropped; the tier is built once in
          --dir and reused  --block-size (payload, at most 4032) --reps --cold=auto|off
Each prints one JSON object on stdout; progress goes to stderr.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace kvoffload::bench;
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << kUsage;
    return 0;
  }
  Flags flags;
  std::string error;
  if (!flags.Parse(argc - 2, argv + 2, &error)) {
    std::cerr << "kvoffload-bench: " << error << "\n" << kUsage;
    return 2;
  }
  int (*run)(Flags&) = nullptr;
  if (cmd == "trace") run = RunTrace;
  if (cmd == "disk") run = RunDisk;
  if (cmd == "cpu") run = RunCpu;
  if (cmd == "policy") run = RunPolicy;
  if (cmd == "policies") run = RunPolicies;
  if (cmd == "gpu") run = RunGpu;
  if (cmd == "crc") run = RunCrc;
  if (cmd == "scatter") run = RunScatter;
  if (cmd == "recovery") run = RunRecovery;
  if (run == nullptr) {
    std::cerr << "kvoffload-bench: unknown subcommand \"" << cmd << "\"\n" << kUsage;
    return 2;
  }
  try {
    return run(flags);
  } catch (const std::exception& e) {  // a flag's value that is not a number
    std::cerr << "kvoffload-bench " << cmd << ": " << e.what() << "\n";
    return 2;
  }
}
