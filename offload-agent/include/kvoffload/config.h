// Engine configuration: what the webhook puts in the environment plus what only the caller
// knows (block size, model fingerprint). Value types; parsing functions are thread-safe.
#ifndef KVOFFLOAD_CONFIG_H_
#define KVOFFLOAD_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/block_key.h"
#include "kvoffload/export.h"
#include "kvoffload/status.h"

namespace kvoffload {

// One secondary tier, as in KVOFFLOAD_TIERS.
struct DiskTierConfig {
  std::string path;
  std::string kind;  // "emptyDir" | "pvcSpec" | "pvcRef"
  uint64_t capacity_bytes = 0;
  // Survives the pod: blocks found at start are served again. False: the tier starts empty.
  bool persistent = false;
  // Several processes (replicas) may use the directory at once.
  bool shared = false;
};

// The largest block the agent stores (1 GiB).
inline constexpr size_t kMaxBlockBytes = size_t{1} << 30;

// The most disk tiers an engine takes: the C API's stats report the CPU tier and these
// (KVO_MAX_TIERS in total), and a tier past them would run unseen by stats and metrics.
inline constexpr size_t kMaxDiskTiers = 15;

struct KVOFFLOAD_EXPORT EngineConfig {
  // From the environment (or set in code).
  uint64_t cpu_bytes = 0;
  std::string eviction_policy = "lru";
  std::vector<DiskTierConfig> tiers;
  // From the caller.
  size_t block_bytes = 0;
  ModelFingerprint fingerprint;
  std::string device = "host";   // "host" | "cuda"
  std::string disk_io = "auto";  // "auto" | "uring" | "psync"
  size_t worker_threads = 2;     // jobs run concurrently
  size_t io_parallelism = 4;     // psync threads / uring rings per tier
  // With a disk tier, the pinned tier keeps slots free ahead of stores: when fewer than this
  // many are free, its demoter writes victims down together until twice as many are. 0, or a
  // pinned tier of fewer than 4 * demote_batch slots: each store evicts its own victims.
  size_t demote_batch = 16;
  size_t event_capacity = 0;     // residency events kept for TakeEvents; 0 = no event feed
  // A load reads its disk blocks into pinned slots (promotion); where every slot is pinned (a
  // load larger than the pinned tier) into buffers of its own, at most this many bytes of them
  // at once (at least one block): past it the load waits for its copies and reuses them. Without
  // a bound a 128k-token prefix took gigabytes past the memory the pod was sized for.
  size_t load_buffer_bytes = size_t{64} << 20;
  // Device pointers per block. A vLLM block spans one page in each of its KV tensors: the
  // engine gathers them into one block (one slot, one file) on store and scatters them back
  // on load, block_bytes / segments bytes each.
  size_t segments = 1;

  // Checks every field; errors name the field and the value.
  Status Validate() const;
};

// Reads KVOFFLOAD_CPU_BYTES (required), KVOFFLOAD_EVICTION_POLICY (default lru) and
// KVOFFLOAD_TIERS (JSON array, default none) into `base`; an empty variable is an unset one.
// Errors name the variable and value.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
KVOFFLOAD_EXPORT Result<EngineConfig> ConfigFromEnv(EngineConfig base, const EnvLookup& env);
// The process environment.
KVOFFLOAD_EXPORT std::optional<std::string> ProcessEnv(std::string_view name);
// InvalidArgument naming the first of `names` (NAME=VALUE entries, as in environ) that is nearly
// one of the three variables above but not it (KVOFFLOAD_TIER, kvoffload_tiers,
// KVOFFLOAD_EVICTION_POLICIES): read as absent, a misspelt one ran without disk tiers or with
// lru, and nothing said so.
KVOFFLOAD_EXPORT Status RefuseMisspeltVariables(const char* const* names);

// Parses the KVOFFLOAD_TIERS JSON array. A capacityBytes of 0 (the webhook's "unknown") is
// the size of the file system at the tier's path, less the webhook's headroom.
KVOFFLOAD_EXPORT Result<std::vector<DiskTierConfig>> ParseTiersJson(std::string_view json);

}  // namespace kvoffload

#endif  // KVOFFLOAD_CONFIG_H_
