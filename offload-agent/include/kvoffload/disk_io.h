// Disk I/O backends: positional reads and writes on already-open files, in batches.
// Backends: "uring" (io_uring, registered buffers, batched submit and reap) and "psync"
// (pread/pwrite on a thread pool). Execute() and ExecuteEach() are thread-safe on both.
#ifndef KVOFFLOAD_DISK_IO_H_
#define KVOFFLOAD_DISK_IO_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/export.h"
#include "kvoffload/status.h"

namespace kvoffload {

// One positional transfer. The backend fills `done` and `status`; an op is OK only when all
// `len` bytes moved (a short transfer that cannot be completed is an IOError, never OK).
struct IoOp {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  std::byte* buf = nullptr;  // For O_DIRECT files: 4096-aligned, len and offset multiples of 4096.
  size_t len = 0;
  uint64_t offset = 0;
  size_t done = 0;
  Status status;
};

struct DiskIoOptions {
  // Memory that most ops will use (the pinned host pool); uring registers it as fixed buffers.
  std::byte* registered_base = nullptr;
  size_t registered_len = 0;
  // psync worker threads; uring rings (each ring serves one caller at a time).
  size_t parallelism = 4;
  size_t queue_depth = 64;
  // uring: the RegistrationFd() of another backend with the same registered memory, whose
  // registration this one shares instead of registering it again (-1: none).
  int share_registration_of = -1;
};

class KVOFFLOAD_EXPORT DiskIo {
 public:
  virtual ~DiskIo() = default;
  virtual std::string_view name() const = 0;
  // Human-readable detail for the startup report ("uring: 4 rings, fixed buffers").
  virtual std::string Describe() const = 0;
  // Runs every op and returns when all have completed (each with its own status).
  virtual void Execute(std::span<IoOp> ops) = 0;
  // Runs every op like Execute and calls done(i), on the calling thread, once op i has its
  // final status, in completion order, so that the caller can use each result (verify a
  // block, start its copy) while the other ops are still in flight. Returns after the last
  // call. done must not start I/O on this backend (the caller's ring or pool slot is busy).
  // The default (for decorators) runs Execute, then reports the ops in order.
  using OpDone = std::function<void(size_t index)>;
  virtual void ExecuteEach(std::span<IoOp> ops, const OpDone& done);
  // A descriptor that DiskIoOptions::share_registration_of can name while this backend lives:
  // uring's ring holding the registered memory; -1 where there is none (psync, no fixed buffers).
  virtual int RegistrationFd() const { return -1; }
};

// "uring", "psync" or "auto" (uring when the kernel and liburing allow it, else psync).
// "uring" where it is unavailable is Unavailable with the reason; unknown names are
// InvalidArgument listing DiskIoNames().
KVOFFLOAD_EXPORT Result<std::unique_ptr<DiskIo>> NewDiskIo(std::string_view name, const DiskIoOptions& options);
// The registered backends, sorted ("auto", "psync", "uring").
KVOFFLOAD_EXPORT std::vector<std::string> DiskIoNames();

// Whether files in `dir` can be opened with O_DIRECT (tmpfs cannot); probes with a real
// aligned write and read of a scratch file that it removes.
KVOFFLOAD_EXPORT bool SupportsODirect(const std::string& dir);

}  // namespace kvoffload

#endif  // KVOFFLOAD_DISK_IO_H_
