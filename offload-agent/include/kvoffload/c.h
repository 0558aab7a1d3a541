/* The stable C API of libkvoffload, for the Python (ctypes) vLLM adapter and other FFI users.
 * Opaque engine handle, status codes, and a per-thread last-error message. Every function is
 * thread-safe for distinct engines and for one engine shared by threads. Nothing here throws;
 * pointers passed in are borrowed for the duration of the call unless stated otherwise. */
#ifndef KVOFFLOAD_C_H_
#define KVOFFLOAD_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KVO_API __attribute__((visibility("default")))
#else
#define KVO_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvo_engine kvo_engine;

/* Same values as kvoffload::StatusCode. */
typedef enum kvo_status {
  KVO_OK = 0,
  KVO_INVALID_ARGUMENT = 1,
  KVO_NOT_FOUND = 2,
  KVO_ALREADY_EXISTS = 3,
  KVO_IO_ERROR = 4,
  KVO_RESOURCE_EXHAUSTED = 5,
  KVO_CORRUPTION = 6,
  KVO_UNAVAILABLE = 7,
  KVO_FAILED_PRECONDITION = 8,
  KVO_DEADLINE_EXCEEDED = 9,
  KVO_UNIMPLEMENTED = 10,
  KVO_INTERNAL = 11,
  KVO_PENDING = 100 /* kvo_job_poll: the job is still running */
} kvo_status;

typedef struct kvo_key {
  uint64_t hi;
  uint64_t lo;
} kvo_key;

/* Tier numbers reported by kvo_lookup: 0 = pinned host (cpu), 1 + i = disk tier i. */
#define KVO_TIER_CPU 0

/* Versioned structs: the caller sets struct_size = sizeof(the struct) as it was compiled.
 * Fields are only ever appended, so a library can tell which ones the caller knows. */
typedef struct kvo_options {
  size_t struct_size;    /* sizeof(kvo_options); required */
  size_t block_bytes;    /* required */
  const char* model;     /* required; with the four below: the model fingerprint */
  const char* revision;  /* NULL = "" */
  const char* dtype;
  const char* layout;
  int32_t rank;
  const char* device;  /* "host" | "cuda"; NULL = "host" */
  const char* disk_io; /* "auto" | "uring" | "psync"; NULL = "auto" */
  /* Non-zero: read KVOFFLOAD_CPU_BYTES / KVOFFLOAD_EVICTION_POLICY / KVOFFLOAD_TIERS from the
   * environment and ignore the three fields below. */
  int from_env;
  uint64_t cpu_bytes;
  const char* eviction_policy; /* NULL = "lru" */
  const char* tiers_json;      /* KVOFFLOAD_TIERS format; NULL = no disk tier */
  /* Appended after the first fields: residency events kept for kvo_take_events; 0 = no event feed. A caller
   * compiled before this field passes the shorter struct_size and gets 0. */
  uint64_t event_capacity;
  /* Device pointers per block, 0 = 1: kvo_store gathers block i from device_ptrs[i * segments
   * + s] (block_bytes / segments bytes each) and kvo_load scatters it back, so a block that
   * spans one page of several KV tensors is one engine block. */
  uint64_t segments;
} kvo_options;

#define KVO_MAX_TIERS 16

typedef struct kvo_tier_stats {
  uint64_t capacity_bytes, used_bytes, blocks;
  uint64_t hits, misses, evictions, dropped, io_errors, corrupt;
  uint64_t bytes_read, bytes_written, read_ns, write_ns;
} kvo_tier_stats;

typedef struct kvo_stats {
  size_t struct_size; /* sizeof(kvo_stats); set by the caller, the library fills that much */
  uint32_t num_tiers; /* [0] = cpu, then disk tiers; at most KVO_MAX_TIERS reported */
  kvo_tier_stats tiers[KVO_MAX_TIERS];
  uint64_t stored_blocks, loaded_blocks, failed_loads, failed_stores;
  uint64_t d2h_bytes, d2h_ns, h2d_bytes, h2d_ns;
  uint64_t queue_depth;
  uint64_t held_blocks;    /* distinct blocks held by kvo_hold now */
  uint64_t events_dropped; /* residency events lost because the feed was full */
  /* Appended: per tier (same index as tiers), blocks the tier refused because every block it
   * holds was pinned by a transfer or held for a load, so nothing could be evicted. */
  uint64_t tier_refused[KVO_MAX_TIERS];
  /* Appended: per disk tier (same index as tiers; 0 for the cpu tier), blocks meant for the
   * tier that did not reach it: full with nothing to evict, out of space, read-only or failing. */
  uint64_t tier_lost[KVO_MAX_TIERS];
} kvo_stats;

/* One residency change (kvo_take_events). */
typedef struct kvo_event {
  kvo_key key;
  int32_t tier;    /* KVO_TIER_CPU or 1 + i for disk tier i */
  int32_t removed; /* 0: the block entered the tier; 1: it left it */
} kvo_event;

/* The message of the last failed call on this thread ("" when none). Valid until the next
 * call on this thread. */
KVO_API const char* kvo_last_error(void);

KVO_API kvo_status kvo_engine_create(const kvo_options* options, kvo_engine** out);
/* Waits for running jobs; queued jobs are cancelled. NULL is ignored. No other call on the
 * engine may be in progress or follow (a thread still in kvo_wait would wake into freed
 * memory): the caller stops its users first, as the adapter's shutdown does. */
KVO_API void kvo_engine_destroy(kvo_engine* engine);

/* Starts copying n blocks from device memory into the offload tiers; *job identifies it.
 * device_ptrs holds n * segments pointers (kvo_options.segments). */
KVO_API kvo_status kvo_store(kvo_engine* engine, const kvo_key* keys, void* const* device_ptrs, size_t n,
                     uint64_t* job);
/* *prefix = number of leading keys stored; tiers[i] (n entries, may be NULL) = tier of key i
 * for i < *prefix, -1 after. */
KVO_API kvo_status kvo_lookup(kvo_engine* engine, const kvo_key* keys, size_t n, size_t* prefix,
                      int32_t* tiers);
/* tiers[i] (n entries) = tier of key i on its own, -1 when absent; not a prefix, and not
 * counted as a lookup in the stats (for checking which blocks still need storing). */
KVO_API kvo_status kvo_where(kvo_engine* engine, const kvo_key* keys, size_t n, int32_t* tiers);
/* kvo_lookup that also holds the prefix it found: no tier of this engine evicts a held block
 * until kvo_release, so a block found now is still there when its kvo_load runs later. Each
 * hold needs one release. Another process sharing a tier may still remove a held file. */
KVO_API kvo_status kvo_hold(kvo_engine* engine, const kvo_key* keys, size_t n, size_t* prefix,
                            int32_t* tiers);
/* Releases one hold of each key; KVO_FAILED_PRECONDITION naming the first key that was not
 * held (the others are still released). */
KVO_API kvo_status kvo_release(kvo_engine* engine, const kvo_key* keys, size_t n);
/* Moves up to cap residency events, oldest first, into out; *n = how many. Empty unless the
 * engine was created with event_capacity > 0. */
KVO_API kvo_status kvo_take_events(kvo_engine* engine, kvo_event* out, size_t cap, size_t* n);
KVO_API kvo_status kvo_load(kvo_engine* engine, const kvo_key* keys, void* const* device_ptrs, size_t n,
                    uint64_t* job);
/* KVO_PENDING while running; then the job's result (the job is then forgotten: a later poll
 * or wait on it is KVO_NOT_FOUND). */
KVO_API kvo_status kvo_job_poll(kvo_engine* engine, uint64_t job);
/* Blocks until the job finishes; its result. Threads may poll and wait on one job at once:
 * every wait that began before the job was forgotten returns its result. */
KVO_API kvo_status kvo_job_wait(kvo_engine* engine, uint64_t job);

KVO_API kvo_status kvo_get_stats(kvo_engine* engine, kvo_stats* out);

/* Graceful shutdown, before kvo_engine_destroy: writes the blocks that are only in the pinned
 * tier to the first persistent disk tier, starting no write after budget_ms: the hottest that
 * tier can hold, coldest first (those it has already are refreshed there in that order).
 * *written, *failed and *left (each may be NULL): blocks written, writes that failed, blocks
 * that needed a write and were not tried (no time left, or colder than what fits).
 * Without a persistent tier nothing is written and all three are 0. */
KVO_API kvo_status kvo_write_back(kvo_engine* engine, uint64_t budget_ms, uint64_t* written,
                                  uint64_t* failed, uint64_t* left);
/* Writes the startup report (backends chosen per tier) into buf (NUL-terminated, truncated to
 * len); returns the full length needed, excluding the NUL. */
KVO_API size_t kvo_describe(kvo_engine* engine, char* buf, size_t len);

/* The eviction policies kvo_options.eviction_policy and KVOFFLOAD_EVICTION_POLICY accept,
 * sorted and joined by ',' ("arc,chain-lru,lirs,lru,lru-tinylfu,s3fifo"), written into buf as
 * kvo_describe writes; returns the full length needed, excluding the NUL. Needs no engine. */
KVO_API size_t kvo_policy_names(char* buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVOFFLOAD_C_H_ */
