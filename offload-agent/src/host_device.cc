// The host device: "device memory" is ordinary host memory and copies run on a worker thread,
// so the engine sees the same asynchronous start/wait semantics as with CUDA streams; a waiter
// whose batch has not started yet copies it itself. One batch is copied at a time.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "device_backends.h"
#include "io_status.h"
#include "mutex.h"

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

// Shared between the ticket (waiter) and whoever copies it: the worker, or the waiter itself.
struct BatchState {
  Mutex mu;
  CondVar cv{&mu};
  bool done GUARDED_BY(mu) = false;
  std::vector<CopyOp> ops;

  // Copies under `engine`: one batch at a time, whichever thread runs it.
  void Run(Mutex* engine) {
    {
      MutexLock lock(engine);
      for (const CopyOp& op : ops) std::memcpy(op.dst, op.src, op.len);
    }
    {
      MutexLock lock(&mu);
      done = true;
    }
    cv.SignalAll();
  }
};

class HostDevice;

class HostTicket final : public CopyTicket {
 public:
  HostTicket(HostDevice* device, std::shared_ptr<BatchState> state)
      : device_(device), state_(std::move(state)) {}
  ~HostTicket() override { static_cast<void>(Wait()); }
  bool Ready() override {
    MutexLock lock(&state_->mu);
    return state_->done;
  }
  Status Wait() override;

 private:
  HostDevice* const device_;  // outlives its tickets
  std::shared_ptr<BatchState> state_;
};

class HostDevice final : public DeviceBackend {
 public:
  HostDevice() : worker_([this] { Loop(); }) {}
  ~HostDevice() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    worker_.join();
  }

  std::string_view name() const override { return "host"; }
  std::string Describe() const override {
    return "host: device memory emulated in host memory, copies on a worker thread";
  }

  Result<std::unique_ptr<PinnedRegion>> AllocatePinned(size_t bytes) override {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap " + std::to_string(bytes) + " bytes");
    return std::unique_ptr<PinnedRegion>(
        std::make_unique<MmapRegion>(static_cast<std::byte*>(p), bytes));
  }

  Result<std::unique_ptr<CopyTicket>> CopyAsync(CopyDirection /*direction*/,
                                                std::span<const CopyOp> ops) override {
    auto state = std::make_shared<BatchState>();
    state->ops.assign(ops.begin(), ops.end());
    {
      MutexLock lock(&mu_);
      queue_.push_back(state);
    }
    cv_.Signal();
    return std::unique_ptr<CopyTicket>(std::make_unique<HostTicket>(this, std::move(state)));
  }

  // Runs the batch on the calling thread if the worker has not started it.
  void RunIfQueued(const std::shared_ptr<BatchState>& batch) {
    {
      MutexLock lock(&mu_);
      auto it = std::find(queue_.begin(), queue_.end(), batch);
      if (it == queue_.end()) return;
      queue_.erase(it);
    }
    batch->Run(&copy_engine_);
  }

 private:
  void Loop() {
    MutexLock lock(&mu_);
    for (;;) {
      while (!stop_ && queue_.empty()) cv_.Wait();
      if (queue_.empty()) return;  // stopping, nothing left
      std::shared_ptr<BatchState> batch = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      batch->Run(&copy_engine_);
      lock.Lock();
    }
  }

  // Batches are copied one at a time, as by one DMA engine, also when waiters run them: the
  // memcpy ceiling the benchmarks compare with is one thread too.
  Mutex copy_engine_;
  Mutex mu_;
  CondVar cv_{&mu_};  // a batch was queued or the device is stopping
  std::deque<std::shared_ptr<BatchState>> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread worker_;
};

Status HostTicket::Wait() {
  // A batch the worker has not started is copied by the waiter: the copy then costs no
  // hand-off to the worker and back (two wake-ups, slow on a busy machine). Copies still
  // start in the background when the worker gets to them first.
  device_->RunIfQueued(state_);
  MutexLock lock(&state_->mu);
  while (!state_->done) state_->cv.Wait();
  return Status::Ok();
}

}  // namespace

std::unique_ptr<DeviceBackend> NewHostDevice() { return std::make_unique<HostDevice>(); }

}  // namespace kvoffload
