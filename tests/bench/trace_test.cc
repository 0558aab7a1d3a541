// The trace generators are deterministic and shaped as documented; the JSONL reader takes the
// Mooncake trace format and names the line, field and value of what it refuses; OPT and the
// policy replay count per-block and prefix-usable hits as computed by hand.
#include "trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvoffload/eviction_policy.h"
#include "replay.h"
#include "trace_file.h"

namespace kvoffload::bench {
namespace {

// One request per id: per-block and prefix-usable hits are then the same, the textbook case.
Trace Singles(std::initializer_list<uint64_t> ids) {
  Trace out;
  for (uint64_t id : ids) out.push_back(TraceRequest{0, {BlockKey{0, id}}});
  return out;
}

TraceRequest Request(std::initializer_list<uint64_t> ids) {
  TraceRequest r;
  for (uint64_t id : ids) r.blocks.push_back(BlockKey{0, id});
  return r;
}

// Silberschatz's reference string: with 3 frames OPT has 9 faults and LRU 12 (of 20).
const Trace kTextbook = Singles({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});

TEST(ReplayOptTest, TextbookStringHasNineFaults) {
  ReplayResult r = ReplayOpt(3, kTextbook);
  EXPECT_EQ(r.accesses, 20u);
  EXPECT_EQ(r.hits, 11u);
  EXPECT_EQ(r.prefix_hits, 11u);
}

TEST(ReplayPolicyTest, LruOnTextbookStringHasTwelveFaults) {
  Result<ReplayResult> r = ReplayPolicy("lru", 3, kTextbook);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hits, 8u);
}

// A loop one block larger than the cache: LRU always evicts the block needed next. OPT, by
// hand (cache 2, new block always enters): hits at positions 3, 5 and 7 (0-based).
TEST(ReplayOptTest, CyclicLoopBeatsLru) {
  const Trace loop = Singles({1, 2, 3, 1, 2, 3, 1, 2, 3});
  EXPECT_EQ(ReplayOpt(2, loop).hits, 3u);
  Result<ReplayResult> lru = ReplayPolicy("lru", 2, loop);
  ASSERT_TRUE(lru.ok());
  EXPECT_EQ(lru->hits, 0u);
}

// LRU told which blocks are never read again, by hand (cache 2): 7 and 1 fill it, 1 is read
// for the last time; 2 (also its last read) evicts 1 instead of LRU's 7, so 7 hits. Plain LRU
// evicts 7 and has no hit. Blocks 1 and 2 die; 7 does not.
TEST(ReplayPolicyTest, KnowingWhichBlocksDieEvictsThemFirst) {
  const Trace t = Singles({7, 1, 2, 7});
  const std::vector<bool> last = LastUses(t);
  EXPECT_EQ(last, (std::vector<bool>{false, true, true, true}));
  Result<ReplayResult> lru = ReplayPolicy("lru", 2, t);
  Result<ReplayResult> told = ReplayPolicy("lru", 2, t, &last);
  ASSERT_TRUE(lru.ok() && told.ok());
  EXPECT_EQ(lru->hits, 0u);
  EXPECT_EQ(told->hits, 1u);
  // On the textbook string it is bounded by OPT and beats LRU (11 and 8 hits).
  const std::vector<bool> textbook_last = LastUses(kTextbook);
  Result<ReplayResult> textbook = ReplayPolicy("lru", 3, kTextbook, &textbook_last);
  ASSERT_TRUE(textbook.ok());
  EXPECT_GT(textbook->hits, 8u);
  EXPECT_LE(textbook->hits, 11u);
}

TEST(ReplayOptTest, ZeroCapacityNeverHits) { EXPECT_EQ(ReplayOpt(0, kTextbook).hits, 0u); }

TEST(ReplayPolicyTest, UnknownPolicyIsAnError) {
  EXPECT_FALSE(ReplayPolicy("fifo-nope", 3, kTextbook).ok());
}

// Cache of 3, by hand: [1 2 3] fills it; [9] evicts 1 (least recent); [1 2 3] then misses 1,
// which evicts 2, whose miss evicts 3: LRU eats its own chain, 0 hits. Per block the replay
// still counts what was resident when read; prefix-usable counts only the leading run.
TEST(ReplayPolicyTest, PrefixUsableCountsOnlyTheLeadingRun) {
  const Trace t = {Request({1, 2, 3}), Request({9}), Request({1, 2, 3}), Request({1, 2, 3})};
  Result<ReplayResult> lru = ReplayPolicy("lru", 3, t);
  ASSERT_TRUE(lru.ok());
  EXPECT_EQ(lru->accesses, 10u);
  // Request 3: 1 misses (evicts 2), 2 misses (evicts 3), 3 misses (evicts 9). Request 4: all hit.
  EXPECT_EQ(lru->hits, 3u);
  EXPECT_EQ(lru->prefix_hits, 3u);

  // A head evicted while its tail stays: cache 2, [1 2] then [3] evicts 1, [2] makes 3 the
  // least recent, and the last [1 2] misses 1 (evicting 3) and reads 2 as resident after that
  // miss: a per-block hit, not a usable one.
  const Trace head_lost = {Request({1, 2}), Request({3}), Request({2}), Request({1, 2})};
  Result<ReplayResult> r = ReplayPolicy("lru", 2, head_lost);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hits, 2u);
  EXPECT_EQ(r->prefix_hits, 1u);
  // OPT, by hand: [3] evicts 1 (read later than 2), [2] hits, [1 2] evicts 3 (never read
  // again) and reads 2 behind the miss on 1.
  ReplayResult opt = ReplayOpt(2, head_lost);
  EXPECT_EQ(opt.hits, 2u);
  EXPECT_EQ(opt.prefix_hits, 1u);
}

// The same trace on chain-lru, which the replay tells each block's position: [9] evicts the
// deepest block of the older request (3), so the last [1 2 3] loads 1 and 2 and stores only 3,
// which evicts 9. By hand: hits 1 and 2 in request 3, all of request 4.
TEST(ReplayPolicyTest, ChainLruKeepsTheHeadThatLruLoses) {
  const Trace t = {Request({1, 2, 3}), Request({9}), Request({1, 2, 3}), Request({1, 2, 3})};
  Result<ReplayResult> chain = ReplayPolicy("chain-lru", 3, t);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->hits, 5u);
  EXPECT_EQ(chain->prefix_hits, 5u);
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
  const Trace trace = GenerateTrace(o);
  std::unordered_map<BlockKey, size_t, BlockKeyHash> count;
  for (const TraceRequest& r : trace) {
    for (const BlockKey& k : r.blocks) ++count[k];
  }
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

// No online policy beats the offline optimum per block, on any cache size.
TEST(ReplayOptTest, BoundsEveryPolicyOnGeneratedTraces) {
  ShapeOptions s;
  s.requests = 300;
  for (const char* shape : {"mixed", "chat", "agent", "rag"}) {
    Result<Trace> trace = GenerateShape(shape, s, Small(11));
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    const size_t distinct = TraceDistinctBlocks(*trace);
    const std::vector<bool> last = LastUses(*trace);
    for (size_t cache : {distinct / 10, distinct / 4, distinct / 2}) {
      const uint64_t opt = ReplayOpt(cache, *trace).hits;
      // Nor does LRU told which blocks die: it is still an online order for the live ones.
      Result<ReplayResult> told = ReplayPolicy("lru", cache, *trace, &last);
      ASSERT_TRUE(told.ok());
      EXPECT_LE(told->hits, opt) << "lru+death on " << shape << " at " << cache;
      for (const std::string& policy : EvictionPolicyNames()) {
        Result<ReplayResult> r = ReplayPolicy(policy, cache, *trace);
        ASSERT_TRUE(r.ok());
        EXPECT_LE(r->hits, opt) << policy << " on " << shape << " at " << cache;
        EXPECT_GT(r->hits, 0u) << policy << " on " << shape << " at " << cache;
        EXPECT_LE(r->prefix_hits, r->hits);
      }
    }
  }
}

// Renaming the keys keeps the requests: the same shape over other keys, and the policies that
// never look at key bits (all but the two that sample keys by hash) hit exactly as before.
TEST(RelabelTest, SameRequestsOtherKeysSameHitsForPoliciesBlindToKeyBits) {
  ShapeOptions s;
  s.requests = 300;
  Result<Trace> trace = GenerateShape("chat", s, Small(5));
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(Relabel(*trace, 0), *trace);
  const size_t distinct = TraceDistinctBlocks(*trace);
  const size_t cache = distinct / 10;
  std::unordered_set<BlockKey, BlockKeyHash> original;
  for (const TraceRequest& r : *trace) original.insert(r.blocks.begin(), r.blocks.end());
  const Trace one = Relabel(*trace, 1);
  const Trace two = Relabel(*trace, 2);
  for (const Trace* renamed : {&one, &two}) {
    ASSERT_EQ(renamed->size(), trace->size());
    EXPECT_EQ(TraceDistinctBlocks(*renamed), distinct);  // no two keys merged
    for (size_t i = 0; i < trace->size(); ++i) {
      ASSERT_EQ((*renamed)[i].blocks.size(), (*trace)[i].blocks.size());
      EXPECT_EQ((*renamed)[i].timestamp_ms, (*trace)[i].timestamp_ms);
      for (const BlockKey& k : (*renamed)[i].blocks) EXPECT_FALSE(original.contains(k));
    }
    EXPECT_EQ(ReplayOpt(cache, *renamed).prefix_hits, ReplayOpt(cache, *trace).prefix_hits);
    for (const char* policy : {"lru", "arc", "chain-lru", "s3fifo"}) {
      Result<ReplayResult> before = ReplayPolicy(policy, cache, *trace);
      Result<ReplayResult> after = ReplayPolicy(policy, cache, *renamed);
      ASSERT_TRUE(before.ok() && after.ok());
      EXPECT_EQ(after->hits, before->hits) << policy;
      EXPECT_EQ(after->prefix_hits, before->prefix_hits) << policy;
    }
  }
  EXPECT_NE(one, two);
}

Trace Shape(const std::string& shape, uint64_t seed, size_t requests) {
  ShapeOptions s;
  s.seed = seed;
  s.requests = requests;
  Result<Trace> t = GenerateShape(shape, s, TraceOptions{});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : Trace{};
}

TEST(TraceShapesTest, DeterministicPerSeedAndSortedByTime) {
  for (const char* shape : {"chat", "agent", "rag"}) {
    const Trace a = Shape(shape, 5, 400);
    EXPECT_EQ(a.size(), 400u) << shape;
    EXPECT_EQ(a, Shape(shape, 5, 400)) << shape;
    EXPECT_NE(a, Shape(shape, 6, 400)) << shape;
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end(),
                               [](const TraceRequest& x, const TraceRequest& y) {
                                 return x.timestamp_ms < y.timestamp_ms;
                               }))
        << shape;
  }
}

TEST(TraceShapesTest, UnknownShapeNamesTheKnownOnes) {
  Result<Trace> t = GenerateShape("chats", ShapeOptions{}, TraceOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("\"chats\""), std::string::npos);
  EXPECT_NE(t.status().message().find("mixed, chat, agent, rag"), std::string::npos);
}

// The fraction of a trace's requests whose first `prefix` blocks equal an earlier request's.
size_t RequestsSharingFirstBlocks(const Trace& t, size_t prefix) {
  std::unordered_set<BlockKey, BlockKeyHash> seen;
  size_t sharing = 0;
  for (const TraceRequest& r : t) {
    if (r.blocks.size() < prefix) continue;
    if (seen.contains(r.blocks[prefix - 1])) ++sharing;
    seen.insert(r.blocks[prefix - 1]);
  }
  return sharing;
}

// Chat: a session's next turn re-reads the previous turn's whole prompt, then more; agents
// share a long tool prefix; RAG's questions are never reused.
TEST(TraceShapesTest, ShapesHaveTheirDocumentedReuse) {
  const Trace chat = Shape("chat", 1, 2000);
  std::unordered_set<BlockKey, BlockKeyHash> last_blocks;
  size_t extends_earlier = 0;
  for (const TraceRequest& r : chat) {
    for (size_t i = 0; i < r.blocks.size(); ++i) {
      if (last_blocks.contains(r.blocks[i]) && i + 1 < r.blocks.size()) {
        ++extends_earlier;  // an earlier prompt ends here and this one goes on
        break;
      }
    }
    last_blocks.insert(r.blocks.back());
  }
  EXPECT_GT(extends_earlier, chat.size() / 2) << "most chat requests are later turns";

  const Trace agent = Shape("agent", 1, 2000);
  EXPECT_GT(RequestsSharingFirstBlocks(agent, 32), agent.size() * 9 / 10)
      << "agents re-read a tool prefix of at least 32 blocks";
  size_t longest = 0;
  for (const TraceRequest& r : agent) longest = std::max(longest, r.blocks.size());
  EXPECT_GT(longest, 150u) << "tool loops grow their context";

  const Trace rag = Shape("rag", 1, 2000);
  std::unordered_set<BlockKey, BlockKeyHash> questions;
  for (const TraceRequest& r : rag) {
    EXPECT_TRUE(questions.insert(r.blocks.back()).second) << "a question block came back";
  }
  EXPECT_GT(RequestsSharingFirstBlocks(rag, 12), rag.size() / 5) << "popular leading documents";
}

TEST(TraceFileTest, ReadsMooncakeShapedLines) {
  Result<Trace> t = ReadTraceFile(KVOFFLOAD_BENCH_TESTDATA "/mooncake_shape.jsonl");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 6u) << "the blank line is skipped";
  EXPECT_EQ((*t)[2].timestamp_ms, 1503);
  EXPECT_EQ((*t)[2].blocks.size(), 5u) << "2560 tokens: five full blocks";
  EXPECT_EQ((*t)[2].blocks[4], (BlockKey{kTraceFileKeyTag, 5}));
  EXPECT_EQ((*t)[1].blocks.size(), 2u) << "1200 tokens: the third block is partial, not cached";
  EXPECT_EQ((*t)[3].blocks.size(), 1u) << "700 tokens: one full block";
  EXPECT_EQ((*t)[4].blocks.size(), 4u) << "no input_length: every id is a block";
  EXPECT_EQ((*t)[5].timestamp_ms, 0) << "no timestamp";
  EXPECT_EQ(TraceAccesses(*t), 18u);
  EXPECT_EQ(TraceDistinctBlocks(*t), 9u);
  Result<ReplayResult> lru = ReplayPolicy("lru", 100, *t);
  ASSERT_TRUE(lru.ok());
  // Unbounded cache: every block read before is a hit: 2 + 4 + 0 + 2 + 1 = 9 (ids 4 and 7 were
  // partial blocks when first read, so never stored).
  EXPECT_EQ(lru->hits, 9u);
  EXPECT_EQ(lru->prefix_hits, 9u);
  EXPECT_EQ(ReplayOpt(100, *t).hits, 9u);
  // At 1024 tokens a block the same lines disagree with their input_length.
  EXPECT_FALSE(ReadTraceFile(KVOFFLOAD_BENCH_TESTDATA "/mooncake_shape.jsonl", 1024).ok());
}

Result<Trace> Parse(const std::string& text) {
  std::istringstream in(text);
  return ReadTrace(in, "t.jsonl");
}

void ExpectError(const std::string& text, const std::string& part) {
  Result<Trace> t = Parse(text);
  ASSERT_FALSE(t.ok()) << text;
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << text;
  EXPECT_NE(t.status().message().find(part), std::string::npos) << t.status().message();
}

TEST(TraceFileTest, BadLinesNameTheLineFieldAndValue) {
  ExpectError("{\"hash_ids\": [1]}\n[1, 2]\n", "t.jsonl:2: not a JSON object");
  ExpectError("{\"hash_ids\": [1]}\n{\"hashids\": [1]}\n", "t.jsonl:2: hash_ids is missing");
  ExpectError("{\"hash_ids\": \"1 2\"}\n", "t.jsonl:1: hash_ids: \"1 2\" is not a list");
  ExpectError("{\"hash_ids\": [1, -2]}\n",
              "t.jsonl:1: hash_ids[1]: -2 is not a non-negative integer");
  ExpectError("{\"hash_ids\": [1, 2.5]}\n", "hash_ids[1]: 2.5");
  // A block's hash covers its whole prefix: one request cannot hold it twice, and a replay
  // counted the second as a hit on the request's own block.
  ExpectError("{\"hash_ids\": [7, 8, 7]}\n", "t.jsonl:1: hash_ids[2]: 7 is hash_ids[0] again");
  ExpectError("{\"timestamp\": \"now\", \"hash_ids\": [1]}\n",
              "timestamp: \"now\" is not a number");
  ExpectError("{\"input_length\": -4, \"hash_ids\": [1]}\n", "input_length: -4");
  ExpectError("{\"input_length\": 1500, \"hash_ids\": [1, 2]}\n",
              "t.jsonl:1: hash_ids has 2 ids but input_length 1500 is 3 blocks of 512 tokens; "
              "give --block-tokens the trace's block size");
  ExpectError("{\"input_length\": 100, \"hash_ids\": [1, 2]}\n", "is 1 block of 512");
  ExpectError("\n\n", "no requests");
  Result<Trace> backwards = ReadTraceFile(KVOFFLOAD_BENCH_TESTDATA "/backwards_timestamp.jsonl");
  ASSERT_FALSE(backwards.ok());
  EXPECT_NE(backwards.status().message().find("backwards_timestamp.jsonl:2: timestamp: 3 is before "
                                              "the previous request's 5.0; sort the file"),
            std::string::npos)
      << backwards.status().message();
  EXPECT_EQ(ReadTraceFile("/nonexistent/trace.jsonl").status().code(), StatusCode::kNotFound);
}

// Writing renumbers ids from 0 in order of first use; reading it back replays identically.
TEST(TraceFileTest, WrittenTraceReadsBackWithTheSameHits) {
  const Trace chat = Shape("chat", 2, 300);
  std::stringstream buf;
  ASSERT_TRUE(WriteTrace(chat, 512, buf).ok());
  const std::string text = buf.str();
  EXPECT_EQ(text.rfind("{\"hash_ids\":[0,1,2,", 0), 0u) << text.substr(0, 80);
  Result<Trace> back = ReadTrace(buf, "written");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), chat.size());
  EXPECT_EQ(TraceDistinctBlocks(*back), TraceDistinctBlocks(chat));
  const size_t cache = TraceDistinctBlocks(chat) / 20;
  const ReplayResult a = ReplayOpt(cache, chat), b = ReplayOpt(cache, *back);
  EXPECT_EQ(a.hits, b.hits);
  EXPECT_EQ(a.prefix_hits, b.prefix_hits);
  Result<ReplayResult> la = ReplayPolicy("lru", cache, chat),
                       lb = ReplayPolicy("lru", cache, *back);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(la->prefix_hits, lb->prefix_hits);
}

}  // namespace
}  // namespace kvoffload::bench
