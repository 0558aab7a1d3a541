// Disk tier recovery: listing a persistent tier at open, then checking and ordering the
// recovered block files in the background (FORMAT.md, Start-up), and the byte count of a tier
// that a shared ledger starts from.
#include "disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "block_file.h"
#include "dir_listing.h"
#include "kvoffload/mutex.h"

namespace kvoffload {
namespace {

// A temp file this old in a shared tier belongs to a writer that died.
constexpr auto kStaleTempAge = std::chrono::hours(1);

int64_t MtimeNs(const struct statx& st) {
  return static_cast<int64_t>(st.stx_mtime.tv_sec) * 1'000'000'000 + st.stx_mtime.tv_nsec;
}

// Regular file `name` in the directory `dirfd`: its size and modification time, without
// following a link. False when it is gone or is not a regular file.
bool StatFile(int dirfd, const std::string& name, uint64_t* size, int64_t* mtime_ns) {
  struct statx st {};
  if (::statx(dirfd, name.c_str(), AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC,
              STATX_TYPE | STATX_SIZE | STATX_MTIME, &st) != 0 ||
      !S_ISREG(st.stx_mode)) {
    return false;
  }
  *size = st.stx_size;
  *mtime_ns = MtimeNs(st);
  return true;
}

// Calls fn(fingerprint, directory name, directory fd) for each fingerprint directory (32 hex
// digits) under the format root. Anything else there (the ledger, its writers' directory,
// names this format never writes) is not ours to count, read or remove.
template <typename Fn>
void ForEachFingerprintDir(const std::string& root, Fn&& fn) {
  const int root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return;
  ForEachEntry(root_fd, [&](std::string_view name, unsigned char type, ino_t) {
    BlockKey fp;
    if ((type != DT_DIR && type != DT_UNKNOWN) || !ParseHexKey(name, &fp)) return;
    const std::string dir(name);
    const int fd = ::openat(root_fd, dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    fn(fp, dir, fd);
    ::close(fd);
  });
  ::close(root_fd);
}

// About how many entries the directory `fd` holds, from its size: ext4 stores a block file's
// entry in 44 bytes (8 + its 36-character name) and fills its hashed directories' blocks to
// three quarters or more, so this overestimates by a third at most. A hint for reserving the
// index, capped by the caller at the tier's capacity (growing it step by step to a million
// keys rehashes it twenty times); 0 where the size says nothing.
size_t EstimatedEntries(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return 0;
  return static_cast<size_t>(st.st_size) / 44;
}

// Regular files and (DT_UNKNOWN) maybe-files: directories and links are never block files.
bool MaybeFile(unsigned char type) { return type == DT_REG || type == DT_UNKNOWN; }

}  // namespace

Status DiskTier::Scan(uint64_t* bytes, std::vector<Recovered>* own) {
  // Other fingerprints' files: (modification time, path, bytes).
  std::vector<std::tuple<int64_t, std::string, uint64_t>> foreign;
  const std::string root = FormatRoot(options_.config.path);
  const int64_t stale_before =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          (std::chrono::system_clock::now() - kStaleTempAge).time_since_epoch())
          .count();
  // Nothing else reaches the tier before Open returns; the lock is for the analysis, and
  // costs nothing held throughout.
  MutexLock lock(&mu_);
  ForEachFingerprintDir(root, [&](const BlockKey& fp, const std::string& dir, int fd)
                                  NO_THREAD_SAFETY_ANALYSIS {
    const bool ours = fp == options_.fingerprint;
    if (ours) {
      entries_.reserve(
          std::min<uint64_t>(EstimatedEntries(fd), options_.config.capacity_bytes / file_bytes_));
    }
    const size_t streams = ForEachEntry(fd, [&](std::string_view name, unsigned char type,
                                                ino_t ino) NO_THREAD_SAFETY_ANALYSIS {
      if (!MaybeFile(type)) return;
      BlockKey key;
      const bool block = ParseBlockFileName(name, &key);
      if (ours && block) {
        // Indexed as listed, while the directory reader lists the next entries. Counted at
        // the size it must have; Settle removes it if it has another. Counted once, should a
        // name ever be listed twice.
        if (!entries_.emplace(key, Entry{}).second) return;
        own->push_back(Recovered{ino, key});
        *bytes += file_bytes_;
        return;
      }
      if (!block && !name.ends_with(".tmp")) return;
      const std::string file(name);
      uint64_t size = 0;
      int64_t mtime = 0;
      if (!StatFile(fd, file, &size, &mtime)) return;
      if (!block) {
        // Private tier: any temp file is a leftover of a crash. Shared: only old ones are.
        if (!options_.config.shared || mtime < stale_before) {
          ::unlinkat(fd, file.c_str(), 0);
        } else {
          *bytes += size;
        }
        return;
      }
      foreign.emplace_back(mtime, root + "/" + dir + "/" + file, size);
      *bytes += size;
    });
    if (ours) listing_streams_ = streams;
  });
  std::sort(foreign.rbegin(), foreign.rend());
  recovered_ = own->size();
  for (auto& [mtime, path, size] : foreign) foreign_.emplace_back(std::move(path), size);
  return Status::Ok();
}

void DiskTier::Settle(std::vector<Recovered> files) {
  // Inode order: with cold caches, neighbouring inodes share the inode-table blocks that the
  // file system reads (and reads ahead) once for all of them.
  std::sort(files.begin(), files.end(),
            [](const Recovered& a, const Recovered& b) { return a.ino < b.ino; });
  // Several threads, each over a run of neighbouring inodes: the stats are CPU work when the
  // inodes are cached and reads (kept in flight together) when they are not. Sized by the
  // node's cores, not by UsableCpus like the copy pools: after a restart the inodes are mostly
  // not cached, and threads waiting on reads cost no CPU time under a container's limit.
  struct Found {
    uint64_t size = 0;
    int64_t mtime = 0;
    bool file = false;
  };
  std::vector<Found> found(files.size());
  const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  const size_t per_thread = (files.size() + threads - 1) / threads;
  auto stat_run = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end && fd >= 0; ++i) {
      if (stop_settling_.load(std::memory_order_relaxed)) return;
      found[i].file = StatFile(fd, files[i].key.ToHex() + ".blk", &found[i].size, &found[i].mtime);
    }
  };
  std::vector<std::thread> stat_threads;
  for (size_t t = 1; t < threads && t * per_thread < files.size(); ++t) {
    stat_threads.emplace_back(stat_run, t * per_thread,
                              std::min(files.size(), (t + 1) * per_thread));
  }
  stat_run(0, std::min(files.size(), per_thread));
  for (std::thread& th : stat_threads) th.join();
  if (fd >= 0) ::close(fd);
  if (stop_settling_.load()) return;  // the tier is being destroyed

  std::vector<std::pair<int64_t, BlockKey>> files_by_age;
  std::vector<BlockKey> wrong_size;
  std::vector<BlockKey> not_files;  // gone since the listing, or not a regular file
  files_by_age.reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (!found[i].file) {
      not_files.push_back(files[i].key);
      continue;
    }
    if (found[i].size != file_bytes_) wrong_size.push_back(files[i].key);
    files_by_age.emplace_back(found[i].mtime, files[i].key);
  }
  std::sort(files_by_age.begin(), files_by_age.end());

  MutexLock lock(&mu_);
  // Every listed block enters the policy first, oldest first (the least recently written are
  // the first victims), then what happened since the listing, in order: the policy hears
  // exactly what it would have had the files been stat'ed before serving.
  for (const BlockKey& key : not_files) policy_->OnInsert(key);
  for (const auto& [mtime, key] : files_by_age) policy_->OnInsert(key);
  const std::vector<std::pair<PolicyCall, BlockKey>> journal = std::move(journal_);
  journal_ = {};
  settled_ = true;
  for (const auto& [call, key] : journal) PolicyOn(call, key);
  // Wrong-size files are never served: removed now, or by the read that holds them pinned
  // (its size check fails). Entries without a regular file are forgotten, not unlinked.
  for (const BlockKey& key : wrong_size) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.doomed || it->second.evicting) continue;
    if (it->second.pins > 0) {
      it->second.doomed = true;
      continue;
    }
    ++stats_.corrupt;
    // One that cannot be removed yet (a read-only file system) goes with the eviction that
    // picks it.
    if (!RemoveLocked(key)) it->second.doomed = true;
  }
  for (const BlockKey& key : not_files) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.doomed || it->second.evicting) continue;
    if (it->second.pins > 0) {
      it->second.doomed = true;
      continue;
    }
    policy_->OnRemove(key);
    entries_.erase(it);
    // A private tier's ledger started from the listing, so the name's bytes go back. A shared
    // tier's was recounted from the files that exist, and whoever removed this one since the
    // listing gave its bytes back then: freeing them again let the tier's files outgrow its
    // capacity by a block each time a replica opened while another evicted.
    if (!options_.config.shared) ledger_->Free(file_bytes_, [](uint64_t*) { return true; });
  }
  // A tier reopened with a smaller capacity sheds its oldest blocks (dropped: a lower tier
  // might not be connected yet).
  while (ledger_->used() > options_.config.capacity_bytes) {
    if (EvictForeignLocked()) continue;
    std::optional<BlockKey> victim = policy_->SelectVictim(
        [this](const BlockKey& k) NO_THREAD_SAFETY_ANALYSIS { return IsPinnedLocked(k); });
    if (!victim) break;
    if (!RemoveLocked(*victim)) {
      policy_->OnInsert(*victim);  // still here (a read-only file system): shed later
      break;
    }
    ++stats_.evictions;
    ++stats_.dropped;
  }
  cv_.SignalAll();
}

std::vector<BlockKey> DiskTier::ListBlocks() const {
  std::vector<BlockKey> keys;
  const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return keys;
  ForEachEntry(fd, [&](std::string_view name, unsigned char type, ino_t) {
    BlockKey key;
    if (MaybeFile(type) && ParseBlockFileName(name, &key)) keys.push_back(key);
  });
  ::close(fd);
  return keys;
}

uint64_t DiskTier::ScanUsedBytes(const LiveWriters& live) const {
  uint64_t total = 0;
  ForEachFingerprintDir(FormatRoot(options_.config.path),
                        [&](const BlockKey&, const std::string&, int fd) {
    ForEachEntry(fd, [&](std::string_view name, unsigned char type, ino_t) {
      BlockKey key;
      if (!MaybeFile(type) || (!ParseBlockFileName(name, &key) && !name.ends_with(".tmp"))) {
        return;
      }
      if (name.ends_with(".tmp") && live.contains(TempFileTag(name))) return;
      uint64_t size = 0;
      int64_t mtime = 0;
      if (StatFile(fd, std::string(name), &size, &mtime)) total += size;
    });
  });
  return total;
}

std::vector<std::pair<std::string, uint64_t>> DiskTier::ListForeign() const {
  std::vector<std::tuple<int64_t, std::string, uint64_t>> found;  // (mtime, path, bytes)
  const std::string root = FormatRoot(options_.config.path);
  ForEachFingerprintDir(root, [&](const BlockKey& fp, const std::string& dir, int fd) {
    if (fp == options_.fingerprint) return;
    ForEachEntry(fd, [&](std::string_view name, unsigned char type, ino_t) {
      BlockKey key;
      if (!MaybeFile(type) || !ParseBlockFileName(name, &key)) return;
      const std::string file(name);
      uint64_t size = 0;
      int64_t mtime = 0;
      if (StatFile(fd, file, &size, &mtime)) found.emplace_back(mtime, root + "/" + dir + "/" + file, size);
    });
  });
  std::sort(found.rbegin(), found.rend());
  std::vector<std::pair<std::string, uint64_t>> foreign;
  foreign.reserve(found.size());
  for (auto& [mtime, path, size] : found) foreign.emplace_back(std::move(path), size);
  return foreign;
}

void DiskTier::PolicyOn(PolicyCall call, const BlockKey& key) {
  if (!settled_) {
    journal_.emplace_back(call, key);
    return;
  }
  switch (call) {
    case PolicyCall::kInsert: policy_->OnInsert(key); break;
    case PolicyCall::kAccess: policy_->OnAccess(key); break;
    case PolicyCall::kRemove: policy_->OnRemove(key); break;
  }
}

}  // namespace kvoffload
