// FaultyDiskIo: a DiskIo decorator that makes chosen reads or writes fail the way disks do
// (ENOSPC, EIO, a short write, or a torn write that the kernel reported as complete), in the
// spirit of leveldb's FaultInjectionTestEnv. Thread-safe: the plan is atomics.
#ifndef KVOFFLOAD_TESTS_FAULTY_DISK_IO_H_
#define KVOFFLOAD_TESTS_FAULTY_DISK_IO_H_

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "kvoffload/disk_io.h"

namespace kvoffload::testing {

enum class Fault { kNone, kEnospc, kEio, kShortWrite, kTornWriteReportedOk };

// Which ops fail: the next `count` ops of the kind, with `fault`.
struct FaultPlan {
  std::atomic<Fault> write_fault{Fault::kNone};
  std::atomic<int> failing_writes{0};
  std::atomic<Fault> read_fault{Fault::kNone};
  std::atomic<int> failing_reads{0};
  std::atomic<int> injected{0};
  // Runs after each batch of healthy writes, on the writing thread (to hold a writer between
  // its write and its publish). Set before the tier is used.
  std::function<void()> after_writes;

  void FailWrites(Fault f, int count) {
    write_fault = f;
    failing_writes = count;
  }
  void FailReads(Fault f, int count) {
    read_fault = f;
    failing_reads = count;
  }
};

class FaultyDiskIo final : public DiskIo {
 public:
  FaultyDiskIo(std::unique_ptr<DiskIo> base, std::shared_ptr<FaultPlan> plan)
      : base_(std::move(base)), plan_(std::move(plan)) {}

  std::string_view name() const override { return base_->name(); }
  std::string Describe() const override { return "faulty(" + base_->Describe() + ")"; }

  void Execute(std::span<IoOp> ops) override {
    std::vector<IoOp*> healthy;
    std::vector<IoOp> healthy_ops;
    for (IoOp& op : ops) {
      const bool write = op.kind == IoOp::Kind::kWrite;
      std::atomic<int>& left = write ? plan_->failing_writes : plan_->failing_reads;
      if (left.fetch_sub(1) > 0) {
        ++plan_->injected;
        Inject(op, write ? plan_->write_fault.load() : plan_->read_fault.load());
        continue;
      }
      left.fetch_add(1);  // not this one: give the count back
      healthy.push_back(&op);
      healthy_ops.push_back(op);
    }
    if (healthy_ops.empty()) return;
    base_->Execute(healthy_ops);
    for (size_t i = 0; i < healthy.size(); ++i) *healthy[i] = healthy_ops[i];
    if (plan_->after_writes && healthy_ops.front().kind == IoOp::Kind::kWrite) {
      plan_->after_writes();
    }
  }

 private:
  // Writes the first half of op (page-aligned, so O_DIRECT files take it) through the base.
  void WriteFirstHalf(const IoOp& op, std::byte* src) {
    IoOp half = op;
    half.buf = src;
    half.len = op.len / 2 / 4096 * 4096;
    if (half.len > 0) base_->Execute(std::span(&half, 1));
  }

  void Inject(IoOp& op, Fault fault) {
    op.done = 0;
    switch (fault) {
      case Fault::kNone:
        op.status = Status::Ok();
        return;
      case Fault::kEnospc:
        op.status = Status::ResourceExhausted("injected ENOSPC: No space left on device");
        return;
      case Fault::kEio:
        op.status = Status::IOError("injected EIO: Input/output error");
        return;
      case Fault::kShortWrite:
        WriteFirstHalf(op, op.buf);
        op.done = op.len / 2 / 4096 * 4096;
        op.status = Status::IOError("injected short write: " + std::to_string(op.done) + " of " +
                                    std::to_string(op.len) + " bytes");
        return;
      case Fault::kTornWriteReportedOk: {
        // The whole length reaches the file, but only the first half holds the data: what a
        // crash between two page writes leaves, while the process was told all was well.
        auto* torn = static_cast<std::byte*>(std::aligned_alloc(4096, op.len));
        std::memcpy(torn, op.buf, op.len / 2);
        std::memset(torn + op.len / 2, 0, op.len - op.len / 2);
        IoOp whole = op;
        whole.buf = torn;
        base_->Execute(std::span(&whole, 1));
        std::free(torn);
        op.done = whole.done;
        op.status = whole.status;
        return;
      }
    }
  }

  std::unique_ptr<DiskIo> base_;
  std::shared_ptr<FaultPlan> plan_;
};

}  // namespace kvoffload::testing

#endif  // KVOFFLOAD_TESTS_FAULTY_DISK_IO_H_
