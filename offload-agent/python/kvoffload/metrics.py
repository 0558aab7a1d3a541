"""The engine's counters as vLLM connector metrics: what KVOffloadAgentSpec declares to vLLM's
Prometheus logger (definitions) and what the scheduler-side manager hands vLLM each step
(MetricsReporter.take). vLLM labels every series with model_name and engine; these add `tier`
("cpu", "disk0", "disk1", ...) and, for evictions, `destination`.

Where vLLM's native tiering (TieringOffloadingSpec) reports a metric with the same meaning, the
same name and label name are used, so one dashboard serves both modes; the rest are named
vllm:kvoffload_*. The table in offload-agent/README.md lists every series; the vLLM tests
check that table against vLLM's real /metrics text.

Ranks: each rank's engine holds its shard of every block, so bytes (moved, resident, capacity)
and I/O errors are summed over the ranks, while block counts (lookups, hits, stores, loads,
evictions, refusals, lost blocks) are rank 0's: every rank is asked the same keys and stores the same
blocks, so a sum would count each block once per rank. Transfer latencies are rank 0's jobs.
Never imports torch."""

import time

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)

TIER = ("tier",)

# vLLM's native tiering names (vllm/v1/kv_offload/tiering/base.py, TieringOffloadingMetrics).
CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"
READ_BYTES = "vllm:kv_offload_tiering_read_bytes"
READ_TIME = "vllm:kv_offload_tiering_read_time"
WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes"
WRITE_TIME = "vllm:kv_offload_tiering_write_time"

# Ours. prometheus_client appends _total to counters in the exposition.
MISSES = "vllm:kvoffload_misses"
EVICTED = "vllm:kvoffload_evicted_blocks"
REFUSED = "vllm:kvoffload_refused_blocks"
LOST = "vllm:kvoffload_lost_blocks"
IO_ERRORS = "vllm:kvoffload_io_errors"
CORRUPT = "vllm:kvoffload_corrupt_blocks"
RESIDENT_BYTES = "vllm:kvoffload_resident_bytes"
RESIDENT_BLOCKS = "vllm:kvoffload_resident_blocks"
CAPACITY_BYTES = "vllm:kvoffload_capacity_bytes"
STORED_BLOCKS = "vllm:kvoffload_stored_blocks"
STORED_BYTES = "vllm:kvoffload_stored_bytes"
LOADED_BLOCKS = "vllm:kvoffload_loaded_blocks"
LOADED_BYTES = "vllm:kvoffload_loaded_bytes"
FAILED_STORES = "vllm:kvoffload_failed_store_blocks"
FAILED_LOADS = "vllm:kvoffload_failed_load_blocks"
LOAD_SECONDS = "vllm:kvoffload_load_duration_seconds"
STORE_SECONDS = "vllm:kvoffload_store_duration_seconds"

# A load of a few blocks from pinned RAM takes tens of microseconds; one that reads a long
# prefix from a slow disk, seconds.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# (metric, engine tier field, engine field holds nanoseconds); counters per tier.
_TIER_COUNTERS = (
    (CHUNK_HITS, "hits", False),
    (MISSES, "misses", False),
    (REFUSED, "refused", False),
    (IO_ERRORS, "io_errors", False),
    (CORRUPT, "corrupt", False),
)
# Disk tiers only, as natively (the secondary tiers): bytes and time moved to and from them, and
# the blocks that never got there.
_DISK_COUNTERS = (
    (LOST, "lost", False),
    (READ_BYTES, "bytes_read", False),
    (READ_TIME, "read_ns", True),
    (WRITE_BYTES, "bytes_written", False),
    (WRITE_TIME, "write_ns", True),
)
_ENGINE_COUNTERS = (
    (STORED_BLOCKS, "stored_blocks"),
    (STORED_BYTES, "d2h_bytes"),
    (LOADED_BLOCKS, "loaded_blocks"),
    (LOADED_BYTES, "h2d_bytes"),
    (FAILED_STORES, "failed_stores"),
    (FAILED_LOADS, "failed_loads"),
)
# Summed over ranks; every other field is rank 0's, but for the blocks that failed on some
# rank: a block fails where any rank's shard does (its own file, its own I/O), so these are the
# most any rank counts, a lower bound that never counts one block twice (and, as each rank's
# count only grows, never goes down).
_SUMMED_TIER_FIELDS = ("capacity_bytes", "used_bytes", "bytes_read", "bytes_written", "read_ns",
                       "write_ns", "io_errors", "corrupt")
_SUMMED_ENGINE_FIELDS = ("d2h_bytes", "h2d_bytes")
_MOST_TIER_FIELDS = ("refused", "lost")
_MOST_ENGINE_FIELDS = ("failed_stores", "failed_loads")


def definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every metric the adapter reports, for OffloadingSpec.build_metric_definitions."""
    def counter(doc, labels=TIER):
        return OffloadingCounterMetadata(documentation=doc, labelnames=labels)

    def gauge(doc):
        return OffloadingGaugeMetadata(documentation=doc, labelnames=TIER)

    def histogram(doc):
        return OffloadingHistogramMetadata(documentation=doc, buckets=LATENCY_BUCKETS)

    return {
        CHUNK_QUERIES: counter("Block lookups that reached a tier (a lookup asks the tiers "
                               "in order until one has the block), labeled by tier."),
        CHUNK_HITS: counter("Block lookups that found the block in a tier, labeled by tier."),
        MISSES: counter("Block lookups that reached a tier and did not find the block there."),
        READ_BYTES: counter("Bytes read from a disk tier (promotions and demotions to the "
                            "next tier), labeled by tier."),
        READ_TIME: counter("Seconds spent reading from a disk tier, labeled by tier."),
        WRITE_BYTES: counter("Bytes written to a disk tier, labeled by tier."),
        WRITE_TIME: counter("Seconds spent writing to a disk tier, labeled by tier."),
        EVICTED: counter("Blocks evicted from a tier to make room, by where they went: the "
                         "next tier, or dropped.", labels=("tier", "destination")),
        REFUSED: counter("Blocks a tier refused because every block in it was pinned by a "
                         "transfer or held for a load."),
        LOST: counter("Blocks meant for a disk tier that did not reach it: the tier was full "
                      "with nothing to evict, out of space, read-only or failing."),
        IO_ERRORS: counter("Failed reads and writes of a disk tier (ENOSPC, EIO, short "
                           "transfers)."),
        CORRUPT: counter("Block files that failed their checksum or size check and were "
                         "removed."),
        RESIDENT_BYTES: gauge("Bytes a tier holds now (disk: whole block files)."),
        RESIDENT_BLOCKS: gauge("Blocks a tier holds now."),
        CAPACITY_BYTES: gauge("Bytes a tier may hold."),
        STORED_BLOCKS: counter("Blocks stored from the device into the pinned tier.", ()),
        STORED_BYTES: counter("Bytes copied from the device into the pinned tier, over all "
                              "ranks.", ()),
        LOADED_BLOCKS: counter("Blocks loaded back to the device.", ()),
        LOADED_BYTES: counter("Bytes copied back to the device, over all ranks.", ()),
        FAILED_STORES: counter("Blocks a store could not keep (no room, copy error).", ()),
        FAILED_LOADS: counter("Blocks a load could not deliver (missing, corrupt, I/O "
                              "error).", ()),
        LOAD_SECONDS: histogram("Seconds from submitting a load job to seeing it done."),
        STORE_SECONDS: histogram("Seconds from submitting a store job to seeing it done."),
    }


def tier_name(index: int) -> str:
    return "cpu" if index == 0 else f"disk{index - 1}"


def combine(per_rank: list[dict]) -> dict:
    """One view of the ranks' engine stats (see the module's note on ranks)."""
    first = per_rank[0]
    out = dict(first)
    for field in _SUMMED_ENGINE_FIELDS:
        out[field] = sum(r[field] for r in per_rank)
    for field in _MOST_ENGINE_FIELDS:
        out[field] = max(r[field] for r in per_rank)
    tiers = []
    for i, tier in enumerate(first["tiers"]):
        t = dict(tier)
        for field in _SUMMED_TIER_FIELDS:
            t[field] = sum(r["tiers"][i][field] for r in per_rank)
        for field in _MOST_TIER_FIELDS:
            t[field] = max(r["tiers"][i][field] for r in per_rank)
        tiers.append(t)
    out["tiers"] = tiers
    return out


class MetricsReporter:
    """Turns successive engine snapshots into vLLM connector stats: counters as the increase
    since the last call, gauges as the value now, histograms as the observations since.
    Reads the engines at most once per `interval_s` (0 by default: every step vLLM asks, as a
    read is a few counters per tier; a read skipped is reported only at the next step, which
    never comes once the engine is idle). Not thread-safe: the scheduler calls it."""

    def __init__(self, interval_s: float):
        self._interval_s = interval_s
        self._last_read = float("-inf")
        self._prev: dict | None = None
        # Per tier: how far the count of victims moved down has been reported ahead of the
        # engines' own (evictions less drops). An eviction is counted when its write down
        # starts and its drop when that write fails, so between two reads the difference can
        # shrink, and a negative counter increase made prometheus_client raise in vLLM's
        # output handler. The shortfall is reported as 0 and taken off the next increases.
        self._moved_ahead: dict[int, int] = {}

    def take(self, read_ranks) -> OffloadingConnectorStats | None:
        """read_ranks() -> (per-rank engine stats, rank 0's load seconds, store seconds)."""
        now = time.monotonic()
        if now - self._last_read < self._interval_s:
            return None
        self._last_read = now
        per_rank, load_s, store_s = read_ranks()
        cur = combine(per_rank)
        prev = self._prev
        self._prev = cur
        stats = OffloadingConnectorStats()
        no_tier: dict = {}
        for i, t in enumerate(cur["tiers"]):
            p = prev["tiers"][i] if prev is not None else no_tier
            label = (tier_name(i),)

            def delta(field, t=t, p=p):
                return t[field] - p.get(field, 0)

            stats.increase_counter(CHUNK_QUERIES, delta("hits") + delta("misses"), label)
            for name, field, nanos in _TIER_COUNTERS + (_DISK_COUNTERS if i > 0 else ()):
                stats.increase_counter(name, delta(field) / 1e9 if nanos else delta(field),
                                       label)
            # A tier's victims go down one tier; those no tier took are dropped.
            stats.increase_counter(EVICTED, delta("dropped"), (label[0], "dropped"))
            if i + 1 < len(cur["tiers"]):
                moved = delta("evictions") - delta("dropped") - self._moved_ahead.get(i, 0)
                self._moved_ahead[i] = max(0, -moved)
                stats.increase_counter(EVICTED, max(0, moved), (label[0], tier_name(i + 1)))
            stats.set_gauge(RESIDENT_BYTES, t["used_bytes"], label)
            stats.set_gauge(RESIDENT_BLOCKS, t["blocks"], label)
            stats.set_gauge(CAPACITY_BYTES, t["capacity_bytes"], label)
        for name, field in _ENGINE_COUNTERS:
            stats.increase_counter(name, cur[field] - (prev[field] if prev is not None else 0))
        for seconds in load_s:
            stats.observe_histogram(LOAD_SECONDS, seconds)
        for seconds in store_s:
            stats.observe_histogram(STORE_SECONDS, seconds)
        return stats
