// Memory and flock(2)-file implementations of the capacity ledger.
#include "capacity_ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "io_status.h"

namespace kvoffload {
namespace {

class MemoryLedger final : public CapacityLedger {
 public:
  MemoryLedger(uint64_t capacity, uint64_t used) : capacity_(capacity), used_(used) {}
  bool TryReserve(uint64_t n) override {
    if (used_ + n > capacity_) return false;
    used_ += n;
    return true;
  }
  void Release(uint64_t n) override { used_ = n > used_ ? 0 : used_ - n; }
  uint64_t used() override { return used_; }
  uint64_t capacity() const override { return capacity_; }

 private:
  const uint64_t capacity_;
  uint64_t used_;
};

// Holds flock(LOCK_EX) on the ledger file for one read-modify-write.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

class FileLedger final : public CapacityLedger {
 public:
  FileLedger(int fd, uint64_t capacity) : fd_(fd), capacity_(capacity) {}
  ~FileLedger() override { ::close(fd_); }

  bool TryReserve(uint64_t n) override {
    FileLock lock(fd_);
    uint64_t used = Read();
    if (used + n > capacity_) return false;
    Write(used + n);
    return true;
  }
  void Release(uint64_t n) override {
    FileLock lock(fd_);
    uint64_t used = Read();
    Write(n > used ? 0 : used - n);
  }
  uint64_t used() override {
    FileLock lock(fd_);
    return Read();
  }
  uint64_t capacity() const override { return capacity_; }

  // REQUIRES: lock held.
  uint64_t Read() {
    uint64_t v = 0;
    // A short read (fresh file) leaves 0; the 8-byte pwrite below is atomic enough because all
    // readers and writers hold the lock.
    if (::pread(fd_, &v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) return 0;
    return v;
  }
  void Write(uint64_t v) {
    // Failure here only leaves the ledger stale; the next Write repairs it. Capacity is then
    // enforced on the last value that reached the file.
    [[maybe_unused]] ssize_t n = ::pwrite(fd_, &v, sizeof(v), 0);
  }

 private:
  const int fd_;
  const uint64_t capacity_;
};

}  // namespace

std::unique_ptr<CapacityLedger> NewMemoryLedger(uint64_t capacity, uint64_t used) {
  return std::make_unique<MemoryLedger>(capacity, used);
}

Result<std::unique_ptr<CapacityLedger>> OpenFileLedger(const std::string& path, uint64_t capacity,
                                                       const std::function<uint64_t()>& scan_used) {
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open ledger " + path);
  auto ledger = std::make_unique<FileLedger>(fd, capacity);
  {
    FileLock lock(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat ledger " + path);
    if (st.st_size < static_cast<off_t>(sizeof(uint64_t))) ledger->Write(scan_used());
  }
  return std::unique_ptr<CapacityLedger>(std::move(ledger));
}

}  // namespace kvoffload
