// The offload engine: stores KV blocks from the device into the pinned host tier, cascades
// evictions down the disk tiers, looks up prefixes and loads blocks back to the device.
// Thread-safe: every method may be called from any thread. Store and Load are asynchronous jobs.
#ifndef KVOFFLOAD_ENGINE_H_
#define KVOFFLOAD_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvoffload/block_key.h"
#include "kvoffload/config.h"
#include "kvoffload/disk_io.h"
#include "kvoffload/export.h"
#include "kvoffload/stats.h"
#include "kvoffload/status.h"

namespace kvoffload {

// Where a block lives: kTierCpu is the pinned host tier, kTierCpu + 1 + i disk tier i.
inline constexpr int kTierMiss = -1;
inline constexpr int kTierCpu = 0;

struct LookupResult {
  size_t prefix = 0;       // keys[0, prefix) are all stored somewhere
  std::vector<int> tiers;  // tier of each of the first `prefix` keys
};

using JobId = uint64_t;

// What WriteBack did.
struct WriteBackReport {
  uint64_t written = 0;  // pinned-only blocks now in the persistent tier
  uint64_t failed = 0;   // writes that failed (no room, I/O error): counted by the tier too
  uint64_t left = 0;     // not tried: the time budget ran out, or colder than what fits
};

// One residency change in the event feed (EngineConfig::event_capacity > 0).
struct TierEvent {
  BlockKey key;
  int tier = kTierCpu;   // kTierCpu or kTierCpu + 1 + i for disk tier i
  bool removed = false;  // false: the block entered the tier; true: it left it
};

// Test and integration hooks.
struct EngineHooks {
  // Wraps the disk I/O backend of disk tier `tier` (fault injection).
  std::function<std::unique_ptr<DiskIo>(size_t tier, std::unique_ptr<DiskIo> base)> wrap_disk_io;
  // Receives the engine's log lines (no trailing newline): one at start with the resolved
  // configuration, then one per change of a tier's state (full, read-only, failing, writable
  // again), never one per block. Called from any engine thread. Empty: stderr.
  std::function<void(const std::string& line)> log;
};

class KVOFFLOAD_EXPORT Engine {
 public:
  // Allocates the pinned pool, probes and opens the disk tiers (scanning persistent ones).
  static Result<std::unique_ptr<Engine>> Open(const EngineConfig& config,
                                              EngineHooks hooks = {});

  // Finishes running jobs, cancels queued ones (Unavailable), then frees the tiers.
  virtual ~Engine() = default;

  // Copies each block into the pinned tier: block i is gathered from the `segments` pointers
  // device_ptrs[i * segments + s], block_bytes / segments bytes each. Blocks already
  // stored are skipped. The device memory must stay valid until the job is waited.
  // REQUIRES: device_ptrs.size() == keys.size() * segments (else InvalidArgument).
  virtual Result<JobId> Store(std::span<const BlockKey> keys,
                              std::span<void* const> device_ptrs) = 0;
  // Longest prefix of keys stored in any tier, with the tier of each.
  virtual LookupResult Lookup(std::span<const BlockKey> keys) = 0;
  // The tier of each key on its own (kTierMiss when absent), not a prefix, and not counted as a
  // lookup in the stats: for a caller that checks which blocks still need storing, so that
  // hit and query counts only say what serving asked.
  virtual std::vector<int> Where(std::span<const BlockKey> keys) = 0;
  // Scatters each block back to its segment pointers (as Store), promoting disk blocks to the
  // pinned tier. The job fails (NotFound / IOError) when any block could not be delivered;
  // the others are delivered.
  virtual Result<JobId> Load(std::span<const BlockKey> keys,
                             std::span<void* const> device_ptrs) = 0;
  // Lookup, and holds the prefix it found: no tier evicts a held block until Release, so a
  // block seen now is still there when its load runs later. Each hold needs one Release.
  // Holds are this process's: another process sharing a tier may still remove the file.
  virtual LookupResult Hold(std::span<const BlockKey> keys) = 0;
  // Releases one hold of each key; FailedPrecondition naming the first key that was not held
  // (the others are still released).
  virtual Status Release(std::span<const BlockKey> keys) = 0;
  // Moves up to out.size() residency changes, oldest first, into out; returns how many. Blocks
  // entering a tier (a store, a promotion, a demotion to disk) and leaving it (eviction,
  // corruption). Blocks recovered from a persistent tier at start are not announced.
  virtual size_t TakeEvents(std::span<TierEvent> out) = 0;

  // false while the job runs; true when it finished OK; its error when it failed. A finished
  // job is forgotten once its result was returned (by Poll or Wait); later calls on it are
  // NotFound. Several threads may poll or wait on one job: every Wait that began before the
  // job was forgotten returns its result, even when another thread's call returned it first.
  // Wait on a job that no worker has started yet runs it on the waiting thread (which would
  // otherwise sleep until a worker is free, and be woken by it), when fewer than
  // worker_threads jobs are running: waiters and workers never run more jobs at once.
  virtual Result<bool> Poll(JobId job) = 0;
  virtual Status Wait(JobId job) = 0;

  // Graceful shutdown: writes every block that is only in the pinned tier to the first
  // persistent disk tier, so that a restart on that tier finds every block offloaded before
  // (blocks on a non-persistent disk tier are not copied). Stops starting writes once
  // `budget` has passed. Nothing to do without a persistent tier. Meant for the end of the
  // engine's life: call it once the caller's jobs are done; stores started meanwhile may be
  // missed.
  virtual WriteBackReport WriteBack(std::chrono::milliseconds budget) = 0;

  virtual EngineStats Stats() const = 0;
  // The resolved configuration: device backend, block size, each tier's path, capacity,
  // policy, disk I/O backend, registered buffers and O_DIRECT, and the model fingerprint.
  virtual std::string Describe() const = 0;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_ENGINE_H_
