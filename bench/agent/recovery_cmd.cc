// `kvoffload-bench recovery`: how long an engine takes to open on a persistent disk tier that
// holds --blocks blocks (a pod restarting on its pvc.ref tier), from Engine::Open's call to its
// return, when lookups are served. Public API only.
//
// The tier is built through the engine itself (stores through a small pinned tier, then a
// write-back), so the files are exactly what the agent writes, and it is kept: a later run on
// the same --dir reuses it when an open finds exactly --blocks blocks and a sample of them loads
// back with the bytes stored. Building 1M files takes minutes; it is timed apart.
//
// Warm opens find the directory entries and inodes in the kernel's caches (a restarted
// container on the same node, soon after). Cold opens drop the caches first (`sync`, then
// 3 > /proc/sys/vm/drop_caches, which needs root on the host): a pod rescheduled after a while,
// or a volume attached to a new node. Where the caches cannot be dropped the cold figure is
// reported as not measured, with the reason.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "kvoffload/engine.h"

namespace kvoffload::bench {
namespace {

namespace fs = std::filesystem;

// The largest payload whose block file is one 4 KiB page (payload + 64-byte trailer): the
// most files, and so the most directory entries and inodes, per byte of tier.
constexpr size_t kDefaultBlock = 4096 - 64;
constexpr size_t kFileBytes = 4096;
// Blocks per store job while building, and the pinned tier's size: each job evicts the
// previous one's blocks to disk.
constexpr size_t kBatch = 256;
constexpr size_t kSample = 64;

BlockKey Key(uint64_t i) { return BlockKey{0x7265636f76657279ULL, i}; }  // "recovery"

// A block's payload: its index, then a byte pattern derived from it, so a block served under
// the wrong key or with stale bytes is caught.
std::byte PatternByte(uint64_t i, size_t k) { return std::byte((i * 131 + k) & 0xFF); }

void Fill(std::byte* p, size_t n, uint64_t i) {
  std::memcpy(p, &i, sizeof(i));
  for (size_t k = sizeof(i); k < n; ++k) p[k] = PatternByte(i, k);
}

bool Matches(const std::byte* p, size_t n, uint64_t i) {
  if (std::memcmp(p, &i, sizeof(i)) != 0) return false;
  for (size_t k = sizeof(i); k < n; ++k) {
    if (p[k] != PatternByte(i, k)) return false;
  }
  return true;
}

EngineConfig MakeConfig(const std::string& dir, size_t block, uint64_t blocks) {
  EngineConfig config;
  config.block_bytes = block;
  config.fingerprint.model = "kvoffload-bench-recovery";
  config.cpu_bytes = kBatch * kFileBytes;
  // Exactly the blocks: a reopen evicts nothing, and a tree of more blocks is not reused.
  config.tiers.push_back(DiskTierConfig{dir, "pvcRef", blocks * kFileBytes, true, false});
  return config;
}

int Fail(const std::string& what) {
  std::cerr << "kvoffload-bench recovery: " << what << "\n";
  return 1;
}

// Loads kSample blocks spread over the tier and checks their bytes; "" when all arrived.
std::string CheckSample(Engine& engine, size_t block, uint64_t blocks) {
  std::vector<std::byte> dev(kSample * block);
  std::vector<BlockKey> keys;
  std::vector<void*> ptrs;
  std::vector<uint64_t> index;
  for (size_t s = 0; s < kSample && s < blocks; ++s) {
    index.push_back(s * blocks / std::min<uint64_t>(kSample, blocks));
    keys.push_back(Key(index.back()));
    ptrs.push_back(dev.data() + s * block);
  }
  Result<JobId> job = engine.Load(keys, ptrs);
  Status s = job.ok() ? engine.Wait(*job) : job.status();
  if (!s.ok()) return "loading the sample: " + s.ToString();
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!Matches(dev.data() + k * block, block, index[k])) {
      return "block " + std::to_string(index[k]) + " came back with other bytes";
    }
  }
  return "";
}

struct Opened {
  std::unique_ptr<Engine> engine;
  uint64_t ns = 0;
  uint64_t cpu_ns = 0;  // of the whole process: the opening thread and its directory reader
};

// Wall time, and the CPU time the process spent meanwhile: on a shared machine the wall time
// also measures the other tenants; the CPU time is what the open costs cores of its own (the
// opening thread, and the thread that reads the directory ahead of it; the engine's other
// threads are idle until the open returns).
Result<Opened> TimedOpen(const EngineConfig& config) {
  const uint64_t c0 = ProcessCpuNs();
  const uint64_t t0 = NowNs();
  Result<std::unique_ptr<Engine>> engine = Engine::Open(config);
  const uint64_t t1 = NowNs();
  const uint64_t c1 = ProcessCpuNs();
  if (!engine.ok()) return engine.status();
  return Opened{std::move(engine).value(), t1 - t0, c1 - c0};
}

// Builds the tier from nothing through the engine: stores in jobs of kBatch blocks (each
// evicts the previous job's blocks from the pinned tier to disk), then a write-back of the
// last job's. Returns wall nanoseconds.
Result<uint64_t> Build(const EngineConfig& config, uint64_t blocks) {
  fs::remove_all(fs::path(config.tiers[0].path) / "kvoffload-v1");
  const uint64_t t0 = NowNs();
  Result<std::unique_ptr<Engine>> opened = Engine::Open(config);
  if (!opened.ok()) return opened.status();
  Engine& engine = **opened;
  const size_t block = config.block_bytes;
  std::vector<std::byte> dev(kBatch * block);
  std::vector<BlockKey> keys;
  std::vector<void*> ptrs;
  Progress progress("recovery build", blocks);
  for (uint64_t first = 0; first < blocks; first += kBatch) {
    const size_t m = std::min<uint64_t>(kBatch, blocks - first);
    keys.resize(m);
    ptrs.resize(m);
    for (size_t j = 0; j < m; ++j) {
      keys[j] = Key(first + j);
      ptrs[j] = dev.data() + j * block;
      Fill(dev.data() + j * block, block, first + j);
    }
    Result<JobId> job = engine.Store(keys, ptrs);
    Status s = job.ok() ? engine.Wait(*job) : job.status();
    if (!s.ok()) return s;
    progress.Update(first + m);
  }
  WriteBackReport wb = engine.WriteBack(std::chrono::hours(1));
  if (wb.failed + wb.left > 0) {
    return Status::IOError("write-back left " + std::to_string(wb.failed + wb.left) +
                           " blocks unwritten");
  }
  const uint64_t on_disk = engine.Stats().tiers.at(1).blocks;
  if (on_disk != blocks) {
    return Status::Internal("built " + std::to_string(on_disk) + " blocks on disk, wanted " +
                            std::to_string(blocks));
  }
  opened.value().reset();
  return NowNs() - t0;
}

// Puts the tree back as built after a run stored `added` (removed here) and so evicted some
// recovered blocks (written again, from their keys). "" when it is whole again.
std::string Restore(const EngineConfig& config, uint64_t blocks,
                    const std::vector<BlockKey>& added) {
  const fs::path scope = fs::path(config.tiers[0].path) / "kvoffload-v1" /
                         config.fingerprint.Scope(config.block_bytes).ToHex();
  for (const BlockKey& k : added) fs::remove(scope / (k.ToHex() + ".blk"));
  Result<std::unique_ptr<Engine>> opened = Engine::Open(config);
  if (!opened.ok()) return "reopening to restore: " + opened.status().ToString();
  Engine& engine = **opened;
  std::vector<uint64_t> missing;
  std::vector<BlockKey> chunk;
  for (uint64_t first = 0; first < blocks; first += 65536) {
    chunk.clear();
    for (uint64_t i = first; i < std::min<uint64_t>(blocks, first + 65536); ++i) {
      chunk.push_back(Key(i));
    }
    const std::vector<int> where = engine.Where(chunk);
    for (size_t j = 0; j < where.size(); ++j) {
      if (where[j] < 0) missing.push_back(first + j);
    }
  }
  const size_t block = config.block_bytes;
  for (size_t at = 0; at < missing.size(); at += kBatch) {
    const size_t m = std::min(kBatch, missing.size() - at);
    std::vector<std::byte> dev(m * block);
    std::vector<BlockKey> keys;
    std::vector<void*> ptrs;
    for (size_t j = 0; j < m; ++j) {
      keys.push_back(Key(missing[at + j]));
      ptrs.push_back(dev.data() + j * block);
      Fill(dev.data() + j * block, block, missing[at + j]);
    }
    Result<JobId> job = engine.Store(keys, ptrs);
    if (Status s = job.ok() ? engine.Wait(*job) : job.status(); !s.ok()) {
      return "restoring: " + s.ToString();
    }
    WriteBackReport wb = engine.WriteBack(std::chrono::hours(1));
    if (wb.failed + wb.left > 0) return "restoring: the write-back left blocks unwritten";
  }
  if (engine.Stats().tiers.at(1).blocks != blocks) {
    return "restored " + std::to_string(engine.Stats().tiers.at(1).blocks) + " blocks, not " +
           std::to_string(blocks);
  }
  return "";
}

// "" when the page cache, dentries and inodes were dropped; else why not.
std::string DropCaches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  if (!f) {
    return std::string("cannot write 3 to /proc/sys/vm/drop_caches (needs root on the host, "
                       "not only in a container): ") + std::strerror(errno);
  }
  return "";
}

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

// Wall times (and the opening thread's CPU times) of the opens.
struct Runs {
  std::vector<uint64_t> ns;
  std::vector<uint64_t> cpu_ns;
};

nlohmann::json Summary(Runs r) {
  std::sort(r.ns.begin(), r.ns.end());
  std::sort(r.cpu_ns.begin(), r.cpu_ns.end());
  nlohmann::json runs = nlohmann::json::array();
  for (uint64_t x : r.ns) runs.push_back(Seconds(x));
  nlohmann::json cpu = nlohmann::json::array();
  for (uint64_t x : r.cpu_ns) cpu.push_back(Seconds(x));
  return {{"min_s", Seconds(r.ns.front())},
          {"median_s", Seconds(r.ns[r.ns.size() / 2])},
          {"max_s", Seconds(r.ns.back())},
          {"runs_s", runs},
          {"cpu_median_s", Seconds(r.cpu_ns[r.cpu_ns.size() / 2])},
          {"cpu_runs_s", cpu}};
}

}  // namespace

int RunRecovery(Flags& flags) {
  const std::string dir_flag = flags.GetString("dir", "");
  const uint64_t blocks = flags.GetU64("blocks", 1 << 20);
  const size_t block = flags.GetBytes("block-size", kDefaultBlock);
  const uint64_t reps = std::max<uint64_t>(flags.GetU64("reps", 3), 1);
  const std::string cold = flags.GetString("cold", "auto");
  if (!flags.Done("recovery")) return 2;
  if (dir_flag.empty()) return Fail("--dir is required (a directory on the disk to measure)");
  if (blocks == 0) return Fail("--blocks=0: the tier needs at least one block");
  if (block == 0 || block + 64 > kFileBytes) {
    return Fail("--block-size=" + std::to_string(block) + " must be 1 to " +
                std::to_string(kDefaultBlock) + " bytes (one 4 KiB file per block)");
  }
  if (cold != "auto" && cold != "off") return Fail("--cold=" + cold + ": auto or off");
  const std::string dir = fs::absolute(dir_flag).string();  // tiers need absolute paths
  fs::create_directories(dir);
  const EngineConfig config = MakeConfig(dir, block, blocks);

  // Reuse the tree when it is the one asked for: exactly `blocks` recovered, sample intact.
  nlohmann::json built = {{"reused", true}};
  {
    Result<Opened> check = TimedOpen(config);
    if (!check.ok()) return Fail(check.status().ToString());
    const uint64_t found = check->engine->Stats().tiers.at(1).blocks;
    const std::string bad = found == blocks ? CheckSample(*check->engine, block, blocks)
                                            : std::to_string(found) + " blocks found";
    if (!bad.empty()) {
      std::fprintf(stderr, "[kvoffload-bench] recovery: building %llu blocks in %s (%s)\n",
                   static_cast<unsigned long long>(blocks), dir.c_str(), bad.c_str());
      check->engine.reset();
      Result<uint64_t> ns = Build(config, blocks);
      if (!ns.ok()) return Fail("building the tier: " + ns.status().ToString());
      built = {{"reused", false},
               {"build_s", Seconds(*ns)},
               {"build_blocks_per_s", static_cast<double>(blocks) / Seconds(*ns)}};
    }
  }

  std::string describe;
  auto measure = [&](bool drop, Runs* out) -> std::string {
    for (uint64_t r = 0; r < reps; ++r) {
      if (drop) {
        if (std::string why = DropCaches(); !why.empty()) return why;
      }
      Result<Opened> o = TimedOpen(config);
      if (!o.ok()) return "open failed: " + o.status().ToString();
      const uint64_t found = o->engine->Stats().tiers.at(1).blocks;
      if (found != blocks) {
        return "open found " + std::to_string(found) + " blocks, not " + std::to_string(blocks);
      }
      describe = o->engine->Describe();
      out->ns.push_back(o->ns);
      out->cpu_ns.push_back(o->cpu_ns);
    }
    return "";
  };
  Runs warm_ns;
  // One untimed open first: the tree was just built or checked, so its entries are cached.
  if (std::string why = measure(false, &warm_ns); !why.empty()) return Fail(why);
  warm_ns = {};
  if (std::string why = measure(false, &warm_ns); !why.empty()) return Fail(why);
  nlohmann::json cold_json;
  if (cold == "off") {
    cold_json = {{"measured", false}, {"reason", "--cold=off"}};
  } else {
    Runs cold_ns;
    const std::string why = measure(true, &cold_ns);
    if (!why.empty() && cold_ns.ns.empty()) {
      cold_json = {{"measured", false}, {"reason", why}};
    } else if (!why.empty()) {
      return Fail(why);
    } else {
      cold_json = Summary(cold_ns);
      cold_json["measured"] = true;
    }
  }

  // The recovered blocks are served: a sample spread over the tier, read and verified (the
  // first reads after a cold open, when the cold run was possible). Then the first eviction:
  // a store into the full tier demotes a block to disk0, which must evict a recovered block,
  // oldest first, and so waits until the tier's thread has stat'ed and ordered them all.
  if (cold_json["measured"].get<bool>()) (void)DropCaches();
  Result<Opened> last = TimedOpen(config);
  if (!last.ok()) return Fail(last.status().ToString());
  const uint64_t t0 = NowNs();
  if (std::string bad = CheckSample(*last->engine, block, blocks); !bad.empty()) return Fail(bad);
  const uint64_t t1 = NowNs();
  // kBatch + 1 new blocks into the pinned tier of kBatch: at least one goes down to disk0.
  std::vector<std::byte> dev((kBatch + 1) * block);
  std::vector<BlockKey> keys;
  std::vector<void*> ptrs;
  for (size_t j = 0; j <= kBatch; ++j) {
    keys.push_back(Key(blocks + j));
    ptrs.push_back(dev.data() + j * block);
    Fill(dev.data() + j * block, block, blocks + j);
  }
  Result<JobId> job = last->engine->Store(keys, ptrs);
  if (Status s = job.ok() ? last->engine->Wait(*job) : job.status(); !s.ok()) {
    return Fail("the first store after the open: " + s.ToString());
  }
  const uint64_t t2 = NowNs();
  const uint64_t evicted = last->engine->Stats().tiers.at(1).evictions;
  last->engine.reset();
  if (evicted == 0) return Fail("the first store after the open evicted nothing from disk0");
  if (std::string bad = Restore(config, blocks, keys); !bad.empty()) return Fail(bad);

  const nlohmann::json out = {{"dir", dir},
                              {"blocks", blocks},
                              {"block_bytes", block},
                              {"file_bytes", kFileBytes},
                              {"tier_bytes", blocks * kFileBytes},
                              {"reps", reps},
                              {"build", built},
                              {"warm", Summary(warm_ns)},
                              {"cold", cold_json},
                              {"sample_blocks", kSample},
                              {"sample_load_s", Seconds(t1 - t0)},
                              // From the open's return: the sample's reads, then a store
                              // whose demotion evicts a recovered block.
                              {"first_eviction_after_open_s", Seconds(t2 - t0)},
                              {"describe", describe}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace kvoffload::bench
