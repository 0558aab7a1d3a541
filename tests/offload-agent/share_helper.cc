// One replica in the two-process sharing test: opens an engine on a shared, persistent tier and
// either stores a key range then verifies every key of both replicas ("serve"), or stores and
// loads continuously under capacity pressure ("churn": six rounds; "churn-until": rounds until
// <dir>/stop exists, then one more). Writes "exact=N foreign=N wrong=N" to <dir>/<role>.result;
// exits 0 when it ran to the end.
//   share_helper <dir> <serve|churn|churn-until> <role> <first> <count> <all_first> <all_count>
//                <capacity_blocks>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "test_util.h"

namespace kvoffload::testing {
namespace {

bool WaitForFile(const std::string& path) {
  for (int i = 0; i < 3000 && !std::filesystem::exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::filesystem::exists(path);
}

int Run(int argc, char** argv) {
  if (argc != 9) {
    std::cerr << "usage: share_helper dir mode role first count all_first all_count capacity\n";
    return 64;
  }
  const std::string dir = argv[1], mode = argv[2], role = argv[3];
  const uint64_t first = std::stoull(argv[4]), count = std::stoull(argv[5]);
  const uint64_t all_first = std::stoull(argv[6]), all_count = std::stoull(argv[7]);
  const size_t capacity = std::stoul(argv[8]);
  const std::string other = role == "a" ? "b" : "a";

  std::filesystem::create_directory(dir + "/tier");  // the volume every replica mounts
  Result<std::unique_ptr<Engine>> opened =
      Engine::Open(Config(1, {Tier(dir + "/tier", capacity, /*persistent=*/true, /*shared=*/true)}));
  if (!opened.ok()) {
    std::cerr << opened.status().ToString() << "\n";
    return 65;
  }
  Engine& e = **opened;
  uint64_t exact = 0, foreign = 0, wrong = 0;
  // Loads every key of the shared range that lookup reports; checks the bytes.
  auto verify = [&] {
    for (uint64_t k = all_first; k < all_first + all_count; ++k) {
      Blocks b = Blocks::Make(k, 1);
      if (e.Lookup(b.keys).prefix == 0) continue;
      Blocks out = b.Empty();
      if (!LoadAndWait(e, out).ok()) {
        // Evicted by the other replica meanwhile: a miss, and nothing may have been written.
        if (out.data[0] != std::vector<std::byte>(kBlock)) ++wrong;
        continue;
      }
      if (out.data[0] != b.data[0]) {
        ++wrong;
        continue;
      }
      ++exact;
      if (k < first || k >= first + count) ++foreign;
    }
  };
  // Stores keys [from, from + n) in batches of 4, then one key of our own so the last real
  // block leaves the single pinned slot for the shared disk.
  auto store = [&](uint64_t from, uint64_t n) {
    for (uint64_t k = from; k < from + n; k += 4) {
      Blocks b = Blocks::Make(k, std::min<uint64_t>(4, from + n - k));
      if (!StoreAndWait(e, b).ok()) ++wrong;
    }
    Blocks flush = Blocks::Make(role == "a" ? 1'000'000 : 2'000'000, 1);
    if (!StoreAndWait(e, flush).ok()) ++wrong;
  };

  if (mode == "serve") {
    store(first, count);
    std::ofstream(dir + "/" + role + ".stored") << "done";
    if (!WaitForFile(dir + "/" + other + ".stored")) return 66;
    verify();
  } else if (mode == "churn-until") {
    bool last = false;
    for (uint64_t round = 0; !last; ++round) {
      last = std::filesystem::exists(dir + "/stop");
      store(first + (round % 6) * count / 6, count / 6);
      verify();
    }
  } else {
    for (int round = 0; round < 6; ++round) {
      store(first + static_cast<uint64_t>(round) * count / 6, count / 6);
      verify();
    }
  }
  std::ofstream(dir + "/" + role + ".result")
      << "exact=" << exact << " foreign=" << foreign << " wrong=" << wrong;
  return 0;
}

}  // namespace
}  // namespace kvoffload::testing

int main(int argc, char** argv) { return kvoffload::testing::Run(argc, argv); }
