// The disk I/O backend registry with its built-ins ("auto" probes io_uring and falls back to
// psync), the O_DIRECT probe and the default ExecuteEach.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "disk_io_backends.h"
#include "kvoffload/disk_io.h"
#include "process_tag.h"

namespace kvoffload {

void DiskIo::ExecuteEach(std::span<IoOp> ops, const OpDone& done) {
  Execute(ops);
  for (size_t i = 0; i < ops.size(); ++i) done(i);
}

DiskIoRegistry& DiskIoBackends() {
  // Leaked on purpose, as EvictionPolicies() is.
  static DiskIoRegistry* registry = [] {
    auto* r = new DiskIoRegistry("disk I/O backend");
    r->Register("psync", &NewPsyncIo);
    r->Register("uring", &NewUringIo);
    r->Register("auto", [](const DiskIoOptions& options) -> Result<std::unique_ptr<DiskIo>> {
      Result<std::unique_ptr<DiskIo>> uring = NewUringIo(options);
      if (uring.ok()) return uring;
      return NewPsyncIo(options);
    });
    return r;
  }();
  return *registry;
}

std::vector<std::string> DiskIoNames() { return DiskIoBackends().Names(); }

Result<std::unique_ptr<DiskIo>> NewDiskIo(std::string_view name, const DiskIoOptions& options) {
  return DiskIoBackends().Create(name, options);
}

bool SupportsODirect(const std::string& dir) {
  static std::atomic<unsigned> counter{0};
  // Named by the process's tag, not its pid: another pod's engine at the same pid probing a
  // shared tier at once made O_EXCL fail, which read as a file system refusing O_DIRECT.
  std::string path = dir + "/.kvoffload-odirect-probe." + ProcessTag() + "." +
                     std::to_string(counter.fetch_add(1));
  int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;  // EINVAL: the file system refuses O_DIRECT (tmpfs)
  constexpr size_t kLen = 4096;
  void* buf = std::aligned_alloc(kLen, kLen);
  bool ok = buf != nullptr;
  if (ok) {
    std::memset(buf, 0x5A, kLen);
    const bool wrote = ::pwrite(fd, buf, kLen, 0) == static_cast<ssize_t>(kLen);
    // A full file system (a persistent tier restarting full) cannot show the write; it took
    // the O_DIRECT open, and one that refuses O_DIRECT I/O says EINVAL. Read as a refusal,
    // the tier ran buffered for its whole life, its Describe blaming the file system.
    ok = wrote ? ::pread(fd, buf, kLen, 0) == static_cast<ssize_t>(kLen)
               : errno == ENOSPC || errno == EDQUOT;
  }
  std::free(buf);
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

}  // namespace kvoffload
