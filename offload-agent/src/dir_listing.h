// Listing a directory of up to millions of entries fast: a persistent tier's open is the
// listing of its block files (FORMAT.md, Start-up).
#ifndef KVOFFLOAD_SRC_DIR_LISTING_H_
#define KVOFFLOAD_SRC_DIR_LISTING_H_

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kvoffload/mutex.h"

namespace kvoffload {

// How many streams list the directory `fd`. A hashed ext4 directory (FS_INDEX_FL) returns its
// entries in hash order, and a position (lseek, telldir) is a hash: streams started at even
// splits of the hash space list disjoint parts of it side by side. That matters cold: one
// stream reads the directory's blocks one at a time as it reaches them, several read several
// at once (a million entries: 2.0-2.4 s cold with one stream, 0.5-0.7 s with 8 to 16, on a
// 2-core machine; warm 0.5 s against 0.2 s). One stream anywhere else, and for a directory
// under 1 MiB (about 20,000 entries), where it is fast either way.
size_t ListingStreams(int fd);
// True for a hashed ext4 directory: one that several streams can list.
bool HashOrderedDirectory(int fd);

// Reads a directory's raw entries (getdents64 records) on threads of their own, a few buffers
// ahead of the caller. At a million entries the kernel's share of a listing (ext4 hashes and
// sorts every name of a hashed directory's block as it returns it, and reads the blocks) and
// the caller's (parsing the names, indexing the keys) are each about half of a tier's open, so
// the listing overlaps the caller's work instead of taking turns with it (bench/RESULTS.md,
// section 9). With several streams buffers come in no particular order; each record is in
// exactly one of them.
class DirectoryReader {
 public:
  // Takes fd (a directory opened for reading) and closes it. `streams` > 1 only where
  // ListingStreams says the directory allows it.
  DirectoryReader(int fd, size_t streams);
  ~DirectoryReader();
  DirectoryReader(const DirectoryReader&) = delete;
  DirectoryReader& operator=(const DirectoryReader&) = delete;

  // The next buffer of records; empty once the directory is read (or reading it failed: the
  // caller sees the entries read until then, as with readdir). The buffer stays valid until
  // the next call.
  std::span<const char> Next();
  // How many streams list the directory: `streams`, or 1 where a stream's own descriptor
  // could not be opened.
  size_t streams() const { return fds_.size(); }

 private:
  // Lists the entries from fd's position to hash position `last` (exclusive; the whole
  // directory with one stream).
  void Run(int fd, uint64_t last);
  // The first name at hash position `pos` or past, "" if none.
  std::string FirstNameFrom(uint64_t pos) const;

  const int fd_;
  std::vector<int> fds_;  // one per stream, fds_[0] == fd_; set before the threads start
  Mutex mu_;
  CondVar cv_{&mu_};
  std::deque<std::vector<char>> full_ GUARDED_BY(mu_);  // read, not yet handed out
  std::vector<std::vector<char>> free_ GUARDED_BY(mu_);  // handed back, for reuse
  std::vector<char> current_ GUARDED_BY(mu_);            // handed out by the last Next
  size_t buffers_ GUARDED_BY(mu_) = 0;                   // made so far
  size_t running_ GUARDED_BY(mu_) = 0;                   // streams still listing
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // started in the constructor, after the members above
};

// The fixed part of the getdents64 record at `at` of buf, copied out: the kernel aligns each
// record to 8 bytes, the copy keeps the read aligned whatever the buffer's own alignment.
inline struct dirent64 RecordAt(std::span<const char> buf, size_t at) {
  struct dirent64 e;
  std::memcpy(&e, buf.data() + at, offsetof(struct dirent64, d_name));
  return e;
}
inline std::string_view NameAt(std::span<const char> buf, size_t at) {
  return buf.data() + at + offsetof(struct dirent64, d_name);
}

// Calls fn(name, d_type, d_ino) for each entry of the directory `dirfd` but . and .. (dirfd
// stays open), listed by `streams` streams (0: as many as ListingStreams allows). d_type
// spares a stat per entry where the file system fills it in (ext4, xfs, btrfs, tmpfs);
// elsewhere it is DT_UNKNOWN and callers stat what they need. Returns how many streams listed
// it.
template <typename Fn>
size_t ForEachEntry(int dirfd, Fn&& fn, size_t streams = 0) {
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  streams = streams == 0 ? ListingStreams(fd) : HashOrderedDirectory(fd) ? streams : 1;
  DirectoryReader reader(fd, streams);
  streams = reader.streams();
  for (std::span<const char> buf = reader.Next(); !buf.empty(); buf = reader.Next()) {
    for (size_t at = 0; at < buf.size();) {
      const struct dirent64 e = RecordAt(buf, at);
      const std::string_view name = NameAt(buf, at);
      at += e.d_reclen;
      if (name == "." || name == "..") continue;
      fn(name, e.d_type, static_cast<ino_t>(e.d_ino));
    }
  }
  return streams;
}

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DIR_LISTING_H_
