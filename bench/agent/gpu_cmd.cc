// `kvoffload-bench gpu`: D2H and H2D bandwidth of the agent's "cuda" device backend for block
// sizes 16 KiB..8 MiB, one CopyAsync per block against batched CopyAsync calls (the engine's
// shape: one call per job), each against the ceiling: one cudaMemcpy of the whole pinned
// buffer, measured in the same run. Built only where the CUDA backend is (make
// agent-cuda-build); bench/gpu/run.sh runs it on a GPU node.
#include <iostream>

#include "cli.h"

#if KVOFFLOAD_BENCH_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/device.h"
#endif

namespace kvoffload::bench {

#if KVOFFLOAD_BENCH_HAVE_CUDA
namespace {

double GiBps(uint64_t bytes, uint64_t ns) {
  return static_cast<double>(bytes) / static_cast<double>(ns) * 1e9 / static_cast<double>(1ULL << 30);
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::cerr << "kvoffload-bench gpu: " << what << ": " << cudaGetErrorString(err) << "\n";
  return false;
}

// Best of `reps` (the first call of each shape pays for lazy setup).
template <typename F>
uint64_t BestNs(int reps, F&& f) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < reps; ++i) {
    const uint64_t t0 = NowNs();
    if (!f()) return 0;
    best = std::min(best, NowNs() - t0);
  }
  return best;
}

}  // namespace

int RunGpu(Flags& flags) {
  const uint64_t total = flags.GetBytes("total", 1ULL << 30);
  const std::string sizes = flags.GetString("sizes", "16K,64K,256K,1M,2M,4M,8M");
  const size_t batch = flags.GetU64("batch", 256);
  const int reps = static_cast<int>(flags.GetU64("reps", 3));
  // Caps the calls per shape (16 KiB blocks: 256 MiB), keeping the script within minutes.
  const size_t max_blocks = flags.GetU64("max-blocks", 16384);
  if (!flags.Done("gpu")) return 2;

  Result<std::unique_ptr<DeviceBackend>> made = NewDeviceBackend("cuda");
  if (!made.ok()) {
    std::cerr << "kvoffload-bench gpu: " << made.status().ToString() << "\n";
    return 1;
  }
  DeviceBackend& cuda = **made;
  std::fprintf(stderr, "[kvoffload-bench] %s\n", cuda.Describe().c_str());
  Result<std::unique_ptr<PinnedRegion>> pinned = cuda.AllocatePinned(total);
  if (!pinned.ok()) {
    std::cerr << "kvoffload-bench gpu: " << pinned.status().ToString() << "\n";
    return 1;
  }
  std::byte* host = (*pinned)->data();
  void* dev_raw = nullptr;
  if (!Check(cudaMalloc(&dev_raw, total), "cudaMalloc")) return 1;
  auto* dev = static_cast<std::byte*>(dev_raw);
  if (!Check(cudaMemset(dev, 0x5a, total), "cudaMemset")) return 1;

  nlohmann::json out = {{"device", cuda.Describe()}, {"total_bytes", total}, {"batch", batch}};
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) out["gpu"] = prop.name;
  for (CopyDirection dir : {CopyDirection::kDeviceToHost, CopyDirection::kHostToDevice}) {
    const bool d2h = dir == CopyDirection::kDeviceToHost;
    const char* label = d2h ? "d2h" : "h2d";
    const uint64_t ceiling_ns = BestNs(reps, [&] {
      return Check(d2h ? cudaMemcpy(host, dev, total, cudaMemcpyDeviceToHost)
                       : cudaMemcpy(dev, host, total, cudaMemcpyHostToDevice),
                   "cudaMemcpy");
    });
    if (ceiling_ns == 0) return 1;
    const double ceiling = GiBps(total, ceiling_ns);
    out[label]["ceiling_gibps"] = ceiling;
    std::stringstream ss(sizes);
    for (std::string item; std::getline(ss, item, ',');) {
      uint64_t block = std::stoull(item);
      if (item.back() == 'K') block <<= 10;
      if (item.back() == 'M') block <<= 20;
      const size_t n = std::min<size_t>(total / block, max_blocks);
      std::vector<CopyOp> ops(n);
      for (size_t i = 0; i < n; ++i) {
        ops[i] = d2h ? CopyOp{host + i * block, dev + i * block, block}
                     : CopyOp{dev + i * block, host + i * block, block};
      }
      // Tickets are waited at the end: the copies of one shape are all in flight together.
      auto run = [&](size_t per_call) {
        std::vector<std::unique_ptr<CopyTicket>> tickets;
        for (size_t i = 0; i < n; i += per_call) {
          Result<std::unique_ptr<CopyTicket>> t =
              cuda.CopyAsync(dir, std::span(ops).subspan(i, std::min(per_call, n - i)));
          if (!t.ok()) {
            std::cerr << "kvoffload-bench gpu: " << t.status().ToString() << "\n";
            return false;
          }
          tickets.push_back(std::move(*t));
        }
        for (auto& t : tickets) {
          if (Status s = t->Wait(); !s.ok()) {
            std::cerr << "kvoffload-bench gpu: " << s.ToString() << "\n";
            return false;
          }
        }
        return true;
      };
      const uint64_t per_block_ns = BestNs(reps, [&] { return run(1); });
      const uint64_t batched_ns = BestNs(reps, [&] { return run(batch); });
      if (per_block_ns == 0 || batched_ns == 0) return 1;
      const double per_block = GiBps(n * block, per_block_ns);
      const double batched = GiBps(n * block, batched_ns);
      out[label]["blocks"].push_back({{"block_bytes", block},
                                      {"per_block_gibps", per_block},
                                      {"batched_gibps", batched},
                                      {"batched_of_ceiling", batched / ceiling},
                                      {"per_block_of_ceiling", per_block / ceiling},
                                      {"batched_speedup", batched / per_block}});
      std::fprintf(stderr, "[kvoffload-bench] gpu %s %s: per-block %.1f GiB/s, batched %.1f GiB/s, ceiling %.1f\n",
                   label, item.c_str(), per_block, batched, ceiling);
    }
  }
  cudaFree(dev);
  std::cout << out.dump(2) << "\n";
  return 0;
}
#else
int RunGpu(Flags& flags) {
  static_cast<void>(flags);
  std::cerr << "kvoffload-bench gpu: built without the CUDA backend; build with "
               "make agent-cuda-build (see bench/gpu/run.sh)\n";
  return 2;
}
#endif

}  // namespace kvoffload::bench
