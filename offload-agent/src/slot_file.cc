// Slot file: a free list of fixed slots over one file, grown with fallocate in chunks.
#include "slot_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "io_status.h"

namespace kvoffload {
namespace {

// What one growth of the file allocates at least: large enough that allocation is rare and
// contiguous, small enough that a tier far larger than its traffic does not hold the disk
// space of blocks it never had.
constexpr uint64_t kGrowBytes = uint64_t{64} << 20;

}  // namespace

SlotFile::SlotFile(std::string path, int fd, size_t slot_bytes, size_t max_slots)
    : path_(std::move(path)), fd_(fd), slot_bytes_(slot_bytes), max_slots_(max_slots) {}

SlotFile::~SlotFile() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

Result<std::unique_ptr<SlotFile>> SlotFile::Create(const std::string& path, size_t slot_bytes,
                                                   size_t max_slots, int open_flags) {
  const int fd = ::open(path.c_str(), open_flags | O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "create " + path);
  return std::unique_ptr<SlotFile>(new SlotFile(path, fd, slot_bytes, max_slots));
}

uint64_t SlotFile::Acquire() {
  MutexLock lock(&mu_);
  if (free_.empty()) return next_++;
  const uint64_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void SlotFile::Release(uint64_t slot) {
  MutexLock lock(&mu_);
  free_.push_back(slot);
}

Status SlotFile::Allocate(uint64_t slot) {
  const uint64_t end = Offset(slot) + slot_bytes_;
  if (end <= allocated_.load(std::memory_order_acquire)) return Status::Ok();
  MutexLock lock(&grow_mu_);
  const uint64_t have = allocated_.load(std::memory_order_relaxed);
  if (end <= have) return Status::Ok();
  const uint64_t limit = uint64_t{max_slots_} * slot_bytes_;
  const uint64_t chunk = std::max<uint64_t>(kGrowBytes / slot_bytes_, 1) * slot_bytes_;
  const uint64_t want = std::min(limit, std::max(end, have + chunk));
  if (fallocate_works_) {
    if (::fallocate(fd_, 0, static_cast<off_t>(have), static_cast<off_t>(want - have)) == 0) {
      allocated_.store(want, std::memory_order_release);
      return Status::Ok();
    }
    if (errno != EOPNOTSUPP && errno != ENOSYS) {
      // Not room for a chunk: perhaps for this one slot. The next slot past it tries again.
      const int err = errno;
      const auto at = static_cast<off_t>(Offset(slot));
      if (::fallocate(fd_, 0, at, static_cast<off_t>(slot_bytes_)) == 0) return Status::Ok();
      return ErrnoStatus(err, "allocate slot " + std::to_string(slot) + " of " + path_);
    }
    // A file system without fallocate (some network ones): the file grows sparse, and the
    // write allocates.
    fallocate_works_ = false;
  }
  if (::ftruncate(fd_, static_cast<off_t>(want)) != 0) {
    return ErrnoStatus(errno, "grow " + path_);
  }
  allocated_.store(want, std::memory_order_release);
  return Status::Ok();
}

}  // namespace kvoffload
