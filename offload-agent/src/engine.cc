// The engine: wires the device, the pinned host tier and the disk tiers into the store /
// lookup / load paths, and runs store and load as asynchronous jobs on worker threads.
#include "kvoffload/engine.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <system_error>

#include "block_file.h"
#include "cpu_tier.h"
#include "disk_tier.h"
#include "event_log.h"
#include "hold_set.h"
#include "kvoffload/device.h"
#include "log_sink.h"
#include "kvoffload/mutex.h"
#include "kvoffload/work_queue.h"

namespace kvoffload {
namespace {

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(const EngineConfig& config)
      : config_(config), fingerprint_(config.fingerprint.Scope(config.block_bytes)) {}

  ~EngineImpl() override {
    // Running jobs finish (their copies complete); queued ones are dropped unrun.
    if (workers_ != nullptr) workers_->Stop();
    if (cpu_ != nullptr) cpu_->StopDemoting();
    // So a job not done now never started (a job a thread runs in Wait is done before that
    // call returns, and no call may overlap the destructor): its device memory was not
    // touched; say so to waiters.
    MutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) {
      if (job->done) continue;
      Finish(*job, Status::Unavailable("engine shut down before the job ran"));
      job->finished.SignalAll();
    }
  }

  Status Init(const EngineHooks& hooks) {
    log_ = hooks.log;
    if (Status s = config_.Validate(); !s.ok()) return s;
    Result<std::unique_ptr<DeviceBackend>> device = NewDeviceBackend(config_.device);
    if (!device.ok()) return device.status();
    device_ = std::move(device).value();

    const size_t slot_bytes = BlockFileBytes(config_.block_bytes);
    const size_t slots = static_cast<size_t>(config_.cpu_bytes / slot_bytes);
    if (slots == 0) {
      return Status::InvalidArgument("KVOFFLOAD_CPU_BYTES=" + std::to_string(config_.cpu_bytes) +
                                     " holds no pinned slot of " + std::to_string(slot_bytes) +
                                     " bytes (block " + std::to_string(config_.block_bytes) +
                                     " + trailer, 4 KiB aligned)");
    }
    Result<std::unique_ptr<PinnedRegion>> pool = device_->AllocatePinned(slots * slot_bytes);
    if (!pool.ok()) {
      // Most often a size past what the pod may have: say which setting asked for it.
      return Status::ResourceExhausted(
          "KVOFFLOAD_CPU_BYTES=" + std::to_string(config_.cpu_bytes) +
          ": the pinned tier cannot be allocated (" + pool.status().message() +
          "); lower kvCacheOffloading.cpu or raise the pod's memory");
    }
    Result<std::unique_ptr<EvictionPolicy>> policy =
        NewEvictionPolicy(config_.eviction_policy, slots);
    if (!policy.ok()) return policy.status();
    std::byte* pool_base = (*pool)->data();
    if (config_.event_capacity > 0) events_ = std::make_unique<EventLog>(config_.event_capacity);
    cpu_ = std::make_unique<CpuTier>(std::move(pool).value(), config_.block_bytes,
                                     std::move(policy).value(), &holds_, events_.get());
    cpu_->SetLog(log_);

    // Every tier's backend registers the same pool: the later ones share the first one's
    // registration (pinned and charged to RLIMIT_MEMLOCK once), which lives in disks_[0].
    int registration = -1;
    for (size_t i = 0; i < config_.tiers.size(); ++i) {
      DiskIoOptions io_options;
      io_options.registered_base = pool_base;
      io_options.registered_len = slots * slot_bytes;
      io_options.parallelism = config_.io_parallelism;
      io_options.share_registration_of = registration;
      Result<std::unique_ptr<DiskIo>> io = NewDiskIo(config_.disk_io, io_options);
      if (!io.ok()) return io.status();
      std::unique_ptr<DiskIo> backend = std::move(io).value();
      if (i == 0) registration = backend->RegistrationFd();
      if (hooks.wrap_disk_io) backend = hooks.wrap_disk_io(i, std::move(backend));
      DiskTierOptions options{"disk" + std::to_string(i),
                              "KVOFFLOAD_TIERS[" + std::to_string(i) + "]",
                              config_.tiers[i], config_.block_bytes,
                              fingerprint_,    config_.eviction_policy,
                              kTierCpu + 1 + static_cast<int>(i),
                              &holds_,         events_.get()};
      options.log = log_;
      Result<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options, std::move(backend));
      if (!tier.ok()) return tier.status();
      disks_.push_back(std::move(tier).value());
    }
    // The cascade: cpu -> disk0 -> disk1 -> ... -> dropped.
    if (!disks_.empty()) {
      cpu_->SetEvictSink([this](std::span<const BlockKey> keys, std::span<std::byte* const> files,
                                std::span<bool> taken) {
        // A block promoted from disk0 is usually still there (promotion keeps the disk copy):
        // its trailer is checksummed only if disk0 really has to write it again.
        std::vector<Status> results(keys.size());
        disks_[0]->InsertBatch(
            keys, files,
            [&](size_t i) { EncodeBlockFile(files[i], config_.block_bytes, fingerprint_, keys[i]); },
            results);
        for (size_t i = 0; i < keys.size(); ++i) taken[i] = results[i].ok();
      });
    }
    if (!disks_.empty() && config_.demote_batch > 0 &&
        4 * config_.demote_batch <= cpu_->slots()) {
      cpu_->DemoteAhead(config_.demote_batch);
    }
    for (size_t i = 0; i + 1 < disks_.size(); ++i) {
      disks_[i]->SetEvictSink([this, i](const BlockKey& key, std::byte* file) {
        return disks_[i + 1]->Insert(key, file).ok();
      });
    }
    workers_ =
        std::make_unique<WorkQueue>(config_.worker_threads, WorkQueue::OnStop::kDropQueued);
    // The one line that says how this engine runs; later lines only report state changes.
    WriteLog(log_, "kvoffload: engine started: " + Describe());
    return Status::Ok();
  }

  Result<JobId> Store(std::span<const BlockKey> keys,
                      std::span<void* const> device_ptrs) override {
    if (Status s = CheckBatch(keys, device_ptrs); !s.ok()) return s;
    std::vector<BlockKey> k(keys.begin(), keys.end());
    std::vector<void*> p(device_ptrs.begin(), device_ptrs.end());
    return Submit([this, k = std::move(k), p = std::move(p)] { return RunStore(k, p); });
  }

  Result<JobId> Load(std::span<const BlockKey> keys,
                     std::span<void* const> device_ptrs) override {
    if (Status s = CheckBatch(keys, device_ptrs); !s.ok()) return s;
    std::vector<BlockKey> k(keys.begin(), keys.end());
    std::vector<void*> p(device_ptrs.begin(), device_ptrs.end());
    return Submit([this, k = std::move(k), p = std::move(p)] { return RunLoad(k, p); });
  }

  LookupResult Lookup(std::span<const BlockKey> keys) override {
    return Prefix(keys, [this](const BlockKey& key) { return Locate(key, /*record=*/true); });
  }

  std::vector<int> Where(std::span<const BlockKey> keys) override {
    std::vector<int> tiers;
    tiers.reserve(keys.size());
    for (const BlockKey& key : keys) tiers.push_back(Locate(key, /*record=*/false));
    return tiers;
  }

  LookupResult Hold(std::span<const BlockKey> keys) override {
    return Prefix(keys, [this](const BlockKey& key) {
      // Held first, checked second: a victim chosen after Add sees the hold, and one chosen
      // before it is no longer Protected, so a block reported here cannot be evicted.
      holds_.Add(key);
      const int tier = Locate(key, /*record=*/true, /*protect=*/true);
      if (tier == kTierMiss) holds_.Remove(key);
      if (tier == kTierCpu) cpu_->NoteHold(key);
      return tier;
    });
  }

  Status Release(std::span<const BlockKey> keys) override {
    Status first;
    for (const BlockKey& key : keys) {
      if (!holds_.Remove(key)) {
        if (first.ok()) first = Status::FailedPrecondition("block " + key.ToHex() + " is not held");
        continue;
      }
      cpu_->NoteRelease(key);
      for (auto& disk : disks_) disk->ReleaseHold(key);
    }
    return first;
  }

  size_t TakeEvents(std::span<TierEvent> out) override {
    return events_ ? events_->Take(out) : 0;
  }

  Result<bool> Poll(JobId job) override {
    MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return Status::NotFound("job " + std::to_string(job) + " is not known");
    if (!it->second->done) return false;
    Status s = it->second->status;
    jobs_.erase(it);  // a thread in Wait on this job keeps its own reference to the record
    if (!s.ok()) return s;
    return true;
  }

  Status Wait(JobId job) override {
    MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return Status::NotFound("job " + std::to_string(job) + " is not known");
    // Ours until we return: another thread's Poll or Wait may forget the job (erase it from
    // jobs_) between its wake-up and ours.
    const std::shared_ptr<JobRecord> record = it->second;
    bool ran = false;
    if (!record->started && running_ < config_.worker_threads) {
      // No worker has taken it yet, and one could: this thread runs it instead of sleeping
      // until a worker has, which spares a wake-up of a worker and one of this thread.
      RunJob(*record, lock);
      ran = true;
    }
    while (!record->done) record->finished.Wait();
    jobs_.erase(job);  // nothing when another caller forgot it first
    Status status = record->status;
    lock.Unlock();
    if (ran) Announce(*record);
    return status;
  }

  WriteBackReport WriteBack(std::chrono::milliseconds budget) override {
    WriteBackReport report;
    const auto deadline = std::chrono::steady_clock::now() + budget;
    size_t target = disks_.size();
    for (size_t i = 0; i < disks_.size(); ++i) {
      if (config_.tiers[i].persistent) {
        target = i;
        break;
      }
    }
    if (target == disks_.size()) return report;
    // The hottest blocks the tier can hold, written coldest first: written in any other order
    // (the pinned tier's hash order, before), a tier smaller than the pinned one evicted the
    // write-back's own earlier writes, the hottest among them as likely as any, and each
    // eviction still counted as written; and the order written is the order a restart
    // recovers them in, oldest first.
    std::vector<BlockKey> keys = cpu_->ResidentKeys();
    const uint64_t room =
        config_.tiers[target].capacity_bytes / BlockFileBytes(config_.block_bytes);
    if (keys.size() > room) {
      report.left += keys.size() - room;
      keys.erase(keys.begin(), keys.end() - static_cast<std::ptrdiff_t>(room));
    }
    for (const BlockKey& key : keys) {
      // A block the target has already is refreshed there in the same order: left at the
      // recency it had (a promoted block's disk copy ages while the pinned tier serves it),
      // it was the first victim of the writes below, the hottest blocks dropped and the
      // report saying nothing was left.
      // (Refresh finds nothing to refresh for a copy another replica of a shared tier
      // published: the copy is there all the same.)
      if (disks_[target]->Contains(key)) {
        disks_[target]->Refresh(key);
        continue;
      }
      bool persisted = false;
      for (size_t i = target + 1; i < disks_.size() && !persisted; ++i) {
        persisted = config_.tiers[i].persistent && disks_[i]->Contains(key);
      }
      if (persisted) continue;
      // Only blocks that needed a write count as left when the budget is spent.
      if (std::chrono::steady_clock::now() >= deadline) {
        ++report.left;
        continue;
      }
      std::byte* slot = cpu_->Pin(key);
      if (slot == nullptr) continue;  // evicted since the listing: the cascade wrote it
      // The pin keeps the slot from being reused while the trailer is encoded and written.
      const Status s = disks_[target]->Insert(
          key, slot, [&] { EncodeBlockFile(slot, config_.block_bytes, fingerprint_, key); });
      cpu_->Unpin(key);
      if (s.ok()) {
        ++report.written;
      } else {
        ++report.failed;
      }
    }
    return report;
  }

  EngineStats Stats() const override {
    EngineStats s;
    s.tiers.push_back(cpu_->Stats());
    for (const auto& d : disks_) s.tiers.push_back(d->Stats());
    s.stored_blocks = stored_blocks_.load();
    s.loaded_blocks = loaded_blocks_.load();
    s.failed_loads = failed_loads_.load();
    s.failed_stores = failed_stores_.load();
    s.d2h_bytes = d2h_bytes_.load();
    s.d2h_ns = d2h_ns_.load();
    s.h2d_bytes = h2d_bytes_.load();
    s.h2d_ns = h2d_ns_.load();
    s.held_blocks = holds_.size();
    s.events_dropped = events_ ? events_->dropped() : 0;
    s.load_buffered_blocks = load_buffered_blocks_.load();
    s.load_buffer_peak_bytes = load_buffer_peak_bytes_.load();
    MutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) s.queue_depth += job->done ? 0u : 1u;
    return s;
  }

  std::string Describe() const override {
    const ModelFingerprint& fp = config_.fingerprint;
    std::string out = "device " + device_->Describe() + "; block " +
                      std::to_string(config_.block_bytes) + " bytes in " +
                      std::to_string(config_.segments) + " segments; cpu tier " +
                      std::to_string(cpu_->slots()) + " slots x " +
                      std::to_string(cpu_->slot_bytes()) + " bytes = " +
                      std::to_string(cpu_->slots() * cpu_->slot_bytes()) + " bytes, policy " +
                      config_.eviction_policy;
    if (cpu_->demote_batch() > 0) {
      out += ", demoted ahead in batches of " + std::to_string(cpu_->demote_batch());
    }
    for (const auto& d : disks_) out += "; " + d->Describe();
    out += "; fingerprint " + fingerprint_.ToHex() + " (model " + fp.model + ", revision " +
           (fp.revision.empty() ? "-" : fp.revision) + ", dtype " + fp.dtype + ", rank " +
           std::to_string(fp.rank) + ")";
    return out;
  }

 private:
  // A job's result, shared by jobs_ (until a caller is given the result), the queued job,
  // and each thread in Wait on it. Fields guarded by jobs_mu_.
  struct JobRecord {
    explicit JobRecord(Mutex* mu) : finished(mu) {}
    bool done = false;
    bool started = false;  // by a worker, or by a thread in Wait
    std::function<Status()> fn;  // the work; taken by whoever starts it
    Status status;
    // The waiters of this job sleep on it alone: with many jobs in flight (one waiting thread
    // each), waking every waiter on every finished job would swamp a few cores with wake-ups
    // that find nothing to do.
    CondVar finished;
  };

  // Runs a job nobody has started in a run slot, with jobs_mu_ released meanwhile.
  void RunJob(JobRecord& job, MutexLock& lock) REQUIRES(jobs_mu_) {
    job.started = true;
    ++running_;
    std::function<Status()> fn = std::move(job.fn);
    lock.Unlock();
    Status s = fn();
    lock.Lock();
    --running_;
    Finish(job, std::move(s));
  }

  // The caller announces the job's end (Announce) once it has released jobs_mu_.
  void Finish(JobRecord& job, Status status) REQUIRES(jobs_mu_) {
    job.done = true;
    job.status = std::move(status);
  }

  // Wakes who waits for a job RunJob ran: the threads in Wait on it and the workers waiting for
  // a run slot (all of them: a woken worker may find its job taken by a waiter and leave the
  // slot to another). Called with jobs_mu_ released: a thread woken under it would only sleep
  // again on it until the caller let go, one more sleep and wake-up per job.
  void Announce(JobRecord& job) EXCLUDES(jobs_mu_) {
    run_slot_free_.SignalAll();
    job.finished.SignalAll();
  }

  Status CheckBatch(std::span<const BlockKey> keys, std::span<void* const> ptrs) const {
    if (keys.size() * config_.segments != ptrs.size()) {
      return Status::InvalidArgument(std::to_string(keys.size()) + " keys of " +
                                     std::to_string(config_.segments) + " segments but " +
                                     std::to_string(ptrs.size()) + " device pointers");
    }
    for (void* p : ptrs) {
      if (p == nullptr) return Status::InvalidArgument("null device pointer in batch");
    }
    return Status::Ok();
  }

  Result<JobId> Submit(std::function<Status()> fn) {
    auto record = std::make_shared<JobRecord>(&jobs_mu_);
    record->fn = std::move(fn);
    JobId id = 0;
    {
      MutexLock lock(&jobs_mu_);
      id = next_job_++;
      jobs_.emplace(id, record);
    }
    // Queued with jobs_mu_ released, as the worker it wakes takes that lock first.
    const bool queued = workers_->Push([this, record] {
      MutexLock start_lock(&jobs_mu_);
      // Threads in Wait may hold run slots: the worker waits for one (or for a waiter to
      // take this job) rather than run more jobs at once than the workers are.
      while (!record->started && running_ >= config_.worker_threads) run_slot_free_.Wait();
      if (record->started) return;
      RunJob(*record, start_lock);
      start_lock.Unlock();
      Announce(*record);
    });
    if (queued) return id;
    MutexLock lock(&jobs_mu_);
    jobs_.erase(id);
    return Status::Unavailable("engine is shutting down");
  }

  // The longest prefix of keys that `tier_of` places in a tier, with those tiers.
  template <typename TierOf>
  static LookupResult Prefix(std::span<const BlockKey> keys, TierOf tier_of) {
    LookupResult result;
    for (const BlockKey& key : keys) {
      const int tier = tier_of(key);
      if (tier == kTierMiss) break;
      result.tiers.push_back(tier);
    }
    result.prefix = result.tiers.size();
    return result;
  }

  // kTierCpu, kTierCpu + 1 + i for disk i, or kTierMiss. With `protect`, only a tier where a
  // held block is now safe from eviction counts (Protected rather than Contains).
  int Locate(const BlockKey& key, bool record, bool protect = false) {
    bool hit = protect ? cpu_->Protected(key) : cpu_->Contains(key);
    if (record) cpu_->RecordLookup(hit);
    if (hit) return kTierCpu;
    for (size_t i = 0; i < disks_.size(); ++i) {
      hit = protect ? disks_[i]->Protected(key) : disks_[i]->Contains(key);
      if (record) disks_[i]->RecordLookup(hit);
      if (hit) return kTierCpu + 1 + static_cast<int>(i);
    }
    return kTierMiss;
  }

  Status RunStore(const std::vector<BlockKey>& keys, const std::vector<void*>& ptrs) {
    std::vector<size_t> taken;    // slots reserved (or to be placed), data not copied yet
    std::vector<size_t> waiting;  // of those, the blocks whose slot a victim still holds
    CpuTier::Victims victims;     // theirs, demoted together in flush
    std::vector<CopyOp> ops;
    Status first_error;
    auto fail = [&](const Status& s, size_t blocks) {
      failed_stores_ += blocks;
      if (first_error.ok()) first_error = s;
    };
    // Demotes the victims (their disk writes in flight together), copies the reserved blocks
    // in and publishes them, freeing their pins for eviction: a batch larger than the pinned
    // tier is stored in pieces that fit.
    auto flush = [&] {
      std::vector<Result<std::byte*>> slots = cpu_->DemoteAndPlace(victims, keys, waiting);
      for (size_t w = 0; w < waiting.size(); ++w) {
        const size_t i = waiting[w];
        const Result<std::byte*>& slot = slots[w];
        cpu_->NoteStore(slot.status().code() == StatusCode::kResourceExhausted);
        if (!slot.ok()) {
          std::erase(taken, i);  // forgotten by the tier
          fail(slot.status(), 1);
          continue;
        }
        GatherOps(ops, *slot, ptrs, i);
      }
      waiting.clear();
      if (taken.empty()) return;
      const uint64_t t0 = NowNs();
      Status copied = CopyAndWait(CopyDirection::kDeviceToHost, ops);
      d2h_ns_ += NowNs() - t0;
      for (size_t i : taken) {
        if (copied.ok()) {
          cpu_->CommitInsert(keys[i], /*keep_pinned=*/false);
        } else {
          cpu_->AbortInsert(keys[i]);
        }
      }
      if (copied.ok()) {
        stored_blocks_ += taken.size();
        d2h_bytes_ += taken.size() * config_.block_bytes;
      } else {
        fail(copied, taken.size());
      }
      taken.clear();
      ops.clear();
    };
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Locate(keys[i], /*record=*/false) != kTierMiss) continue;  // already offloaded
      // Callers pass a request's blocks in chain order, so the index is the block's position
      // among those this call stores (the policy's OnInsertAt).
      const auto position = static_cast<uint32_t>(i);
      // With nothing reserved, the job may wait for other jobs' transfers to free a slot.
      Result<std::byte*> slot = cpu_->BeginInsert(keys[i], position, &victims, taken.empty());
      if (slot.status().code() == StatusCode::kResourceExhausted && !taken.empty()) {
        flush();  // our own reserved slots were the pinned ones, or our victims not demoted
        slot = cpu_->BeginInsert(keys[i], position, &victims, /*wait=*/true);
      }
      if (slot.status().code() == StatusCode::kAlreadyExists) continue;  // another job has it
      if (slot.ok() && *slot == nullptr) {  // its outcome is known once flush places it
        taken.push_back(i);
        waiting.push_back(i);
        continue;
      }
      cpu_->NoteStore(slot.status().code() == StatusCode::kResourceExhausted);
      if (!slot.ok()) {
        fail(slot.status(), 1);
        continue;
      }
      taken.push_back(i);
      GatherOps(ops, *slot, ptrs, i);
    }
    flush();
    return first_error;
  }

  Status RunLoad(const std::vector<BlockKey>& keys, const std::vector<void*>& ptrs) {
    const size_t n = keys.size();
    std::vector<const std::byte*> src(n, nullptr);
    std::vector<bool> pinned(n, false);
    std::vector<Status> result(n);
    std::vector<std::vector<size_t>> from_disk(disks_.size());
    // Pin every disk block before making room for promotions: that cascades evictions down the
    // tiers, which must not take the blocks this job is about to read. A block is read from
    // the first tier that can pin it, so a copy being evicted from an upper tier (which may
    // still be listed there) is passed over for the one below.
    // The pinned tier's blocks first, all at once (one lock, one policy call: PinChain).
    std::vector<std::byte*> in_cpu(n);
    cpu_->PinChain(keys, in_cpu);
    for (size_t i = 0; i < n; ++i) {
      if (in_cpu[i] != nullptr) {
        src[i] = in_cpu[i];
        pinned[i] = true;
        continue;
      }
      size_t t = 0;
      for (Status pin; t < disks_.size(); ++t) {
        if (!disks_[t]->Contains(keys[i])) continue;  // Contains indexes a shared tier's file
        disks_[t]->Pin(std::span(&keys[i], 1), std::span(&pin, 1));
        if (pin.ok()) break;
      }
      if (t == disks_.size()) {
        result[i] = Status::NotFound("block " + keys[i].ToHex() + " is not offloaded");
        continue;
      }
      from_disk[t].push_back(i);
    }
    // Copies start as soon as their block is in host memory: the pinned tier's blocks now,
    // each disk block once it is read and verified, while the rest are still being read.
    std::vector<AlignedBuffer> bounce;  // before copies: freed after they were waited
    DeviceCopies copies(this);
    std::vector<CopyOp> ops;
    size_t delivered = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!pinned[i]) continue;  // so far, pinned means found in the pinned tier
      ScatterOps(ops, ptrs, i, src[i]);
      ++delivered;
    }
    copies.Start(ops);
    // Disk blocks in windows of load_buffer_bytes: where the pinned tier has no slot for them
    // (its slots pinned, by this load's own promotions too, until its copies are done) they
    // are read into buffers of the load's own, and those of one window are freed, once its
    // copies are done, before the next is read.
    const size_t window =
        std::max<size_t>(1, config_.load_buffer_bytes / BlockFileBytes(config_.block_bytes));
    Status copied = Status::Ok();
    for (size_t t = 0; t < disks_.size(); ++t) {
      for (size_t at = 0; at < from_disk[t].size(); at += window) {
        const size_t end = std::min(from_disk[t].size(), at + window);
        const std::vector<size_t> idx(from_disk[t].begin() + static_cast<ptrdiff_t>(at),
                                      from_disk[t].begin() + static_cast<ptrdiff_t>(end));
        DiskBatch part;
        for (size_t i : idx) part.keys.push_back(keys[i]);
        part.result.assign(idx.size(), Status::Ok());
        Promote(t, idx, part, src, pinned, result, bounce, [&](size_t i) {
          ops.clear();
          ScatterOps(ops, ptrs, i, src[i]);
          copies.Start(ops);
          ++delivered;
        });
        if (bounce.empty()) continue;
        if (Status s = copies.Wait(); copied.ok() && !s.ok()) copied = s;
        bounce.clear();
      }
    }
    if (Status s = copies.Wait(); copied.ok() && !s.ok()) copied = s;
    for (size_t i = 0; i < n; ++i) {
      if (pinned[i]) cpu_->Unpin(keys[i]);
    }
    if (!copied.ok()) {
      failed_loads_ += n;
      return copied;
    }
    loaded_blocks_ += delivered;
    h2d_bytes_ += delivered * config_.block_bytes;
    const size_t failed = n - delivered;
    if (failed == 0) return Status::Ok();
    failed_loads_ += failed;
    for (size_t i = 0; i < n; ++i) {
      if (result[i].ok()) continue;
      std::string msg = std::to_string(failed) + " of " + std::to_string(n) +
                        " blocks not loaded; first: " + result[i].message();
      return result[i].code() == StatusCode::kIOError ? Status::IOError(std::move(msg))
                                                       : Status::NotFound(std::move(msg));
    }
    return Status::Ok();
  }

  // The host-to-device copies of one load, started piecemeal and waited together. h2d_ns
  // counts from the first start to the end of the wait: the span the job had copies in flight.
  class DeviceCopies {
   public:
    explicit DeviceCopies(EngineImpl* engine) : engine_(engine) {}
    void Start(const std::vector<CopyOp>& ops) {
      if (ops.empty()) return;
      if (t0_ == 0) t0_ = NowNs();
      Result<std::unique_ptr<CopyTicket>> ticket =
          engine_->device_->CopyAsync(CopyDirection::kHostToDevice, ops);
      if (ticket.ok()) {
        tickets_.push_back(std::move(ticket).value());
      } else if (first_error_.ok()) {
        first_error_ = ticket.status();
      }
    }
    // Waits for every copy started; the first error.
    Status Wait() {
      for (auto& ticket : tickets_) {
        Status s = ticket->Wait();
        if (first_error_.ok() && !s.ok()) first_error_ = s;
      }
      if (t0_ != 0) engine_->h2d_ns_ += NowNs() - t0_;
      t0_ = 0;  // a load that waits for one window's copies starts the next span afresh
      tickets_.clear();
      return first_error_;
    }

   private:
    EngineImpl* const engine_;
    std::vector<std::unique_ptr<CopyTicket>> tickets_;
    Status first_error_;
    uint64_t t0_ = 0;
  };

  // The blocks one load reads from one disk tier, pinned there.
  struct DiskBatch {
    std::vector<BlockKey> keys;
    std::vector<Status> result;  // from DiskTier::Pin, then from the read
  };

  // Reads the pinned blocks of disk tier t into fresh pinned slots (promotion), or into
  // private buffers when the cpu tier cannot take them now; a failed read sets result[i].
  // on_read(i) runs as soon as block i is in host memory at src[i] (before its promotion is
  // published), while the batch's other blocks are still being read.
  void Promote(size_t t, const std::vector<size_t>& idx, DiskBatch& batch,
               std::vector<const std::byte*>& src, std::vector<bool>& pinned,
               std::vector<Status>& result, std::vector<AlignedBuffer>& bounce,
               const std::function<void(size_t i)>& on_read) {
    const size_t file_bytes = BlockFileBytes(config_.block_bytes);
    std::vector<std::byte*> dst(idx.size(), nullptr);
    std::vector<bool> promoted(idx.size(), false);
    // As in RunStore: the victims that make room for the promoted blocks are demoted together.
    CpuTier::Victims victims;
    std::vector<size_t> waiting;  // promoted blocks whose slot a victim still holds
    auto place = [&](size_t j, Result<std::byte*> slot) {
      promoted[j] = slot.ok();
      if (slot.ok()) {
        dst[j] = *slot;
      } else {
        // Not promoted (every slot pinned): read into a buffer of its own.
        bounce.emplace_back(static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, file_bytes)));
        dst[j] = bounce.back().get();
        ++load_buffered_blocks_;
        const uint64_t held = bounce.size() * file_bytes;
        uint64_t peak = load_buffer_peak_bytes_.load();
        while (held > peak && !load_buffer_peak_bytes_.compare_exchange_weak(peak, held)) {
        }
      }
    };
    auto settle = [&] {
      std::vector<Result<std::byte*>> slots = cpu_->DemoteAndPlace(victims, batch.keys, waiting);
      for (size_t w = 0; w < waiting.size(); ++w) place(waiting[w], std::move(slots[w]));
      waiting.clear();
    };
    for (size_t j = 0; j < idx.size(); ++j) {
      if (!batch.result[j].ok()) continue;  // gone since the lookup
      Result<std::byte*> slot = cpu_->BeginInsert(batch.keys[j], EvictionPolicy::kUnknownPosition,
                                                  &victims);
      if (slot.status().code() == StatusCode::kResourceExhausted && !waiting.empty()) {
        settle();  // our own victims, not demoted yet, were the room
        slot = cpu_->BeginInsert(batch.keys[j], EvictionPolicy::kUnknownPosition, &victims);
      }
      if (slot.ok() && *slot == nullptr) {
        waiting.push_back(j);
      } else {
        place(j, std::move(slot));
      }
    }
    settle();
    disks_[t]->ReadPinned(batch.keys, dst, batch.result, [&](size_t j) {
      src[idx[j]] = dst[j];
      on_read(idx[j]);
    });
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      if (batch.result[j].ok()) {
        if (promoted[j]) {
          cpu_->CommitInsert(batch.keys[j], /*keep_pinned=*/true);
          pinned[i] = true;
        }
      } else {
        result[i] = batch.result[j];
        if (promoted[j]) cpu_->AbortInsert(batch.keys[j]);
      }
    }
  }

  // The copies of block i from its segment pointers into its host slot, and back.
  void GatherOps(std::vector<CopyOp>& ops, std::byte* slot, const std::vector<void*>& ptrs,
                 size_t i) const {
    const size_t seg = config_.block_bytes / config_.segments;
    for (size_t s = 0; s < config_.segments; ++s) {
      ops.push_back(CopyOp{slot + s * seg, ptrs[i * config_.segments + s], seg});
    }
  }
  void ScatterOps(std::vector<CopyOp>& ops, const std::vector<void*>& ptrs, size_t i,
                  const std::byte* slot) const {
    const size_t seg = config_.block_bytes / config_.segments;
    for (size_t s = 0; s < config_.segments; ++s) {
      ops.push_back(CopyOp{ptrs[i * config_.segments + s], slot + s * seg, seg});
    }
  }

  Status CopyAndWait(CopyDirection direction, const std::vector<CopyOp>& ops) {
    Result<std::unique_ptr<CopyTicket>> ticket = device_->CopyAsync(direction, ops);
    if (!ticket.ok()) return ticket.status();
    return (*ticket)->Wait();
  }

  const EngineConfig config_;
  const BlockKey fingerprint_;
  LogSink log_;  // set once in Init, before any other thread starts
  std::unique_ptr<DeviceBackend> device_;
  // Before the tiers, which point at them: destroyed after.
  HoldSet holds_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<CpuTier> cpu_;
  std::vector<std::unique_ptr<DiskTier>> disks_;

  std::atomic<uint64_t> stored_blocks_{0}, loaded_blocks_{0}, failed_loads_{0}, failed_stores_{0};
  std::atomic<uint64_t> d2h_bytes_{0}, d2h_ns_{0}, h2d_bytes_{0}, h2d_ns_{0};
  std::atomic<uint64_t> load_buffered_blocks_{0}, load_buffer_peak_bytes_{0};

  mutable Mutex jobs_mu_;
  // Jobs not yet reported to a caller of Poll or Wait.
  std::map<JobId, std::shared_ptr<JobRecord>> jobs_ GUARDED_BY(jobs_mu_);
  JobId next_job_ GUARDED_BY(jobs_mu_) = 1;
  // Jobs running now, on workers or on threads in Wait: never more than worker_threads, the
  // bound a configuration sizes the pinned tier for (each running store reserves its slots).
  size_t running_ GUARDED_BY(jobs_mu_) = 0;
  CondVar run_slot_free_{&jobs_mu_};
  // Runs Store and Load jobs; started last in Init, stopped first in the destructor.
  std::unique_ptr<WorkQueue> workers_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Open(const EngineConfig& config, EngineHooks hooks) {
  auto engine = std::make_unique<EngineImpl>(config);
  try {
    if (Status s = engine->Init(hooks); !s.ok()) return s;
  } catch (const std::system_error& e) {
    // std::thread's only failure: what started is stopped as `engine` goes.
    return Status::Unavailable(std::string("cannot start the engine's threads: ") + e.what() +
                               " (a container at its pids limit?)");
  }
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace kvoffload
