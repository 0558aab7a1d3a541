// The io_uring disk backend: batches of block reads/writes submitted with one syscall and
// reaped together (ExecuteEach reports each op as soon as it is reaped), on rings that have the
// pinned host pool registered as fixed buffers (no per-I/O page pinning). Several rings so that
// concurrent jobs do not serialise on one.
#include "disk_io_backends.h"

#if KVOFFLOAD_HAVE_LIBURING

#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "io_status.h"
#include "kvoffload/mutex.h"

namespace kvoffload {
namespace {

// A registered buffer (iovec) may not exceed 1 GiB.
constexpr size_t kMaxFixedBuffer = size_t{1} << 30;

// IORING_REGISTER_CLONE_BUFFERS (Linux 6.12) and its argument, from the kernel's UAPI: Debian
// 12's liburing (2.3) predates io_uring_clone_buffers, so the call goes through
// io_uring_register() with the opcode and layout the kernel defines. All zero but src_fd clones
// every buffer of the source ring.
constexpr unsigned kRegisterCloneBuffers = 30;
struct CloneBuffersArg {
  uint32_t src_fd = 0;
  uint32_t flags = 0;
  uint32_t src_off = 0;
  uint32_t dst_off = 0;
  uint32_t nr = 0;
  uint32_t pad[3] = {};
};

class Ring {
 public:
  ~Ring() {
    if (initialised_) io_uring_queue_exit(&ring_);
  }

  Status Init(unsigned entries) {
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
    initialised_ = true;
    return Status::Ok();
  }

  // Registration can fail (RLIMIT_MEMLOCK without CAP_IPC_LOCK); the ring then uses plain ops.
  bool RegisterBuffers(const std::vector<iovec>& iovs) {
    if (iovs.empty()) return false;
    fixed_ = io_uring_register_buffers(&ring_, iovs.data(), static_cast<unsigned>(iovs.size())) == 0;
    return fixed_;
  }

  // Shares the registered buffers of the ring `src_fd`: the kernel takes a reference to its
  // pinned pages and their page array, where a registration of its own pins the pool again,
  // keeps another page array (16 bytes per 4 KiB page) and charges the pool to RLIMIT_MEMLOCK
  // once more. False on kernels before 6.12 (EINVAL), which the caller then registers instead.
  bool CloneBuffersFrom(int src_fd) {
    CloneBuffersArg arg;
    arg.src_fd = static_cast<uint32_t>(src_fd);
    fixed_ = io_uring_register(static_cast<unsigned>(ring_.ring_fd), kRegisterCloneBuffers, &arg,
                               1) == 0;
    return fixed_;
  }

  int fd() const { return ring_.ring_fd; }

  void UnregisterBuffers() {
    if (fixed_) io_uring_unregister_buffers(&ring_);
    fixed_ = false;
  }

  // Sends a no-op through the ring: proves the kernel really serves it (seccomp may not).
  Status Nop() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_nop(sqe);
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_submit");
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_wait_cqe");
    io_uring_cqe_seen(&ring_, cqe);
    return Status::Ok();
  }

  // Runs the ops; done (may be null) hears of each op once it has its final status.
  void Run(std::span<IoOp> ops, const std::vector<iovec>& iovs, unsigned depth,
           const DiskIo::OpDone* done) REQUIRES(mu) {
    std::vector<size_t> pending;   // op indexes still to (re)submit
    std::vector<size_t> finished;  // op indexes with their final status, not reported yet
    std::vector<bool> reported(ops.size());
    pending.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].done = 0;
      ops[i].status = broken_.ok() ? Status::Ok() : broken_;
      (ops[i].len > 0 && broken_.ok() ? pending : finished).push_back(i);
    }
    auto report = [&] {
      for (size_t i : finished) {
        reported[i] = true;
        if (done != nullptr) (*done)(i);
      }
      finished.clear();
    };
    size_t queued = 0;     // prepared in the SQ ring, not yet accepted by the kernel
    size_t in_flight = 0;  // accepted by the kernel, completion not reaped yet
    while (!pending.empty() || queued > 0 || in_flight > 0) {
      // Fill the submission queue, then submit everything and wait with one syscall.
      while (!pending.empty() && queued + in_flight < depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        size_t i = pending.back();
        pending.pop_back();
        Prep(sqe, ops[i], iovs);
        io_uring_sqe_set_data64(sqe, i);
        ++queued;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);  // the loop guarantees work in flight
      if (rc >= 0) {
        queued -= std::min(queued, static_cast<size_t>(rc));
        in_flight += static_cast<size_t>(rc);
      } else if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The prepared entries stay in the ring and would run with a later caller's data:
        // this ring is unusable from now on; fail what remains once the kernel is done.
        broken_ = ErrnoStatus(-rc, "io_uring_submit");
        Drain(ops, in_flight);
        finished.clear();
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].status.ok() && ops[i].done < ops[i].len) ops[i].status = broken_;
          if (!reported[i]) finished.push_back(i);
        }
        report();
        return;
      }
      Reap(ops, in_flight, pending, finished);
      // Reported after the ring is advanced and while the other ops are still in flight: the
      // caller's work on one op overlaps the transfers of the rest.
      report();
    }
    report();
  }

  // One caller at a time drives the ring.
  Mutex mu;

 private:
  void Prep(io_uring_sqe* sqe, const IoOp& op, const std::vector<iovec>& iovs) {
    std::byte* p = op.buf + op.done;
    auto n = static_cast<unsigned>(op.len - op.done);
    uint64_t off = op.offset + op.done;
    int index = fixed_ ? FixedIndex(p, n, iovs) : -1;
    if (op.kind == IoOp::Kind::kRead) {
      if (index >= 0) {
        io_uring_prep_read_fixed(sqe, op.fd, p, n, off, index);
      } else {
        io_uring_prep_read(sqe, op.fd, p, n, off);
      }
    } else if (index >= 0) {
      io_uring_prep_write_fixed(sqe, op.fd, p, n, off, index);
    } else {
      io_uring_prep_write(sqe, op.fd, p, n, off);
    }
  }

  static int FixedIndex(const std::byte* p, size_t n, const std::vector<iovec>& iovs) {
    for (size_t i = 0; i < iovs.size(); ++i) {
      const auto* base = static_cast<const std::byte*>(iovs[i].iov_base);
      if (p >= base && p + n <= base + iovs[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

  // Consumes the available completions; requeues short or interrupted transfers and adds the
  // ops that reached their final status to `finished`.
  void Reap(std::span<IoOp> ops, size_t& in_flight, std::vector<size_t>& pending,
            std::vector<size_t>& finished) {
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      --in_flight;
      auto i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      IoOp& op = ops[i];
      const char* what = op.kind == IoOp::Kind::kRead ? "io_uring read" : "io_uring write";
      if (cqe->res == -EINTR || cqe->res == -EAGAIN) {
        pending.push_back(i);
      } else if (cqe->res < 0) {
        op.status = ErrnoStatus(-cqe->res, what);
        finished.push_back(i);
      } else if (cqe->res == 0) {
        op.status = Status::IOError(std::string(what) + ": short transfer (" +
                                    std::to_string(op.done) + " of " + std::to_string(op.len) +
                                    " bytes)");
        finished.push_back(i);
      } else {
        op.done += static_cast<size_t>(cqe->res);
        // Resubmit the remainder of a short transfer.
        (op.done < op.len ? pending : finished).push_back(i);
      }
    }
    io_uring_cq_advance(&ring_, seen);
  }

  // Waits for every accepted entry, so no buffer is freed while the kernel may still use it.
  void Drain(std::span<IoOp> ops, size_t in_flight) REQUIRES(mu) {
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      const int err = io_uring_wait_cqe(&ring_, &cqe);
      // A signal is no reason to stop: the kernel still owns the entries' buffers, which the
      // caller frees or reuses once this returns.
      if (err == -EINTR) continue;
      if (err != 0) break;
      ops[static_cast<size_t>(io_uring_cqe_get_data64(cqe))].status = broken_;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
    }
  }

  io_uring ring_{};
  bool initialised_ = false;
  bool fixed_ = false;
  Status broken_ GUARDED_BY(mu);  // set when a submission failed for good
};

class UringIo final : public DiskIo {
 public:
  std::string_view name() const override { return "uring"; }
  std::string Describe() const override {
    return "uring: " + std::to_string(rings_.size()) + " rings x " + std::to_string(depth_) +
           " entries, " +
           (!fixed_    ? "no fixed buffers"
            : borrowed_ ? "fixed buffers shared with an earlier tier's registration"
            : shared_   ? "fixed buffers registered once"
                        : "fixed buffers registered on each ring");
  }

  Status Init(const DiskIoOptions& options) {
    depth_ = static_cast<unsigned>(std::clamp<size_t>(options.queue_depth, 4, 4096));
    for (size_t off = 0; off < options.registered_len; off += kMaxFixedBuffer) {
      iovs_.push_back(iovec{options.registered_base + off,
                            std::min(kMaxFixedBuffer, options.registered_len - off)});
    }
    for (size_t i = 0; i < std::max<size_t>(1, options.parallelism); ++i) {
      auto ring = std::make_unique<Ring>();
      if (Status s = ring->Init(depth_); !s.ok()) return s;
      if (Status s = ring->Nop(); !s.ok()) return s;
      rings_.push_back(std::move(ring));
    }
    // The first ring shares the registration of another backend over the same memory (an
    // earlier disk tier's) or registers the pool, and the others share the first ring's; where
    // the kernel cannot share, each registers its own. Fixed buffers are used only when every
    // ring has them: a ring that registered while another could not lets its pages go again.
    borrowed_ = !iovs_.empty() && options.share_registration_of >= 0 &&
                rings_[0]->CloneBuffersFrom(options.share_registration_of);
    fixed_ = borrowed_ || rings_[0]->RegisterBuffers(iovs_);
    shared_ = fixed_;
    for (size_t i = 1; i < rings_.size() && fixed_; ++i) {
      if (rings_[i]->CloneBuffersFrom(rings_[0]->fd())) continue;
      shared_ = false;
      fixed_ = rings_[i]->RegisterBuffers(iovs_);
    }
    if (!fixed_) {
      for (auto& ring : rings_) ring->UnregisterBuffers();
      iovs_.clear();
      shared_ = borrowed_ = false;
    }
    return Status::Ok();
  }

  int RegistrationFd() const override { return shared_ ? rings_[0]->fd() : -1; }

  void Execute(std::span<IoOp> ops) override { RunOnARing(ops, nullptr); }
  void ExecuteEach(std::span<IoOp> ops, const OpDone& done) override { RunOnARing(ops, &done); }

 private:
  // Takes the first idle ring; when all are busy, queues on one chosen round-robin. The
  // caller drives that ring (and runs `done`) until its ops are complete.
  void RunOnARing(std::span<IoOp> ops, const OpDone* done) {
    for (auto& ring : rings_) {
      if (ring->mu.TryLock()) {
        ring->Run(ops, iovs_, depth_, done);
        ring->mu.Unlock();
        return;
      }
    }
    Ring& ring = *rings_[next_.fetch_add(1) % rings_.size()];
    MutexLock lock(&ring.mu);
    ring.Run(ops, iovs_, depth_, done);
  }

  unsigned depth_ = 64;
  bool fixed_ = false;
  bool shared_ = false;    // every ring shares the first ring's registration (so fixed_)
  bool borrowed_ = false;  // and the first ring shares share_registration_of's
  std::vector<iovec> iovs_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::atomic<size_t> next_{0};
};

}  // namespace

Result<std::unique_ptr<DiskIo>> NewUringIo(const DiskIoOptions& options) {
  auto io = std::make_unique<UringIo>();
  if (Status s = io->Init(options); !s.ok()) {
    return Status::Unavailable("io_uring unavailable: " + s.message());
  }
  return std::unique_ptr<DiskIo>(std::move(io));
}

}  // namespace kvoffload

#else  // !KVOFFLOAD_HAVE_LIBURING

namespace kvoffload {

Result<std::unique_ptr<DiskIo>> NewUringIo(const DiskIoOptions& /*options*/) {
  return Status::Unavailable("io_uring unavailable: libkvoffload was built without liburing");
}

}  // namespace kvoffload

#endif
