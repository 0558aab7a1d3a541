// `kvoffload-bench crc`: GB/s per core (bytes per second of thread CPU time) of the block
// checksum the agent uses (ISA-L's CRC-32C) against the one-stream loop it replaced (the SSE4.2
// crc32 instruction, 8 bytes at a time, each step waiting for the previous one; a byte table
// where there is no SSE4.2), over buffers of each --sizes, every buffer checksummed whole as a
// block's payload is. Both must give the same checksums, or the run fails: the comparison is
// also a check of the format.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "crc32c.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvoffload::bench {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) ? (c >> 1) ^ 0x82F63B78U : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t OneStreamTable(const std::byte* data, size_t len, uint32_t crc) {
  for (size_t i = 0; i < len; ++i) {
    crc = kTable[(crc ^ static_cast<uint32_t>(data[i])) & 0xFFU] ^ (crc >> 8);
  }
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t OneStreamSse42(const std::byte* data, size_t len,
                                                           uint32_t crc) {
  uint64_t c = crc;
  for (; len >= 8; data += 8, len -= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; len > 0; ++data, --len) c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*data));
  return c32;
}
#endif

// The replaced implementation, same convention as Crc32c (seed and result inverted).
uint32_t OneStream(const std::byte* data, size_t len) {
#if defined(__x86_64__)
  static const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
  if (kHasSse42) return ~OneStreamSse42(data, len, 0xFFFFFFFFU);
#endif
  return ~OneStreamTable(data, len, 0xFFFFFFFFU);
}

// "4K,64K,1M": sizes in bytes, K/M suffixes binary.
std::vector<uint64_t> ParseSizes(const std::string& list) {
  std::vector<uint64_t> sizes;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    uint64_t size = std::stoull(item);
    if (item.back() == 'K') size <<= 10;
    if (item.back() == 'M') size <<= 20;
    sizes.push_back(size);
  }
  return sizes;
}

// GB/s (10^9 bytes per second of this thread's CPU time, as storage bandwidth is quoted) of one
// pass over `bufs`, each checksummed whole; `sums` gets each buffer's checksum.
template <typename Fn>
double Pass(Fn crc, const std::vector<std::vector<std::byte>>& bufs, std::vector<uint32_t>* sums) {
  uint64_t bytes = 0;
  const uint64_t t0 = ThreadCpuNs();
  for (size_t i = 0; i < bufs.size(); ++i) {
    (*sums)[i] = crc(bufs[i].data(), bufs[i].size());
    bytes += bufs[i].size();
  }
  const uint64_t ns = std::max<uint64_t>(ThreadCpuNs() - t0, 1);
  return static_cast<double>(bytes) / static_cast<double>(ns);
}

}  // namespace

int RunCrc(Flags& flags) {
  const std::vector<uint64_t> sizes = ParseSizes(flags.GetString("sizes", "4K,64K,1M,16M"));
  const uint64_t total = flags.GetBytes("total", 256ULL << 20);
  const uint64_t reps = flags.GetU64("reps", 5);
  if (!flags.Done("crc")) return 2;
  nlohmann::json results = nlohmann::json::array();
  for (const uint64_t size : sizes) {
    if (size == 0 || size > total) {
      std::cerr << "kvoffload-bench crc: --sizes entry " << size
                << " must be between 1 and --total (" << total << ")\n";
      return 2;
    }
    // `total` bytes in buffers of `size`: past the caches for the large sizes, as the payloads
    // of blocks just copied from the GPU are.
    std::vector<std::vector<std::byte>> bufs(total / size, std::vector<std::byte>(size));
    uint32_t seed = 12345;
    for (auto& b : bufs) {
      for (std::byte& x : b) x = std::byte((seed = seed * 1103515245U + 12345U) >> 24);
    }
    std::vector<uint32_t> new_sums(bufs.size());
    std::vector<uint32_t> old_sums(bufs.size());
    // Alternating passes, best of each: both see the same caches and the same neighbours.
    double isal = 0;
    double one = 0;
    for (uint64_t r = 0; r < reps; ++r) {
      isal = std::max(isal, Pass([](const std::byte* p, size_t n) { return Crc32c(p, n); }, bufs,
                                 &new_sums));
      one = std::max(one, Pass(OneStream, bufs, &old_sums));
    }
    if (new_sums != old_sums) {
      std::cerr << "kvoffload-bench crc: the checksums differ at " << size << "-byte buffers\n";
      return 1;
    }
    results.push_back({{"buffer_bytes", size},
                       {"buffers", bufs.size()},
                       {"isal_gbps", isal},
                       {"one_stream_gbps", one},
                       {"speedup", isal / one}});
  }
  std::cout << nlohmann::json{{"threads", 1}, {"reps", reps}, {"results", results}}.dump(2)
            << "\n";
  return 0;
}

}  // namespace kvoffload::bench
