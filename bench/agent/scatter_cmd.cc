// `kvoffload-bench scatter`: memcpy of one load's bytes, laid out as a load from the pinned tier
// meets them, on --threads threads: --blocks blocks from pinned slots (block + trailer, 4 KiB
// aligned, as the engine keeps them) into a destination as large as the load, either each block
// whole into one row of one buffer, or cut into --pieces equal pieces, piece p into row b of
// buffer p (vLLM keeps one KV tensor per layer, so a block is one row of each). The `cpu`
// subcommand's reference copies into a small device buffer that stays in the cache; a load
// writes every byte of its rows once, so this is the reference a single load of that size has.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"

namespace kvoffload::bench {
namespace {

// Touched once, so that no timed copy takes a first-touch page fault.
std::byte* Map(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap " + std::to_string(bytes) + " bytes");
  std::memset(p, 0x5a, bytes);
  return static_cast<std::byte*>(p);
}

}  // namespace

int RunScatter(Flags& flags) {
  const size_t block = flags.GetBytes("block-size", 196608);
  const size_t blocks = std::max<uint64_t>(flags.GetU64("blocks", 128), 1);
  const size_t pieces = std::max<uint64_t>(flags.GetU64("pieces", 6), 1);
  const size_t threads = std::max<uint64_t>(flags.GetU64("threads", 2), 1);
  const uint64_t reps = std::max<uint64_t>(flags.GetU64("reps", 200), 1);
  if (!flags.Done("scatter")) return 2;
  if (block % pieces != 0) {
    std::cerr << "kvoffload-bench scatter: --block-size=" << block << " is not a multiple of "
              << "--pieces=" << pieces << "; give a block size that the pieces divide\n";
    return 2;
  }
  const size_t piece = block / pieces;
  const size_t slot = (block + 64 + 4095) / 4096 * 4096;
  std::byte* const slots = Map(blocks * slot);
  std::byte* const whole = Map(blocks * block);
  std::vector<std::byte*> rows;
  for (size_t p = 0; p < pieces; ++p) rows.push_back(Map(blocks * piece));

  // Block b goes to thread b % threads; threads start and join inside the timing, as the host
  // device's hand-offs are inside a load's.
  auto run = [&](bool scattered) {
    const uint64_t t0 = NowNs();
    std::vector<std::thread> pool;
    for (size_t th = 0; th < threads; ++th) {
      pool.emplace_back([&, th] {
        for (size_t b = th; b < blocks; b += threads) {
          const std::byte* src = slots + b * slot;
          if (!scattered) {
            std::memcpy(whole + b * block, src, block);
            continue;
          }
          for (size_t p = 0; p < pieces; ++p) {
            std::memcpy(rows[p] + b * piece, src + p * piece, piece);
          }
        }
      });
    }
    for (std::thread& t : pool) t.join();
    return NowNs() - t0;
  };
  // Alternating, each its best: the other tenants of a shared machine come and go.
  uint64_t best_whole = UINT64_MAX, best_scattered = UINT64_MAX;
  for (uint64_t r = 0; r < reps; ++r) {
    best_whole = std::min(best_whole, run(false));
    best_scattered = std::min(best_scattered, run(true));
  }
  auto gibps = [&](uint64_t ns) {
    return static_cast<double>(blocks * block) / static_cast<double>(ns) * 1e9 / (1 << 30);
  };
  const nlohmann::json out = {{"block_bytes", block},
                              {"blocks", blocks},
                              {"pieces", pieces},
                              {"threads", threads},
                              {"reps", reps},
                              {"whole_ms", static_cast<double>(best_whole) / 1e6},
                              {"whole_gibps", gibps(best_whole)},
                              {"scattered_ms", static_cast<double>(best_scattered) / 1e6},
                              {"scattered_gibps", gibps(best_scattered)}};
  std::cout << out.dump(2) << "\n";
  ::munmap(slots, blocks * slot);
  ::munmap(whole, blocks * block);
  for (std::byte* p : rows) ::munmap(p, blocks * piece);
  return 0;
}

}  // namespace kvoffload::bench
