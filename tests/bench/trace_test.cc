// The trace generator is deterministic and shaped as documented; OPT and the policy replay
// count hits as computed by hand on textbook reference strings.
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "replay.h"
#include "trace.h"

namespace kvoffload::bench {
namespace {

std::vector<BlockKey> Keys(std::initializer_list<uint64_t> ids) {
  std::vector<BlockKey> out;
  for (uint64_t id : ids) out.push_back(BlockKey{0, id});
  return out;
}

// Silberschatz's reference string: with 3 frames OPT has 9 faults and LRU 12 (of 20).
const std::vector<BlockKey> kTextbook =
    Keys({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});

TEST(ReplayOptTest, TextbookStringHasNineFaults) {
  ReplayResult r = ReplayOpt(3, kTextbook);
  EXPECT_EQ(r.accesses, 20u);
  EXPECT_EQ(r.hits, 11u);
}

TEST(ReplayPolicyTest, LruOnTextbookStringHasTwelveFaults) {
  Result<ReplayResult> r = ReplayPolicy("lru", 3, kTextbook);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hits, 8u);
}

// A loop one block larger than the cache: LRU always evicts the block needed next. OPT, by
// hand (cache 2, new block always enters): hits at positions 3, 5 and 7 (0-based).
TEST(ReplayOptTest, CyclicLoopBeatsLru) {
  const std::vector<BlockKey> loop = Keys({1, 2, 3, 1, 2, 3, 1, 2, 3});
  EXPECT_EQ(ReplayOpt(2, loop).hits, 3u);
  Result<ReplayResult> lru = ReplayPolicy("lru", 2, loop);
  ASSERT_TRUE(lru.ok());
  EXPECT_EQ(lru->hits, 0u);
}

TEST(ReplayOptTest, ZeroCapacityNeverHits) {
  EXPECT_EQ(ReplayOpt(0, kTextbook).hits, 0u);
}

TEST(ReplayPolicyTest, UnknownPolicyIsAnError) {
  EXPECT_FALSE(ReplayPolicy("fifo-nope", 3, kTextbook).ok());
}

TraceOptions Small(uint64_t seed) {
  TraceOptions o;
  o.seed = seed;
  o.requests = 500;
  o.documents = 200;
  o.conversations = 20;
  o.scan_every = 100;
  o.scan_blocks = 50;
  return o;
}

TEST(GenerateTraceTest, SameSeedSameTraceOtherSeedOther) {
  EXPECT_EQ(GenerateTrace(Small(7)), GenerateTrace(Small(7)));
  EXPECT_NE(GenerateTrace(Small(7)), GenerateTrace(Small(8)));
}

TEST(GenerateTraceTest, ScansAreOneTimeAndPromptsAreShared) {
  const TraceOptions o = Small(3);
  const std::vector<BlockKey> trace = GenerateTrace(o);
  std::unordered_map<BlockKey, size_t, BlockKeyHash> count;
  for (const BlockKey& k : trace) ++count[k];
  size_t scan_blocks = 0;
  for (const auto& [key, n] : count) {
    const uint64_t kind = key.hi >> 56;
    if (kind == 4) {  // scan
      ++scan_blocks;
      EXPECT_EQ(n, 1u);
    }
  }
  EXPECT_EQ(scan_blocks, o.requests / o.scan_every * o.scan_blocks);
  // System prompt block 0 of some prompt is read by many requests.
  size_t most_read_prompt = 0;
  for (uint64_t p = 0; p < o.system_prompts; ++p) {
    most_read_prompt = std::max(most_read_prompt, count[BlockKey{(1ULL << 56) | p, 0}]);
  }
  EXPECT_GT(most_read_prompt, o.requests / o.system_prompts / 2);
}

// No online policy beats the offline optimum, on any cache size.
TEST(ReplayOptTest, BoundsLruAndArcOnGeneratedTrace) {
  const std::vector<BlockKey> trace = GenerateTrace(Small(11));
  for (size_t cache : {size_t{50}, size_t{300}, size_t{2000}}) {
    const uint64_t opt = ReplayOpt(cache, trace).hits;
    for (const char* policy : {"lru", "arc"}) {
      Result<ReplayResult> r = ReplayPolicy(policy, cache, trace);
      ASSERT_TRUE(r.ok());
      EXPECT_LE(r->hits, opt) << policy << " at " << cache;
      EXPECT_GT(r->hits, 0u) << policy << " at " << cache;
    }
  }
}

}  // namespace
}  // namespace kvoffload::bench
