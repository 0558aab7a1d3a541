// The process under test in the crash-safety trials, linked to libkvoffload as a
// vLLM replica would be.
//   crash_helper write <tier>            stores keys 0,1,2,... (wrapping at kKeys) until killed
//   crash_helper verify <tier> <result>  opens the tier (timing the recovery scan), loads every
//                                        key it reports and compares with what was written
//   crash_helper hammer <tier> <seconds> <seed> <result>   shared tier: stores and loads a key
//                                        space another process hammers too, for <seconds>
// Results: "exact=N wrong=N missed=N recovery_us=N". A block's content is a function of its key
// (Pattern), as KV blocks are of their content hash, so every load can be checked.
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "test_util.h"

namespace kvoffload::testing {
namespace {

constexpr uint64_t kKeys = 256;          // 4x the disk tier: eviction runs throughout
constexpr size_t kDiskBlocks = 64;

using Clock = std::chrono::steady_clock;

// Loads key k into a zeroed buffer. exact: the bytes written; wrong: anything else served;
// missed: a lookup hit that then failed to load (evicted meanwhile) with the buffer untouched.
void Check(Engine& e, uint64_t k, uint64_t* exact, uint64_t* wrong, uint64_t* missed) {
  Blocks b = Blocks::Make(k, 1);
  if (e.Lookup(b.keys).prefix == 0) return;
  Blocks out = b.Empty();
  if (!LoadAndWait(e, out).ok()) {
    if (out.data[0] != std::vector<std::byte>(kBlock)) {
      ++*wrong;  // a failed load must not have written anything
    } else {
      ++*missed;
    }
    return;
  }
  if (out.data[0] == b.data[0]) {
    ++*exact;
  } else {
    ++*wrong;
  }
}

int Run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: crash_helper write|verify|hammer <tier> ...\n";
    return 64;
  }
  const std::string mode = argv[1], tier = argv[2];
  const bool shared = mode == "hammer";
  const auto start = Clock::now();
  Result<std::unique_ptr<Engine>> opened =
      Engine::Open(Config(1, {Tier(tier, kDiskBlocks, /*persistent=*/true, shared)}));
  const auto recovery =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  if (!opened.ok()) {
    std::cerr << opened.status().ToString() << "\n";
    return 65;
  }
  Engine& e = **opened;
  uint64_t exact = 0, wrong = 0, missed = 0;
  if (mode == "write") {
    std::ofstream(tier + "/.ready") << "1";  // the parent kills only once writing has begun
    for (uint64_t i = 0;; ++i) {
      // Batches of 4 with a one-block CPU tier: each store pushes blocks down to the disk.
      Blocks b = Blocks::Make(i * 4 % kKeys, 4);
      if (!StoreAndWait(e, b).ok()) return 66;
    }
  }
  if (mode == "verify" && argc == 4) {
    for (uint64_t k = 0; k < kKeys; ++k) Check(e, k, &exact, &wrong, &missed);
  } else if (mode == "hammer" && argc == 6) {
    const auto deadline = start + std::chrono::seconds(std::stoi(argv[3]));
    std::mt19937_64 rng(std::stoull(argv[4]));
    while (Clock::now() < deadline) {
      const uint64_t k = rng() % kKeys;
      if (rng() % 2 == 0) {
        Blocks b = Blocks::Make(k, 1);
        if (!StoreAndWait(e, b).ok()) ++wrong;
      } else {
        Check(e, k, &exact, &wrong, &missed);
      }
    }
  } else {
    std::cerr << "crash_helper: bad arguments for " << mode << "\n";
    return 64;
  }
  std::ofstream(argv[argc - 1]) << "exact=" << exact << " wrong=" << wrong << " missed=" << missed
                                << " recovery_us=" << recovery;
  return 0;
}

}  // namespace
}  // namespace kvoffload::testing

int main(int argc, char** argv) { return kvoffload::testing::Run(argc, argv); }
