// The C API: a thin shell over kvoffload::Engine that turns Status into codes plus a
// thread-local message, and never lets an exception cross into C.
#include "kvoffload/c.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kvoffload/engine.h"
#include "kvoffload/eviction_policy.h"

struct kvo_engine {
  std::unique_ptr<kvoffload::Engine> engine;
  size_t segments;        // device pointers per block
  uint64_t event_capacity;  // the most events its feed holds
};

namespace {

using kvoffload::Status;

thread_local std::string last_error;

kvo_status Report(const Status& s) {
  last_error = s.ok() ? std::string() : s.ToString();
  return static_cast<kvo_status>(s.code());
}

// Runs fn, turning a stray exception (std::bad_alloc) into KVO_INTERNAL.
template <typename Fn>
kvo_status Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Report(Status::Internal(std::string("unexpected exception: ") + e.what()));
  }
}

const char* Or(const char* v, const char* fallback) { return v != nullptr ? v : fallback; }

std::vector<kvoffload::BlockKey> Keys(const kvo_key* keys, size_t n) {
  std::vector<kvoffload::BlockKey> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kvoffload::BlockKey{keys[i].hi, keys[i].lo};
  return out;
}

// Writes text into buf as kvo_describe documents it: NUL-terminated, truncated to len; returns
// the full length.
size_t CopyOut(const std::string& text, char* buf, size_t len) {
  if (buf != nullptr && len > 0) {
    size_t n = std::min(text.size(), len - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

kvo_status CheckEngine(kvo_engine* engine) {
  if (engine == nullptr) return Report(Status::InvalidArgument("engine is NULL"));
  return KVO_OK;
}

// Store and Load take the same arguments and hand back a job id; `start` picks which one.
template <typename Start>
kvo_status StartJob(kvo_engine* engine, const kvo_key* keys, void* const* device_ptrs, size_t n,
                    uint64_t* job, Start start) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if ((n > 0 && (keys == nullptr || device_ptrs == nullptr)) || job == nullptr) {
      return Report(Status::InvalidArgument("keys, device_ptrs and job must not be NULL"));
    }
    std::vector<kvoffload::BlockKey> k = Keys(keys, n);
    auto id = start(*engine->engine, k, std::span<void* const>(device_ptrs, n * engine->segments));
    if (!id.ok()) return Report(id.status());
    *job = *id;
    return Report(Status::Ok());
  });
}

// Lookup and Hold take the same arguments and fill the same prefix; `find` picks which one.
template <typename Find>
kvo_status FindPrefix(kvo_engine* engine, const kvo_key* keys, size_t n, size_t* prefix,
                      int32_t* tiers, Find find) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if ((n > 0 && keys == nullptr) || prefix == nullptr) {
      return Report(Status::InvalidArgument("keys and prefix must not be NULL"));
    }
    kvoffload::LookupResult r = find(*engine->engine, Keys(keys, n));
    *prefix = r.prefix;
    if (tiers != nullptr) {
      for (size_t i = 0; i < n; ++i) tiers[i] = i < r.prefix ? r.tiers[i] : kvoffload::kTierMiss;
    }
    return Report(Status::Ok());
  });
}

}  // namespace

extern "C" {

const char* kvo_last_error(void) { return last_error.c_str(); }

kvo_status kvo_engine_create(const kvo_options* options, kvo_engine** out) {
  return Guard([&] {
    if (options == nullptr || out == nullptr) {
      return Report(Status::InvalidArgument("options and out must not be NULL"));
    }
    *out = nullptr;
    // Fields are appended: a struct from an older caller ends before the newer ones, which
    // then keep their zero defaults. Every size the struct has had is one a caller may pass
    // (only the first and the current were, and a caller built between them was refused).
    static constexpr std::array<size_t, 3> kSizes = {offsetof(kvo_options, event_capacity),
                                                     offsetof(kvo_options, segments),
                                                     sizeof(kvo_options)};
    if (std::find(kSizes.begin(), kSizes.end(), options->struct_size) == kSizes.end()) {
      std::string known;
      for (size_t size : kSizes) known += (known.empty() ? "" : ", ") + std::to_string(size);
      return Report(Status::InvalidArgument(
          "kvo_options.struct_size=" + std::to_string(options->struct_size) + " but this " +
          "libkvoffload knows " + known + "; set it to sizeof(kvo_options)"));
    }
    kvo_options full;
    std::memset(&full, 0, sizeof(full));
    std::memcpy(&full, options, options->struct_size);
    options = &full;
    kvoffload::EngineConfig config;
    config.block_bytes = options->block_bytes;
    config.fingerprint = {Or(options->model, ""), Or(options->revision, ""),
                          Or(options->dtype, ""), Or(options->layout, ""), options->rank};
    config.device = Or(options->device, "host");
    config.disk_io = Or(options->disk_io, "auto");
    config.event_capacity = options->event_capacity;
    config.segments = options->segments == 0 ? 1 : options->segments;
    if (options->from_env != 0) {
      if (kvoffload::Status s = kvoffload::RefuseMisspeltVariables(environ); !s.ok()) {
        return Report(s);
      }
      kvoffload::Result<kvoffload::EngineConfig> env =
          kvoffload::ConfigFromEnv(config, kvoffload::ProcessEnv);
      if (!env.ok()) return Report(env.status());
      config = std::move(env).value();
    } else {
      config.cpu_bytes = options->cpu_bytes;
      config.eviction_policy = Or(options->eviction_policy, "lru");
      if (options->tiers_json != nullptr) {
        auto tiers = kvoffload::ParseTiersJson(options->tiers_json);
        if (!tiers.ok()) return Report(tiers.status());
        config.tiers = std::move(tiers).value();
      }
    }
    kvoffload::Result<std::unique_ptr<kvoffload::Engine>> engine =
        kvoffload::Engine::Open(config);
    if (!engine.ok()) return Report(engine.status());
    *out = new kvo_engine{std::move(engine).value(), config.segments, config.event_capacity};
    return Report(Status::Ok());
  });
}

void kvo_engine_destroy(kvo_engine* engine) { delete engine; }

kvo_status kvo_store(kvo_engine* engine, const kvo_key* keys, void* const* device_ptrs, size_t n,
                     uint64_t* job) {
  return StartJob(engine, keys, device_ptrs, n, job, [](auto& e, const auto& k, auto ptrs) {
    return e.Store(k, ptrs);
  });
}

kvo_status kvo_load(kvo_engine* engine, const kvo_key* keys, void* const* device_ptrs, size_t n,
                    uint64_t* job) {
  return StartJob(engine, keys, device_ptrs, n, job, [](auto& e, const auto& k, auto ptrs) {
    return e.Load(k, ptrs);
  });
}

kvo_status kvo_lookup(kvo_engine* engine, const kvo_key* keys, size_t n, size_t* prefix,
                      int32_t* tiers) {
  return FindPrefix(engine, keys, n, prefix, tiers,
                    [](auto& e, const auto& k) { return e.Lookup(k); });
}

kvo_status kvo_where(kvo_engine* engine, const kvo_key* keys, size_t n, int32_t* tiers) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if (n > 0 && (keys == nullptr || tiers == nullptr)) {
      return Report(Status::InvalidArgument("keys and tiers must not be NULL"));
    }
    const std::vector<int> where = engine->engine->Where(Keys(keys, n));
    for (size_t i = 0; i < n; ++i) tiers[i] = where[i];
    return Report(Status::Ok());
  });
}

kvo_status kvo_hold(kvo_engine* engine, const kvo_key* keys, size_t n, size_t* prefix,
                    int32_t* tiers) {
  return FindPrefix(engine, keys, n, prefix, tiers,
                    [](auto& e, const auto& k) { return e.Hold(k); });
}

kvo_status kvo_release(kvo_engine* engine, const kvo_key* keys, size_t n) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if (n > 0 && keys == nullptr) return Report(Status::InvalidArgument("keys must not be NULL"));
    return Report(engine->engine->Release(Keys(keys, n)));
  });
}

kvo_status kvo_take_events(kvo_engine* engine, kvo_event* out, size_t cap, size_t* n) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if ((cap > 0 && out == nullptr) || n == nullptr) {
      return Report(Status::InvalidArgument("out and n must not be NULL"));
    }
    // At most what the feed can hold: a caller's large buffer is no reason to allocate as
    // much again here.
    std::vector<kvoffload::TierEvent> events(std::min<uint64_t>(cap, engine->event_capacity));
    *n = engine->engine->TakeEvents(events);
    for (size_t i = 0; i < *n; ++i) {
      out[i] = kvo_event{kvo_key{events[i].key.hi, events[i].key.lo}, events[i].tier,
                         events[i].removed ? 1 : 0};
    }
    return Report(Status::Ok());
  });
}

kvo_status kvo_job_poll(kvo_engine* engine, uint64_t job) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    kvoffload::Result<bool> done = engine->engine->Poll(job);
    if (!done.ok()) return Report(done.status());
    if (!*done) {
      last_error.clear();
      return KVO_PENDING;
    }
    return Report(Status::Ok());
  });
}

kvo_status kvo_job_wait(kvo_engine* engine, uint64_t job) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    return Report(engine->engine->Wait(job));
  });
}

kvo_status kvo_get_stats(kvo_engine* engine, kvo_stats* out) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    if (out == nullptr) return Report(Status::InvalidArgument("out must not be NULL"));
    const size_t caller_size = out->struct_size;
    if (caller_size < offsetof(kvo_stats, tiers)) {
      return Report(Status::InvalidArgument("kvo_stats.struct_size=" +
                                            std::to_string(caller_size) + " is too small"));
    }
    const kvoffload::EngineStats s = engine->engine->Stats();
    kvo_stats all;
    std::memset(&all, 0, sizeof(all));
    all.struct_size = std::min(caller_size, sizeof(kvo_stats));
    static_assert(KVO_MAX_TIERS == kvoffload::kMaxDiskTiers + 1, "every tier is reported");
    all.num_tiers = static_cast<uint32_t>(std::min<size_t>(s.tiers.size(), KVO_MAX_TIERS));
    for (uint32_t i = 0; i < all.num_tiers; ++i) {
      const kvoffload::TierStats& t = s.tiers[i];
      all.tiers[i] = kvo_tier_stats{t.capacity_bytes, t.used_bytes, t.blocks,        t.hits,
                                    t.misses,         t.evictions,  t.dropped,       t.io_errors,
                                    t.corrupt,        t.bytes_read, t.bytes_written, t.read_ns,
                                    t.write_ns};
      all.tier_refused[i] = t.refused;
      all.tier_lost[i] = t.lost;
    }
    all.stored_blocks = s.stored_blocks;
    all.loaded_blocks = s.loaded_blocks;
    all.failed_loads = s.failed_loads;
    all.failed_stores = s.failed_stores;
    all.d2h_bytes = s.d2h_bytes;
    all.d2h_ns = s.d2h_ns;
    all.h2d_bytes = s.h2d_bytes;
    all.h2d_ns = s.h2d_ns;
    all.queue_depth = s.queue_depth;
    all.held_blocks = s.held_blocks;
    all.events_dropped = s.events_dropped;
    // An older caller's struct is a prefix of ours: hand back what it has room for.
    std::memcpy(out, &all, all.struct_size);
    return Report(Status::Ok());
  });
}

kvo_status kvo_write_back(kvo_engine* engine, uint64_t budget_ms, uint64_t* written,
                          uint64_t* failed, uint64_t* left) {
  return Guard([&] {
    if (CheckEngine(engine) != KVO_OK) return KVO_INVALID_ARGUMENT;
    // A day is past any shutdown: larger budgets (UINT64_MAX as "no limit") turned negative or
    // overflowed the clock's nanoseconds, a deadline already past, and nothing was written.
    constexpr uint64_t kMaxBudgetMs = 24ull * 3600 * 1000;
    const kvoffload::WriteBackReport r = engine->engine->WriteBack(
        std::chrono::milliseconds(static_cast<int64_t>(std::min(budget_ms, kMaxBudgetMs))));
    if (written != nullptr) *written = r.written;
    if (failed != nullptr) *failed = r.failed;
    if (left != nullptr) *left = r.left;
    return KVO_OK;
  });
}

// Nothing may throw into C: the two calls that return a length, not a status, give 0 (an
// empty text) where building the text failed (out of memory).
size_t kvo_describe(kvo_engine* engine, char* buf, size_t len) {
  if (engine == nullptr) return 0;
  try {
    return CopyOut(engine->engine->Describe(), buf, len);
  } catch (const std::exception&) {
    return CopyOut("", buf, len);
  }
}

size_t kvo_policy_names(char* buf, size_t len) {
  try {
    std::string joined;
    for (const std::string& name : kvoffload::EvictionPolicyNames()) {
      joined += (joined.empty() ? "" : ",") + name;
    }
    return CopyOut(joined, buf, len);
  } catch (const std::exception&) {
    return CopyOut("", buf, len);
  }
}

}  // extern "C"
