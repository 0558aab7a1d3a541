// Disk tier: publish (temp file + link, or a slot), verified reads, eviction cascade
// (recovery at open: disk_tier_recovery.cc).
#include "disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "block_file.h"
#include "crc32c.h"
#include "io_status.h"
#include "kvoffload/tier_headroom.h"

namespace kvoffload {
namespace {

namespace fs = std::filesystem;

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer AllocAligned(size_t bytes) {
  return AlignedBuffer(static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, bytes)));
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Whether `dir` takes an O_TMPFILE (opened with `flags`) and linkat of it through /proc/self/fd:
// Linux >= 3.11 on ext4, xfs, btrfs, tmpfs; not every network or FUSE file system, nor a
// container without /proc. Probes with a real file, linked and removed.
bool SupportsTmpfileLink(const std::string& dir, int flags) {
  static std::atomic<unsigned> counter{0};
  const int fd = ::open(dir.c_str(), flags | O_TMPFILE | O_WRONLY, 0600);
  if (fd < 0) return false;
  const std::string probe = dir + "/.kvoffload-tmpfile-probe." + ProcessTag() + "." +
                            std::to_string(counter.fetch_add(1));
  const bool ok = ::linkat(AT_FDCWD, ("/proc/self/fd/" + std::to_string(fd)).c_str(), AT_FDCWD,
                           probe.c_str(), AT_SYMLINK_FOLLOW) == 0;
  ::close(fd);
  if (ok) ::unlink(probe.c_str());
  return ok;
}

// Whether `path` names something that is not a regular file (a directory, a symbolic link, a
// FIFO, ...): no block file, and not ours to read, count or remove (FORMAT.md, Compatibility).
// False when nothing is there.
bool NamesNonFile(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

// Open errors that say nothing about the file: the process or the system is short of something
// for now (EIO too, as a read's EIO: the disk may recover).
bool Transient(int err) {
  return err == EMFILE || err == ENFILE || err == ENOMEM || err == EIO || err == EINTR ||
         err == EAGAIN;
}

// Whether a tier keeps its blocks in a slot file: one nobody else reads and that never outlives
// its engine (FORMAT.md, Slot file).
bool KeepsSlots(const DiskTierConfig& c) { return !c.persistent && !c.shared; }

// The bytes one block takes in the tier: its file, or its slot where the tier keeps slots.
size_t StoredBytes(const DiskTierOptions& options) {
  return KeepsSlots(options.config) ? RoundUp(options.block_bytes, kBlockAlign)
                                    : BlockFileBytes(options.block_bytes);
}

// Creates, writes, syncs and removes a file in `dir`. A tier on a read-only or broken file
// system would otherwise open fine and drop every block pushed to it. A full one passes: a
// persistent tier may be full of its own blocks at restart, and eviction makes room.
Status ProbeWritable(const std::string& dir) {
  static std::atomic<unsigned> counter{0};
  const std::string probe = dir + "/.kvoffload-write-probe." + ProcessTag() + "." +
                            std::to_string(counter.fetch_add(1));
  auto full = [](int err) { return err == ENOSPC || err == EDQUOT; };
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    return full(errno) ? Status::Ok() : ErrnoStatus(errno, "cannot create a file in " + dir);
  }
  const char page[4096] = {};
  const bool written = ::write(fd, page, sizeof(page)) == static_cast<ssize_t>(sizeof(page));
  const int write_errno = errno;
  const bool synced = written && ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written && !full(write_errno)) return ErrnoStatus(write_errno, "cannot write to " + dir);
  if (written && !synced && !full(sync_errno)) {
    return ErrnoStatus(sync_errno, "cannot fsync a file in " + dir);
  }
  return Status::Ok();
}

}  // namespace

DiskTier::DirLock::~DirLock() {
  if (fd >= 0) ::close(fd);
}

DiskTier::DiskTier(const DiskTierOptions& options, std::unique_ptr<DiskIo> io)
    : options_(options),
      file_bytes_(BlockFileBytes(options.block_bytes)),
      stored_bytes_(StoredBytes(options)),
      dir_(FingerprintDir(options.config.path, options.fingerprint)),
      io_(std::move(io)) {
  stats_.name = options.name;
  stats_.capacity_bytes = options.config.capacity_bytes;
}

DiskTier::~DiskTier() {
  stop_settling_.store(true);
  if (settler_.joinable()) settler_.join();
  MutexLock lock(&mu_);
  for (const std::string& spare : spares_) ::unlink(spare.c_str());
  for (const auto& [key, held] : held_files_) ::close(held.fd);
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options,
                                                 std::unique_ptr<DiskIo> io) {
  // A tier larger than its file system never evicts: once the disk is full each new block is
  // refused (ENOSPC) and lost while the old ones stay. It holds what the file system does, less
  // the headroom the webhook keeps from a size it knows (an emptyDir's sizeLimit, a hand-written
  // size past the volume, a PVC whose file system's own overhead is more than that headroom).
  // Not refused: a PVC of a size's worth of bytes has a file system smaller than that.
  DiskTierOptions sized = options;
  struct statvfs fs {};
  // A file system that reports no size (ramfs, some FUSE ones) is not sized by it.
  if (::statvfs(options.config.path.c_str(), &fs) == 0 && fs.f_blocks > 0) {
    const uint64_t total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    const uint64_t fits = total - TierHeadroomBytes(total);
    if (options.config.capacity_bytes > fits) {
      sized.config.capacity_bytes = fits;
      WriteLog(options.log, options.field + ".capacityBytes=" +
                                std::to_string(options.config.capacity_bytes) +
                                " is more than the file system at " + options.config.path +
                                " holds (" + std::to_string(total) + " bytes, less " +
                                std::to_string(total - fits) + " kept free): the tier holds " +
                                std::to_string(fits) + " bytes");
    }
  }
  // Nor more blocks than its eviction policy indexes: a tier of tiny blocks on a large file
  // system is lowered, as above, rather than refused.
  const uint64_t stored = StoredBytes(options);
  if (sized.config.capacity_bytes / stored > options.max_blocks) {
    const uint64_t fits = options.max_blocks * stored;
    WriteLog(options.log, options.field + ".capacityBytes=" +
                              std::to_string(sized.config.capacity_bytes) + " is " +
                              std::to_string(sized.config.capacity_bytes / stored) +
                              " blocks, more than the eviction policy indexes (" +
                              std::to_string(options.max_blocks) + "): the tier holds " +
                              std::to_string(fits) + " bytes");
    sized.config.capacity_bytes = fits;
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(sized, std::move(io)));
  if (Status s = tier->Init(); !s.ok()) return s;
  return tier;
}

Status DiskTier::Init() {
  const DiskTierConfig& c = options_.config;
  // Start-up errors name the configuration entry first (the tier's name is what its metrics
  // and log lines call it).
  const std::string where = options_.field + " (" + options_.name + ", " + c.path + ")";
  if (c.capacity_bytes < stored_bytes_) {
    return Status::InvalidArgument(where + ": capacityBytes=" + std::to_string(c.capacity_bytes) +
                                   " holds no block of " + std::to_string(stored_bytes_) +
                                   " bytes; give it at least that, or leave the tier out");
  }
  // The tier's directory is its volume's mount. Created here, a tier whose volume is not
  // mounted would fill the container's own file system, and a persistent one would lose its
  // blocks at every restart.
  struct stat st {};
  const int stat_errno = ::stat(c.path.c_str(), &st) == 0 ? 0 : errno;
  if (stat_errno != 0 || !S_ISDIR(st.st_mode)) {
    const std::string what = stat_errno == ENOENT ? "does not exist"
                             : stat_errno != 0    ? std::strerror(stat_errno)
                                                  : "is not a directory";
    return Status::InvalidArgument(options_.field + ".path=\"" + c.path + "\": " + what +
                                   ": mount the tier's volume there");
  }
  // One engine per private tier: FORMAT.md's reuse renames over victims' files assuming no
  // other writer, each engine would count the directory's capacity as its own, and one that
  // starts empty removes kvoffload-v1, the other's blocks with it. The lock is flock'ed, so it
  // goes with the descriptor, at close or at the process's death. Read-only, so that it does
  // not keep the file system from being remounted read-only; NFS turns flock into a POSIX
  // lock, whose exclusive form needs a descriptor open for writing (EBADF): one is opened there.
  // Shared tiers lock it shared: their replicas open together, and a private opener is refused
  // while they are there.
  const std::string lock_path = c.path + "/kvoffload.lock";
  const int lock_op = (c.shared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  dir_lock_.fd = ::open(lock_path.c_str(), O_CREAT | O_RDONLY | O_CLOEXEC, 0644);
  int locked = dir_lock_.fd < 0 ? -1 : ::flock(dir_lock_.fd, lock_op);
  if (locked != 0 && errno == EBADF) {
    ::close(dir_lock_.fd);
    dir_lock_.fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    locked = dir_lock_.fd < 0 ? -1 : ::flock(dir_lock_.fd, lock_op);
  }
  if (dir_lock_.fd < 0) {
    // Something else by that name (a directory) is no matter of permissions.
    const int err = errno;
    return Status::IOError(options_.field + ".path=\"" + c.path + "\": cannot create " +
                           lock_path + ": " + std::strerror(err) +
                           (err == EISDIR ? "; remove that directory: the engine creates the file"
                                          : "; the tier must be writable"));
  }
  if (locked != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::FailedPrecondition(
          options_.field + ".path=\"" + c.path + "\": another engine has this directory open" +
          (c.shared ? " as a private tier" : "") +
          ": set shared:true for a tier several engines use, or give each engine its own "
          "directory");
    }
    // A file system without locks (NFS mounted nolock): the tier still works; only the
    // guard against a second engine is gone, which the log says.
    WriteLog(options_.log, options_.field + ".path=\"" + c.path + "\": cannot lock " + lock_path +
                               " (" + std::strerror(errno) +
                               "); make sure no other engine opens this directory");
  }
  std::error_code ec;
  // A fresh pod starts empty; a shared directory is never wiped (other replicas are using it).
  if (!c.persistent && !c.shared) fs::remove_all(FormatRoot(c.path), ec);
  fs::create_directories(dir_, ec);
  if (ec) return Status::IOError(where + ": cannot create " + dir_ + ": " + ec.message());
  if (Status s = ProbeWritable(dir_); !s.ok()) {
    return Status::IOError(where + ": " + s.message() + "; the tier must be writable");
  }
  direct_ = SupportsODirect(dir_);
  if (KeepsSlots(c)) {
    // Nobody else reads this tier and it never outlives us: its blocks need no names, and
    // one file of slots spares the file system a file per block (FORMAT.md, Slot file).
    Result<std::unique_ptr<SlotFile>> slots = SlotFile::Create(
        TempPath("slots"), stored_bytes_, c.capacity_bytes / stored_bytes_, OpenFlags(0));
    if (!slots.ok()) return Status::IOError(where + ": " + slots.status().message());
    slots_ = std::move(slots).value();
  } else {
    tmpfile_ = !options_.named_temp_files && SupportsTmpfileLink(dir_, OpenFlags(0));
  }

  Result<std::unique_ptr<EvictionPolicy>> policy =
      NewEvictionPolicy(options_.policy, std::max<size_t>(1, c.capacity_bytes / stored_bytes_));
  if (!policy.ok()) return policy.status();
  {
    MutexLock lock(&mu_);
    policy_ = std::move(policy).value();
  }

  uint64_t scanned_bytes = 0;
  std::vector<Recovered> recovered;
  if (c.persistent) {
    if (Status s = Scan(&scanned_bytes, &recovered); !s.ok()) return s;
  }
  std::unique_ptr<CapacityLedger> ledger;
  if (c.shared) {
    Result<std::unique_ptr<CapacityLedger>> file = OpenFileLedger(
        FormatRoot(c.path) + "/ledger", c.capacity_bytes, [this](const LiveWriters& live) { return ScanUsedBytes(live); });
    // Named like the other start-up errors: which entry of KVOFFLOAD_TIERS to look at.
    if (!file.ok()) return Status::IOError(where + ": " + file.status().message());
    ledger = std::move(file).value();
  } else {
    ledger = NewMemoryLedger(c.capacity_bytes, scanned_bytes);
  }
  MutexLock lock(&mu_);
  ledger_ = std::move(ledger);
  if (c.persistent) {
    // Serving starts now; ordering, checking sizes and shedding blocks past a smaller capacity
    // follow on their own thread; until that is done no block of ours is evicted.
    settled_ = false;
    settler_ = std::thread([this, files = std::move(recovered)]() mutable {
      Settle(std::move(files));
    });
  }
  return Status::Ok();
}

bool DiskTier::EvictForeignLocked(Status* failure) {
  if (foreign_.empty()) return false;
  const std::string& path = foreign_.back().first;
  int err = 0;
  ledger_->Free(foreign_.back().second, [&](uint64_t*) { return UnlinkCounted(path, &err); });
  if (StillThere(err)) {
    if (failure) *failure = ErrnoStatus(err, "remove " + path);
    return false;
  }
  const fs::path dir = fs::path(path).parent_path();
  foreign_.pop_back();
  // Removed, not moved down: no lower tier takes another model's block.
  ++stats_.evictions;
  ++stats_.dropped;
  // A private tier removes a fingerprint directory with its last file (rmdir fails while
  // another is there). In a shared tier a replica of that fingerprint may still write there.
  if (!options_.config.shared) ::rmdir(dir.c_str());
  return true;
}

bool DiskTier::UnlinkCounted(const std::string& path, int* err) const {
  const int e = ::unlink(path.c_str()) == 0 ? 0 : errno;
  if (err) *err = e;
  return e == 0 || (e == ENOENT && !options_.config.shared);
}

int DiskTier::OpenFlags(int base) const { return base | O_CLOEXEC | (direct_ ? O_DIRECT : 0); }

bool DiskTier::IsPinnedLocked(const BlockKey& key) const {
  if (inserting_.contains(key)) return true;
  auto it = entries_.find(key);
  return it != entries_.end() && (it->second.pins > 0 || it->second.evicting ||
                                  (options_.holds && options_.holds->Contains(key)));
}

bool DiskTier::Protected(const BlockKey& key) {
  if (!Contains(key)) return false;  // also indexes a file another process shared since
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.evicting || it->second.doomed) return false;
  if (!HoldsFilesOpen()) return true;
  auto [held, first] = held_files_.try_emplace(key);
  if (first) {
    Result<int> fd = OpenBlockFile(key);
    if (!fd.ok()) {
      held_files_.erase(held);
      // Another process removed it (and gave its bytes back), or it is no block file: it is
      // not here any more. Otherwise (EMFILE, ...) a miss for this hold; the file stays.
      NoteReadFailureLocked(&it->second, fd.status());
      if (it->second.doomed && it->second.pins == 0) RemoveDoomedLocked(key);
      return false;
    }
    held->second.fd = *fd;
  }
  ++held->second.holds;
  return true;
}

void DiskTier::ReleaseHold(const BlockKey& key) {
  if (!HoldsFilesOpen()) return;  // Protected opened nothing here
  MutexLock lock(&mu_);
  auto it = held_files_.find(key);
  if (it == held_files_.end() || --it->second.holds > 0) return;
  ::close(it->second.fd);
  held_files_.erase(it);
}

int DiskTier::HeldFileForRead(const BlockKey& key) {
  if (!HoldsFilesOpen()) return -1;  // no lock taken on the other tiers' reads
  MutexLock lock(&mu_);
  auto it = held_files_.find(key);
  if (it == held_files_.end()) return -1;
  ++it->second.holds;
  return it->second.fd;
}

bool DiskTier::Contains(const BlockKey& key) {
  // In use here (pinned, being evicted, held open): its file is there for us whatever other
  // replicas do.
  auto in_use = [this](const Entry& e, const BlockKey& k) NO_THREAD_SAFETY_ANALYSIS {
    return e.pins > 0 || e.evicting || held_files_.contains(k);
  };
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      if (it->second.doomed) return false;
      if (!options_.config.shared || in_use(it->second, key)) return true;
    } else if (!options_.config.shared) {
      return false;
    }
  }
  // Shared tier: another process may have published it since we started, or evicted it since
  // we indexed it (a lookup then reported a block whose load failed).
  auto on_disk = [this, &key] {
    // lstat: a link, even to a file of the right size, is no block file (FORMAT.md,
    // Compatibility), and an ext4 directory of one block has a block file's size at 4 KiB.
    struct stat st {};
    return ::lstat(BlockPath(dir_, key).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           static_cast<uint64_t>(st.st_size) == file_bytes_;
  };
  const bool there = on_disk();
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (!there) {
    // Checked again under the lock: a block we published since the first look is indexed
    // only after its file is linked.
    if (it != entries_.end() && !it->second.doomed && !in_use(it->second, key) && !on_disk()) {
      // A name that is no block file any more is not ours to remove (FORMAT.md); a file gone
      // took its bytes back with the other process's unlink.
      if (NamesNonFile(BlockPath(dir_, key))) {
        DropNonFileLocked(key);
      } else {
        RemoveLocked(key);
      }
    }
    return false;
  }
  if (it == entries_.end()) IndexSharedLocked(key);
  return true;
}

bool DiskTier::IndexSharedLocked(const BlockKey& key) {
  if (inserting_.contains(key) || !entries_.emplace(key, Entry{}).second) return false;
  PolicyOn(PolicyCall::kInsert, key);
  return true;
}

void DiskTier::Refresh(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && !it->second.evicting && !it->second.doomed) {
    PolicyOn(PolicyCall::kAccess, key);
  }
}

Status DiskTier::Insert(const BlockKey& key, std::byte* file,
                        const std::function<void()>& encode) {
  Status result;
  InsertBatch(std::span(&key, 1), std::span(&file, 1),
              encode ? BlockEncoder([&encode](size_t) { encode(); }) : BlockEncoder(),
              std::span(&result, 1));
  return result;
}

void DiskTier::InsertBatch(std::span<const BlockKey> keys, std::span<std::byte* const> files,
                           const BlockEncoder& encode, std::span<Status> results) {
  std::vector<size_t> todo;  // the blocks this call writes, with their rooms
  std::vector<Room> rooms;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    results[i] = Status::Ok();
    if (auto it = entries_.find(key); it != entries_.end()) {
      if (!it->second.evicting && !it->second.doomed) {
        // Already here (promotion keeps the disk copy): the block comes back as the newest,
        // as a write would have made it. Left at the recency of its promotion, it was this
        // tier's next victim, ahead of blocks never read again.
        PolicyOn(PolicyCall::kAccess, key);
        continue;
      }
      // A doomed copy nobody holds is one whose file could not be removed (stuck_): it goes
      // now if it can, and this copy takes its place.
      const bool stuck = it->second.doomed && !it->second.evicting && it->second.pins == 0;
      if (!stuck || !RemoveLocked(key)) {
        // The old copy is leaving. Waiting for it could wait on a job that waits on us, so
        // this copy is given up (the caller counts it as dropped).
        results[i] = Status::Unavailable("block " + key.ToHex() + " is being removed from " +
                                         options_.name);
        continue;
      }
    }
    if (inserting_.contains(key)) continue;  // another thread (or this batch) is writing it
    inserting_.insert(key);
    PolicyOn(PolicyCall::kInsert, key);
    Room room;
    if (Status s = Reserve(&room); !s.ok()) {
      // Full: every file of ours is pinned, held or being evicted. Otherwise a victim's file
      // could not be removed (a read-only file system), which the state says.
      const bool full = s.code() == StatusCode::kResourceExhausted;
      ++(full ? stats_.refused : stats_.io_errors);
      inserting_.erase(key);
      PolicyOn(PolicyCall::kRemove, key);
      NoteWrite(s, /*no_victim=*/full);
      cv_.SignalAll();
      results[i] = s;
      continue;
    }
    todo.push_back(i);
    rooms.push_back(std::move(room));
  }
  if (todo.empty()) return;
  lock.Unlock();
  // Written together: a store job's evictions keep as many writes in flight as it has blocks,
  // instead of one at a time on the job's thread.
  std::vector<Result<bool>> published;
  if (slots_) {
    std::vector<std::byte*> slot_files;
    std::vector<uint64_t> slot_numbers;
    for (size_t j = 0; j < todo.size(); ++j) {
      slot_files.push_back(files[todo[j]]);
      slot_numbers.push_back(rooms[j].slot);
    }
    // A slot holds the payload alone, and its checksum goes to the index: each block is
    // encoded once its write is done, while the batch's other writes are in flight, instead
    // of all of them before the first write starts (8 x 4 us at 64 KiB, with the disk idle).
    published = WriteSlots(slot_files, slot_numbers, [&](size_t j) {
      if (encode) encode(todo[j]);
    });
  } else {
    // A file's trailer is part of what it writes.
    if (encode) {
      for (size_t i : todo) encode(i);
    }
    for (size_t j = 0; j < todo.size(); ++j) {
      published.push_back(WriteFile(keys[todo[j]], files[todo[j]], rooms[j]));
    }
  }
  lock.Lock();
  for (size_t j = 0; j < todo.size(); ++j) {
    const size_t i = todo[j];
    const BlockKey& key = keys[i];
    inserting_.erase(key);
    // The write settled the reservation: kept when our file (or another process's) holds the
    // bytes, given back otherwise.
    if (published[j].ok()) {
      // A slot file keeps the payload's checksum here rather than in a trailer on disk.
      const uint32_t crc = slots_ ? EncodedPayloadCrc(files[i], options_.block_bytes) : 0;
      entries_.emplace(key, Entry{.at = {rooms[j].slot, crc}});
      if (options_.events) options_.events->Record(key, options_.tier, /*removed=*/false);
    } else {
      PolicyOn(PolicyCall::kRemove, key);
      ++stats_.io_errors;
    }
    NoteWrite(published[j].status());
    results[i] = published[j].status();
  }
  cv_.SignalAll();
}

Status DiskTier::Reserve(Room* room) {
  bool listed = false;
  bool recounted = false;
  for (;;) {
    if (!spares_.empty()) {
      std::string spare = std::move(spares_.back());
      spares_.pop_back();
      // A spare's bytes are still counted, so writing over it keeps the count where it is.
      // Above the capacity (a persistent tier reopened smaller while its blocks were held, so
      // that the start-up could not shed them) it goes instead, and with it its bytes, until a
      // write fits again.
      if (ledger_->used() > ledger_->capacity()) {
        ledger_->Free(file_bytes_, [&](uint64_t*) { return UnlinkCounted(spare); });
        continue;
      }
      room->spare = std::move(spare);
      return Status::Ok();
    }
    // Recovered blocks are counted at the size this format writes, so a write that fits goes
    // ahead before they are checked; other fingerprints' files were ordered at open.
    if (ledger_->TryReserve(stored_bytes_)) {
      // The ledger holds at most capacity / stored_bytes_ blocks: a slot is always free.
      if (slots_) room->slot = slots_->Acquire();
      return Status::Ok();
    }
    Status foreign_failure;
    if (EvictForeignLocked(&foreign_failure)) continue;
    if (!foreign_failure.ok()) return foreign_failure;
    if (RemoveStuckLocked()) continue;
    // Our victims only once the recovered blocks are in the policy, oldest first (and any of
    // the wrong size removed, which may leave room).
    if (!settled_) {
      cv_.Wait();
      continue;
    }
    std::optional<BlockKey> victim =
        // Called inside this locked scope (the analysis cannot see into lambdas).
        policy_->SelectVictim(
            [this](const BlockKey& k) NO_THREAD_SAFETY_ANALYSIS { return IsPinnedLocked(k); });
    if (victim) {
      Entry& entry = entries_[*victim];
      entry.evicting = true;
      const SlotRef at = entry.at;
      const bool doomed = entry.doomed;
      ++evictions_in_flight_;
      mu_.Unlock();
      const Status evicted = Evict(*victim, at, doomed);
      mu_.Lock();
      --evictions_in_flight_;
      cv_.SignalAll();
      // Its file is still there: so would be the next victim's (the file system is read-only).
      if (!evicted.ok()) return evicted;
      continue;
    }
    if (evictions_in_flight_ > 0) {  // room is being made by another thread
      cv_.Wait();
      continue;
    }
    // A shared tier filled by other replicas since we opened holds blocks of our fingerprint
    // that we never indexed: with none of them victims, every block pushed here was dropped
    // for as long as this replica ran. Index what the directory holds, once per write, and
    // evict from it as from our own.
    if (options_.config.shared && !listed) {
      listed = true;
      mu_.Unlock();
      const std::vector<BlockKey> on_disk = ListBlocks();
      mu_.Lock();
      bool indexed = false;
      for (const BlockKey& key : on_disk) indexed |= IndexSharedLocked(key);
      if (indexed) {
        // The blocks being written entered the policy before this call; they are newer than
        // the ones just indexed, which would otherwise be kept while our new block goes next.
        for (const BlockKey& key : inserting_) {
          PolicyOn(PolicyCall::kRemove, key);
          PolicyOn(PolicyCall::kInsert, key);
        }
        continue;
      }
    }
    // Still nothing to evict: the count may be wrong (files removed from outside, the ledger
    // damaged), or replicas of another model or block size filled the tier after we listed
    // it (or a shared tier that lists nothing at open). The files win: recount them under the
    // ledger's lock, and take the other fingerprints' files there now as victims, first. A
    // recount lists the whole tier, so the ledger allows one every kRecountInterval (a
    // private tier counts in memory and has nothing to recount: its files are ours alone).
    if (!recounted) {
      recounted = true;
      mu_.Unlock();
      const bool due = ledger_->Recount();
      std::vector<std::pair<std::string, uint64_t>> foreign;
      if (due) foreign = ListForeign();
      mu_.Lock();
      if (due) {
        foreign_ = std::move(foreign);
        continue;
      }
    }
    return Status::ResourceExhausted(options_.name + " (" + options_.config.path +
                                     ") is full: " + std::to_string(ledger_->used()) + " of " +
                                     std::to_string(ledger_->capacity()) +
                                     " bytes and no block of ours can be evicted");
  }
}

Status DiskTier::Evict(const BlockKey& key, SlotRef at, bool doomed) {
  Status result;
  bool taken = false;
  // The last tier drops its victims: reading one first would only cost a whole block of I/O.
  if (sink_ && !doomed) {
    AlignedBuffer buf = AllocAligned(file_bytes_);
    std::byte* dst = buf.get();
    ReadFiles(std::span(&key, 1), slots_ ? std::span(&at, 1) : std::span<const SlotRef>(),
              std::span(&dst, 1), std::span(&result, 1), {});
    taken = result.ok() && sink_(key, dst);
  }
  // A name replaced by something else (a FIFO, a link) is left where it is: renamed to a spare,
  // a FIFO would hang the write that opens it.
  const bool non_file = !slots_ && NamesNonFile(BlockPath(dir_, key));
  // No reader can hold the victim: it was unpinned when chosen and Pin refuses evicting blocks,
  // so its file can be renamed before the lock is taken.
  std::string spare = doomed || non_file ? std::string() : SetAside(key);
  MutexLock lock(&mu_);
  if (result.code() == StatusCode::kCorruption) ++stats_.corrupt;
  Status failure;
  if (non_file) {
    DropNonFileLocked(key);
  } else if (!spare.empty()) {
    ForgetLocked(key);
    spares_.push_back(std::move(spare));
  } else if (!RemoveLocked(key, &failure)) {
    // Still here: a victim again later, once the file system takes removals (SelectVictim
    // took it out of the policy), the first one if it is doomed.
    entries_.at(key).evicting = false;
    if (doomed) {
      stuck_.push_back(key);
    } else {
      PolicyOn(PolicyCall::kInsert, key);
    }
    return failure;
  }
  ++stats_.evictions;
  if (!taken) ++stats_.dropped;
  return Status::Ok();
}

void DiskTier::NoteWrite(const Status& result, bool no_victim) {
  std::string state;
  if (!result.ok()) {
    const std::string& m = result.message();
    state = no_victim ? "full (no block can be evicted)"
            : result.code() == StatusCode::kResourceExhausted
                ? "full (the file system is out of space)"
            : m.find(std::strerror(EROFS)) != std::string::npos ? "read-only"
                                                                : "failing";
    ++blocks_lost_;
    ++stats_.lost;
  }
  if (state == write_state_) return;
  // One line per change of state, never one per block.
  const std::string tier = "kvoffload: " + options_.name + " (" + options_.config.path + ") is ";
  if (state.empty()) {
    WriteLog(options_.log, tier + "writable again; " + std::to_string(blocks_lost_) +
                               " blocks did not reach it");
    blocks_lost_ = 0;
  } else {
    WriteLog(options_.log,
             tier + state + ": " + result.message() + "; blocks meant for it are dropped");
  }
  write_state_ = std::move(state);
}

bool DiskTier::RemoveLocked(const BlockKey& key, Status* failure) {
  if (slots_) {
    FreeSlot(entries_.at(key).at.slot);
    ForgetLocked(key);
    return true;
  }
  // Only the process whose unlink succeeds gives the bytes back in a shared tier (exactly one);
  // a private tier also gives back those of a file already gone (UnlinkCounted).
  const std::string path = BlockPath(dir_, key);
  int err = 0;
  ledger_->Free(file_bytes_, [&](uint64_t* bytes) {
    // A shared ledger counted the file at its size when it recounted (a file cut short, or
    // left at 0 bytes by a crash without O_DIRECT): freeing a whole block for it left the
    // ledger low for good, and the files went past the capacity. A private tier counted
    // every block file it listed at file_bytes_.
    struct stat st {};
    if (options_.config.shared && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      *bytes = static_cast<uint64_t>(st.st_size);
    }
    return UnlinkCounted(path, &err);
  });
  if (StillThere(err)) {
    if (failure) *failure = ErrnoStatus(err, "remove " + path);
    return false;
  }
  ForgetLocked(key);
  return true;
}

void DiskTier::ForgetLocked(const BlockKey& key) {
  PolicyOn(PolicyCall::kRemove, key);
  entries_.erase(key);
  // A key leaves stuck_ with its entry: a copy stored again under it later must not be taken
  // for the stuck one (removed under a load that holds it).
  std::erase(stuck_, key);
  if (options_.events) options_.events->Record(key, options_.tier, /*removed=*/true);
  cv_.SignalAll();
}

void DiskTier::RemoveDoomedLocked(const BlockKey& key) {
  if (!slots_ && NamesNonFile(BlockPath(dir_, key))) return DropNonFileLocked(key);
  if (RemoveLocked(key)) return;
  PolicyOn(PolicyCall::kRemove, key);
  if (std::find(stuck_.begin(), stuck_.end(), key) == stuck_.end()) stuck_.push_back(key);
}

bool DiskTier::RemoveStuckLocked() {
  if (stuck_.empty()) return false;
  // Doomed, so in nobody's hands: Pin and Protected refuse doomed blocks, the policy no longer
  // has it, and the key left stuck_ if its entry went (ForgetLocked). RemoveLocked takes it
  // out of stuck_ when the removal works.
  const BlockKey key = stuck_.back();
  return RemoveLocked(key);  // false: the file system still refuses
}

void DiskTier::DropNonFileLocked(const BlockKey& key) {
  ForgetLocked(key);
  // A private tier counted the block's bytes when it wrote or listed its file, which is gone
  // now. A shared tier's ledger goes back to the regular files on disk at the next recount;
  // every replica that indexed the key would give the bytes back here, once each.
  if (!options_.config.shared) ledger_->Free(file_bytes_, [](uint64_t*) { return true; });
}

std::string DiskTier::SetAside(const BlockKey& key) const {
  // In a shared tier another process may have the victim open for a read (it opened the file
  // before we chose it), and would read our new block's bytes: a checksum miss, but a miss.
  // A slot is free for the next write once its block is forgotten.
  if (options_.config.shared || slots_) return {};
  std::string spare = TempPath("spare");
  if (::rename(BlockPath(dir_, key).c_str(), spare.c_str()) != 0) return {};
  return spare;
}

std::string DiskTier::TempPath(std::string_view stem) const {
  static std::atomic<uint64_t> counter{0};
  return dir_ + "/" + std::string(stem) + "." + tag_ + "." +
         std::to_string(counter.fetch_add(1)) + ".tmp";
}

std::string_view DiskTier::TempFileTag(std::string_view name) {
  name.remove_suffix(std::string_view(".tmp").size());
  name = name.substr(0, name.rfind('.'));  // the counter
  const size_t stem_end = name.find('.');
  return stem_end == std::string_view::npos ? std::string_view() : name.substr(stem_end + 1);
}

void DiskTier::TimedWrite(std::span<IoOp> ops, const DiskIo::OpDone& done) {
  // Each op's own time to completion: the figure is per block, as with one write at a time.
  const uint64_t t0 = NowNs();
  uint64_t ns = 0;
  io_->ExecuteEach(ops, [&](size_t k) {
    ns += NowNs() - t0;
    if (done) done(k);
  });
  // Blocks that reached the tier: a write that failed part-way (ENOSPC after some pages) put
  // bytes down that are no block, and counting them showed throughput while every block was
  // lost.
  uint64_t bytes = 0;
  for (const IoOp& op : ops) {
    if (op.status.ok()) bytes += op.done;
  }
  MutexLock lock(&mu_);
  stats_.bytes_written += bytes;
  stats_.write_ns += ns;
}

std::vector<Result<bool>> DiskTier::WriteSlots(std::span<std::byte* const> files,
                                               std::span<const uint64_t> slots,
                                               const BlockEncoder& written) {
  std::vector<Status> status(files.size());
  std::vector<IoOp> ops;
  std::vector<size_t> op_of;
  for (size_t j = 0; j < files.size(); ++j) {
    status[j] = slots_->Allocate(slots[j]);
    if (!status[j].ok()) continue;
    // The payload alone: the trailer's checksum stays in the index (InsertBatch).
    ops.push_back(IoOp{IoOp::Kind::kWrite, slots_->fd(), files[j], stored_bytes_,
                       slots_->Offset(slots[j]), 0, Status::Ok()});
    op_of.push_back(j);
  }
  if (!ops.empty()) TimedWrite(ops, [&](size_t k) { written(op_of[k]); });
  for (size_t k = 0; k < ops.size(); ++k) {
    const Status& s = ops[k].status;
    if (s.ok()) continue;
    const size_t j = op_of[k];
    status[j] = s.code() == StatusCode::kResourceExhausted
                    ? s
                    : Status::IOError("write slot " + std::to_string(slots[j]) + " of " +
                                      slots_->path() + ": " + s.message());
  }
  std::vector<Result<bool>> out;
  out.reserve(files.size());
  for (size_t j = 0; j < files.size(); ++j) {
    if (status[j].ok()) {
      out.emplace_back(true);
      continue;
    }
    // The slot holds no block now (perhaps half of one): it is free, and its bytes go back.
    FreeSlot(slots[j]);
    out.emplace_back(status[j]);
  }
  return out;
}

void DiskTier::FreeSlot(uint64_t slot) {
  slots_->Release(slot);
  ledger_->Free(stored_bytes_, [](uint64_t*) { return true; });
}

Result<bool> DiskTier::WriteFile(const BlockKey& key, std::byte* file, const Room& room) {
  const std::string final_path = BlockPath(dir_, key);
  const std::string& spare = room.spare;
  const bool reuse = !spare.empty();
  // Without O_TMPFILE: a named temp file, linked and then unlinked.
  const std::string tmp = reuse ? spare : tmpfile_ ? std::string() : TempPath(key.ToHex());
  auto open_temp = [&] {
    return reuse      ? ::open(tmp.c_str(), OpenFlags(O_WRONLY))
           : tmpfile_ ? ::open(dir_.c_str(), OpenFlags(O_TMPFILE | O_WRONLY), 0644)
                      : ::open(tmp.c_str(), OpenFlags(O_CREAT | O_EXCL | O_WRONLY), 0644);
  };
  int fd = open_temp();
  if (fd < 0 && errno == ENOENT && !reuse && RecreateDirs()) fd = open_temp();
  const std::string what = tmp.empty() ? final_path + " (temp file)" : tmp;
  if (fd < 0) {
    const Status s = ErrnoStatus(errno, (reuse ? "open " : "create ") + what);
    if (reuse) {
      ledger_->Free(file_bytes_, [&](uint64_t*) { return UnlinkCounted(tmp); });
    } else {
      ledger_->Settle(file_bytes_, [] { return false; });
    }
    return s;
  }
  IoOp op{IoOp::Kind::kWrite, fd, file, file_bytes_, 0, 0, Status::Ok()};
  TimedWrite(std::span(&op, 1));
  int rc = -1;
  int err = 0;
  if (reuse) {
    // A private tier: no other process publishes this key, so rename may replace nothing,
    // and the spare's bytes were counted all along; they are given back only if it goes.
    // A name there that is not a regular file (planted, or left by another release) is not
    // ours to remove, which the rename would do.
    ::close(fd);
    if (op.status.ok() && NamesNonFile(final_path)) {
      err = EEXIST;
    } else if (op.status.ok()) {
      rc = ::rename(tmp.c_str(), final_path.c_str());
      err = errno;
    }
    if (rc != 0) ledger_->Free(file_bytes_, [&](uint64_t*) { return UnlinkCounted(tmp); });
  } else {
    // link(2) publishes atomically and, unlike rename, never replaces a block another process
    // published meanwhile (so the shared ledger counts every file exactly once). An O_TMPFILE
    // is linked through /proc/self/fd, which needs no capability (AT_EMPTY_PATH may).
    // Published under the ledger's lock, so a recount sees the file or the reservation, not
    // both and not neither. Our bytes stay reserved only when our link made the file.
    // A temp that is not published goes inside Settle, before its bytes are given back:
    // given back first, another write could take them while the file was still on disk,
    // and `du` saw the tier over its capacity for that moment.
    ledger_->Settle(file_bytes_, [&] {
      if (op.status.ok()) {
        rc = tmpfile_ ? ::linkat(AT_FDCWD, ("/proc/self/fd/" + std::to_string(fd)).c_str(),
                                 AT_FDCWD, final_path.c_str(), AT_SYMLINK_FOLLOW)
                      : ::link(tmp.c_str(), final_path.c_str());
        err = errno;
        if (rc == 0) return true;
      }
      ::close(fd);  // an O_TMPFILE that was not linked is freed here
      fd = -1;
      if (!tmpfile_) ::unlink(tmp.c_str());
      return false;
    });
    if (fd >= 0) {
      ::close(fd);
      if (!tmpfile_) ::unlink(tmp.c_str());  // the block keeps the name link gave it
    }
  }
  if (!op.status.ok()) {
    return Status(op.status.code() == StatusCode::kResourceExhausted
                      ? op.status
                      : Status::IOError("write " + what + ": " + op.status.message()));
  }
  if (rc == 0) return true;
  // Another process's copy (a shared tier): ours is dropped and theirs is served. A name that
  // is not a regular file holds no block: taken for a copy, it was a hit that every load
  // failed. The block is not stored (counted as lost) and the name stays.
  if (err == EEXIST && !NamesNonFile(final_path)) return false;
  if (err == EEXIST) {
    return Status::FailedPrecondition("publish " + final_path +
                                      ": the name is taken by something that is not a regular "
                                      "file; the block is not stored there");
  }
  return ErrnoStatus(err, "publish " + final_path);
}

bool DiskTier::RecreateDirs() {
  std::error_code ec;
  // False without an error: another thread made them first.
  if (fs::create_directories(dir_, ec)) {
    WriteLog(options_.log, "kvoffload: " + options_.name + " (" + options_.config.path + "): " +
                               dir_ + " was removed from outside; created it again");
  }
  return !ec;
}

void DiskTier::ReadFiles(std::span<const BlockKey> keys, std::span<const SlotRef> at,
                         std::span<std::byte* const> dsts, std::span<Status> results,
                         const BlockRead& on_read) {
  std::vector<IoOp> ops;
  std::vector<size_t> op_index;
  std::vector<bool> through_hold;  // per op: read through a held file (ReleaseHold, not close)
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!results[i].ok()) continue;
    if (slots_) {
      ops.push_back(IoOp{IoOp::Kind::kRead, slots_->fd(), dsts[i], stored_bytes_,
                         slots_->Offset(at[i].slot), 0, Status::Ok()});
      op_index.push_back(i);
      through_hold.push_back(false);
      continue;
    }
    // The file as it was when held (and checked then), even if unlinked since.
    int fd = HeldFileForRead(keys[i]);
    const bool held = fd >= 0;
    if (!held) {
      Result<int> opened = OpenBlockFile(keys[i]);
      if (!opened.ok()) {
        results[i] = opened.status();
        continue;
      }
      fd = *opened;
    }
    ops.push_back(IoOp{IoOp::Kind::kRead, fd, dsts[i], file_bytes_, 0, 0, Status::Ok()});
    op_index.push_back(i);
    through_hold.push_back(held);
  }
  uint64_t bytes = 0;
  const uint64_t t0 = NowNs();
  if (!ops.empty()) {
    io_->ExecuteEach(ops, [&](size_t j) {
      if (through_hold[j]) {
        ReleaseHold(keys[op_index[j]]);
      } else if (!slots_) {
        ::close(ops[j].fd);
      }
      const size_t i = op_index[j];
      bytes += ops[j].done;
      if (!ops[j].status.ok()) {
        // The backend's message is the call's alone ("pread: Input/output error"): the load's
        // error named no tier, file or block.
        const std::string where =
            slots_ ? slots_->path() + " slot " + std::to_string(at[i].slot) : BlockPath(dir_, keys[i]);
        results[i] = ops[j].status.WithContext("read block " + keys[i].ToHex() + " from " + where);
      } else if (slots_) {
        results[i] = VerifySlot(dsts[i], keys[i], at[i]);
      } else {
        results[i] = VerifyBlockFile(dsts[i], options_.block_bytes, options_.fingerprint, keys[i]);
      }
      if (results[i].ok() && on_read) on_read(i);
    });
  }
  // Includes the verification, which overlaps the reads.
  const uint64_t t1 = NowNs();
  MutexLock lock(&mu_);
  stats_.bytes_read += bytes;
  stats_.read_ns += t1 - t0;
}

Result<int> DiskTier::OpenBlockFile(const BlockKey& key) const {
  const std::string path = BlockPath(dir_, key);
  // O_NONBLOCK: a FIFO's open for reading would wait for a writer, forever, and the load and
  // the engine's close with it. O_NOFOLLOW: a link may lead anywhere, to bytes the capacity
  // never counted. O_DIRECT waits until the file is known to be a regular one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("block " + key.ToHex() + " is gone");
    const Status failed = ErrnoStatus(err, "open " + path);
    // EACCES, ELOOP (a link), ...: this name will fail every load.
    return Transient(err) ? failed : Status::FailedPrecondition(failed.message());
  }
  struct stat st {};
  Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = ErrnoStatus(errno, "stat " + path);
  } else if (!S_ISREG(st.st_mode)) {
    bad = Status::FailedPrecondition("block " + key.ToHex() + ": " + path +
                                     " is not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) != file_bytes_) {
    bad = Status::Corruption("block " + key.ToHex() + ": file is " + std::to_string(st.st_size) +
                             " bytes, expected " + std::to_string(file_bytes_));
  } else if (::fcntl(fd, F_SETFL, direct_ ? O_DIRECT : 0) != 0) {
    // Clears O_NONBLOCK before any read: io_uring may answer a read of a file opened
    // non-blocking with EAGAIN instead of waiting for the disk.
    bad = ErrnoStatus(errno, "fcntl " + path);
  }
  if (!bad.ok()) {
    ::close(fd);
    return bad;
  }
  return fd;
}

void DiskTier::NoteReadFailureLocked(Entry* entry, const Status& failure) {
  const StatusCode code = failure.code();
  if (code == StatusCode::kCorruption) {
    ++stats_.corrupt;
    entry->doomed = true;
  } else if (code == StatusCode::kNotFound) {
    entry->doomed = true;  // removed by another process sharing the tier
  } else if (code == StatusCode::kFailedPrecondition) {
    ++stats_.io_errors;
    entry->doomed = true;  // no file this engine can read: a miss from now on
  } else if (!failure.ok()) {
    ++stats_.io_errors;  // may be transient (EIO, EMFILE): the file is kept
  }
}

Status DiskTier::VerifySlot(std::byte* file, const BlockKey& key, SlotRef at) const {
  // A slot written over by another block, half written or never written does not match the
  // checksum the index kept for this one.
  if (Crc32c(file, options_.block_bytes) != at.crc) {
    return Status::Corruption("block " + key.ToHex() + ": payload checksum mismatch (slot " +
                              std::to_string(at.slot) + " of " + slots_->path() + ")");
  }
  EncodeTrailer(file, options_.block_bytes, options_.fingerprint, key, at.crc);
  return Status::Ok();
}

void DiskTier::Pin(std::span<const BlockKey> keys, std::span<Status> results) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = entries_.find(keys[i]);
    // A block being evicted is on its way down: a miss here, so no reader ever delays eviction.
    if (it == entries_.end() || it->second.doomed || it->second.evicting) {
      results[i] = Status::NotFound("block " + keys[i].ToHex() + " is not in " + options_.name);
      continue;
    }
    ++it->second.pins;
    PolicyOn(PolicyCall::kAccess, keys[i]);
    results[i] = Status::Ok();
  }
}

void DiskTier::ReadPinned(std::span<const BlockKey> keys, std::span<std::byte* const> dsts,
                          std::span<Status> results, const BlockRead& on_read) {
  std::vector<bool> pinned(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pinned[i] = results[i].ok();
  std::vector<SlotRef> at;
  if (slots_) {
    // Pinned blocks stay where they are until unpinned.
    at.resize(keys.size());
    MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (pinned[i]) at[i] = entries_.at(keys[i]).at;
    }
  }
  ReadFiles(keys, at, dsts, results, on_read);
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!pinned[i]) continue;
    Entry& e = entries_[keys[i]];
    --e.pins;
    NoteReadFailureLocked(&e, results[i]);
    if (e.pins == 0 && e.doomed) RemoveDoomedLocked(keys[i]);
  }
  cv_.SignalAll();
}

void DiskTier::RecordLookup(bool hit) {
  MutexLock lock(&mu_);
  ++(hit ? stats_.hits : stats_.misses);
}

TierStats DiskTier::Stats() {
  MutexLock lock(&mu_);
  TierStats s = stats_;
  s.used_bytes = ledger_->used();
  s.blocks = entries_.size();
  return s;
}

std::string DiskTier::Describe() const {
  const DiskTierConfig& c = options_.config;
  return options_.name + " " + c.path + " (" + (c.kind.empty() ? "dir" : c.kind) + ", " +
         std::to_string(c.capacity_bytes) + " bytes, policy " + options_.policy +
         (c.persistent ? ", persistent" : "") + (c.shared ? ", shared" : "") + "): " +
         io_->Describe() + ", O_DIRECT " + (direct_ ? "on" : "off (file system refuses it)") +
         (slots_ ? ", blocks in one slot file" : ", a file per block") +
         ", " + std::to_string(recovered_) + " blocks recovered" +
         (listing_streams_ > 1
              ? " (directory listed in " + std::to_string(listing_streams_) + " streams)"
              : "");
}

}  // namespace kvoffload
