// The pinned host tier: one pool allocated up front and cut into fixed slots (BlockFileBytes
// each, so a slot is also a ready O_DIRECT buffer for its block file). Evicted blocks go to a
// sink (disk tier 0) before their slot is reused.
// Thread-safe: one mutex guards the index; the sink runs outside it; pinned slots (copies and
// reads in flight) are never victims and are not reused until unpinned. Only a caller that
// holds no slot may wait for another's transfers to release one (BeginInsert's `wait`), which
// keeps jobs deadlock-free: whoever it waits for is copying or reading, never waiting on it.
// With DemoteAhead, a thread of the tier demotes victims in batches before inserts need their
// slots; it waits for nothing an insert holds, and no insert waits for it.
#ifndef KVOFFLOAD_SRC_CPU_TIER_H_
#define KVOFFLOAD_SRC_CPU_TIER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "event_log.h"
#include "hold_set.h"
#include "kvoffload/block_key.h"
#include "kvoffload/device.h"
#include "kvoffload/eviction_policy.h"
#include "kvoffload/stats.h"
#include "log_sink.h"
#include "kvoffload/mutex.h"

namespace kvoffload {

class CpuTier {
 public:
  // Receives evicted blocks: their slots (payload + room for the trailer), valid during the
  // call. Sets taken[i] when a lower tier took block i (false: it is dropped and counted).
  using EvictSink = std::function<void(std::span<const BlockKey> keys,
                                       std::span<std::byte* const> slots, std::span<bool> taken)>;
  // Victims chosen but not demoted yet (BeginInsert with a list; DemoteAndPlace sends them down).
  struct Victim {
    BlockKey key;
    size_t slot;
  };
  using Victims = std::vector<Victim>;

  // REQUIRES: pool->size() >= one slot; policy sized for pool->size() / slot bytes.
  // holds (blocks never chosen as victims) and events (residency feed) may be null; both
  // outlive the tier.
  CpuTier(std::unique_ptr<PinnedRegion> pool, size_t block_bytes,
          std::unique_ptr<EvictionPolicy> policy, const HoldSet* holds = nullptr,
          EventLog* events = nullptr);

  ~CpuTier() { StopDemoting(); }

  // REQUIRES: called once, before any insert.
  void SetEvictSink(EvictSink sink) { sink_ = std::move(sink); }
  // Keeps slots free ahead of inserts: whenever fewer than `batch` slots are free or being
  // freed, a thread of the tier demotes victims (a batch per call of the sink) until 2 * batch
  // are. Inserts then take free slots instead of each waiting for its own victim's write; one
  // that finds none still demotes its own. REQUIRES: the sink is set; 4 * batch <= slots(); called
  // once, before any insert.
  void DemoteAhead(size_t batch);
  // Stops that thread once its batch is demoted: before whatever the sink writes to goes.
  void StopDemoting();
  // Where the tier says it turned full (every slot pinned or held) and that it takes blocks
  // again; without a call, stderr. REQUIRES: called before any insert.
  void SetLog(LogSink log) { log_ = std::move(log); }

  // Resident (published) blocks only.
  bool Contains(const BlockKey& key);
  // Resident and not chosen as a victim: a block the caller has put in the HoldSet stays here
  // until released. False for a block being demoted (it may still be readable).
  bool Protected(const BlockKey& key);

  // Reserves a slot for a new block, evicting as needed. The block is invisible until
  // CommitInsert. AlreadyExists when the key is known here (resident, being inserted, or
  // evicted but its slot still pinned); ResourceExhausted when every slot is pinned.
  // position: the block's place in the chain being stored, for the policy (OnInsertAt).
  //
  // With `deferred`, a block that needs a victim does not wait for its demotion: the victim is
  // added to the list and the block gets no slot yet (nullptr); the caller sends the list down
  // and takes the slots with DemoteAndPlace. A caller with deferred victims never waits
  // here for other demotions (ResourceExhausted instead: demote first, then retry), so they
  // cannot wait on it.
  //
  // With `wait` (REQUIRES: the caller holds no slot of this tier: no insert begun and not
  // committed, no pin), a tier whose every slot is taken by transfers in flight (other inserts'
  // copies, loads' pins) is waited on until one ends, rather than refused: they end on their
  // own, and a store refused there loses its blocks. Slots that are only held (HoldSet) are
  // not waited for: a hold lasts until the caller's scheduler lets go.
  Result<std::byte*> BeginInsert(const BlockKey& key,
                                 uint32_t position = EvictionPolicy::kUnknownPosition,
                                 Victims* deferred = nullptr, bool wait = false);
  // Demotes the victims together (one call of the sink), then gives each block keys[w] of
  // `waiting` (BeginInsert left them without a slot) one: the victims' own slots first, so that
  // an insert waiting on the tier cannot take them and leave these blocks with none, then by
  // evicting (now) as needed. ResourceExhausted for a block when every slot is pinned: it is
  // then forgotten. Victims' slots left over are freed. One result per entry of `waiting`.
  std::vector<Result<std::byte*>> DemoteAndPlace(Victims& victims,
                                                 std::span<const BlockKey> keys,
                                                 std::span<const size_t> waiting);
  // Publishes the block; with keep_pinned the caller holds a pin to release with Unpin.
  void CommitInsert(const BlockKey& key, bool keep_pinned);
  void AbortInsert(const BlockKey& key);

  // The keys of the blocks resident now (published, not being evicted), coldest first: the
  // policy's eviction order.
  std::vector<BlockKey> ResidentKeys();

  // Pins a resident block and returns its slot; nullptr when absent or not yet published. A
  // use for the policy at no known chain position (a load's blocks go through PinChain).
  std::byte* Pin(const BlockKey& key);
  // Pin for each block a load asks for, keys[i] at position i of its chain, under one lock,
  // with one call to the policy for all of them (EvictionPolicy::OnAccessBatch). slots[i]:
  // the block's slot, nullptr where Pin would give nullptr. REQUIRES: sizes equal.
  void PinChain(std::span<const BlockKey> keys, std::span<std::byte*> slots);
  // The engine started / stopped holding the block for a load (EvictionPolicy::OnHold);
  // ignored for a block not resident here.
  void NoteHold(const BlockKey& key);
  void NoteRelease(const BlockKey& key);
  void Unpin(const BlockKey& key);

  // The final outcome of one block a store offered (after the store's own retries): refused
  // when BeginInsert found no slot. Counts refusals and logs a change between full and not.
  void NoteStore(bool refused);
  void RecordLookup(bool hit);
  TierStats Stats();
  size_t slot_bytes() const { return slot_bytes_; }
  size_t slots() const { return slot_count_; }
  size_t demote_batch() const { return demote_batch_; }  // 0 without DemoteAhead

 private:
  // kEvicting: being demoted, still readable. kZombie: demoted while pinned; the slot is freed by
  // the last Unpin.
  enum class State { kInserting, kResident, kEvicting, kZombie };
  struct Entry {
    size_t slot = 0;
    uint32_t pins = 0;
    State state = State::kInserting;
  };

  std::byte* SlotPtr(size_t slot) const { return pool_->data() + slot * slot_bytes_; }
  // Not a victim now: pinned, held, or not resident.
  bool Unevictable(const BlockKey& key) const REQUIRES(mu_);
  // Pin's work bar the policy: the slot (nullptr when absent or unpublished), and whether the
  // block is resident, so a use for the policy.
  std::byte* PinLocked(const BlockKey& key, bool* used) REQUIRES(mu_);
  // Gives `key` (being inserted, no slot yet) a free slot, evicting as BeginInsert says. Asks
  // the demoter for a batch when this leaves too few slots free (WakeDemoterIfAsked).
  Result<std::byte*> PlaceLocked(const BlockKey& key, MutexLock& lock, Victims* deferred,
                                 bool wait = false) REQUIRES(mu_);
  // A slot became a possible victim or free: wakes the inserts waiting in PlaceLocked.
  void NoteRoom() REQUIRES(mu_);
  // Releases mu_ (the caller's scope ends with it released), then wakes the demoter if
  // PlaceLocked asked for it: woken under the lock, it would only sleep again on mu_ until
  // the inserting thread let go.
  void WakeDemoterIfAsked(MutexLock& lock) REQUIRES(mu_);
  // Marks a victim as being demoted.
  Victim Evicting(const BlockKey& key) REQUIRES(mu_);
  // Runs the sink with mu_ released, then frees the victims' slots (or leaves them to the last
  // Unpin).
  void DemoteLocked(Victims& victims, MutexLock& lock, std::vector<size_t>* freed = nullptr)
      REQUIRES(mu_);
  void DemoterLoop() EXCLUDES(mu_);

  const std::unique_ptr<PinnedRegion> pool_;
  const size_t slot_bytes_;
  const size_t slot_count_;
  EvictSink sink_;
  LogSink log_;
  const HoldSet* const holds_;
  EventLog* const events_;

  Mutex mu_;
  CondVar cv_{&mu_};  // an eviction finished or a slot was freed
  std::unique_ptr<EvictionPolicy> policy_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_ GUARDED_BY(mu_);
  std::vector<size_t> free_ GUARDED_BY(mu_);
  size_t evictions_in_flight_ GUARDED_BY(mu_) = 0;
  // Slots taken by transfers in flight: inserts with a slot not yet committed or aborted, and
  // blocks pinned (a copy or read of theirs in flight). What a waiting insert waits for.
  size_t transfers_in_flight_ GUARDED_BY(mu_) = 0;
  size_t waiting_for_room_ GUARDED_BY(mu_) = 0;  // inserts asleep on cv_ for a slot
  // DemoteAhead: its batch (0: none), the demoter's share of evictions_in_flight_, whether an
  // insert asked it for a batch, and whether it is to stop.
  size_t demote_batch_ = 0;
  size_t demoting_ GUARDED_BY(mu_) = 0;
  bool demoter_asked_ GUARDED_BY(mu_) = false;
  bool demoter_stop_ GUARDED_BY(mu_) = false;
  CondVar demoter_cv_{&mu_};
  std::thread demoter_;
  TierStats stats_ GUARDED_BY(mu_);
  // Entries kResident or kEvicting (readable): kept as they change so that Stats() is O(1),
  // since vLLM asks for stats every scheduler step.
  size_t resident_ GUARDED_BY(mu_) = 0;
  // Whether the last store was refused, and how many were since the tier turned full: a
  // change is logged once, not once per block.
  bool full_ GUARDED_BY(mu_) = false;
  uint64_t refused_since_full_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_CPU_TIER_H_
