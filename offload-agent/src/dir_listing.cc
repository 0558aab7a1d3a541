#include "dir_listing.h"

#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <algorithm>

namespace kvoffload {
namespace {

// Large buffers: each getdents64 call returns as many entries as fit, and the threads meet
// once per buffer rather than once per entry.
constexpr size_t kBufferBytes = size_t{256} << 10;
constexpr size_t kBuffersPerStream = 4;

}  // namespace

bool HashOrderedDirectory(int fd) {
  constexpr long kExt4Magic = 0xEF53;  // EXT4_SUPER_MAGIC, also ext2 and ext3
  struct statfs fs {};
  int flags = 0;
  return ::fstatfs(fd, &fs) == 0 && fs.f_type == kExt4Magic &&
         ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_INDEX_FL) != 0;
}

size_t ListingStreams(int fd) {
  constexpr off_t kMaxStreams = 8;
  struct stat st {};
  if (!HashOrderedDirectory(fd) || ::fstat(fd, &st) != 0) return 1;
  return static_cast<size_t>(std::min<off_t>(kMaxStreams, 1 + st.st_size / (off_t{1} << 20)));
}

DirectoryReader::DirectoryReader(int fd, size_t streams) : fd_(fd) {
  // 64-bit hash positions: the major hash (its lowest bit always clear) shifted into the top
  // 31 bits, the minor hash below; past the last entry is 2^63 - 1.
  const uint64_t split = (uint64_t{1} << 63) / std::max<size_t>(streams, 1);
  // Each stream reads through a descriptor of its own, opened and placed here: one that
  // cannot be (out of descriptors) leaves the whole listing to one stream rather than a part
  // of the directory unlisted.
  fds_.assign(std::max<size_t>(streams, 1), -1);
  fds_[0] = fd_;
  for (size_t i = 1; i < fds_.size(); ++i) {
    fds_[i] = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds_[i] < 0 || ::lseek(fds_[i], static_cast<off_t>(split * i), SEEK_SET) < 0) {
      for (size_t j = 1; j <= i; ++j) {
        if (fds_[j] >= 0) ::close(fds_[j]);
      }
      fds_.resize(1);
      break;
    }
  }
  {
    MutexLock lock(&mu_);
    running_ = fds_.size();
  }
  for (size_t i = 0; i < fds_.size(); ++i) {
    const uint64_t last = i + 1 == fds_.size() ? UINT64_MAX : split * (i + 1);
    threads_.emplace_back([this, i, last] { Run(fds_[i], last); });
  }
}

DirectoryReader::~DirectoryReader() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
  for (int fd : fds_) ::close(fd);
}

std::span<const char> DirectoryReader::Next() {
  MutexLock lock(&mu_);
  if (!current_.empty()) {
    free_.push_back(std::move(current_));
    current_ = {};
    cv_.SignalAll();
  }
  while (full_.empty() && running_ > 0) cv_.Wait();
  if (full_.empty()) return {};
  current_ = std::move(full_.front());
  full_.pop_front();
  return current_;
}

std::string DirectoryReader::FirstNameFrom(uint64_t pos) const {
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return {};
  std::vector<char> buf(4096);
  std::string name;
  if (::lseek(fd, static_cast<off_t>(pos), SEEK_SET) >= 0 &&
      ::getdents64(fd, buf.data(), buf.size()) > 0) {
    name = NameAt(buf, 0);
  }
  ::close(fd);
  return name;
}

void DirectoryReader::Run(int fd, uint64_t last) {
  const bool single = fds_.size() == 1;
  bool first_buffer = true;
  bool done = false;
  std::vector<char> buf;
  while (!done) {
    {
      MutexLock lock(&mu_);
      while (free_.empty() && buffers_ == kBuffersPerStream * fds_.size() && !stopping_) {
        cv_.Wait();
      }
      if (stopping_) break;
      if (!free_.empty()) {
        buf = std::move(free_.back());
        free_.pop_back();
      } else {
        ++buffers_;
      }
    }
    buf.resize(kBufferBytes);
    const ssize_t n = ::getdents64(fd, buf.data(), buf.size());
    if (n <= 0) break;
    buf.resize(static_cast<size_t>(n));
    if (!single) {
      // An entry's own position is the one the record before it gives as its successor's
      // (d_off). The stream ends with the first entry whose successor is at `last` or past.
      for (size_t at = 0; at < buf.size();) {
        const struct dirent64 e = RecordAt(buf, at);
        at += e.d_reclen;
        if (static_cast<uint64_t>(e.d_off) >= last) {
          buf.resize(at);
          done = true;
          break;
        }
      }
      // The first entry's own position is only known to be at `first` or past. When the
      // stream ends with it, it is ours only if the first entry at `last` or past is another
      // one (else a later stream lists it: its part of the hash space is empty).
      if (first_buffer && done && buf.size() == RecordAt(buf, 0).d_reclen &&
          FirstNameFrom(last) == NameAt(buf, 0)) {
        buf.clear();
      }
    }
    first_buffer = false;
    MutexLock lock(&mu_);
    if (!buf.empty()) {
      full_.push_back(std::move(buf));
      cv_.SignalAll();
    }
    buf = {};
  }
  MutexLock lock(&mu_);
  --running_;
  cv_.SignalAll();
}

}  // namespace kvoffload
