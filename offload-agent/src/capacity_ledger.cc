// Memory and flock(2)-file implementations of the capacity ledger.
#include "capacity_ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "io_status.h"
#include "process_tag.h"

namespace kvoffload {
namespace {

class MemoryLedger final : public CapacityLedger {
 public:
  MemoryLedger(uint64_t capacity, uint64_t used) : capacity_(capacity), used_(used) {}
  bool TryReserve(uint64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ + n > capacity_) return false;
    used_ += n;
    return true;
  }
  bool Settle(uint64_t n, const std::function<bool()>& publish) override {
    std::lock_guard<std::mutex> lock(mu_);
    const bool published = publish();
    if (!published) Sub(n);
    return published;
  }
  bool Free(uint64_t n, const Remove& remove) override {
    std::lock_guard<std::mutex> lock(mu_);
    const bool removed = remove(&n);
    if (removed) Sub(n);
    return removed;
  }
  uint64_t used() override {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  uint64_t capacity() const override { return capacity_; }
  bool Recount() override { return false; }

 private:
  void Sub(uint64_t n) { used_ = n > used_ ? 0 : used_ - n; }
  std::mutex mu_;
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

uint64_t ReadU64(int fd) {
  uint64_t v = 0;
  // A short read (fresh file) leaves 0; 8-byte pwrites are whole because every reader and
  // writer holds the ledger lock.
  if (::pread(fd, &v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) return 0;
  return v;
}

void WriteU64(int fd, uint64_t v) {
  // Failure here only leaves a stale value; the next write or recount repairs it.
  [[maybe_unused]] ssize_t n = ::pwrite(fd, &v, sizeof(v), 0);
}

// A ledger file and this writer's file beside it, locked.
struct Files {
  int fd = -1;
  int writer_fd = -1;
};

// Opens (creating them and their directory) the ledger at `path` and writer file `name` in
// `path`.writers/. The writer file is created and locked under the ledger lock: a reaper
// (which holds it) never takes a writer file that exists but is not locked yet for one whose
// writer died.
// Opens (creating it and its directory) the ledger file at `path`.
Result<int> OpenLedgerFile(const std::string& path) {
  std::error_code ec;
  // Our directory, unless it was removed from outside (the tier's own directory, its mount,
  // is never created here).
  std::filesystem::create_directory(std::filesystem::path(path).parent_path(), ec);
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open ledger " + path);
  return fd;
}

Result<Files> OpenFiles(const std::string& path, const std::string& name) {
  Result<int> opened = OpenLedgerFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  const std::string writers = path + ".writers";
  if (::mkdir(writers.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, "create " + writers);
  }
  int wfd = -1;
  int err = 0;
  {
    FileLock lock(fd);
    // O_EXCL: never another writer's file, which truncating would make it forget its bytes
    // in flight before its lock refused us.
    wfd = ::open((writers + "/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
    if (wfd >= 0 && ::flock(wfd, LOCK_EX | LOCK_NB) != 0) {
      err = errno;
      ::close(wfd);
      wfd = -1;
    } else if (wfd < 0) {
      err = errno;
    }
  }
  if (wfd < 0) {
    ::close(fd);
    return ErrnoStatus(err, "create writer file in " + writers);
  }
  return Files{fd, wfd};
}

// Whether `path` names the file open as `fd` (the same inode), not another or nothing.
bool IsFileAt(int fd, const std::string& path) {
  struct stat open {};
  struct stat named {};
  return ::fstat(fd, &open) == 0 && ::stat(path.c_str(), &named) == 0 &&
         named.st_ino == open.st_ino && named.st_dev == open.st_dev;
}

// How often a ledger that is not full looks for writers that died.
constexpr auto kReapInterval = std::chrono::seconds(5);

class FileLedger final : public CapacityLedger {
 public:
  FileLedger(int fd, int writer_fd, std::string path, std::string writer_name,
             uint64_t capacity, ScanUsed scan_used)
      : fd_(fd),
        writer_fd_(writer_fd),
        path_(std::move(path)),
        writers_dir_(path_ + ".writers"),
        writer_name_(std::move(writer_name)),
        capacity_(capacity),
        scan_used_(std::move(scan_used)) {}
  ~FileLedger() override {
    {
      FileLock lock(fd_);
      ::unlink((writers_dir_ + "/" + writer_name_).c_str());  // nothing in flight any more
    }
    ::close(writer_fd_);
    ::close(fd_);
  }

  bool TryReserve(uint64_t n) override {
    std::lock_guard<std::mutex> guard(mu_);
    FollowPath();
    FileLock lock(fd_);
    uint64_t used = Load(0).used;
    const auto now = std::chrono::steady_clock::now();
    if (Exceeds(used, n) || now - last_reap_ > kReapInterval) {
      last_reap_ = now;
      // A writer killed at any point may have charged bytes it never wrote down as in flight
      // (or the reverse): after a death the files, not the arithmetic, say what is used.
      if (ReapDeadWriters()) {
        used = OnDiskAndInFlight();
        WriteU64(fd_, used);
      }
    }
    if (Exceeds(used, n)) return false;
    WriteU64(fd_, used + n);
    in_flight_ += n;
    WriteU64(writer_fd_, in_flight_);
    return true;
  }
  bool Settle(uint64_t n, const std::function<bool()>& publish) override {
    std::lock_guard<std::mutex> guard(mu_);
    FileLock lock(fd_);
    const bool published = publish();
    in_flight_ = Sub(in_flight_, n);
    WriteU64(writer_fd_, in_flight_);
    if (!published) {
      // Our reservation is in the total: a total below it is damaged. A recount already
      // leaves our bytes out (they are no longer in flight).
      const Loaded total = Load(n);
      if (!total.recounted) WriteU64(fd_, Sub(total.used, n));
    }
    return published;
  }
  bool Free(uint64_t n, const Remove& remove) override {
    std::lock_guard<std::mutex> guard(mu_);
    FileLock lock(fd_);
    const bool removed = remove(&n);
    if (removed) {
      // The file was counted: a total below its size is damaged. A recount made after the
      // unlink already leaves it out.
      const Loaded total = Load(n);
      if (!total.recounted) WriteU64(fd_, Sub(total.used, n));
    }
    return removed;
  }
  uint64_t used() override {
    std::lock_guard<std::mutex> guard(mu_);
    FileLock lock(fd_);
    return ReadU64(fd_);
  }
  uint64_t capacity() const override { return capacity_; }
  bool Recount() override {
    std::lock_guard<std::mutex> guard(mu_);
    FileLock lock(fd_);
    if (!RecountDue()) return false;
    RecountLocked();
    return true;
  }

  // REQUIRES: the ledger lock. Sets the total to what is on disk plus what live writers have
  // in flight, and returns it.
  uint64_t RecountLocked() {
    ReapDeadWriters();
    const uint64_t used = OnDiskAndInFlight();
    WriteU64(fd_, used);
    return used;
  }
  int fd() const { return fd_; }

 private:
  static uint64_t Sub(uint64_t a, uint64_t b) { return b > a ? 0 : a - b; }
  // Whether n more bytes go past the capacity; no overflow, whatever the total read.
  bool Exceeds(uint64_t used, uint64_t n) const { return used > capacity_ || n > capacity_ - used; }

  // REQUIRES: mu_. Whether a recount may run now (kRecountInterval since the last one that
  // was not at open); if so, it counts as run.
  bool RecountDue() {
    const auto now = std::chrono::steady_clock::now();
    if (recounted_ && now - last_recount_ < kRecountInterval) return false;
    recounted_ = true;
    last_recount_ = now;
    return true;
  }

  struct Loaded {
    uint64_t used = 0;
    bool recounted = false;
  };
  // REQUIRES: the ledger lock. The stored total; when it cannot be right (a file shorter than
  // 8 bytes, more than the capacity, or less than `at_least`, which the caller knows it
  // holds), the recount of the files instead, when one is due. Someone truncating or writing
  // the ledger while engines run otherwise left the tier over its capacity, or refusing every
  // write, until the next open.
  // A file cut short is recounted even within kRecountInterval of the last recount: no writer
  // leaves it so, and read as 0 it let the tier fill to twice its capacity when it was cut a
  // second time soon after the first. (A total over this replica's capacity may be another
  // replica's larger one: that waits for the interval.)
  Loaded Load(uint64_t at_least) {
    uint64_t v = 0;
    const bool whole = ::pread(fd_, &v, sizeof(v), 0) == static_cast<ssize_t>(sizeof(v));
    if (whole && v <= capacity_ && v >= at_least) return {v, false};
    if (whole && !RecountDue()) return {v, false};
    if (!whole) RecountDue();  // counts as run
    return {RecountLocked(), true};
  }

  // Calls f(name, fd, alive) for every other writer file. A writer's file is flock'ed for as
  // long as the writer lives, so getting its lock means the writer is gone.
  template <typename F>
  void ForEachOtherWriter(F f) {
    DIR* d = ::opendir(writers_dir_.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.' && writer_name_ != e->d_name) names.emplace_back(e->d_name);
    }
    ::closedir(d);
    for (const std::string& name : names) {
      const std::string path = writers_dir_ + "/" + name;
      const int wfd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (wfd < 0) continue;
      const bool dead = ::flock(wfd, LOCK_EX | LOCK_NB) == 0;
      f(path, wfd, !dead);
      ::close(wfd);
    }
  }

  // REQUIRES: the ledger lock. Removes the files of writers that died; true when there was one.
  bool ReapDeadWriters() {
    bool any = false;
    ForEachOtherWriter([&any](const std::string& path, int, bool alive) {
      if (alive) return;
      any = true;
      ::unlink(path.c_str());
    });
    return any;
  }

  // REQUIRES: the ledger lock. The files on disk plus what live writers have in flight. A live
  // writer's temp file is left out of the files: its bytes are in its in-flight count from the
  // reservation to Settle, and after Settle's link the file is a block under another name
  // too (named temp files, where O_TMPFILE is missing: NFS), so it was counted twice.
  uint64_t OnDiskAndInFlight() {
    uint64_t in_flight = in_flight_;
    LiveWriters live{TagOf(writer_name_)};
    ForEachOtherWriter([&](const std::string& path, int wfd, bool alive) {
      if (!alive) return;
      in_flight += ReadU64(wfd);
      live.insert(TagOf(path.substr(path.rfind('/') + 1)));
    });
    return scan_used_(live) + in_flight;
  }
  // A writer file is named "<process tag>.<n>" (OpenFileLedger).
  static std::string TagOf(const std::string& writer_name) {
    return writer_name.substr(0, writer_name.rfind('.'));
  }

  // REQUIRES: mu_, not the ledger lock. When the ledger file is no longer at its path (the
  // tier's format directory removed from outside, with the writer files, or the ledger file
  // alone removed or replaced), moves to the ledger at the path, creating it (and our writer
  // file, where that went too) there, and recounts it: replicas that kept
  // counting in the removed file and replicas started since, counting in a new one, would
  // each fill the whole capacity. Checked at every reservation (two stats, next to the
  // block write it is for). Should the move fail (the file system turned read-only), the old
  // ledger is kept and the next reservation tries again.
  void FollowPath() {
    if (IsFileAt(fd_, path_)) return;
    // Only the ledger file replaced or removed (`rm ledger`, a restore that renames one in):
    // our writer file is still where the others count it, and creating it again (O_EXCL)
    // would fail at every reservation, leaving us counting in the old file for good.
    if (IsFileAt(writer_fd_, writers_dir_ + "/" + writer_name_)) {
      Result<int> ledger = OpenLedgerFile(path_);
      if (!ledger.ok()) return;
      int old = *ledger;
      {
        FileLock lock(old);
        std::swap(fd_, old);
        RecountLocked();
      }
      ::close(old);
      return;
    }
    Result<Files> moved = OpenFiles(path_, writer_name_);
    if (!moved.ok()) return;
    {
      FileLock lock(moved->fd);
      WriteU64(moved->writer_fd, in_flight_);
      ::close(writer_fd_);  // its lock goes with it; the file went (or moved) with its directory
      writer_fd_ = moved->writer_fd;
      std::swap(fd_, moved->fd);
      RecountLocked();
    }
    ::close(moved->fd);  // the old ledger, now that ours is the new one
  }

  std::mutex mu_;  // one thread of this process at a time under the flock
  int fd_;         // replaced (under mu_) only by FollowPath
  int writer_fd_;
  const std::string path_;
  const std::string writers_dir_;
  const std::string writer_name_;
  const uint64_t capacity_;
  const ScanUsed scan_used_;
  uint64_t in_flight_ = 0;
  std::chrono::steady_clock::time_point last_reap_ = std::chrono::steady_clock::now();
  // The last recount besides the one at open (recounted_: there was one), for the rate limit.
  bool recounted_ = false;
  std::chrono::steady_clock::time_point last_recount_;
};

}  // namespace

std::unique_ptr<CapacityLedger> NewMemoryLedger(uint64_t capacity, uint64_t used) {
  return std::make_unique<MemoryLedger>(capacity, used);
}

Result<std::unique_ptr<CapacityLedger>> OpenFileLedger(const std::string& path, uint64_t capacity,
                                                       const ScanUsed& scan_used) {
  // The process's tag plus a counter: two engines of one process on one tier are two writers,
  // and two processes of two pods are too, whatever their pids (process_tag.h).
  static std::atomic<unsigned> counter{0};
  const std::string name = ProcessTag() + "." + std::to_string(counter.fetch_add(1));
  Result<Files> files = OpenFiles(path, name);
  if (!files.ok()) return files.status();
  auto ledger =
      std::make_unique<FileLedger>(files->fd, files->writer_fd, path, name, capacity, scan_used);
  {
    // The files win: whatever the stored total says (a writer killed between reserving and
    // publishing left its bytes counted), the recount is what is on disk and in flight.
    FileLock lock(ledger->fd());
    ledger->RecountLocked();
  }
  return std::unique_ptr<CapacityLedger>(std::move(ledger));
}

}  // namespace kvoffload
