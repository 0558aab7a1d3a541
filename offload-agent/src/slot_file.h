// The one file in which a private tier that starts empty keeps its blocks (FORMAT.md, Slot
// file): fixed slots of one block file's bytes each, allocated as the tier grows and written
// over in place from then on. A file per block costs the file system an inode and data blocks
// on every store and an open and close on every load; a slot costs a positional transfer.
// Thread-safe.
#ifndef KVOFFLOAD_SRC_SLOT_FILE_H_
#define KVOFFLOAD_SRC_SLOT_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/mutex.h"
#include "kvoffload/status.h"

namespace kvoffload {

class SlotFile {
 public:
  // Creates `path` (it must not exist), opened with `open_flags` (O_DIRECT where the tier
  // takes it), for up to max_slots slots of slot_bytes (a multiple of 4096).
  static Result<std::unique_ptr<SlotFile>> Create(const std::string& path, size_t slot_bytes,
                                                  size_t max_slots, int open_flags);
  ~SlotFile();  // closes and removes the file: its blocks live only as long as the tier
  SlotFile(const SlotFile&) = delete;
  SlotFile& operator=(const SlotFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t Offset(uint64_t slot) const { return slot * slot_bytes_; }

  // A free slot: the one given back last, else the lowest never used (so the file grows only
  // as far as the tier has ever been full). REQUIRES: fewer than max_slots are out (the
  // tier's capacity ledger is what guarantees it).
  uint64_t Acquire();
  void Release(uint64_t slot);

  // Makes sure the file's blocks under `slot` are allocated, growing it in chunks (as fio lays
  // out its file before writing: one allocation for many slots, contiguous on disk).
  // ResourceExhausted when the file system is full; the slot stays the caller's.
  Status Allocate(uint64_t slot);

 private:
  SlotFile(std::string path, int fd, size_t slot_bytes, size_t max_slots);

  const std::string path_;
  const int fd_;
  const size_t slot_bytes_;
  const size_t max_slots_;

  Mutex mu_;
  std::vector<uint64_t> free_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 0;

  Mutex grow_mu_;
  // Bytes allocated from the start of the file; read without the lock on the fast path.
  std::atomic<uint64_t> allocated_{0};
  bool fallocate_works_ GUARDED_BY(grow_mu_) = true;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_SLOT_FILE_H_
