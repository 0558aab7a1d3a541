// The host device: "device memory" is ordinary host memory and copies run on a small pool of
// worker threads, so the engine sees the same asynchronous start/wait semantics as with CUDA
// streams. A batch is cut into chunks that the workers, and its waiter once it waits, copy in
// parallel: one thread's memcpy reached a fraction of the host's copy bandwidth, CPU-bound on
// vLLM's one-piece-per-layer layout. Batches have no order among themselves (device.h).
#include <sys/mman.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <string>
#include <vector>

#include "device_backends.h"
#include "io_status.h"
#include "kvoffload/cpu_budget.h"
#include "kvoffload/mutex.h"
#include "kvoffload/read_file.h"
#include "kvoffload/work_queue.h"

namespace kvoffload {
namespace {

class MmapRegion final : public PinnedRegion {
 public:
  MmapRegion(std::byte* data, size_t size) : data_(data), size_(size) {}
  ~MmapRegion() override { ::munmap(data_, size_); }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::byte* const data_;
  const size_t size_;
};

// A batch cut into chunks of about kChunkBytes (ops longer than that are cut too), so that the
// pool's workers and the waiter copy one batch together: vLLM's layout makes a block several
// small pieces (one per layer), too small to share out one by one.
constexpr size_t kChunkBytes = 256 << 10;

// Shared between the ticket (waiter) and whoever copies its chunks: workers, or the waiter.
struct BatchState {
  explicit BatchState(std::span<const CopyOp> ops) {
    size_t bytes = 0;
    for (const CopyOp& op : ops) {
      for (size_t off = 0; off < op.len; off += kChunkBytes) {
        size_t len = std::min(kChunkBytes, op.len - off);
        pieces.push_back({static_cast<std::byte*>(op.dst) + off,
                          static_cast<const std::byte*>(op.src) + off, len});
        bytes += len;
        if (bytes >= kChunkBytes) {
          chunk_ends.push_back(pieces.size());
          bytes = 0;
        }
      }
    }
    if (bytes > 0) chunk_ends.push_back(pieces.size());
    MutexLock lock(&mu);
    chunks_left = chunk_ends.size();
    done = chunks_left == 0;
  }

  // The index of a chunk nobody has claimed yet, or chunks() when all are claimed.
  size_t Claim() { return std::min(next_chunk.fetch_add(1, std::memory_order_relaxed), chunks()); }
  size_t chunks() const { return chunk_ends.size(); }

  void RunChunk(size_t chunk) {
    size_t begin = chunk == 0 ? 0 : chunk_ends[chunk - 1];
    for (size_t i = begin; i < chunk_ends[chunk]; ++i) {
      std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].len);
    }
    bool last;
    {
      MutexLock lock(&mu);
      last = --chunks_left == 0;
      done = last;
    }
    if (last) cv.SignalAll();
  }

  // Copies chunks until none is left unclaimed.
  void Help() {
    for (size_t c = Claim(); c < chunks(); c = Claim()) RunChunk(c);
  }

  Mutex mu;
  CondVar cv{&mu};
  bool done GUARDED_BY(mu) = false;
  size_t chunks_left GUARDED_BY(mu) = 0;
  std::vector<CopyOp> pieces;      // immutable after construction
  std::vector<size_t> chunk_ends;  // chunk c is pieces [chunk_ends[c-1], chunk_ends[c])
  std::atomic<size_t> next_chunk{0};
};

class HostTicket final : public CopyTicket {
 public:
  explicit HostTicket(std::shared_ptr<BatchState> state) : state_(std::move(state)) {}
  ~HostTicket() override { static_cast<void>(Wait()); }
  bool Ready() override {
    MutexLock lock(&state_->mu);
    return state_->done;
  }
  Status Wait() override {
    // The waiter copies the chunks no worker has started: that costs no hand-off to a worker
    // and back (two wake-ups, slow on a busy machine), and adds its own core to the pool's.
    state_->Help();
    MutexLock lock(&state_->mu);
    while (!state_->done) state_->cv.Wait();
    return Status::Ok();
  }

 private:
  std::shared_ptr<BatchState> state_;
};

// The most memory this process can commit, and what sets it: the machine's, or the container's
// limit where its cgroup is the root of /sys/fs/cgroup (a cgroup namespace, as containers on
// cgroup v2 have). The host device's mmap reserves nothing, so a pinned tier past it was taken
// and the process killed by the OOM killer later, as the tier filled.
std::pair<uint64_t, std::string> MemoryCeiling() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::pair<uint64_t, std::string> ceiling{UINT64_MAX, ""};
  if (pages > 0 && page > 0) {
    ceiling = {static_cast<uint64_t>(pages) * static_cast<uint64_t>(page),
               "the machine's memory"};
  }
  if (Result<std::string> max = ReadWholeFile("/sys/fs/cgroup/memory.max"); max.ok()) {
    uint64_t limit = 0;
    const auto [end, ec] = std::from_chars(max->data(), max->data() + max->size(), limit);
    if (ec == std::errc() && end != max->data() && limit < ceiling.first) {
      ceiling = {limit, "the container's memory limit (/sys/fs/cgroup/memory.max)"};
    }
  }
  return ceiling;
}

class HostDevice final : public DeviceBackend {
 public:
  // The workers finish every queued batch before they exit (kRunQueued), so tickets may
  // outlive the device.
  explicit HostDevice(size_t copy_threads)
      : workers_(copy_threads, WorkQueue::OnStop::kRunQueued) {}

  std::string_view name() const override { return "host"; }
  std::string Describe() const override {
    return "host: device memory emulated in host memory, copies on " +
           std::to_string(workers_.threads()) + " worker threads and the waiter";
  }

  Result<std::unique_ptr<PinnedRegion>> AllocatePinned(size_t bytes) override {
    if (const auto [ceiling, what] = MemoryCeiling(); bytes > ceiling) {
      return Status::ResourceExhausted(std::to_string(bytes) + " bytes is more than " + what +
                                       " (" + std::to_string(ceiling) + " bytes)");
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap " + std::to_string(bytes) + " bytes");
    return std::unique_ptr<PinnedRegion>(
        std::make_unique<MmapRegion>(static_cast<std::byte*>(p), bytes));
  }

  Result<std::unique_ptr<CopyTicket>> CopyAsync(CopyDirection /*direction*/,
                                                std::span<const CopyOp> ops) override {
    auto state = std::make_shared<BatchState>(ops);
    // A batch of one chunk is copied here and now: waking a worker for it costs more than the
    // copy (a 64 KiB block is a few microseconds of memcpy; two context switches on a busy
    // machine are tens), and the caller has the block in cache.
    if (state->chunks() <= 1) {
      state->Help();
      return std::unique_ptr<CopyTicket>(std::make_unique<HostTicket>(std::move(state)));
    }
    // One job for each worker the batch can keep busy, each copying chunks until none is
    // left unclaimed: the workers take the oldest batch's chunks first, and a job that finds
    // them all claimed (by other workers or by the waiter) does nothing.
    const size_t helpers = std::min(state->chunks(), workers_.threads());
    for (size_t i = 0; i < helpers; ++i) {
      // Refused only while the device is being destroyed: the waiter then copies it all.
      if (!workers_.Push([state] { state->Help(); })) break;
    }
    return std::unique_ptr<CopyTicket>(std::make_unique<HostTicket>(std::move(state)));
  }

 private:
  WorkQueue workers_;
};

}  // namespace

size_t DefaultHostCopyThreads() {
  return std::clamp<size_t>(static_cast<size_t>(UsableCpus()), 1, 4);
}

std::unique_ptr<DeviceBackend> NewHostDevice(size_t copy_threads) {
  return std::make_unique<HostDevice>(std::max<size_t>(copy_threads, 1));
}

}  // namespace kvoffload
