// Policy semantics: LRU order, pinned keys skipped, ARC adapting on ghost hits and resisting a
// one-time scan that flushes LRU, S3-FIFO's queues (and the policy against a plain model of
// it), lru-tinylfu's filter switching on and off, lirs keeping a loop that LRU never hits, and
// the name-keyed factory.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "kvoffload/eviction_policy.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Key;

std::unique_ptr<EvictionPolicy> Make(const std::string& name, size_t capacity) {
  Result<std::unique_ptr<EvictionPolicy>> p = NewEvictionPolicy(name, capacity);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

// Simulates a tier of `capacity` blocks driving the policy: a hit is OnAccess, a miss inserts
// and evicts while over capacity. Returns whether the access hit.
struct Cache {
  Cache(const std::string& name, size_t capacity) : policy(Make(name, capacity)), cap(capacity) {}
  bool Access(const BlockKey& k) {
    if (resident.contains(k)) {
      policy->OnAccess(k);
      return true;
    }
    policy->OnInsert(k);
    resident.insert(k);
    while (resident.size() > cap) {
      std::optional<BlockKey> v =
          policy->SelectVictim([&](const BlockKey& x) { return x == k; });
      EXPECT_TRUE(v.has_value());
      EXPECT_NE(*v, k) << "the key being inserted is pinned";
      resident.erase(*v);
    }
    return false;
  }
  std::unique_ptr<EvictionPolicy> policy;
  size_t cap;
  std::set<BlockKey> resident;
};

TEST(LruPolicyTest, EvictsLeastRecentlyUsedFirst) {
  auto lru = Make("lru", 3);
  lru->OnInsert(Key(1));
  lru->OnInsert(Key(2));
  lru->OnInsert(Key(3));
  lru->OnAccess(Key(1));  // order now 2, 3, 1
  EXPECT_EQ(lru->EvictionOrder(), (std::vector<BlockKey>{Key(2), Key(3), Key(1)}));
  EXPECT_EQ(lru->SelectVictim(nullptr), Key(2));
  EXPECT_EQ(lru->SelectVictim(nullptr), Key(3));
  EXPECT_EQ(lru->resident(), 1u);
}

TEST(LruPolicyTest, PinnedKeysAreNeverVictims) {
  auto lru = Make("lru", 3);
  for (uint64_t i = 1; i <= 3; ++i) lru->OnInsert(Key(i));
  auto pinned = [](const BlockKey& k) { return k == Key(1) || k == Key(2); };
  EXPECT_EQ(lru->SelectVictim(pinned), Key(3));
  EXPECT_EQ(lru->SelectVictim(pinned), std::nullopt) << "only pinned keys are left";
  EXPECT_EQ(lru->resident(), 2u);
}

TEST(LruPolicyTest, RemoveForgetsWithoutEvicting) {
  auto lru = Make("lru", 2);
  lru->OnInsert(Key(1));
  lru->OnInsert(Key(2));
  lru->OnRemove(Key(1));
  lru->OnRemove(Key(9));  // unknown: ignored
  EXPECT_EQ(lru->EvictionOrder(), (std::vector<BlockKey>{Key(2)}));
}

TEST(ArcPolicyTest, SecondAccessMovesToFrequentList) {
  auto arc = Make("arc", 4);
  arc->OnInsert(Key(1));
  arc->OnInsert(Key(2));
  arc->OnAccess(Key(1));
  EXPECT_EQ(arc->DebugString(), "arc c=4 p=0 t1=1 t2=1 b1=0 b2=0");
  // T1 (seen once) goes first while it is above its target p = 0.
  EXPECT_EQ(arc->SelectVictim(nullptr), Key(2));
  EXPECT_EQ(arc->DebugString(), "arc c=4 p=0 t1=0 t2=1 b1=1 b2=0");
}

TEST(ArcPolicyTest, GhostHitInB1GrowsRecencyTargetAndB2HitShrinksIt) {
  Cache c("arc", 4);
  auto state = [&] { return c.policy->DebugString(); };
  for (uint64_t k : {1u, 2u, 1u, 2u}) c.Access(Key(k));  // 1, 2 frequent (T2)
  for (uint64_t k : {3u, 4u, 5u}) c.Access(Key(k));     // 5 pushes 3 from T1 into B1
  EXPECT_EQ(state(), "arc c=4 p=0 t1=2 t2=2 b1=1 b2=0");
  EXPECT_FALSE(c.Access(Key(3)));  // B1 ghost hit: recency was undervalued, p grows
  EXPECT_EQ(state(), "arc c=4 p=1 t1=1 t2=3 b1=1 b2=0");
  c.Access(Key(6));                // T1 over target: 5 goes to B1
  EXPECT_FALSE(c.Access(Key(4)));  // B1 hit again: p = 2; now T1 is within target, so T2 pays
  EXPECT_EQ(state(), "arc c=4 p=2 t1=1 t2=3 b1=1 b2=1");
  EXPECT_FALSE(c.Access(Key(1)));  // B2 ghost hit: frequency was undervalued, p shrinks
  EXPECT_NE(state().find("p=1"), std::string::npos) << state();
  EXPECT_TRUE(c.resident.contains(Key(1)));
}

// A working set used twice, then a long one-time scan: LRU loses the working set, ARC keeps it.
TEST(ArcPolicyTest, ResistsOneTimeScanThatFlushesLru) {
  constexpr size_t kCapacity = 100;
  Cache lru("lru", kCapacity);
  Cache arc("arc", kCapacity);
  for (int round = 0; round < 2; ++round) {
    for (uint64_t k = 0; k < 50; ++k) {
      lru.Access(Key(k));
      arc.Access(Key(k));
    }
  }
  for (uint64_t k = 1000; k < 2000; ++k) {  // the scan: each key once
    lru.Access(Key(k));
    arc.Access(Key(k));
  }
  size_t lru_hits = 0, arc_hits = 0;
  for (uint64_t k = 0; k < 50; ++k) {
    lru_hits += lru.Access(Key(k)) ? 1u : 0u;
    arc_hits += arc.Access(Key(k)) ? 1u : 0u;
  }
  EXPECT_EQ(lru_hits, 0u) << "the scan flushed LRU";
  EXPECT_EQ(arc_hits, 50u) << "ARC kept the frequent set through the scan";
}

TEST(ArcPolicyTest, PinnedKeysAreSkippedAcrossBothLists) {
  auto arc = Make("arc", 3);
  arc->OnInsert(Key(1));
  arc->OnInsert(Key(2));
  arc->OnAccess(Key(2));  // T1 = {1}, T2 = {2}
  auto pin1 = [](const BlockKey& k) { return k == Key(1); };
  EXPECT_EQ(arc->SelectVictim(pin1), Key(2)) << "T1's only block is pinned: take from T2";
  EXPECT_EQ(arc->SelectVictim(pin1), std::nullopt);
}

TEST(ArcPolicyTest, GhostListsStayBounded) {
  Cache c("arc", 8);
  for (uint64_t k = 0; k < 1000; ++k) c.Access(Key(k % 37));
  // |T1| + |T2| + |B1| + |B2| <= 2c: parse the counts back out of the debug line.
  std::string s = c.policy->DebugString();
  size_t total = 0;
  for (const char* f : {" t1=", " t2=", " b1=", " b2="}) {
    total += std::stoul(s.substr(s.find(f) + 4));
  }
  EXPECT_LE(total, 16u) << s;
  EXPECT_EQ(c.resident.size(), 8u);
}

// New blocks never used again leave from the small queue, before any block that was used.
TEST(S3FifoPolicyTest, UnusedNewBlocksLeaveBeforeUsedOnes) {
  Cache c("s3fifo", 20);  // S holds 2
  for (uint64_t k = 0; k < 20; ++k) c.Access(Key(k));
  for (uint64_t k = 0; k < 5; ++k) c.Access(Key(k));      // used once more: these move to M
  for (uint64_t k = 100; k < 200; ++k) c.Access(Key(k));  // a one-time scan, 5x the cache
  for (uint64_t k = 0; k < 5; ++k) EXPECT_TRUE(c.Access(Key(k))) << "used block " << k;
  EXPECT_EQ(c.resident.size(), 20u);
}

TEST(S3FifoPolicyTest, AGhostHitEntersMainAndOutlivesTheSmallQueue) {
  Cache c("s3fifo", 10);  // S holds 1, G up to 10
  c.Access(Key(1));
  for (uint64_t k = 2; k <= 11; ++k) c.Access(Key(k));  // 1 leaves unused: remembered in G
  EXPECT_FALSE(c.resident.contains(Key(1)));
  EXPECT_FALSE(c.Access(Key(1))) << "a ghost is no hit";
  // Stored again from G it went to M: it outlives new blocks passing through S.
  for (uint64_t k = 20; k < 25; ++k) c.Access(Key(k));
  EXPECT_TRUE(c.resident.contains(Key(1))) << c.policy->DebugString();
}

TEST(S3FifoPolicyTest, UseCountsSaturateAndDecayInMain) {
  Cache c("s3fifo", 10);
  for (uint64_t k = 0; k < 10; ++k) c.Access(Key(k));
  for (int i = 0; i < 100; ++i) c.Access(Key(3));
  // 100 blocks, each used once after its store, pass through M (9 blocks): block 3 goes
  // round M about 11 times. Its count stopped at 3, so it leaves on the fourth round.
  for (uint64_t k = 1000; k < 1100; ++k) {
    c.Access(Key(k));
    c.Access(Key(k));
  }
  EXPECT_FALSE(c.resident.contains(Key(3))) << "a saturated count still decays";
  EXPECT_EQ(c.resident.size(), 10u);
}

TEST(S3FifoPolicyTest, PinnedBlocksAreSkippedInBothQueues) {
  auto p = Make("s3fifo", 10);
  p->OnInsert(Key(1));
  p->OnInsert(Key(2));
  p->OnAccess(Key(2));
  auto pin_all_but_2 = [](const BlockKey& k) { return k != Key(2); };
  EXPECT_EQ(p->SelectVictim(pin_all_but_2), Key(2)) << "1 is pinned; 2 moved to M, then left";
  auto pin_all = [](const BlockKey&) { return true; };
  EXPECT_EQ(p->SelectVictim(pin_all), std::nullopt);
  EXPECT_EQ(p->resident(), 1u);
  EXPECT_EQ(p->SelectVictim(nullptr), Key(1));
  EXPECT_EQ(p->SelectVictim(nullptr), std::nullopt) << "nothing resident";
  p->OnRemove(Key(1));  // a ghost now: ignored
  EXPECT_EQ(p->resident(), 0u);
}

// S3-FIFO as the paper describes it, written for clarity: three deques and a map. The policy
// keeps its queues as rings of hash tags with lazily skipped stale positions, compacts them and
// grows its table; each of those must leave the victims and the order exactly these.
class S3FifoModel {
 public:
  explicit S3FifoModel(size_t capacity)
      : small_target_(std::max<size_t>(1, capacity / 10)),
        ghost_limit_(capacity - small_target_ + 1) {}

  void Insert(const BlockKey& k) {
    auto it = info_.find(k);
    if (it == info_.end()) {
      info_[k] = {'S', 0};
      s_.push_back(k);
    } else if (it->second.queue == 'G') {
      std::erase(g_, k);
      it->second = {'M', 0};
      m_.push_back(k);
    }
  }
  void Access(const BlockKey& k) {
    auto it = info_.find(k);
    if (it != info_.end() && it->second.queue != 'G') {
      it->second.uses = std::min(it->second.uses + 1, 3);
    }
  }
  void Remove(const BlockKey& k) {
    auto it = info_.find(k);
    if (it == info_.end() || it->second.queue == 'G') return;
    std::erase(it->second.queue == 'S' ? s_ : m_, k);
    info_.erase(it);
  }
  std::optional<BlockKey> Victim(const EvictionPolicy::IsPinned& pinned) {
    size_t pinned_s = 0, pinned_m = 0;
    for (size_t budget = 5 * (s_.size() + m_.size() + 1); budget > 0; --budget) {
      const bool s_ok = !s_.empty() && pinned_s < s_.size();
      const bool m_ok = !m_.empty() && pinned_m < m_.size();
      if (!s_ok && !m_ok) return std::nullopt;
      const bool from_s = s_ok && (s_.size() > small_target_ || !m_ok);
      std::deque<BlockKey>& q = from_s ? s_ : m_;
      const BlockKey k = q.front();
      q.pop_front();
      Info& i = info_[k];
      if (pinned && pinned(k)) {
        q.push_back(k);
        ++(from_s ? pinned_s : pinned_m);
      } else if (i.uses > 0) {
        i = {'M', from_s ? 0 : i.uses - 1};
        m_.push_back(k);
        pinned_m = 0;  // M's pinned blocks come round again behind it
      } else if (from_s) {
        i.queue = 'G';
        g_.push_back(k);
        if (g_.size() > ghost_limit_) {
          info_.erase(g_.front());
          g_.pop_front();
        }
        return k;
      } else {
        info_.erase(k);
        return k;
      }
    }
    return std::nullopt;
  }
  std::vector<BlockKey> Order() const {
    std::vector<BlockKey> out(s_.begin(), s_.end());
    out.insert(out.end(), m_.begin(), m_.end());
    return out;
  }

 private:
  struct Info {
    char queue;
    int uses;
  };
  const size_t small_target_;
  const size_t ghost_limit_;
  std::deque<BlockKey> s_, m_, g_;
  std::map<BlockKey, Info> info_;
};

// Random stores, loads, removals and evictions (some with pinned keys) over a key space a few
// times the capacity; removal-heavy phases without evictions pile up stale ring positions (the
// policy compacts its rings), and phases that store far past the capacity grow its table.
TEST(S3FifoPolicyTest, MatchesAPlainModelOfTheAlgorithm) {
  for (const size_t capacity : {size_t{1}, size_t{2}, size_t{10}, size_t{37}, size_t{300}}) {
    std::mt19937_64 rng(capacity);
    auto p = Make("s3fifo", capacity);
    S3FifoModel model(capacity);
    const uint64_t keys = 4 * capacity + 3;
    for (uint64_t phase = 0; phase < 24; ++phase) {
      const uint64_t kind = phase % 4;  // 0, 1: mixed; 2: removals outpace evictions; 3: overfill
      for (uint64_t op = 0; op < 2000; ++op) {
        const uint64_t r = rng() % 100;
        const BlockKey k = Key(kind == 3 ? 1'000'000 * (phase + 1) + op : rng() % keys);
        if (kind == 3 || r < 35) {
          p->OnInsert(k);
          model.Insert(k);
        } else if (r < 60) {
          p->OnAccess(k);
          model.Access(k);
        } else if (r < (kind == 2 ? 100 : 70)) {
          p->OnRemove(k);
          model.Remove(k);
        } else {
          EvictionPolicy::IsPinned pinned;
          if (r % 2 == 1) pinned = [m = r % 3](const BlockKey& x) { return x.lo % 3 == m; };
          const std::optional<BlockKey> want = model.Victim(pinned);
          ASSERT_EQ(p->SelectVictim(pinned), want) << "capacity " << capacity << " phase " << phase;
        }
      }
      ASSERT_EQ(p->EvictionOrder(), model.Order()) << "capacity " << capacity << " phase " << phase;
      ASSERT_EQ(p->resident(), model.Order().size());
    }
  }
}

TEST(ChainLruPolicyTest, KeepsAChainsHeadAndEvictsItsDeepestBlockFirst) {
  auto p = Make("chain-lru", 8);
  for (uint32_t i = 0; i < 4; ++i) p->OnInsertAt(Key(i), i);  // request 1: blocks 0..3
  EXPECT_EQ(p->EvictionOrder(), (std::vector<BlockKey>{Key(3), Key(2), Key(1), Key(0)}));
  p->OnInsertAt(Key(10), 0);  // request 2 is more recent than all of request 1
  p->OnInsertAt(Key(11), 1);
  EXPECT_EQ(p->EvictionOrder(),
            (std::vector<BlockKey>{Key(3), Key(2), Key(1), Key(0), Key(11), Key(10)}));
  // Request 3 loads request 1's first two blocks: they become the most recent, head first.
  p->OnAccessAt(Key(0), 0);
  p->OnAccessAt(Key(1), 1);
  EXPECT_EQ(p->EvictionOrder(),
            (std::vector<BlockKey>{Key(3), Key(2), Key(11), Key(10), Key(1), Key(0)}));
  EXPECT_EQ(p->SelectVictim(nullptr), Key(3));
  EXPECT_EQ(p->SelectVictim([](const BlockKey& k) { return k == Key(2); }), Key(11))
      << "pinned blocks are passed over";
}

TEST(ChainLruPolicyTest, WithoutPositionsItIsLru) {
  auto chain = Make("chain-lru", 4);
  auto lru = Make("lru", 4);
  for (uint64_t k : {1u, 2u, 3u, 4u}) {
    chain->OnInsert(Key(k));
    lru->OnInsert(Key(k));
  }
  for (uint64_t k : {2u, 1u, 4u}) {
    chain->OnAccess(Key(k));
    lru->OnAccess(Key(k));
  }
  EXPECT_EQ(chain->EvictionOrder(), lru->EvictionOrder());
  EXPECT_EQ(chain->SelectVictim(nullptr), Key(3));
}

// The block a chain continues from can leave (evicted or removed) between two calls; the next
// block then starts at the front instead of following a node the slab may have reused.
TEST(ChainLruPolicyTest, ChainWhoseLastBlockLeftRestartsAtTheFront) {
  auto p = Make("chain-lru", 4);
  p->OnInsertAt(Key(1), 0);
  p->OnInsertAt(Key(2), 1);
  EXPECT_EQ(p->SelectVictim(nullptr), Key(2));
  p->OnInsertAt(Key(3), 2);  // gets the slab node Key(2) had: it must not follow itself
  EXPECT_EQ(p->EvictionOrder(), (std::vector<BlockKey>{Key(1), Key(3)}));
  p->OnInsertAt(Key(4), 3);
  EXPECT_EQ(p->EvictionOrder(), (std::vector<BlockKey>{Key(1), Key(4), Key(3)}));
  p->OnRemove(Key(4));
  p->OnAccessAt(Key(1), 4);
  EXPECT_EQ(p->EvictionOrder(), (std::vector<BlockKey>{Key(3), Key(1)}));
  EXPECT_EQ(p->resident(), 2u);
}

// A block joins the latest call's only at a position past it (a store skips what its request
// has stored, leaving gaps); otherwise it starts a chain at the front, as LRU places it. Jobs
// interleave: a store past its request's stored prefix went behind another request's deepest
// block, to be evicted with it, and a load whose head is on disk (positions from 1) put the
// chain it had just read behind the latest chain's deepest block, the next victims.
TEST(ChainLruPolicyTest, ABlockFollowsTheLatestOnlyAtAPositionPastIt) {
  auto p = Make("chain-lru", 16);
  p->OnInsertAt(Key(20), 0);  // request B stores its first two blocks
  p->OnInsertAt(Key(21), 1);
  for (uint32_t i = 0; i < 4; ++i) p->OnInsertAt(Key(10 + i), i);  // request A, all four
  p->OnInsertAt(Key(22), 2);  // B stores two more, past the two it has
  p->OnInsertAt(Key(23), 3);
  EXPECT_EQ(p->EvictionOrder(), (std::vector<BlockKey>{Key(21), Key(20), Key(13), Key(12),
                                                       Key(11), Key(10), Key(23), Key(22)}));
  // A load of C's blocks 1-3 (its head on disk) after D's chain: C is the most recent.
  auto q = Make("chain-lru", 16);
  for (uint32_t i = 0; i < 4; ++i) q->OnInsertAt(Key(30 + i), i);  // C
  for (uint32_t i = 0; i < 4; ++i) q->OnInsertAt(Key(40 + i), i);  // D
  const std::vector<BlockKey> c = {Key(31), Key(32), Key(33)};
  const std::vector<uint32_t> at = {1, 2, 3};
  q->OnAccessBatch(c, at);
  EXPECT_EQ(q->EvictionOrder(), (std::vector<BlockKey>{Key(30), Key(43), Key(42), Key(41),
                                                       Key(40), Key(33), Key(32), Key(31)}));
  // A store that skips a block it has: the rest still follows its chain.
  auto r = Make("chain-lru", 16);
  r->OnInsertAt(Key(50), 0);
  r->OnInsertAt(Key(51), 1);
  r->OnInsertAt(Key(53), 3);
  EXPECT_EQ(r->EvictionOrder(), (std::vector<BlockKey>{Key(53), Key(51), Key(50)}));
}

// The defaults of the engine-knowledge calls: positioned calls are the plain ones, holds change
// nothing, for a policy that does not use them.
// Where blocks are re-read soon after they are stored, the admission filter never wins in the
// miniature caches, so the policy stays off and evicts exactly as lru does.
// Where recency wins (a sliding window of 48 keys, re-read while recent, with a new key every
// fourth access), the adaptive policy `name` hits and evicts exactly as LRU does and its state
// says so (`lru_state`, a piece of its DebugString).
void ExpectLruWhereRecencyWins(const std::string& name, const std::string& lru_state) {
  Cache adaptive(name, 64);
  Cache lru("lru", 64);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t k = static_cast<uint64_t>(i / 4) + rng() % 48;
    ASSERT_EQ(adaptive.Access(Key(k)), lru.Access(Key(k))) << name << ", access " << i;
  }
  EXPECT_EQ(adaptive.policy->EvictionOrder(), lru.policy->EvictionOrder()) << name;
  EXPECT_NE(adaptive.policy->DebugString().find(lru_state), std::string::npos)
      << adaptive.policy->DebugString();
}

TEST(LruTinyLfuPolicyTest, WhereRecencyWinsItIsLru) {
  ExpectLruWhereRecencyWins("lru-tinylfu", "filter=off");
}

// A hot set read over and over amid a stream of blocks read once, larger than the tier: LRU
// lets the stream flush the hot set; the filter, once the miniature caches turn it on, keeps
// the stream's blocks out (each enters at the LRU end and is the next to go). Runs lru-tinylfu
// and lru side by side, one access in three to the hot set, and counts the hits of the second
// half; checks the filter is on and won by half again.
struct HotSetRun {
  Cache tinylfu;
  size_t tinylfu_hits = 0;
  size_t lru_hits = 0;
  uint64_t next_once = 1'000'000;  // the stream's next key
};
HotSetRun RunHotSetAmidStream(size_t capacity, uint64_t hot_keys, int accesses, uint64_t seed) {
  HotSetRun run{Cache("lru-tinylfu", capacity)};
  Cache lru("lru", capacity);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < accesses; ++i) {
    const BlockKey k = i % 3 == 0 ? Key(rng() % hot_keys) : Key(run.next_once++);
    const bool a = run.tinylfu.Access(k);
    const bool b = lru.Access(k);
    if (i >= accesses / 2) {
      run.tinylfu_hits += a;
      run.lru_hits += b;
    }
  }
  EXPECT_NE(run.tinylfu.policy->DebugString().find("filter=on"), std::string::npos)
      << run.tinylfu.policy->DebugString();
  EXPECT_GT(run.tinylfu_hits * 2, run.lru_hits * 3)
      << "lru-tinylfu " << run.tinylfu_hits << ", lru " << run.lru_hits;
  return run;
}

TEST(LruTinyLfuPolicyTest, KeepsAFrequentSetThatAOneOffStreamFlushesFromLru) {
  constexpr size_t kCapacity = 400;
  HotSetRun run = RunHotSetAmidStream(kCapacity, 200, 200000, 9);
  // 33,333 reads of the hot set in the measured half; LRU kept about half of them.
  EXPECT_GT(run.tinylfu_hits, 30000u) << "lru " << run.lru_hits;

  // New blocks stored meanwhile are never the victim while pinned, and the count stays right.
  EvictionPolicy& p = *run.tinylfu.policy;
  for (int i = 0; i < 100; ++i) {
    const BlockKey fresh = Key(run.next_once++);
    p.OnInsert(fresh);
    const std::optional<BlockKey> victim =
        p.SelectVictim([&](const BlockKey& x) { return x == fresh; });
    ASSERT_TRUE(victim.has_value());
    EXPECT_NE(*victim, fresh);
  }
  EXPECT_EQ(p.resident(), kCapacity);
  const BlockKey newest = p.EvictionOrder().back();
  p.OnRemove(newest);
  p.OnRemove(newest);
  EXPECT_EQ(p.resident(), kCapacity - 1) << "a key that is not resident is ignored";
}

// Past 32K blocks the miniatures sample fewer keys (one in eight here, at 36K); the switch must
// still find the filter's win.
TEST(LruTinyLfuPolicyTest, ALargeTierStillSwitchesTheFilterOn) {
  RunHotSetAmidStream(36000, 18000, 720000, 3);
}

// lirs starts as LRU (an HIR share of the whole tier) and stays so where recency wins.
TEST(LirsPolicyTest, WhereRecencyWinsItIsLru) {
  ExpectLruWhereRecencyWins("lirs", "hir-share=1.00");
}

// Uniform random reads of twice as many blocks as the tier holds: every share hits about half
// the time, so no share is better and lirs must stay LRU, where a margin on the miniatures'
// hit counts let one share win a window by chance now and then and the tier follow it.
TEST(LirsPolicyTest, NoShareTakesOverByChance) {
  constexpr size_t kCapacity = 512;
  Cache lirs("lirs", kCapacity);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 400000; ++i) {
    lirs.Access(Key(rng() % (2 * kCapacity)));
    ASSERT_NE(lirs.policy->DebugString().find("hir-share=1.00"), std::string::npos)
        << "access " << i << ": " << lirs.policy->DebugString();
  }
}

// A hot set re-read in turn with a new block stored between any two reads (documents that come
// back, each with a question never asked again): the hot set's reuse distance is larger than
// the tier, so LRU never hits it, and lirs moves off LRU. What fills its empty LIR set then
// decides how soon it hits: the blocks stored next are one-time blocks, which would hold LIR
// until they are its least recent; the hot blocks are the ones that come back.
TEST(LirsPolicyTest, RefillsLirWithBlocksThatComeBack) {
  constexpr size_t kCapacity = 1000;
  constexpr uint64_t kHot = 700;
  Cache lirs("lirs", kCapacity);
  uint64_t next_new = kHot;
  uint64_t hot_reads = 0;
  uint64_t hot_hits = 0;
  bool switched = false;
  for (uint64_t i = 0; i < 400 * kHot; ++i) {
    const bool hit = lirs.Access(Key(i % kHot));
    lirs.Access(Key(next_new++));
    if (!switched) {
      switched = lirs.policy->DebugString().find("hir-share=1.00") == std::string::npos;
      continue;
    }
    if (++hot_reads > 3 * kHot) break;  // three passes over the hot set after the switch
    hot_hits += hit;
  }
  const std::string state = lirs.policy->DebugString();
  ASSERT_TRUE(switched) << state;
  EXPECT_GE(hot_hits, 3 * kHot / 2) << state;
  // Only blocks that came back are LIR: filled with whatever was stored next, LIR held 980
  // blocks here, 280 of them never read again.
  const size_t lir = state.find(" lir=");
  ASSERT_NE(lir, std::string::npos) << state;
  EXPECT_LE(std::stoul(state.substr(lir + 5)), kHot) << state;
}

// A loop over more blocks than the tier holds (sessions that all come back, more of them open
// than fit): LRU evicts every block just before its turn and never hits. Once the miniatures
// show it, lirs keeps a fixed LIR set of the loop and hits on it every pass.
TEST(LirsPolicyTest, KeepsMostOfALoopThatLruNeverHits) {
  constexpr size_t kCapacity = 100;
  constexpr uint64_t kLoop = 150;
  Cache lirs("lirs", kCapacity);
  Cache lru("lru", kCapacity);
  size_t lirs_hits = 0;
  size_t lru_hits = 0;
  constexpr uint64_t kAccesses = 400 * kLoop;
  for (uint64_t i = 0; i < kAccesses; ++i) {
    const bool a = lirs.Access(Key(i % kLoop));
    const bool b = lru.Access(Key(i % kLoop));
    if (i >= kAccesses - 20 * kLoop) {
      lirs_hits += a;
      lru_hits += b;
    }
  }
  EXPECT_EQ(lru_hits, 0u);
  // At an HIR share of 10% (or 2%) the 90 (98) LIR blocks hit on every pass of 150.
  EXPECT_GE(lirs_hits, 20 * 85u) << lirs.policy->DebugString();
  EXPECT_EQ(lirs.policy->DebugString().find("hir-share=1.00"), std::string::npos)
      << lirs.policy->DebugString();
  EXPECT_EQ(lirs.policy->resident(), kCapacity);

  // Pinned blocks are skipped: with every HIR block pinned, the victim is the least recent
  // LIR block, and the count stays right.
  EvictionPolicy& p = *lirs.policy;
  const std::vector<BlockKey> order = p.EvictionOrder();
  const std::set<BlockKey> pinned(order.begin(), order.begin() + 5);
  const std::optional<BlockKey> victim =
      p.SelectVictim([&](const BlockKey& k) { return pinned.contains(k); });
  ASSERT_TRUE(victim.has_value());
  EXPECT_FALSE(pinned.contains(*victim));
  EXPECT_EQ(*victim, order[5]);
  EXPECT_EQ(p.resident(), kCapacity - 1);
  p.OnRemove(order[6]);
  p.OnRemove(order[6]);
  p.OnRemove(*victim);  // now a ghost: not resident, ignored
  EXPECT_EQ(p.resident(), kCapacity - 2);
}

// When lirs leaves a share for LRU, nearly every ghost becomes one that no use could promote.
// They are forgotten a few a call: all at once held a 500K-block tier's lock for 110 ms.
TEST(LirsPolicyTest, GhostsAreForgottenAFewACallWhenTheShareChanges) {
  constexpr size_t kCapacity = 100;
  Cache lirs("lirs", kCapacity);
  auto ghosts = [&] {
    const std::string state = lirs.policy->DebugString();
    return std::stoul(state.substr(state.find(" ghosts=") + 8));
  };
  // A loop larger than the tier: lirs leaves LRU for a share with LIR blocks.
  for (uint64_t i = 0; i < 400 * 150; ++i) lirs.Access(Key(i % 150));
  ASSERT_EQ(lirs.policy->DebugString().find("hir-share=1.00"), std::string::npos)
      << lirs.policy->DebugString();
  // New blocks only: each goes through the HIR FIFO and is remembered, newer than every LIR
  // block's last use.
  uint64_t next = 1000;
  for (int i = 0; i < 2000; ++i) lirs.Access(Key(next++));
  const size_t most = ghosts();
  ASSERT_GE(most, 4 * kCapacity) << lirs.policy->DebugString();
  // Each new block used again 50 blocks later: LRU hits every reuse, lirs's small FIFO none, so
  // the miniatures send the tier back to LRU, whose ghosts are all forgotten.
  size_t largest_drop = 0;
  size_t before = ghosts();
  for (int i = 0; i < 40000; ++i) {
    lirs.Access(Key(next));
    lirs.Access(Key(next - 50));
    ++next;
    const size_t now = ghosts();
    if (now < before) largest_drop = std::max(largest_drop, before - now);
    before = now;
  }
  EXPECT_NE(lirs.policy->DebugString().find("hir-share=1.00"), std::string::npos)
      << lirs.policy->DebugString();
  EXPECT_EQ(ghosts(), 0u) << "LRU keeps none";
  // Two accesses a round, each evicting once: a few ghosts each, not hundreds at once.
  EXPECT_LE(largest_drop, 2 * 5u);
}

// A disk tier of small blocks can count hundreds of millions of blocks of capacity (up to
// kMaxEvictionPolicyBlocks, past which the tier is lowered): every policy must be made for it
// without allocating in proportion (lru-tinylfu's counts are capped at 4M blocks).
TEST(EvictionPolicyFactoryTest, EveryPolicyIsMadeForAHugeTier) {
  for (const std::string& name : EvictionPolicyNames()) {
    auto p = Make(name, kMaxEvictionPolicyBlocks);
    ASSERT_NE(p, nullptr) << name;
    Cache small(name, 4);
    for (uint64_t i = 0; i < 16; ++i) small.Access(Key(i % 6));
    EXPECT_EQ(small.policy->resident(), 4u) << name;
    p->OnInsert(Key(1));
    EXPECT_EQ(p->resident(), 1u) << name;
  }
}

TEST(EvictionPolicyTest, PositionsAndHoldsDefaultToThePlainCalls) {
  auto arc = Make("arc", 4);
  arc->OnInsertAt(Key(1), 0);
  arc->OnInsertAt(Key(2), 1);
  arc->OnAccessAt(Key(1), 0);
  arc->OnHold(Key(2));
  arc->OnRelease(Key(2));
  arc->OnRelease(Key(9));
  EXPECT_EQ(arc->DebugString(), "arc c=4 p=0 t1=1 t2=1 b1=0 b2=0");
}

// The contract every tier leans on, under random use with random pins (held blocks, loads in
// flight): a victim is resident and not pinned, and no victim means every resident block is
// pinned (a tier then refuses the store or waits for a slot). S3-FIFO passed over a pinned
// block of its main queue again after an unpinned one went round, counted it twice and gave up
// with that unpinned block still there.
TEST(EvictionPolicyTest, AVictimIsFoundWheneverAnUnpinnedBlockIsResident) {
  for (const std::string& name : EvictionPolicyNames()) {
    for (const size_t capacity : {3u, 9u, 40u}) {
      auto p = Make(name, capacity);
      std::set<BlockKey> resident;
      std::set<BlockKey> pinned;
      std::mt19937_64 rng(capacity);
      auto is_pinned = [&](const BlockKey& k) { return pinned.contains(k); };
      for (int step = 0; step < 20000; ++step) {
        const BlockKey k = Key(rng() % (3 * capacity));
        switch (rng() % 8) {
          case 0:
            if (pinned.size() < capacity - 1) pinned.insert(k);
            break;
          case 1:
            pinned.erase(k);
            break;
          case 2:
            if (resident.contains(k)) {
              p->OnRemove(k);
              resident.erase(k);
              pinned.erase(k);
            }
            break;
          default:
            if (resident.contains(k)) {
              p->OnAccess(k);
              break;
            }
            p->OnInsert(k);
            resident.insert(k);
            while (resident.size() > capacity) {
              const std::optional<BlockKey> v =
                  p->SelectVictim([&](const BlockKey& x) { return x == k || is_pinned(x); });
              size_t free_to_go = 0;
              for (const BlockKey& r : resident) free_to_go += r != k && !is_pinned(r) ? 1u : 0u;
              ASSERT_EQ(v.has_value(), free_to_go > 0)
                  << name << " capacity " << capacity << " step " << step << ": "
                  << free_to_go << " unpinned resident, " << p->DebugString();
              if (!v) {  // as a tier that refuses the store: the new block goes
                p->OnRemove(k);
                resident.erase(k);
                break;
              }
              ASSERT_TRUE(resident.contains(*v) && *v != k && !is_pinned(*v)) << name;
              resident.erase(*v);
            }
        }
        ASSERT_EQ(p->resident(), resident.size()) << name << " step " << step;
      }
    }
  }
}

// OnAccessBatch (a load's resident blocks at once, which list policies walk with their
// lookups overlapped) must leave every policy exactly where one OnAccessAt per block does:
// the same victims, the same order, the same state, chain after chain, with repeats.
TEST(EvictionPolicyTest, BatchedAccessesMatchOneCallPerBlock) {
  constexpr size_t kCapacity = 64;
  for (const std::string& name : EvictionPolicyNames()) {
    auto one = Make(name, kCapacity);
    auto batched = Make(name, kCapacity);
    std::set<BlockKey> resident;
    std::mt19937_64 rng(7);
    size_t accessed = 0, longest = 0;
    for (int chain = 0; chain < 1500; ++chain) {
      const size_t length = 1 + rng() % 80;
      std::vector<BlockKey> hits, misses;
      std::vector<uint32_t> hit_positions, miss_positions;
      for (size_t i = 0; i < length; ++i) {
        const BlockKey k = Key(rng() % 120);
        const bool hit = resident.contains(k);
        (hit ? hits : misses).push_back(k);
        (hit ? hit_positions : miss_positions).push_back(static_cast<uint32_t>(i));
      }
      for (size_t i = 0; i < hits.size(); ++i) one->OnAccessAt(hits[i], hit_positions[i]);
      batched->OnAccessBatch(hits, hit_positions);
      accessed += hits.size();
      longest = std::max(longest, hits.size());
      for (size_t i = 0; i < misses.size(); ++i) {
        if (resident.contains(misses[i])) continue;  // a repeat within the chain
        one->OnInsertAt(misses[i], miss_positions[i]);
        batched->OnInsertAt(misses[i], miss_positions[i]);
        resident.insert(misses[i]);
        while (resident.size() > kCapacity) {
          auto pinned = [&](const BlockKey& x) { return x == misses[i]; };
          const std::optional<BlockKey> a = one->SelectVictim(pinned);
          const std::optional<BlockKey> b = batched->SelectVictim(pinned);
          ASSERT_TRUE(a.has_value()) << name;
          ASSERT_EQ(a, b) << name << ", chain " << chain;
          resident.erase(*a);
        }
      }
      ASSERT_EQ(one->EvictionOrder(), batched->EvictionOrder()) << name << ", chain " << chain;
      ASSERT_EQ(one->DebugString(), batched->DebugString()) << name << ", chain " << chain;
    }
    // Enough uses to cross the adaptive policies' windows, and batches longer than the list
    // policies' lookahead (24 keys, src/key_list.h).
    EXPECT_GT(accessed, 8000u) << name;
    EXPECT_GT(longest, 24u) << name;
  }
}

TEST(EvictionPolicyFactoryTest, KnowsLruAndArcAndNamesThemOnError) {
  EXPECT_EQ(Make("lru", 1)->name(), "lru");
  EXPECT_EQ(Make("arc", 1)->name(), "arc");
  EXPECT_EQ(Make("chain-lru", 1)->name(), "chain-lru");
  Result<std::unique_ptr<EvictionPolicy>> bad = NewEvictionPolicy("lfu", 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"lfu\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo"),
            std::string::npos);
  EXPECT_FALSE(NewEvictionPolicy("lru", 0).ok());
}

// s3fifo's rings hold up to twice its live blocks in 2^31 positions, the others' indexes are
// 32-bit: a tier of more blocks threw from a store thread once full enough (the process ended).
// Every registered policy is refused past the bound, at the factory, naming it.
TEST(EvictionPolicyFactoryTest, ATierOfMoreBlocksThanAPolicyIndexesIsRefused) {
  for (const std::string& name : EvictionPolicyNames()) {
    Result<std::unique_ptr<EvictionPolicy>> p =
        NewEvictionPolicy(name, kMaxEvictionPolicyBlocks + 1);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(p.status().message().find(std::to_string(kMaxEvictionPolicyBlocks + 1) +
                                        " blocks is more than a policy indexes (" +
                                        std::to_string(kMaxEvictionPolicyBlocks) + ")"),
              std::string::npos)
        << p.status().ToString();
  }
}

// The plug point: a third policy registers itself from its own file.
std::unique_ptr<EvictionPolicy> NewFifoForTest(size_t capacity) {
  Result<std::unique_ptr<EvictionPolicy>> p = NewEvictionPolicy("lru", capacity);
  return std::move(p).value();
}

TEST(EvictionPolicyFactoryTest, RegistrationAddsANameOnce) {
  EXPECT_TRUE(RegisterEvictionPolicy("test-fifo", &NewFifoForTest));
  EXPECT_FALSE(RegisterEvictionPolicy("test-fifo", &NewFifoForTest)) << "names are unique";
  EXPECT_TRUE(NewEvictionPolicy("test-fifo", 2).ok());
}

}  // namespace
}  // namespace kvoffload
