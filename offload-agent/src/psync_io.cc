// The portable disk backend: pread/pwrite on a small thread pool, so a batch of block files is
// read or written in parallel without io_uring.
#include <unistd.h>

#include <vector>

#include "io_status.h"
#include "kvoffload/mutex.h"
#include "disk_io_backends.h"
#include "kvoffload/work_queue.h"

namespace kvoffload {
namespace {

// Moves all of op.len, retrying short transfers and EINTR.
void RunOp(IoOp& op) {
  while (op.done < op.len) {
    std::byte* p = op.buf + op.done;
    size_t n = op.len - op.done;
    auto off = static_cast<off_t>(op.offset + op.done);
    ssize_t r = op.kind == IoOp::Kind::kRead ? ::pread(op.fd, p, n, off) : ::pwrite(op.fd, p, n, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      op.status = ErrnoStatus(errno, op.kind == IoOp::Kind::kRead ? "pread" : "pwrite");
      return;
    }
    if (r == 0) {
      op.status = Status::IOError(std::string(op.kind == IoOp::Kind::kRead ? "pread" : "pwrite") +
                                  ": short transfer (" + std::to_string(op.done) + " of " +
                                  std::to_string(op.len) + " bytes)");
      return;
    }
    op.done += static_cast<size_t>(r);
  }
  op.status = Status::Ok();
}

class PsyncIo final : public DiskIo {
 public:
  explicit PsyncIo(size_t threads) : workers_(threads, WorkQueue::OnStop::kRunQueued) {}

  std::string_view name() const override { return "psync"; }
  std::string Describe() const override {
    return "psync: pread/pwrite on " + std::to_string(workers_.threads()) + " threads";
  }

  void Execute(std::span<IoOp> ops) override {
    ExecuteEach(ops, [](size_t) {});
  }

  void ExecuteEach(std::span<IoOp> ops, const OpDone& done) override {
    if (ops.size() == 1) {  // no hand-off for a single op
      RunOp(ops[0]);
      done(0);
      return;
    }
    Batch batch(&mu_);
    for (size_t i = 0; i < ops.size(); ++i) {
      auto job = [this, op = &ops[i], i, &batch] {
        RunOp(*op);
        MutexLock lock(&mu_);
        // Signalled under the lock: the waiter cannot return (and free the batch) before.
        batch.finished.push_back(i);
        batch.done_cv.SignalAll();
      };
      // Refused only while the backend is being destroyed: run it here then.
      if (!workers_.Push(job)) job();
    }
    MutexLock lock(&mu_);
    std::vector<size_t> now;
    for (size_t reported = 0; reported < ops.size(); reported += now.size()) {
      while (batch.finished.empty()) batch.done_cv.Wait();
      now.swap(batch.finished);
      batch.finished.clear();
      // The caller's work on these ops overlaps the pool's work on the others.
      lock.Unlock();
      for (size_t i : now) done(i);
      lock.Lock();
    }
  }

 private:
  struct Batch {
    explicit Batch(Mutex* mu) : done_cv(mu) {}
    std::vector<size_t> finished;  // ops done and not yet reported; guarded by PsyncIo's mu_
    CondVar done_cv;
  };

  Mutex mu_;  // guards every batch's `finished`; outlives the workers, whose jobs take it
  WorkQueue workers_;
};

}  // namespace

std::unique_ptr<DiskIo> NewPsyncIo(const DiskIoOptions& options) {
  return std::make_unique<PsyncIo>(options.parallelism);
}

}  // namespace kvoffload
