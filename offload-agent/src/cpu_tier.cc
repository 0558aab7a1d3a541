// Pinned host tier: slot reservation with eviction to the sink, pins, publication.
#include "cpu_tier.h"

#include <utility>

#include "block_file.h"

namespace kvoffload {

CpuTier::CpuTier(std::unique_ptr<PinnedRegion> pool, size_t block_bytes,
                 std::unique_ptr<EvictionPolicy> policy, const HoldSet* holds,
                 EventLog* events)
    : pool_(std::move(pool)),
      slot_bytes_(BlockFileBytes(block_bytes)),
      slot_count_(pool_->size() / slot_bytes_),
      holds_(holds),
      events_(events),
      policy_(std::move(policy)) {
  free_.reserve(slot_count_);
  for (size_t i = slot_count_; i > 0; --i) free_.push_back(i - 1);
  stats_.name = "cpu";
  stats_.capacity_bytes = slot_count_ * slot_bytes_;
}

bool CpuTier::Contains(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it != entries_.end() &&
         (it->second.state == State::kResident || it->second.state == State::kEvicting);
}

bool CpuTier::Protected(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.state == State::kResident;
}

Result<std::byte*> CpuTier::BeginInsert(const BlockKey& key, uint32_t position,
                                         Victims* deferred, bool wait) {
  MutexLock lock(&mu_);
  if (entries_.contains(key)) {
    return Status::AlreadyExists("block " + key.ToHex() + " is already in the cpu tier");
  }
  entries_.emplace(key, Entry{});
  policy_->OnInsertAt(key, position);
  Result<std::byte*> slot = PlaceLocked(key, lock, deferred, wait);
  WakeDemoterIfAsked(lock);
  return slot;
}

std::vector<Result<std::byte*>> CpuTier::DemoteAndPlace(Victims& victims,
                                                        std::span<const BlockKey> keys,
                                                        std::span<const size_t> waiting) {
  std::vector<Result<std::byte*>> slots;
  slots.reserve(waiting.size());
  std::vector<size_t> freed;  // the victims' slots: in no free list, so only ours to take
  {
    MutexLock lock(&mu_);
    DemoteLocked(victims, lock, &freed);
  }
  for (size_t w : waiting) {
    MutexLock lock(&mu_);
    if (!freed.empty()) {
      free_.push_back(freed.back());  // the free slot PlaceLocked takes, under this same lock
      freed.pop_back();
    }
    slots.push_back(PlaceLocked(keys[w], lock, nullptr));
    WakeDemoterIfAsked(lock);  // as soon as this block asked, not after the others
  }
  if (!freed.empty()) {
    MutexLock lock(&mu_);
    free_.insert(free_.end(), freed.begin(), freed.end());
    cv_.SignalAll();
  }
  return slots;
}

bool CpuTier::Unevictable(const BlockKey& key) const {
  const Entry& e = entries_.at(key);
  return e.pins > 0 || e.state != State::kResident || (holds_ && holds_->Contains(key));
}

Result<std::byte*> CpuTier::PlaceLocked(const BlockKey& key, MutexLock& lock,
                                        Victims* deferred, bool wait) {
  // Called by the policy inside this locked scope (the analysis cannot see into lambdas).
  auto is_pinned = [this](const BlockKey& k) NO_THREAD_SAFETY_ANALYSIS { return Unevictable(k); };
  // With no slot free, this insert demotes a victim of its own even while the demoter writes a
  // batch: waiting for that batch instead left the disk with one batch at a time, draining
  // to nothing before the next, where stores that write their own victims keep it busy
  // meanwhile (256 KiB one-block stores, median of 5: 0.99 GiB/s waiting, 1.39 not).
  while (free_.empty()) {
    std::optional<BlockKey> victim = policy_->SelectVictim(is_pinned);
    if (!victim) {
      // Our own deferred victims count as in flight, but only we can demote them.
      // A waiting caller holds no slot, so the transfers it waits for are not its own.
      if ((evictions_in_flight_ > 0 && (deferred == nullptr || deferred->empty())) ||
          (wait && transfers_in_flight_ > 0)) {
        ++waiting_for_room_;
        cv_.Wait();
        --waiting_for_room_;
        continue;
      }
      entries_.erase(key);
      policy_->OnRemove(key);
      return Status::ResourceExhausted("all " + std::to_string(slot_count_) +
                                       " pinned host slots are in use by copies in flight or held for loads");
    }
    if (deferred != nullptr) {
      deferred->push_back(Evicting(*victim));
      return nullptr;
    }
    Victims one{Evicting(*victim)};
    DemoteLocked(one, lock);
  }
  Entry& e = entries_.at(key);
  e.slot = free_.back();
  free_.pop_back();
  ++transfers_in_flight_;  // until CommitInsert or AbortInsert
  if (free_.size() + demoting_ < demote_batch_) demoter_asked_ = true;
  return SlotPtr(e.slot);
}

void CpuTier::WakeDemoterIfAsked(MutexLock& lock) {
  const bool wake = std::exchange(demoter_asked_, false);
  lock.Unlock();
  if (wake) demoter_cv_.Signal();
}

void CpuTier::DemoteAhead(size_t batch) {
  demote_batch_ = batch;
  demoter_ = std::thread([this] { DemoterLoop(); });
}

void CpuTier::StopDemoting() {
  {
    MutexLock lock(&mu_);
    demoter_stop_ = true;
  }
  demoter_cv_.Signal();
  if (demoter_.joinable()) demoter_.join();
}

void CpuTier::DemoterLoop() {
  auto is_pinned = [this](const BlockKey& k) NO_THREAD_SAFETY_ANALYSIS { return Unevictable(k); };
  MutexLock lock(&mu_);
  for (;;) {
    // Woken by an insert that left fewer than a batch free; a wake-up that finds enough free
    // (another insert's, or a spurious one) goes back to sleep.
    while (!demoter_stop_ && free_.size() + demoting_ >= demote_batch_) demoter_cv_.Wait();
    // Awake, it writes batch after batch until 2 * batch slots are free or being freed, each
    // of at most `batch` victims (the writes a disk queue takes at once): under a stream of
    // stores the next batch goes out as soon as the last is written, where waiting for the
    // next insert to ask left the disk idle for a wake-up each time (64 KiB blocks stored 8
    // a job: 1.40-1.48 -> 1.76-1.79 GiB/s, median of 5 runs).
    while (!demoter_stop_ && free_.size() + demoting_ < 2 * demote_batch_) {
      Victims victims;
      while (victims.size() < demote_batch_ &&
             free_.size() + demoting_ + victims.size() < 2 * demote_batch_) {
        std::optional<BlockKey> victim = policy_->SelectVictim(is_pinned);
        if (!victim) break;
        victims.push_back(Evicting(*victim));
      }
      if (victims.empty()) {
        // Every block is pinned, held or in flight: the next insert that takes a slot asks again.
        demoter_cv_.Wait();
        continue;
      }
      const size_t n = victims.size();
      demoting_ += n;
      DemoteLocked(victims, lock);  // wakes the inserts waiting for this batch (PlaceLocked)
      demoting_ -= n;
    }
    if (demoter_stop_) return;
  }
}

CpuTier::Victim CpuTier::Evicting(const BlockKey& key) {
  Entry& v = entries_.at(key);
  v.state = State::kEvicting;
  ++stats_.evictions;
  ++evictions_in_flight_;
  return Victim{key, v.slot};
}

void CpuTier::DemoteLocked(Victims& victims, MutexLock& lock, std::vector<size_t>* freed) {
  if (victims.empty()) return;
  std::vector<BlockKey> keys;
  std::vector<std::byte*> slots;
  for (const Victim& v : victims) {
    keys.push_back(v.key);
    slots.push_back(SlotPtr(v.slot));
  }
  auto taken = std::make_unique<bool[]>(victims.size());
  lock.Unlock();
  // Pins only block slot reuse, not the demotion: readers and the disk write both only read.
  if (sink_) sink_(keys, slots, std::span(taken.get(), victims.size()));
  lock.Lock();
  for (size_t i = 0; i < victims.size(); ++i) {
    const BlockKey& key = victims[i].key;
    // Recorded after the sink's own "entered disk0": a reader of the feed never sees the block
    // in no tier while it moves down.
    if (events_) events_->Record(key, kTierCpu, /*removed=*/true);
    if (!taken[i]) ++stats_.dropped;
    Entry& demoted = entries_.at(key);
    --resident_;
    if (demoted.pins == 0) {
      entries_.erase(key);
      (freed != nullptr ? *freed : free_).push_back(victims[i].slot);
    } else {
      demoted.state = State::kZombie;  // a copy still reads it; Unpin frees the slot
    }
    --evictions_in_flight_;
  }
  victims.clear();
  cv_.SignalAll();
}

void CpuTier::NoteRoom() {
  if (waiting_for_room_ > 0) cv_.SignalAll();
}

void CpuTier::CommitInsert(const BlockKey& key, bool keep_pinned) {
  MutexLock lock(&mu_);
  Entry& e = entries_.at(key);
  e.state = State::kResident;
  ++resident_;
  if (events_) events_->Record(key, kTierCpu, /*removed=*/false);
  if (keep_pinned) {
    ++e.pins;  // the insert's transfer goes on as the pin's (transfers_in_flight_ unchanged)
    return;
  }
  --transfers_in_flight_;
  NoteRoom();
}

void CpuTier::AbortInsert(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  free_.push_back(it->second.slot);
  entries_.erase(it);
  policy_->OnRemove(key);
  --transfers_in_flight_;
  cv_.SignalAll();
}

std::vector<BlockKey> CpuTier::ResidentKeys() {
  MutexLock lock(&mu_);
  std::vector<BlockKey> keys;
  keys.reserve(entries_.size());
  for (const BlockKey& key : policy_->EvictionOrder()) {
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.state == State::kResident) keys.push_back(key);
  }
  return keys;
}

std::byte* CpuTier::PinLocked(const BlockKey& key, bool* used) {
  *used = false;
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.state != State::kResident && e.state != State::kEvicting) return nullptr;
  if (e.pins++ == 0) ++transfers_in_flight_;
  *used = e.state == State::kResident;
  return SlotPtr(e.slot);
}

std::byte* CpuTier::Pin(const BlockKey& key) {
  MutexLock lock(&mu_);
  bool used = false;
  std::byte* slot = PinLocked(key, &used);
  if (used) policy_->OnAccessAt(key, EvictionPolicy::kUnknownPosition);
  return slot;
}

void CpuTier::PinChain(std::span<const BlockKey> keys, std::span<std::byte*> slots) {
  std::vector<BlockKey> used_keys;
  std::vector<uint32_t> positions;
  used_keys.reserve(keys.size());
  positions.reserve(keys.size());
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    bool used = false;
    slots[i] = PinLocked(keys[i], &used);
    if (!used) continue;
    used_keys.push_back(keys[i]);
    // Numbered among the blocks used here, in chain order: those on disk (a head among them)
    // leave gaps that would otherwise read as the start of another chain.
    positions.push_back(static_cast<uint32_t>(positions.size()));
  }
  // The policy hears of the uses after the pins, which it never sees: the same calls in the
  // same order as one Pin per block.
  if (!used_keys.empty()) policy_->OnAccessBatch(used_keys, positions);
}

void CpuTier::NoteHold(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.state == State::kResident) policy_->OnHold(key);
}

void CpuTier::NoteRelease(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.state == State::kResident) policy_->OnRelease(key);
}

void CpuTier::Unpin(const BlockKey& key) {
  MutexLock lock(&mu_);
  auto it = entries_.find(key);
  Entry& e = it->second;
  if (--e.pins > 0) return;
  --transfers_in_flight_;
  if (e.state == State::kZombie) {
    free_.push_back(e.slot);
    entries_.erase(it);
    cv_.SignalAll();
    return;
  }
  NoteRoom();
}

void CpuTier::NoteStore(bool refused) {
  MutexLock lock(&mu_);
  if (refused) {
    ++stats_.refused;
    ++refused_since_full_;
  }
  if (refused == full_) return;
  full_ = refused;
  // One line per change of state, never one per block.
  const std::string tier = "kvoffload: cpu tier (" + std::to_string(slot_count_) + " slots) ";
  if (full_) {
    WriteLog(log_, tier + "is full: every slot is pinned by copies in flight or held for "
                          "loads; stores are refused until one is released");
  } else {
    WriteLog(log_, tier + "takes blocks again; " + std::to_string(refused_since_full_) +
                       " were refused");
    refused_since_full_ = 0;
  }
}

void CpuTier::RecordLookup(bool hit) {
  MutexLock lock(&mu_);
  ++(hit ? stats_.hits : stats_.misses);
}

TierStats CpuTier::Stats() {
  MutexLock lock(&mu_);
  TierStats s = stats_;
  s.blocks = resident_;
  s.used_bytes = (slot_count_ - free_.size()) * slot_bytes_;
  return s;
}

}  // namespace kvoffload
