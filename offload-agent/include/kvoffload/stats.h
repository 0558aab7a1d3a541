// Counters an engine exposes; a snapshot copied out under the engine's locks.
#ifndef KVOFFLOAD_STATS_H_
#define KVOFFLOAD_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvoffload {

struct TierStats {
  std::string name;  // "cpu", "disk0", ...
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // bytes this tier holds now (disk: whole files)
  uint64_t blocks = 0;
  uint64_t hits = 0;        // lookups that found the block here
  uint64_t misses = 0;      // lookups whose first missing block was not here either
  uint64_t evictions = 0;   // blocks pushed out to make room
  uint64_t dropped = 0;     // evicted blocks that no lower tier took
  uint64_t refused = 0;     // blocks not taken: every block here was pinned or held (no victim)
  // Disk tiers: blocks meant for this tier that did not reach it, whatever the reason: full with
  // no victim (also in refused), out of space, read-only, failing writes. The log says when that
  // starts and stops; this says how many. 0 for the pinned tier (see refused, failed_stores).
  uint64_t lost = 0;
  uint64_t io_errors = 0;   // failed reads/writes (ENOSPC, EIO, short transfers)
  uint64_t corrupt = 0;     // files that failed their checksum or size check (removed)
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t read_ns = 0;   // reading batches, with the verification that overlaps the reads
  uint64_t write_ns = 0;
};

struct EngineStats {
  std::vector<TierStats> tiers;  // [0] = cpu (pinned host), then the disk tiers in order
  uint64_t stored_blocks = 0;
  uint64_t loaded_blocks = 0;
  uint64_t failed_loads = 0;   // blocks a load could not deliver (missing, corrupt, I/O error)
  uint64_t failed_stores = 0;  // blocks a store could not keep (no room, copy error)
  uint64_t d2h_bytes = 0;
  uint64_t d2h_ns = 0;
  uint64_t h2d_bytes = 0;
  uint64_t h2d_ns = 0;  // per load, first copy started to last copy done (overlaps its reads)
  uint64_t queue_depth = 0;  // jobs submitted and not yet finished
  uint64_t held_blocks = 0;  // distinct blocks held (Engine::Hold) now
  uint64_t events_dropped = 0;  // residency events lost because the feed was full
  // Blocks loads read into buffers of their own because no pinned slot was free (a load larger
  // than the pinned tier), and the most bytes of such buffers one load held at once.
  uint64_t load_buffered_blocks = 0;
  uint64_t load_buffer_peak_bytes = 0;
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_STATS_H_
