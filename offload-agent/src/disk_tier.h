// One disk tier: checksummed block files with an eviction policy and a capacity it never
// exceeds. A private tier that starts empty keeps them as slots of one file (slot_file.h); a
// persistent or shared one as a file per block, which outlives the process and other
// processes can find by name (FORMAT.md). Evicted blocks are handed to a sink (the next tier,
// or dropped).
// Thread-safe: one mutex guards the index; file I/O and the sink run outside it. Blocks being
// read are pinned so that eviction skips them; no call ever waits for a pin to drop (the pin
// holder may be a job waiting on this tier), which keeps the cascade deadlock-free.
// A persistent tier serves its recovered blocks as soon as it is open; their files are checked
// (size, type) and ordered (modification time) by a thread of its own, and evictions of its own
// blocks wait for that.
#ifndef KVOFFLOAD_SRC_DISK_TIER_H_
#define KVOFFLOAD_SRC_DISK_TIER_H_

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "capacity_ledger.h"
#include "event_log.h"
#include "hold_set.h"
#include "kvoffload/block_key.h"
#include "kvoffload/config.h"
#include "kvoffload/disk_io.h"
#include "kvoffload/eviction_policy.h"
#include "kvoffload/eviction_policy.h"
#include "kvoffload/stats.h"
#include "process_tag.h"
#include "log_sink.h"
#include "kvoffload/mutex.h"
#include "slot_file.h"

namespace kvoffload {

struct DiskTierOptions {
  std::string name;   // "disk0"
  std::string field;  // where its configuration came from, for errors: "KVOFFLOAD_TIERS[0]"
  DiskTierConfig config;
  size_t block_bytes = 0;
  BlockKey fingerprint;  // ModelFingerprint::Scope(block_bytes)
  std::string policy = "lru";
  int tier = 1;                     // its number in the engine (TierEvent::tier)
  const HoldSet* holds = nullptr;   // blocks never chosen as victims; outlives the tier
  EventLog* events = nullptr;       // residency feed; outlives the tier
  // Publish through named temp files even where O_TMPFILE works (tests of that path).
  bool named_temp_files = false;
  LogSink log = nullptr;  // state changes (full, read-only, failing, writable again); empty = stderr
  // The most blocks the tier holds: its capacity is lowered to this many (tests lower it).
  size_t max_blocks = kMaxEvictionPolicyBlocks;
};

class DiskTier {
 public:
  // Receives an evicted block: file bytes (payload + trailer) in an aligned buffer that is
  // valid only during the call. Returns whether the next tier took it; the last tier has no
  // sink: its victims are dropped (and counted).
  using EvictSink = std::function<bool(const BlockKey& key, std::byte* file)>;

  // Refuses a tier directory that does not exist (its volume is not mounted there), creates
  // the format directories below it, probes O_DIRECT, then either clears the tier and creates its slot
  // file (neither persistent nor shared), or lists it so its blocks are served again
  // (persistent); their files are checked and put in eviction order in the background (a write
  // that needs one of them evicted waits for that).
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                std::unique_ptr<DiskIo> io);
  ~DiskTier();

  // REQUIRES: called once, before any Insert.
  void SetEvictSink(EvictSink sink) { sink_ = std::move(sink); }

  // Whether the block is here. Shared tiers also look for a file another process published.
  bool Contains(const BlockKey& key);
  // A use elsewhere of a block that is here (the write-back read the pinned tier's copy):
  // the policy hears it as an access. Nothing when the block is not here, or is leaving.
  void Refresh(const BlockKey& key);
  // Here and not being evicted or removed, for a hold the caller has put in the HoldSet: the
  // block stays here until released. On a shared tier the HoldSet binds this process only, and
  // another one evicts by unlinking the file, so a hold there also opens the file (once per
  // key, counted) and reads of the block use that descriptor until ReleaseHold; a file
  // already gone makes the block a miss here.
  bool Protected(const BlockKey& key);
  // One hold of the key ended: drops the count Protected took, closing the file at zero. A
  // key this tier opened nothing for is ignored (its hold found the block in another tier).
  void ReleaseHold(const BlockKey& key);

  // Writes the block file (from `file`, BlockFileBytes long, 4096-aligned) into a free slot,
  // or to a temp file that it publishes atomically, evicting to make room first. OK when the
  // block is (now) here; ResourceExhausted when no room can be made; IOError on a failed
  // write. The trailer must be encoded, or `encode` given: it is called (once) only when the
  // file is really written, so a block already here costs no checksum.
  Status Insert(const BlockKey& key, std::byte* file, const std::function<void()>& encode = {});
  // Encodes block i's trailer in place (InsertBatch calls it only for the blocks it writes).
  using BlockEncoder = std::function<void(size_t i)>;
  // Insert for each block (results[i] as Insert returns), with the writes of those that go to
  // disk submitted together: a store job's evictions keep that many writes in flight.
  void InsertBatch(std::span<const BlockKey> keys, std::span<std::byte* const> files,
                   const BlockEncoder& encode, std::span<Status> results);

  // Pins the blocks that are here (results[i] OK; NotFound for the others) so that no eviction
  // takes them before ReadPinned. Callers pin before making room anywhere in the cascade.
  void Pin(std::span<const BlockKey> keys, std::span<Status> results);
  // Called with i as soon as block i was read and verified (results[i] OK), while the rest of
  // the batch is still being read; on the reading thread.
  using BlockRead = std::function<void(size_t i)>;

  // Reads and verifies each pinned block (results[i] OK) into dsts[i] (BlockFileBytes each,
  // aligned), then unpins it. A block that fails verification is removed and reported as
  // Corruption; one that another process removed, as NotFound. on_read (may be empty) hears of
  // each good block as it arrives.
  void ReadPinned(std::span<const BlockKey> keys, std::span<std::byte* const> dsts,
                  std::span<Status> results, const BlockRead& on_read = {});

  void RecordLookup(bool hit);
  TierStats Stats();
  std::string Describe() const;

 private:
  // Where a block is in the slot file and its payload's checksum, which the slot file does
  // not hold (slot files only).
  struct SlotRef {
    uint64_t slot = 0;
    uint32_t crc = 0;
  };
  struct Entry {
    SlotRef at;
    uint32_t pins = 0;       // reads in flight
    bool evicting = false;   // chosen as victim (unpinned then); being cascaded and removed
    bool doomed = false;     // found corrupt or gone; removed once pins drop to 0
  };

  // A recovered block file, from its directory entry alone.
  struct Recovered {
    ino_t ino;
    BlockKey key;
  };
  // Calls before the recovered blocks are in the policy, replayed after them in order.
  enum class PolicyCall { kInsert, kAccess, kRemove };

  DiskTier(const DiskTierOptions& options, std::unique_ptr<DiskIo> io);
  Status Init();
  // Indexes our fingerprint's blocks from their names alone (no stat: a million files take a
  // million inode reads when the caches are cold) into `own`, and lists other fingerprints'
  // files and temp files. `bytes`: what they hold (ours at the exact size they must have).
  Status Scan(uint64_t* bytes, std::vector<Recovered>* own);
  // The background half of recovery: stats the recovered files (in inode order), puts them in
  // the policy oldest first, replays what happened meanwhile, removes wrong-size files, sheds
  // blocks past the capacity, then lets evictions of our blocks begin.
  void Settle(std::vector<Recovered> files);
  // Bytes of every block and temp file under the tier (the shared ledger's starting point).
  uint64_t ScanUsedBytes(const LiveWriters& live) const;
  // Other fingerprints' block files under the tier now (path, bytes), newest first, as
  // foreign_ holds them.
  std::vector<std::pair<std::string, uint64_t>> ListForeign() const;
  // The keys of the blocks in our fingerprint's directory, as named on disk now. In a shared
  // tier these include blocks other replicas stored after we opened, which we learn of only by
  // looking them up.
  std::vector<BlockKey> ListBlocks() const;
  // The policy calls, journaled until the recovered blocks are settled.
  void PolicyOn(PolicyCall call, const BlockKey& key) REQUIRES(mu_);
  // Indexes a block another process published in a shared tier, unless this process has it
  // already or is writing it; true when it was new here.
  bool IndexSharedLocked(const BlockKey& key) REQUIRES(mu_);
  // Removes the oldest other fingerprint's file, if any is left; true when it did. A file that
  // cannot be removed (read-only file system) stays listed, counted, and *failure says why.
  bool EvictForeignLocked(Status* failure = nullptr) REQUIRES(mu_);
  // Unlinks a file whose bytes the ledger counts; true when they are to be given back: this
  // call removed it, or, in a private tier, it was gone already (removed from outside: nobody
  // else gives its bytes back, and the files win). In a shared tier a file already gone was
  // another replica's to give back, or, removed from outside, the recount's. *err: the errno
  // of a failed unlink, else 0.
  bool UnlinkCounted(const std::string& path, int* err = nullptr) const;
  // Whether a file whose unlink failed with `err` is still there, with its bytes: not when it
  // is gone or is no file (a directory, a path through a non-directory).
  static bool StillThere(int err) {
    return err != 0 && err != ENOENT && err != EISDIR && err != ENOTDIR;
  }
  // Opens block `key`'s file for reading, once it is known to be a regular file of the size
  // a block file has: its descriptor; NotFound when it is gone; Corruption when its size is
  // wrong; FailedPrecondition when the name is no file the engine can read (a directory, a
  // link, a FIFO, a file it may not open); IOError when the process or system is short of
  // something (EMFILE, ...) and the file may well be fine.
  Result<int> OpenBlockFile(const BlockKey& key) const;
  // Counts a failed read or open of a block's file and dooms the entry when the failure says
  // the file is no block (every load of it would fail as well; vLLM asserts on a failed load).
  void NoteReadFailureLocked(Entry* entry, const Status& failure) REQUIRES(mu_);
  // Removes a doomed block (pins == 0): its file, or only its entry when the name is not a
  // regular file (DropNonFileLocked). A file that cannot be removed leaves the policy for
  // stuck_.
  void RemoveDoomedLocked(const BlockKey& key) REQUIRES(mu_);
  // Removes the newest block of stuck_ if its file can be removed now; true when it went.
  bool RemoveStuckLocked() REQUIRES(mu_);
  // Forgets a block whose name is no longer a regular file (replaced behind our back), leaving
  // that name alone (FORMAT.md, Compatibility).
  void DropNonFileLocked(const BlockKey& key) REQUIRES(mu_);
  // Reads and verifies without touching the index (callers pin or own the entries); each
  // block is verified as its read completes, while the others are in flight. at[i]: where
  // block i is (slot files only; empty otherwise). Either way dsts[i] ends up a whole block
  // file (payload and trailer).
  void ReadFiles(std::span<const BlockKey> keys, std::span<const SlotRef> at,
                 std::span<std::byte* const> dsts, std::span<Status> results,
                 const BlockRead& on_read);
  // Where a new block is written: over an evicted block's file (its bytes still counted;
  // file per block), into a slot, or else into a new file for which bytes were reserved.
  struct Room {
    std::string spare;
    uint64_t slot = 0;
  };
  // Makes room for one block; mu_ is released while victims are cascaded.
  Status Reserve(Room* room) REQUIRES(mu_);
  // Cascades and removes a victim; an error when its file could not be removed (the block
  // stays, a victim again later). A doomed one (corrupt, its removal failed before) is
  // removed only: neither cascaded nor written over, as its file may be of any size.
  Status Evict(const BlockKey& key, SlotRef at, bool doomed);
  // A file per block: true when this call published the file; false when another process
  // had already.
  Result<bool> WriteFile(const BlockKey& key, std::byte* file, const Room& room);
  // Creates the format and fingerprint directories again, after someone removed them while
  // the tier was open (rm -rf <tier>/kvoffload-v1): every write would fail until a restart.
  // True when they are there now.
  bool RecreateDirs();
  // The slot file's writes, submitted together; each slot whose write fails is given back
  // with its bytes. written(j) runs once file j's write has completed, while the others may
  // still be in flight.
  std::vector<Result<bool>> WriteSlots(std::span<std::byte* const> files,
                                       std::span<const uint64_t> slots,
                                       const BlockEncoder& written);
  // Checks a block read from its slot against the checksum kept for it, and puts its trailer
  // back (the next tier and the caller take whole block files).
  Status VerifySlot(std::byte* file, const BlockKey& key, SlotRef at) const;
  // Gives a slot and its bytes back (its block left the index, or never entered it).
  void FreeSlot(uint64_t slot);
  // Runs the writes and counts their bytes and each one's time; done(k) (if given) runs once
  // op k has completed.
  void TimedWrite(std::span<IoOp> ops, const DiskIo::OpDone& done = {});
  // REQUIRES: lock held; entry pins == 0. Unlinks the file and forgets the block; true when it
  // did. A file that cannot be unlinked (read-only file system, no permission) is still there,
  // readable and using its bytes: the block stays indexed, and *failure says why.
  bool RemoveLocked(const BlockKey& key, Status* failure = nullptr) REQUIRES(mu_);
  // Forgets the block, leaving its file to the caller.
  void ForgetLocked(const BlockKey& key) REQUIRES(mu_);
  // Renames an evicting block's file out of the index's sight, for the next write to go over
  // it (private tiers): its new path, or empty when the caller must remove it instead.
  std::string SetAside(const BlockKey& key) const;
  bool IsPinnedLocked(const BlockKey& key) const REQUIRES(mu_);
  // A new temp file's path: <stem>.<pid>.<n>.tmp in our fingerprint directory.
  std::string TempPath(std::string_view stem) const;
  // The process tag in a temp file's name ("<stem>.<tag>.<n>.tmp", TempPath).
  static std::string_view TempFileTag(std::string_view name);
  int OpenFlags(int base) const;

  // The descriptor of <tier>/kvoffload.lock, flock'ed while the tier is open: exclusively by
  // a private tier's one engine, shared by the engines of a shared tier. Declared first so it
  // is closed last, after the slot file and spares are gone.
  struct DirLock {
    int fd = -1;
    ~DirLock();
  } dir_lock_;
  const DiskTierOptions options_;
  const size_t file_bytes_;
  // What one block takes in this tier: a block file, or a slot (the payload rounded up to
  // 4096: its trailer is rebuilt from memory on each read). The capacity counts these.
  const size_t stored_bytes_;
  const std::string dir_;
  // Temp file names carry it (process_tag.h; made once at open, not once per eviction).
  const std::string tag_ = ProcessTag();
  std::unique_ptr<DiskIo> io_;
  std::unique_ptr<EvictionPolicy> policy_ GUARDED_BY(mu_);
  // Set once in Init(), before any other thread sees the tier; thread-safe itself, and WriteFile
  // settles reservations outside mu_.
  std::unique_ptr<CapacityLedger> ledger_;
  // Set once in Init() for a private tier that starts empty; null for a file per block.
  std::unique_ptr<SlotFile> slots_;
  EvictSink sink_;
  bool direct_ = false;
  bool tmpfile_ = false;  // temp files are O_TMPFILE (nameless until published)
  size_t recovered_ = 0;  // block files listed at open (set before another thread sees the tier)
  size_t listing_streams_ = 0;  // how many streams listed them (likewise)
  std::atomic<bool> stop_settling_{false};
  std::thread settler_;  // joined by the destructor before anything else goes

  mutable Mutex mu_;
  CondVar cv_{&mu_};  // an eviction or an insert finished
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_ GUARDED_BY(mu_);
  std::unordered_set<BlockKey, BlockKeyHash> inserting_ GUARDED_BY(mu_);
  // Shared tiers: the files of held blocks (Protected), open while any hold that opened them
  // lasts. An unlinked file's bytes stay on the file system until closed, beyond what the
  // ledger and `du` count: at most the blocks held for loads in flight.
  struct HeldFile {
    int fd = -1;
    uint32_t holds = 0;
  };
  std::unordered_map<BlockKey, HeldFile, BlockKeyHash> held_files_ GUARDED_BY(mu_);
  // Shared tiers keep a file per block, and only they open the files of held blocks.
  bool HoldsFilesOpen() const { return options_.config.shared && !slots_; }
  // The held block's descriptor for one read, held once more for it so that a release
  // meanwhile cannot close it (the caller ends that with ReleaseHold), or -1. Not a dup: a load
  // of held blocks then needed two descriptors a block, and long prefixes ran out (EMFILE).
  int HeldFileForRead(const BlockKey& key) EXCLUDES(mu_);
  // Files of evicted blocks, renamed to temp names, still counted in the ledger, waiting to
  // be overwritten in place by the write that evicted them (FORMAT.md, Reuse). Overwriting a
  // file's allocated blocks costs the file system no inode or block allocation, which is most
  // of a new small file's cost. At most one per thread inside Reserve, as each eviction there
  // is followed by that thread taking a spare.
  std::vector<std::string> spares_ GUARDED_BY(mu_);
  // Other fingerprints' block files (path, bytes) in a persistent tier, newest first: evicted
  // before any of ours, from the back.
  std::vector<std::pair<std::string, uint64_t>> foreign_ GUARDED_BY(mu_);
  // Doomed blocks whose file could not be removed (a read-only file system): out of the
  // policy, whose newest block a failed load made them, so that they go first, when a write
  // needs room or when the block is stored again. A key leaves it with its entry
  // (ForgetLocked).
  std::vector<BlockKey> stuck_ GUARDED_BY(mu_);
  size_t evictions_in_flight_ GUARDED_BY(mu_) = 0;
  // False from a persistent start until Settle is done: no victim of ours is chosen; policy
  // calls wait in journal_.
  bool settled_ GUARDED_BY(mu_) = true;
  std::vector<std::pair<PolicyCall, BlockKey>> journal_ GUARDED_BY(mu_);
  TierStats stats_ GUARDED_BY(mu_);
  // What the last write said about the tier: "" (writable), or why it is not (full, read-only,
  // failing). A change is logged once, not once per block; blocks_lost_ counts the blocks that
  // did not reach the tier since (stats_.lost counts them all).
  std::string write_state_ GUARDED_BY(mu_);
  uint64_t blocks_lost_ GUARDED_BY(mu_) = 0;
  // REQUIRES: mu_. Records the outcome of one write (no_victim: refused before writing, as
  // every block here was pinned or held) and logs a change of state.
  void NoteWrite(const Status& result, bool no_victim = false) REQUIRES(mu_);
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DISK_TIER_H_
