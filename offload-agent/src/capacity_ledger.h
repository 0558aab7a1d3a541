// Byte accounting of one disk tier, so that the tier never holds more than its capacity.
// Private tiers count in memory. Shared tiers count in a file beside the blocks, updated under
// flock(2), so every process on the tier sees one total; each process also keeps the bytes it
// has reserved and not yet published in a writer file of its own, locked while it lives, so a
// survivor can give back what a killed writer had reserved. Thread-safe.
#ifndef KVOFFLOAD_SRC_CAPACITY_LEDGER_H_
#define KVOFFLOAD_SRC_CAPACITY_LEDGER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <memory>
#include <string>

#include "kvoffload/status.h"

namespace kvoffload {

class CapacityLedger {
 public:
  virtual ~CapacityLedger() = default;
  // Adds n bytes when the total stays within capacity; false (and no change) otherwise. The
  // bytes are in flight until Settle().
  virtual bool TryReserve(uint64_t n) = 0;
  // Ends a reservation of n bytes: `publish` runs under the ledger's lock (so a recount never
  // sees a file both published and in flight) and says whether a file now holds the bytes;
  // when it did not, they are given back. Returns what `publish` returned.
  virtual bool Settle(uint64_t n, const std::function<bool()>& publish) = 0;
  // Frees a published file of n bytes: `remove` runs under the ledger's lock and the bytes are
  // given back when it returns true (only the process whose unlink succeeds frees a file).
  // `remove` may set *bytes (n when called) to what the file really held: a shared tier's
  // file of the wrong size, which a recount counted at its size.
  using Remove = std::function<bool(uint64_t* bytes)>;
  virtual bool Free(uint64_t n, const Remove& remove) = 0;
  virtual uint64_t used() = 0;
  virtual uint64_t capacity() const = 0;
  // Sets the total to what the files on disk hold plus what live writers have in flight, under
  // the lock the open's recount takes, unless it did so less than kRecountInterval ago; true
  // when it did. A tier calls it when it is full and has nothing of its own to evict: the
  // total may be wrong (files removed from outside, the ledger damaged). The memory ledger
  // has nothing to recount from (a private tier gives back a file's bytes when it finds the
  // file gone): false.
  virtual bool Recount() = 0;
};

// At most one recount in this long, per process and tier, besides the one at open: a recount
// lists and stats every file of the tier.
inline constexpr std::chrono::seconds kRecountInterval{5};

// In-process ledger starting at `used`.
std::unique_ptr<CapacityLedger> NewMemoryLedger(uint64_t capacity, uint64_t used);

// The process tags (ProcessTag) of the writers alive at a recount, this one's included.
using LiveWriters = std::set<std::string, std::less<>>;
// The bytes of the tier's files on disk: its blocks, and the temp files of processes not in
// `live` (a live writer's temp file is in its in-flight count until Settle).
using ScanUsed = std::function<uint64_t(const LiveWriters& live)>;

// File ledger at `path`, writer files in `path`.writers/. Opening recounts under the lock: the
// files win (`scan_used`) plus what live writers have in flight. While open, when the tier is full and at most every few seconds otherwise,
// it looks for writers that died and, if there is one, recounts the same way (a scan, so only
// after a death). It also recounts (Recount's rate limit) when the stored total cannot be
// right: a file shorter than 8 bytes, more than the capacity, or less than a file it frees
// (damaged while engines ran). A reservation that finds the ledger no longer at `path`
// (removed or moved away) moves to the one there, creating it and a writer file, and recounts.
// `scan_used` must not call back into the ledger.
Result<std::unique_ptr<CapacityLedger>> OpenFileLedger(const std::string& path, uint64_t capacity,
                                                       const ScanUsed& scan_used);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_CAPACITY_LEDGER_H_
