// `kvoffload-bench disk` and `kvoffload-bench cpu`: bytes per second through the engine with
// the host device, using only the public API (Engine::Open, Store, Load, Wait, Stats).
//
// disk: a small pinned tier in front of one disk tier, so every stored block is evicted to
//   disk (the store figure is the disk write path: slot -> checksummed file -> publish), then
//   the blocks are loaded back from disk (the read path: verified read -> promote -> device).
//   Queue depth: fio (run with the same iodepth by bench/agent/run.py) keeps `qd` transfers
//   queued and refills on every completion, so the engine gets `qd` workers and `qd` client
//   threads, each keeping one job in flight: one-block store jobs (a disk write per eviction)
//   and, by default, one-block load jobs. --load-batch / --load-jobs give other load shapes
//   (--load-batch=8 --load-jobs=1 is one 8-block job at a time, whose queue drains to
//   nothing at the end of every job, which fio's never does). --store-batch / --store-jobs do
//   the same for stores: --store-batch=8 --store-jobs=1 is how vLLM stores, a step's new
//   blocks in one job. The pinned tier's demoter writes evictions to disk in batches of
//   --demote-batch (default qd) ahead of the stores that need the slots.
//   --state=empty times an empty tier; --state=full the steady state of a tier that serves
//   traffic: the tier holds exactly the blocks of one pass and is filled by an untimed pass
//   first, so every timed store evicts a block from disk, and the loads read a full tier.
// cpu: the pinned tier alone, large enough for every block; one warm round (pages touched,
//   tier full), then timed rounds of fresh blocks (store evicts the old ones) and loads,
//   each followed by memcpy of the same bytes in the same block-sized pieces; best of each.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "kvoffload/cpu_budget.h"
#include "kvoffload/engine.h"

namespace kvoffload::bench {
namespace {

// FORMAT.md: a block file (and a pinned slot) is the payload plus a 64-byte trailer, rounded
// up to 4096.
size_t SlotBytes(size_t block) { return (block + 64 + 4095) / 4096 * 4096; }

// Emulated device memory: touched and non-zero, so no copy reads the shared zero page.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes)
      : data(static_cast<std::byte*>(
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))),
        size(bytes) {
    if (data == MAP_FAILED) throw std::runtime_error("mmap device buffer");
    std::memset(data, 0x5a, size);
  }
  ~DeviceBuffer() { ::munmap(data, size); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* data;
  size_t size;
};

BlockKey Key(uint64_t round, uint64_t i) { return BlockKey{round + 1, i}; }

// Runs store (or load) jobs over keys [first, end) of `round`, `per_job` blocks each, from
// `clients` threads that each submit one job and wait for it: a new job starts as soon as any
// job finishes, as fio refills its queue on every completion (one thread waiting on the oldest
// job would leave the engine idle behind a slow one). Client c uses device slots
// [c * per_job, (c + 1) * per_job). Returns wall nanoseconds.
Result<uint64_t> RunJobs(Engine& engine, bool store, uint64_t round, size_t first, size_t end,
                         size_t per_job, size_t clients, DeviceBuffer& dev, size_t block,
                         const char* what) {
  if (clients * per_job * block > dev.size) {
    return Status::InvalidArgument(std::string(what) + ": device buffer too small");
  }
  std::atomic<size_t> next{first};
  std::atomic<size_t> finished{0};
  std::mutex mu;
  Status first_error;
  auto client = [&](size_t c, Progress* progress) {
    std::vector<BlockKey> keys;
    std::vector<void*> ptrs;
    for (size_t i; (i = next.fetch_add(per_job)) < end;) {
      const size_t m = std::min(per_job, end - i);
      keys.resize(m);
      ptrs.resize(m);
      for (size_t j = 0; j < m; ++j) {
        keys[j] = Key(round, i + j);
        ptrs[j] = dev.data + (c * per_job + j) * block;
      }
      Result<JobId> job = store ? engine.Store(keys, ptrs) : engine.Load(keys, ptrs);
      Status s = job.ok() ? engine.Wait(*job) : job.status();
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
        return;
      }
      finished += m;
      if (progress != nullptr) progress->Update(finished.load());
    }
  };
  Progress progress(what, end - first);
  const uint64_t t0 = NowNs();
  std::vector<std::thread> threads;
  for (size_t c = 1; c < clients; ++c) threads.emplace_back(client, c, nullptr);
  client(0, &progress);  // this thread is client 0 and reports progress
  for (std::thread& t : threads) t.join();
  const uint64_t ns = NowNs() - t0;
  if (!first_error.ok()) return first_error;
  return ns;
}

double GiBps(uint64_t bytes, uint64_t ns) {
  return static_cast<double>(bytes) / static_cast<double>(ns) * 1e9 / static_cast<double>(1ULL << 30);
}

int Fail(const char* cmd, const Status& s) {
  std::cerr << "kvoffload-bench " << cmd << ": " << s.ToString() << "\n";
  return 1;
}

}  // namespace

int RunDisk(Flags& flags) {
  const std::string dir_flag = flags.GetString("dir", "");
  const size_t block = flags.GetBytes("block-size", 2 << 20);
  const size_t qd = flags.GetU64("qd", 8);
  const uint64_t total = flags.GetBytes("total", 256 << 20);
  const std::string io = flags.GetString("disk-io", "auto");
  const size_t load_batch = flags.GetU64("load-batch", 1);
  const size_t load_jobs = flags.GetU64("load-jobs", qd);
  const size_t store_batch = flags.GetU64("store-batch", 1);
  const size_t store_jobs = flags.GetU64("store-jobs", qd);
  const size_t demote_batch = flags.GetU64("demote-batch", qd);
  const std::string state = flags.GetString("state", "empty");
  if (!flags.Done("disk")) return 2;
  if (dir_flag.empty() || block == 0 || qd == 0 || load_batch == 0 || load_jobs == 0 ||
      store_batch == 0 || store_jobs == 0 || (state != "empty" && state != "full")) {
    std::cerr << "kvoffload-bench disk: --dir is required; --block-size, --qd, --load-batch, "
                 "--load-jobs, --store-batch and --store-jobs > 0; --state is empty or full\n";
    return 2;
  }
  const bool full = state == "full";
  const std::string dir = std::filesystem::absolute(dir_flag).string();  // tiers need absolute paths
  const size_t n = std::max<uint64_t>(total / block, 8 * qd);
  EngineConfig config;
  config.block_bytes = block;
  config.fingerprint.model = "kvoffload-bench";
  config.disk_io = io;
  config.worker_threads = qd;
  config.io_parallelism = qd;
  // The demoter writes up to qd victims together (--demote-batch, 0: every store evicts its
  // own), as fio keeps qd writes queued; the pinned tier is the smallest it runs in (4
  // batches: 2 kept free, 2 resident). Everything else lives on disk.
  config.demote_batch = demote_batch;
  const size_t cpu_blocks = 4 * qd;
  config.cpu_bytes = cpu_blocks * SlotBytes(block);
  // Empty: room for every block, so nothing is evicted from disk. Full: room for one pass.
  const size_t disk_blocks = full ? n : n + cpu_blocks + 1;
  config.tiers.push_back(
      DiskTierConfig{dir, "emptyDir", disk_blocks * SlotBytes(block), false, false});
  Result<std::unique_ptr<Engine>> engine = Engine::Open(config);
  if (!engine.ok()) return Fail("disk", engine.status());
  std::fprintf(stderr, "[kvoffload-bench] %s\n", (*engine)->Describe().c_str());
  DeviceBuffer dev(std::max({qd, load_jobs * load_batch, store_jobs * store_batch}) * block);

  // Full: round 0 fills the disk tier (and the pinned one); the timed round 1 evicts it.
  const uint64_t round = full ? 1 : 0;
  if (full) {
    Result<uint64_t> fill =
        RunJobs(**engine, true, 0, 0, n + cpu_blocks, 1, qd, dev, block, "disk fill");
    if (!fill.ok()) return Fail("disk", fill.status());
  }
  const TierStats before = (*engine)->Stats().tiers.at(1);
  Result<uint64_t> store_ns =
      RunJobs(**engine, true, round, 0, n, store_batch, store_jobs, dev, block, "disk store");
  if (!store_ns.ok()) return Fail("disk", store_ns.status());
  // Blocks the timed stores wrote to disk (the last ones stored are still only pinned).
  const TierStats after = (*engine)->Stats().tiers.at(1);
  const uint64_t on_disk = (after.bytes_written - before.bytes_written) / SlotBytes(block);
  const uint64_t evicted_during_store = after.evictions - before.evictions;
  // The last blocks stored are still only in the pinned tier. Loading the first cpu_blocks
  // (untimed) promotes them, which writes those back to disk; from then on every pinned block
  // is also on disk (tiers are inclusive on promotion), so the timed loads below evict
  // without writing and measure the read path alone.
  Result<uint64_t> warm =
      RunJobs(**engine, false, round, 0, cpu_blocks, qd, 1, dev, block, "disk warm");
  if (!warm.ok()) return Fail("disk", warm.status());
  const TierStats before_load = (*engine)->Stats().tiers.at(1);
  const uint64_t written_before_load = before_load.bytes_written;
  Result<uint64_t> load_ns =
      RunJobs(**engine, false, round, cpu_blocks, n, load_batch, load_jobs, dev, block, "disk load");
  if (!load_ns.ok()) return Fail("disk", load_ns.status());
  const EngineStats s = (*engine)->Stats();
  const nlohmann::json out = {
      {"block_bytes", block},
      {"qd", qd},
      {"state", state},
      {"blocks", n},
      {"disk_evictions_during_store", evicted_during_store},
      {"describe", (*engine)->Describe()},
      {"store_gibps", GiBps(on_disk * block, *store_ns)},
      {"load_gibps", GiBps((n - cpu_blocks) * block, *load_ns)},
      {"bytes_written_during_load", s.tiers.at(1).bytes_written - written_before_load},
      // Where a load's time goes: a block's wait for its disk read (with its verification),
      // against the time each client had a block in flight. The difference is the engine's
      // own hand-offs (client, worker, device copy). The tier counts a job's reads once, as
      // the time from their submission to the last one's end, and each of the job's
      // load_batch blocks waits that long.
      {"disk_read_us_per_block",
       static_cast<double>(s.tiers.at(1).read_ns - before_load.read_ns) / 1e3 *
           static_cast<double>(load_batch) / static_cast<double>(n - cpu_blocks)},
      {"load_us_per_block_in_flight", static_cast<double>(*load_ns) / 1e3 *
                                          static_cast<double>(load_jobs * load_batch) /
                                          static_cast<double>(n - cpu_blocks)},
      {"store_us_per_block_in_flight",
       static_cast<double>(*store_ns) / 1e3 * static_cast<double>(qd) / static_cast<double>(n)},
      {"disk_write_us_per_block", static_cast<double>(after.write_ns - before.write_ns) / 1e3 /
                                      static_cast<double>(std::max<uint64_t>(on_disk, 1))},
      {"disk_blocks_written", on_disk},
      {"disk_bytes_written", s.tiers.at(1).bytes_written},
      {"disk_bytes_read", s.tiers.at(1).bytes_read},
      {"failed_stores", s.failed_stores},
      {"failed_loads", s.failed_loads},
      {"io_errors", s.tiers.at(1).io_errors}};
  engine.value().reset();  // closes the tier before its directory is removed
  std::filesystem::remove_all(std::filesystem::path(dir) / "kvoffload-v1");
  std::cout << out.dump(2) << "\n";
  return 0;
}

int RunCpu(Flags& flags) {
  const size_t block = flags.GetBytes("block-size", 2 << 20);
  const uint64_t total = flags.GetBytes("total", 512 << 20);
  const size_t batch = flags.GetU64("batch", 16);
  const size_t inflight = flags.GetU64("jobs", 2);
  const uint64_t reps = std::max<uint64_t>(flags.GetU64("reps", 5), 1);
  // The host device copies on min(4, usable CPUs) workers plus the waiter, so the ceiling is
  // memcpy on as many threads as the process runs at once, up to that pool.
  const size_t copy_threads = std::max<uint64_t>(
      flags.GetU64("memcpy-threads", static_cast<uint64_t>(std::clamp(UsableCpus(), 1, 4))), 1);
  if (!flags.Done("cpu")) return 2;
  const size_t n = std::max<uint64_t>(total / block, batch * inflight);
  EngineConfig config;
  config.block_bytes = block;
  config.fingerprint.model = "kvoffload-bench";
  config.cpu_bytes = n * SlotBytes(block);
  Result<std::unique_ptr<Engine>> engine = Engine::Open(config);
  if (!engine.ok()) return Fail("cpu", engine.status());
  std::fprintf(stderr, "[kvoffload-bench] %s\n", (*engine)->Describe().c_str());
  DeviceBuffer dev(batch * inflight * block);

  // The ceiling: the same bytes, block by block, between the same device buffer and a pool
  // laid out like the engine's (slot stride, touched first). The stride matters: with a
  // power-of-two stride source and destination share their offset within a page and glibc's
  // memcpy runs several times slower (4K aliasing).
  const size_t slot = SlotBytes(block);
  const size_t slots = dev.size / block;
  DeviceBuffer pool(n * slot);
  // Rounds alternate engine and memcpy so that both see the same neighbours on a shared
  // machine; each reports its best round. Round 0 only warms (pool pages, a full tier).
  uint64_t store_ns = 0, load_ns = 0, memcpy_ns = UINT64_MAX;
  for (uint64_t round = 0; round <= reps; ++round) {
    Result<uint64_t> st = RunJobs(**engine, true, round, 0, n, batch, inflight, dev, block, "cpu store");
    if (!st.ok()) return Fail("cpu", st.status());
    Result<uint64_t> ld = RunJobs(**engine, false, round, 0, n, batch, inflight, dev, block, "cpu load");
    if (!ld.ok()) return Fail("cpu", ld.status());
    // Each thread copies the blocks of its device slots (so no two write the same bytes); threads
    // start and join inside the timing, as the device's hand-offs are inside the engine's.
    auto copy = [&](bool to_pool) {
      std::vector<std::thread> threads;
      for (size_t th = 0; th < copy_threads; ++th) {
        threads.emplace_back([&, th] {
          for (size_t i = 0; i < n; ++i) {
            if ((i % slots) % copy_threads != th) continue;
            std::byte* p = pool.data + i * slot;
            std::byte* d = dev.data + (i % slots) * block;
            if (to_pool) {
              std::memcpy(p, d, block);
            } else {
              std::memcpy(d, p, block);
            }
          }
        });
      }
      for (std::thread& t : threads) t.join();
    };
    const uint64_t t0 = NowNs();
    copy(true);
    copy(false);
    const uint64_t t1 = NowNs();
    if (round == 0) continue;
    if (store_ns == 0 || *st + *ld < store_ns + load_ns) store_ns = *st, load_ns = *ld;
    memcpy_ns = std::min(memcpy_ns, t1 - t0);
  }
  const EngineStats s = (*engine)->Stats();
  const uint64_t bytes = 2 * n * block;
  const nlohmann::json out = {{"block_bytes", block},
                              {"blocks", n},
                              {"batch", batch},
                              {"jobs_in_flight", inflight},
                              {"reps", reps},
                              {"store_gibps", GiBps(n * block, store_ns)},
                              {"load_gibps", GiBps(n * block, load_ns)},
                              {"store_load_gibps", GiBps(bytes, store_ns + load_ns)},
                              {"memcpy_gibps", GiBps(bytes, memcpy_ns)},
                              {"memcpy_threads", copy_threads},
                              {"ratio", static_cast<double>(memcpy_ns) /
                                            static_cast<double>(store_ns + load_ns)},
                              {"failed_stores", s.failed_stores},
                              {"failed_loads", s.failed_loads}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace kvoffload::bench
