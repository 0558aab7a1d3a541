// The C API through libkvoffload.so: create from options and from the environment, the
// store/lookup/load/poll/wait cycle, stats, the describe report and last-error messages.
#include "kvoffload/c.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

extern "C" int kvo_c_round_trip(size_t block_bytes);

namespace {

using kvoffload::testing::kBlock;
using kvoffload::testing::kSlot;
using kvoffload::testing::TempDir;

// Blocks with their pattern payloads, and the pointer array kvo_store and kvo_load take.
struct Blocks {
  std::vector<kvo_key> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<void*> ptrs;
};

Blocks MakeBlocks(std::vector<kvo_key> keys) {
  Blocks b{std::move(keys), {}, {}};
  for (const kvo_key& k : b.keys) {
    b.data.push_back(kvoffload::testing::Pattern(kvoffload::BlockKey{k.hi, k.lo}, kBlock));
  }
  for (auto& d : b.data) b.ptrs.push_back(d.data());
  return b;
}

// Keys {hi, 0} .. {hi, n-1}.
std::vector<kvo_key> KeyRun(uint64_t hi, uint64_t n) {
  std::vector<kvo_key> keys;
  for (uint64_t i = 0; i < n; ++i) keys.push_back(kvo_key{hi, i});
  return keys;
}

kvo_options Options(uint64_t cpu_blocks) {
  kvo_options o{};
  o.struct_size = sizeof(o);
  o.block_bytes = kBlock;
  o.model = "llama-3-8b";
  o.revision = "rev1";
  o.dtype = "bf16";
  o.layout = "nhd";
  o.cpu_bytes = cpu_blocks * kSlot;
  return o;
}

TEST(CApiTest, RoundTripFromC) { EXPECT_EQ(kvo_c_round_trip(kBlock), 0); }

TEST(CApiTest, StoreCascadeLookupLoadAndStats) {
  TempDir dir;
  const std::string tiers = R"([{"path":")" + dir.path() +
                            R"(","kind":"emptyDir","capacityBytes":)" +
                            std::to_string(4 * kSlot) + "}]";
  kvo_options o = Options(2);
  o.eviction_policy = "arc";
  o.tiers_json = tiers.c_str();
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();

  Blocks blocks = MakeBlocks(KeyRun(100, 5));
  std::vector<kvo_key>& keys = blocks.keys;
  std::vector<std::vector<std::byte>>& data = blocks.data;
  std::vector<void*>& ptrs = blocks.ptrs;
  uint64_t job = 0;
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), keys.size(), &job), KVO_OK);
  kvo_status polled = KVO_PENDING;
  while (polled == KVO_PENDING) polled = kvo_job_poll(e, job);
  ASSERT_EQ(polled, KVO_OK) << kvo_last_error();

  size_t prefix = 0;
  std::vector<int32_t> tiers_out(6, 99);
  std::vector<kvo_key> query = keys;
  query.push_back(kvo_key{7, 7});  // never stored
  ASSERT_EQ(kvo_lookup(e, query.data(), query.size(), &prefix, tiers_out.data()), KVO_OK);
  EXPECT_EQ(prefix, 5u);
  EXPECT_EQ(tiers_out, (std::vector<int32_t>{1, 1, 1, 0, 0, -1}));

  // kvo_where: each key on its own, past a missing one, and not counted as a lookup.
  kvo_stats before{};
  before.struct_size = sizeof(before);
  ASSERT_EQ(kvo_get_stats(e, &before), KVO_OK);
  std::vector<kvo_key> gapped = {kvo_key{7, 7}, keys[0], keys[4]};
  std::vector<int32_t> where(3, 99);
  ASSERT_EQ(kvo_where(e, gapped.data(), gapped.size(), where.data()), KVO_OK);
  EXPECT_EQ(where, (std::vector<int32_t>{-1, 1, 0}));
  kvo_stats after{};
  after.struct_size = sizeof(after);
  ASSERT_EQ(kvo_get_stats(e, &after), KVO_OK);
  for (uint32_t t = 0; t < after.num_tiers; ++t) {
    EXPECT_EQ(after.tiers[t].hits, before.tiers[t].hits) << "tier " << t;
    EXPECT_EQ(after.tiers[t].misses, before.tiers[t].misses) << "tier " << t;
  }

  std::vector<std::vector<std::byte>> back(5, std::vector<std::byte>(kBlock));
  std::vector<void*> back_ptrs;
  for (auto& b : back) back_ptrs.push_back(b.data());
  ASSERT_EQ(kvo_load(e, keys.data(), back_ptrs.data(), keys.size(), &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  EXPECT_EQ(back, data);

  kvo_stats s{};
  s.struct_size = sizeof(s);
  ASSERT_EQ(kvo_get_stats(e, &s), KVO_OK);
  EXPECT_EQ(s.num_tiers, 2u);
  EXPECT_EQ(s.stored_blocks, 5u);
  EXPECT_EQ(s.loaded_blocks, 5u);
  EXPECT_EQ(s.tiers[0].hits, 2u);
  EXPECT_EQ(s.tiers[1].hits, 3u);
  EXPECT_EQ(s.tiers[1].misses, 1u);
  EXPECT_GT(s.tiers[1].bytes_written, 0u);
  EXPECT_LE(s.tiers[1].used_bytes, s.tiers[1].capacity_bytes);

  // A caller compiled against a shorter kvo_stats gets its prefix and nothing past it.
  kvo_stats older;
  std::memset(&older, 0xAB, sizeof(older));
  older.struct_size = offsetof(kvo_stats, stored_blocks);
  ASSERT_EQ(kvo_get_stats(e, &older), KVO_OK);
  EXPECT_EQ(older.num_tiers, 2u);
  EXPECT_EQ(older.tiers[1].hits, 3u);
  EXPECT_EQ(older.stored_blocks, 0xABABABABABABABABULL) << "written past the caller's struct";

  char buf[16];
  const size_t need = kvo_describe(e, buf, sizeof(buf));
  EXPECT_GT(need, sizeof(buf));
  EXPECT_EQ(std::string(buf).size(), sizeof(buf) - 1) << "truncated and NUL-terminated";
  std::string full(need + 1, '\0');
  kvo_describe(e, full.data(), full.size());
  EXPECT_NE(full.find("policy arc"), std::string::npos) << full;
  kvo_engine_destroy(e);
}

// The Python settings take their list of policies from here: the agent's registry, joined by
// ',', with kvo_describe's buffer rules.
TEST(CApiTest, PolicyNamesAreTheRegisteredPolicies) {
  const std::string want = "arc,chain-lru,lirs,lru,lru-tinylfu,s3fifo";
  EXPECT_EQ(kvo_policy_names(nullptr, 0), want.size());
  std::string full(want.size() + 1, 'x');
  EXPECT_EQ(kvo_policy_names(full.data(), full.size()), want.size());
  EXPECT_STREQ(full.c_str(), want.c_str());
  char short_buf[5];
  EXPECT_EQ(kvo_policy_names(short_buf, sizeof(short_buf)), want.size());
  EXPECT_STREQ(short_buf, "arc,") << "truncated and NUL-terminated";
  // Each listed name creates an engine; a name not listed is refused with the list.
  for (const char* name : {"arc", "chain-lru", "lirs", "lru", "lru-tinylfu", "s3fifo"}) {
    kvo_options o = Options(4);
    o.eviction_policy = name;
    kvo_engine* e = nullptr;
    ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << name << ": " << kvo_last_error();
    kvo_engine_destroy(e);
  }
  kvo_options o = Options(4);
  o.eviction_policy = "fifo";
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvo_last_error())
                .find("use one of: arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo"),
            std::string::npos)
      << kvo_last_error();
}

// A block size whose file (block + trailer, rounded up to 4 KiB) overflowed size_t made the
// pinned slot 0 bytes, and sizing the pool divided by it: SIGFPE through the C API. A block
// is at most 1 GiB, refused naming the value.
TEST(CApiTest, AnImpossibleBlockSizeIsRefusedNotACrash) {
  for (uint64_t block : {uint64_t{SIZE_MAX} - 100, (uint64_t{1} << 30) + 4096}) {
    kvo_options o = Options(4);
    o.block_bytes = block;
    o.cpu_bytes = UINT64_MAX;
    kvo_engine* e = nullptr;
    ASSERT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT) << block;
    EXPECT_NE(std::string(kvo_last_error())
                  .find("block_bytes=" + std::to_string(block) + " is over 1073741824"),
              std::string::npos)
        << kvo_last_error();
  }
}

TEST(CApiTest, WriteBackCopiesPinnedOnlyBlocksToThePersistentTier) {
  TempDir dir;
  const std::string tiers = R"([{"path":")" + dir.path() +
                            R"(","kind":"pvcRef","capacityBytes":)" +
                            std::to_string(8 * kSlot) + "}]";
  kvo_options o = Options(4);
  o.tiers_json = tiers.c_str();
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  Blocks blocks = MakeBlocks(KeyRun(5, 2));
  std::vector<kvo_key>& keys = blocks.keys;
  std::vector<void*>& ptrs = blocks.ptrs;
  uint64_t job = 0;
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), keys.size(), &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  uint64_t written = 99, failed = 99, left = 99;
  // UINT64_MAX as "no limit": it overflowed the clock into a deadline already past, and
  // nothing was written.
  ASSERT_EQ(kvo_write_back(e, UINT64_MAX, &written, &failed, &left), KVO_OK) << kvo_last_error();
  EXPECT_EQ(written, 2u);
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(left, 0u);
  EXPECT_EQ(kvo_write_back(e, 10000, nullptr, nullptr, nullptr), KVO_OK);  // outputs optional
  kvo_engine_destroy(e);
  EXPECT_EQ(kvo_write_back(nullptr, 0, nullptr, nullptr, nullptr), KVO_INVALID_ARGUMENT);

  // The restarted engine finds both blocks on the persistent tier.
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  size_t prefix = 0;
  std::vector<int32_t> where(2, 99);
  ASSERT_EQ(kvo_lookup(e, keys.data(), keys.size(), &prefix, where.data()), KVO_OK);
  EXPECT_EQ(prefix, 2u);
  EXPECT_EQ(where, (std::vector<int32_t>{1, 1}));
  kvo_engine_destroy(e);
}

// A disk tier that can take nothing (its one block is held for a load): the pinned tier's victims
// are lost there, and kvo_stats says how many per tier (appended: a shorter struct gets 0s).
TEST(CApiTest, BlocksThatDidNotReachADiskTierAreCountedPerTier) {
  TempDir dir;
  const std::string tiers = R"([{"path":")" + dir.path() +
                            R"(","kind":"emptyDir","capacityBytes":)" + std::to_string(kSlot) +
                            "}]";
  kvo_options o = Options(1);
  o.tiers_json = tiers.c_str();
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  Blocks blocks = MakeBlocks(KeyRun(9, 6));
  std::vector<kvo_key>& keys = blocks.keys;
  std::vector<void*>& ptrs = blocks.ptrs;
  uint64_t job = 0;
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), 2, &job), KVO_OK);  // 0 on disk0, 1 pinned
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  size_t prefix = 0;
  ASSERT_EQ(kvo_hold(e, keys.data(), 1, &prefix, nullptr), KVO_OK);
  ASSERT_EQ(prefix, 1u);
  // Blocks 1 to 4 are demoted in turn, and disk0 cannot evict its held block for any of them.
  for (size_t i = 2; i < keys.size(); ++i) {
    ASSERT_EQ(kvo_store(e, &keys[i], &ptrs[i], 1, &job), KVO_OK);
    ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  }
  kvo_stats s{};
  s.struct_size = sizeof(s);
  ASSERT_EQ(kvo_get_stats(e, &s), KVO_OK);
  EXPECT_EQ(s.tier_lost[1], 4u);
  EXPECT_EQ(s.tier_refused[1], 4u);
  EXPECT_EQ(s.tier_lost[0], 0u);
  EXPECT_EQ(s.tiers[0].dropped, 4u);
  kvo_stats older;
  std::memset(&older, 0xAB, sizeof(older));
  older.struct_size = offsetof(kvo_stats, tier_lost);
  ASSERT_EQ(kvo_get_stats(e, &older), KVO_OK);
  EXPECT_EQ(older.tier_refused[1], 4u);
  EXPECT_EQ(older.tier_lost[1], 0xABABABABABABABABULL) << "written past the caller's struct";
  ASSERT_EQ(kvo_release(e, keys.data(), 1), KVO_OK);
  kvo_engine_destroy(e);
}

TEST(CApiTest, HoldReleaseAndEventFeed) {
  kvo_options o = Options(2);
  o.event_capacity = 16;
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  Blocks blocks = MakeBlocks({{5, 1}, {5, 2}, {5, 3}});
  std::vector<kvo_key>& keys = blocks.keys;
  std::vector<void*>& ptrs = blocks.ptrs;
  uint64_t job = 0;
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), 2, &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();

  size_t prefix = 9;
  std::vector<int32_t> tiers(3, 99);
  ASSERT_EQ(kvo_hold(e, keys.data(), keys.size(), &prefix, tiers.data()), KVO_OK);
  EXPECT_EQ(prefix, 2u);
  EXPECT_EQ(tiers, (std::vector<int32_t>{KVO_TIER_CPU, KVO_TIER_CPU, -1}));
  // Both slots held: the third block finds no slot, the two held ones stay.
  ASSERT_EQ(kvo_store(e, &keys[2], &ptrs[2], 1, &job), KVO_OK);
  EXPECT_EQ(kvo_job_wait(e, job), KVO_RESOURCE_EXHAUSTED);
  kvo_stats s{};
  s.struct_size = sizeof(s);
  ASSERT_EQ(kvo_get_stats(e, &s), KVO_OK);
  EXPECT_EQ(s.held_blocks, 2u);
  EXPECT_EQ(kvo_release(e, keys.data(), keys.size()), KVO_FAILED_PRECONDITION);
  EXPECT_NE(std::string(kvo_last_error()).find("not held"), std::string::npos);
  ASSERT_EQ(kvo_get_stats(e, &s), KVO_OK);
  EXPECT_EQ(s.held_blocks, 0u);

  std::vector<kvo_event> events(16);
  size_t n = 0;
  ASSERT_EQ(kvo_take_events(e, events.data(), events.size(), &n), KVO_OK);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(events[0].key.lo, 1u);
  EXPECT_EQ(events[0].tier, KVO_TIER_CPU);
  EXPECT_EQ(events[0].removed, 0);
  EXPECT_EQ(kvo_take_events(e, nullptr, 4, &n), KVO_INVALID_ARGUMENT);
  kvo_engine_destroy(e);

  // A caller compiled before event_capacity existed passes the shorter struct: no feed.
  o = Options(2);
  o.struct_size = offsetof(kvo_options, event_capacity);
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), 1, &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK);
  ASSERT_EQ(kvo_take_events(e, events.data(), events.size(), &n), KVO_OK);
  EXPECT_EQ(n, 0u);
  kvo_engine_destroy(e);

  // One compiled after event_capacity but before segments was refused (only the first and the
  // current sizes were known); it gets its feed.
  o = Options(2);
  o.struct_size = offsetof(kvo_options, segments);
  o.event_capacity = 4;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  ASSERT_EQ(kvo_store(e, keys.data(), ptrs.data(), 1, &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK);
  ASSERT_EQ(kvo_take_events(e, events.data(), events.size(), &n), KVO_OK);
  EXPECT_EQ(n, 1u) << "its feed is on";
  kvo_engine_destroy(e);
}

TEST(CApiTest, SegmentsGatherOneBlockFromSeveralPointers) {
  kvo_options o = Options(2);
  o.segments = 2;
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  const kvo_key key{9, 9};
  std::vector<std::byte> whole = kvoffload::testing::Pattern({9, 9}, kBlock);
  // The two halves of the block live in two unrelated buffers ("K" and "V" pages).
  std::vector<std::byte> k(whole.begin(), whole.begin() + kBlock / 2);
  std::vector<std::byte> v(whole.begin() + kBlock / 2, whole.end());
  void* in[] = {k.data(), v.data()};
  uint64_t job = 0;
  ASSERT_EQ(kvo_store(e, &key, in, 1, &job), KVO_OK) << kvo_last_error();
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  std::vector<std::byte> k2(kBlock / 2), v2(kBlock / 2);
  void* out[] = {k2.data(), v2.data()};
  ASSERT_EQ(kvo_load(e, &key, out, 1, &job), KVO_OK);
  ASSERT_EQ(kvo_job_wait(e, job), KVO_OK) << kvo_last_error();
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
  kvo_engine_destroy(e);
}

TEST(CApiTest, ErrorsCarryCodesAndMessages) {
  kvo_options o = Options(2);
  o.model = nullptr;
  kvo_engine* e = nullptr;
  EXPECT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT);
  EXPECT_EQ(e, nullptr);
  EXPECT_NE(std::string(kvo_last_error()).find("fingerprint.model"), std::string::npos)
      << kvo_last_error();

  o = Options(2);
  o.struct_size = sizeof(o) + 8;  // a caller built against a layout this library never had
  EXPECT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvo_last_error()).find("struct_size"), std::string::npos);

  o = Options(2);
  o.tiers_json = "[{";
  EXPECT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvo_last_error()).find("KVOFFLOAD_TIERS"), std::string::npos);

  o = Options(2);
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK);
  EXPECT_STREQ(kvo_last_error(), "");
  EXPECT_EQ(kvo_job_wait(e, 424242), KVO_NOT_FOUND);
  EXPECT_NE(std::string(kvo_last_error()).find("424242"), std::string::npos);
  kvo_key k{1, 1};
  void* null_ptr = nullptr;
  uint64_t job = 0;
  EXPECT_EQ(kvo_store(e, &k, &null_ptr, 1, &job), KVO_INVALID_ARGUMENT);
  EXPECT_EQ(kvo_store(nullptr, &k, &null_ptr, 1, &job), KVO_INVALID_ARGUMENT);
  kvo_engine_destroy(e);
  kvo_engine_destroy(nullptr);
}

TEST(CApiTest, CreatesFromTheWebhookEnvironment) {
  TempDir dir;
  const std::string tiers = R"([{"path":")" + dir.path() +
                            R"(","kind":"pvcRef","capacityBytes":40960,"persistent":true,"shared":true}])";
  ASSERT_EQ(::setenv("KVOFFLOAD_CPU_BYTES", "8192", 1), 0);
  ASSERT_EQ(::setenv("KVOFFLOAD_EVICTION_POLICY", "arc", 1), 0);
  ASSERT_EQ(::setenv("KVOFFLOAD_TIERS", tiers.c_str(), 1), 0);
  kvo_options o = Options(0);
  o.from_env = 1;
  kvo_engine* e = nullptr;
  ASSERT_EQ(kvo_engine_create(&o, &e), KVO_OK) << kvo_last_error();
  std::string d(1024, '\0');
  kvo_describe(e, d.data(), d.size());
  EXPECT_NE(d.find("2 slots"), std::string::npos) << d;
  EXPECT_NE(d.find("shared"), std::string::npos) << d;
  kvo_engine_destroy(e);

  ASSERT_EQ(::setenv("KVOFFLOAD_CPU_BYTES", "10Gi", 1), 0);
  EXPECT_EQ(kvo_engine_create(&o, &e), KVO_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvo_last_error()).find("KVOFFLOAD_CPU_BYTES=\"10Gi\""),
            std::string::npos)
      << kvo_last_error();
  ::unsetenv("KVOFFLOAD_CPU_BYTES");
  ::unsetenv("KVOFFLOAD_EVICTION_POLICY");
  ::unsetenv("KVOFFLOAD_TIERS");
}

}  // namespace
