// Byte accounting of one disk tier, so that the tier never holds more than its capacity.
// Private tiers count in memory. Shared tiers count in a file beside the blocks, updated under
// flock(2), so every process on the tier sees one total. Thread-compatible: the owning tier
// calls it under its own mutex.
#ifndef KVOFFLOAD_SRC_CAPACITY_LEDGER_H_
#define KVOFFLOAD_SRC_CAPACITY_LEDGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvoffload/status.h"

namespace kvoffload {

class CapacityLedger {
 public:
  virtual ~CapacityLedger() = default;
  // Adds n bytes when the total stays within capacity; false (and no change) otherwise.
  virtual bool TryReserve(uint64_t n) = 0;
  virtual void Release(uint64_t n) = 0;
  virtual uint64_t used() = 0;
  virtual uint64_t capacity() const = 0;
};

// In-process ledger starting at `used`.
std::unique_ptr<CapacityLedger> NewMemoryLedger(uint64_t capacity, uint64_t used);

// File ledger at `path`. When the file does not exist yet it is created (under the lock) with
// the total that `scan_used` computes from the files on disk; otherwise the stored total is
// trusted, because other processes may be writing right now.
Result<std::unique_ptr<CapacityLedger>> OpenFileLedger(const std::string& path, uint64_t capacity,
                                                       const std::function<uint64_t()>& scan_used);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_CAPACITY_LEDGER_H_
