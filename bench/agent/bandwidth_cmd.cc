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
//   --state=mixed fills the tier the same way, then times stores and loads together, as a
//   tier serves them: op k of the run is a store of a new block (k even, evicting from disk)
//   or a load of a resident one (k odd), one-block jobs from the `qd` clients, a pass of
//   each (fio's limit: --rw=rw, half reads, over a file it wrote whole first).
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
#include <functional>
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

// A disk tier's slot holds the payload alone (its checksum stays in the engine's index), so a
// block's disk transfer is its size rounded up to 4096, as an O_DIRECT transfer must be.
size_t DiskBytes(size_t block) { return (block + 4095) / 4096 * 4096; }

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

// Op i of a run: a store or a load, of which block. A job's ops are all of its first op's kind.
struct Op {
  bool store;
  BlockKey key;
};
using OpAt = std::function<Op(size_t)>;

// Every op of a run a store (or every one a load) of the blocks of `round`, in key order.
OpAt Pass(bool store, uint64_t round) {
  return [store, round](size_t i) { return Op{store, Key(round, i)}; };
}

// A run's wall time and, per kind, the blocks done and the sum of the time each client had
// its job in flight, counted once per block.
struct Timing {
  uint64_t wall_ns = 0;
  uint64_t blocks[2] = {0, 0};     // [load, store]
  uint64_t flight_ns[2] = {0, 0};  // [load, store]
};

// Runs jobs over ops [first, end), `per_job` ops each, from `clients` threads that each submit
// one job and wait for it: a new job starts as soon as any job finishes, as fio refills its
// queue on every completion (one thread waiting on the oldest job would leave the engine idle
// behind a slow one). Client c uses device slots [c * per_job, (c + 1) * per_job).
Result<Timing> RunJobs(Engine& engine, const OpAt& op_at, size_t first, size_t end,
                       size_t per_job, size_t clients, DeviceBuffer& dev, size_t block,
                       const char* what) {
  if (clients * per_job * block > dev.size) {
    return Status::InvalidArgument(std::string(what) + ": device buffer too small");
  }
  std::atomic<size_t> next{first};
  std::atomic<size_t> finished{0};
  std::mutex mu;
  Status first_error;
  Timing timing;
  auto client = [&](size_t c, Progress* progress) {
    std::vector<BlockKey> keys;
    std::vector<void*> ptrs;
    Timing mine;
    for (size_t i; (i = next.fetch_add(per_job)) < end;) {
      const size_t m = std::min(per_job, end - i);
      const bool store = op_at(i).store;
      keys.resize(m);
      ptrs.resize(m);
      for (size_t j = 0; j < m; ++j) {
        keys[j] = op_at(i + j).key;
        ptrs[j] = dev.data + (c * per_job + j) * block;
      }
      const uint64_t t0 = NowNs();
      Result<JobId> job = store ? engine.Store(keys, ptrs) : engine.Load(keys, ptrs);
      Status s = job.ok() ? engine.Wait(*job) : job.status();
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = s;
        return;
      }
      mine.blocks[store] += m;
      mine.flight_ns[store] += (NowNs() - t0) * m;
      finished += m;
      if (progress != nullptr) progress->Update(finished.load());
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int k = 0; k < 2; ++k) {
      timing.blocks[k] += mine.blocks[k];
      timing.flight_ns[k] += mine.flight_ns[k];
    }
  };
  Progress progress(what, end - first);
  const uint64_t t0 = NowNs();
  std::vector<std::thread> threads;
  for (size_t c = 1; c < clients; ++c) threads.emplace_back(client, c, nullptr);
  client(0, &progress);  // this thread is client 0 and reports progress
  for (std::thread& t : threads) t.join();
  timing.wall_ns = NowNs() - t0;
  if (!first_error.ok()) return first_error;
  return timing;
}

double GiBps(uint64_t bytes, uint64_t ns) {
  return static_cast<double>(bytes) / static_cast<double>(ns) * 1e9 / static_cast<double>(1ULL << 30);
}

// Microseconds per block of `ns` spent on `blocks` blocks (0 blocks counts as 1).
double UsPerBlock(uint64_t ns, uint64_t blocks) {
  return static_cast<double>(ns) / 1e3 / static_cast<double>(std::max<uint64_t>(blocks, 1));
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
      store_batch == 0 || store_jobs == 0 ||
      (state != "empty" && state != "full" && state != "mixed")) {
    std::cerr << "kvoffload-bench disk: --dir is required; --block-size, --qd, --load-batch, "
                 "--load-jobs, --store-batch and --store-jobs > 0; --state is empty, full or "
                 "mixed\n";
    return 2;
  }
  const bool empty = state == "empty";
  const bool mixed = state == "mixed";
  if (mixed && (load_batch != 1 || store_batch != 1 || load_jobs != qd || store_jobs != qd)) {
    std::cerr << "kvoffload-bench disk: --state=mixed runs one-block jobs from --qd clients; "
                 "--load-batch, --load-jobs, --store-batch and --store-jobs do not apply\n";
    return 2;
  }
  const std::string dir = std::filesystem::absolute(dir_flag).string();  // tiers need absolute paths
  // A scratch directory: made here, where the engine takes only a tier's existing mount.
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  const size_t cpu_blocks = 4 * qd;
  // Mixed: at least 32 x qd blocks, so that its loads stay clear of the pinned tier and of
  // the evictions (below).
  const size_t n = std::max<uint64_t>(total / block, (mixed ? 32 : 8) * qd);
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
  config.cpu_bytes = cpu_blocks * SlotBytes(block);
  // Empty: room for every block, so nothing is evicted from disk. Full, mixed: one pass.
  const size_t disk_blocks = empty ? n + cpu_blocks + 1 : n;
  config.tiers.push_back(
      DiskTierConfig{dir, "emptyDir", disk_blocks * DiskBytes(block), false, false});
  Result<std::unique_ptr<Engine>> engine = Engine::Open(config);
  if (!engine.ok()) return Fail("disk", engine.status());
  std::fprintf(stderr, "[kvoffload-bench] %s\n", (*engine)->Describe().c_str());
  DeviceBuffer dev(std::max({qd, load_jobs * load_batch, store_jobs * store_batch}) * block);

  // Full and mixed: round 0 fills the disk tier (and the pinned one); round 1 evicts it.
  const uint64_t round = empty ? 0 : 1;
  if (!empty) {
    Result<Timing> fill =
        RunJobs(**engine, Pass(true, 0), 0, n + cpu_blocks, 1, qd, dev, block, "disk fill");
    if (!fill.ok()) return Fail("disk", fill.status());
  }
  nlohmann::json out = {{"block_bytes", block},
                        {"qd", qd},
                        {"state", state},
                        {"blocks", n},
                        {"describe", (*engine)->Describe()}};
  if (mixed) {
    // Blocks in the order they were stored: the fill's (round 0), then the timed run's (round
    // 1). Op 2j stores the run's block j; op 2j + 1 loads the block stored n / 4 stores
    // before it. A tier of n blocks under LRU keeps the blocks of the last n accesses, half
    // stores and half loads, so what it keeps reaches n / 2 stores back: a load is always on
    // disk (once past the pinned tier's 4 x qd newest, when n >= 32 x qd), and the stores
    // evict the blocks loaded long ago or never. So the run can be as long as wanted: it moves
    // a pass each way, as the other states do.
    const size_t filled = n + cpu_blocks;
    const auto stored = [filled](size_t p) {
      return p < filled ? Key(0, p) : Key(1, p - filled);
    };
    const OpAt op_at = [&](size_t k) {
      const size_t j = k / 2;
      return k % 2 == 0 ? Op{true, stored(filled + j)} : Op{false, stored(filled - n / 4 + j)};
    };
    // The fill's last blocks are still only pinned. Loading cpu_blocks older ones (untimed)
    // promotes them and writes those back, so the timed run writes only what it stores, as
    // fio's writes are its own.
    Result<Timing> warm = RunJobs(**engine, Pass(false, 0), n / 4, n / 4 + cpu_blocks, qd, 1,
                                  dev, block, "disk warm");
    if (!warm.ok()) return Fail("disk", warm.status());
    const TierStats before = (*engine)->Stats().tiers.at(1);
    Result<Timing> t = RunJobs(**engine, op_at, 0, 2 * n, 1, qd, dev, block, "disk mixed");
    if (!t.ok()) return Fail("disk", t.status());
    const TierStats after = (*engine)->Stats().tiers.at(1);
    const uint64_t written = (after.bytes_written - before.bytes_written) / DiskBytes(block);
    const uint64_t read = (after.bytes_read - before.bytes_read) / DiskBytes(block);
    out.update({
        // What reached the disk, each way, while stores and loads ran together.
        {"store_gibps", GiBps(written * block, t->wall_ns)},
        {"load_gibps", GiBps(read * block, t->wall_ns)},
        {"stores", t->blocks[1]},
        {"loads", t->blocks[0]},
        {"disk_evictions", after.evictions - before.evictions},
        {"disk_write_us_per_block", UsPerBlock(after.write_ns - before.write_ns, written)},
        {"disk_read_us_per_block", UsPerBlock(after.read_ns - before.read_ns, read)},
        {"store_us_per_block_in_flight", UsPerBlock(t->flight_ns[1], t->blocks[1])},
        {"load_us_per_block_in_flight", UsPerBlock(t->flight_ns[0], t->blocks[0])},
        {"disk_blocks_written", written},
        {"disk_blocks_read", read},
    });
  } else {
    const TierStats before = (*engine)->Stats().tiers.at(1);
    Result<Timing> store = RunJobs(**engine, Pass(true, round), 0, n, store_batch, store_jobs,
                                   dev, block, "disk store");
    if (!store.ok()) return Fail("disk", store.status());
    const uint64_t store_ns = store->wall_ns;
    // Blocks the timed stores wrote to disk (the last ones stored are still only pinned).
    const TierStats after = (*engine)->Stats().tiers.at(1);
    const uint64_t on_disk = (after.bytes_written - before.bytes_written) / DiskBytes(block);
    // The last blocks stored are still only in the pinned tier. Loading the first cpu_blocks
    // (untimed) promotes them, which writes those back to disk; from then on every pinned
    // block is also on disk (tiers are inclusive on promotion), so the timed loads below
    // evict without writing and measure the read path alone.
    Result<Timing> warm =
        RunJobs(**engine, Pass(false, round), 0, cpu_blocks, qd, 1, dev, block, "disk warm");
    if (!warm.ok()) return Fail("disk", warm.status());
    const TierStats before_load = (*engine)->Stats().tiers.at(1);
    Result<Timing> load = RunJobs(**engine, Pass(false, round), cpu_blocks, n, load_batch,
                                  load_jobs, dev, block, "disk load");
    if (!load.ok()) return Fail("disk", load.status());
    const uint64_t load_ns = load->wall_ns;
    const TierStats end = (*engine)->Stats().tiers.at(1);
    out.update({
        {"disk_evictions_during_store", after.evictions - before.evictions},
        {"store_gibps", GiBps(on_disk * block, store_ns)},
        {"load_gibps", GiBps((n - cpu_blocks) * block, load_ns)},
        {"bytes_written_during_load", end.bytes_written - before_load.bytes_written},
        // Where a load's time goes: a block's wait for its disk read (with its verification),
        // against the time each client had a block in flight. The difference is the engine's
        // own hand-offs (client, worker, device copy). The tier counts a job's reads once, as
        // the time from their submission to the last one's end, and each of the job's
        // load_batch blocks waits that long.
        {"disk_read_us_per_block",
         static_cast<double>(end.read_ns - before_load.read_ns) / 1e3 *
             static_cast<double>(load_batch) / static_cast<double>(n - cpu_blocks)},
        {"load_us_per_block_in_flight", static_cast<double>(load_ns) / 1e3 *
                                            static_cast<double>(load_jobs * load_batch) /
                                            static_cast<double>(n - cpu_blocks)},
        {"store_us_per_block_in_flight",
         static_cast<double>(store_ns) / 1e3 * static_cast<double>(qd) / static_cast<double>(n)},
        {"disk_write_us_per_block", UsPerBlock(after.write_ns - before.write_ns, on_disk)},
        {"disk_blocks_written", on_disk},
        {"disk_bytes_written", end.bytes_written},
        {"disk_bytes_read", end.bytes_read},
    });
  }
  const EngineStats s = (*engine)->Stats();
  out.update({{"failed_stores", s.failed_stores},
              {"failed_loads", s.failed_loads},
              {"io_errors", s.tiers.at(1).io_errors}});
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
    Result<Timing> st =
        RunJobs(**engine, Pass(true, round), 0, n, batch, inflight, dev, block, "cpu store");
    if (!st.ok()) return Fail("cpu", st.status());
    Result<Timing> ld =
        RunJobs(**engine, Pass(false, round), 0, n, batch, inflight, dev, block, "cpu load");
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
    if (store_ns == 0 || st->wall_ns + ld->wall_ns < store_ns + load_ns) {
      store_ns = st->wall_ns;
      load_ns = ld->wall_ns;
    }
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
