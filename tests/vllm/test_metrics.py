"""The adapter's metrics as vLLM's own Prometheus logger exports them: vLLM's engine for real
(real_engine.py, metrics on as `vllm serve` has them), its registry rendered as /metrics
renders it, and the values checked against the workload the test ran and against the engine's
own stats. Also keeps the metric table of offload-agent/README.md honest: every name in it
must be in the real exposition.

Workload: 8 pinned slots in front of a 20-block disk tier. The first questions about eight
documents store 32 blocks: the pinned tier keeps the newest 8 and evicts 24 to disk0, which
keeps 20 and drops the oldest 4 (document 0). A second question about document 1 (gone from
vLLM's own cache) then loads its 4 blocks from disk0. (One document only: promoting them
evicts 4 pinned blocks to disk0, which drops its oldest, document 2's.)"""

import pathlib
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

import tiny_model
from kvoffload import metrics
from test_real_engine import DISK_SLOT, SLOT, disk_tier, model, run_engine  # noqa: F401 (fixture)

README = pathlib.Path(__file__).resolve().parents[2] / "offload-agent" / "README.md"
CPU_SLOTS = 8
DISK_BLOCKS = 20
DOCS = 8
FIRST = [[d, 0] for d in range(DOCS)]
AGAIN = [[1, 1]]
STORED = DOCS * tiny_model.PREFIX_BLOCKS
LOADED = len(AGAIN) * tiny_model.PREFIX_BLOCKS


def readme_metrics() -> dict[str, str]:
    """name -> type, from the table in the README's metrics section."""
    rows = re.findall(r"^\| `(vllm:[a-z_:]+)` \| (counter|gauge|histogram) \|",
                      README.read_text(), flags=re.M)
    assert rows, f"no metric table in {README}"
    return dict(rows)


class Exposition:
    """The samples of one /metrics text."""

    def __init__(self, text: str):
        self.samples = [s for family in text_string_to_metric_families(text)
                        for s in family.samples]

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def value(self, name: str, **labels) -> float:
        found = [s.value for s in self.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, f"{len(found)} samples of {name} {labels}"
        return found[0]

    def labelled(self, prefix: str) -> list:
        return [s for s in self.samples if s.name.startswith(prefix)]


# The default metrics interval: each phase's last steps come within a second of its first, and
# the engine then idles; with reads at most once a second, what those steps did stayed off
# /metrics (stored blocks 0 after 32 were stored).
@pytest.fixture(scope="module")
def run(model, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    tmp_path = tmp_path_factory.mktemp("metrics")
    r = run_engine(tmp_path, "metrics", model,
                   [["generate", FIRST], ["metrics"], ["generate", AGAIN], ["metrics"]],
                   cpu_slots=CPU_SLOTS, tiers=[disk_tier(tmp_path, "kv-cache-0", DISK_BLOCKS)],
                   log_stats=True)
    _, first, _, again = r["phases"]
    return model, (Exposition(first["exposition"]), first["stats"]), \
        (Exposition(again["exposition"]), again["stats"])


def test_every_readme_metric_is_exported_with_its_type(run):
    _, _, (exp, _) = run
    names = exp.names()
    missing = []
    for name, kind in readme_metrics().items():
        wanted = name + "_count" if kind == "histogram" else name
        if wanted not in names:
            missing.append(name)
    assert not missing, f"in the README table but not on /metrics: {missing}"
    # And the other way: nothing of ours on /metrics that the table does not document.
    ours = {s.name for s in exp.labelled("vllm:kvoffload_")}
    ours |= {s.name for s in exp.labelled("vllm:kv_offload_tiering_")}
    documented = set(readme_metrics())
    def family(name):  # prometheus_client's extra samples: X_created beside X_total, ...
        base = re.sub(r"_(bucket|count|sum|created)$", "", name)
        return base if base in documented else base + "_total"
    undocumented = {n for n in ours if n not in documented and family(n) not in documented}
    assert not undocumented, f"on /metrics but not in the README table: {undocumented}"


def test_every_series_carries_the_model_and_tier(run):
    model_path, _, (exp, _) = run
    ours = exp.labelled("vllm:kvoffload_") + exp.labelled("vllm:kv_offload_tiering_")
    assert ours
    for s in ours:
        assert s.labels.get("model_name") == model_path, s
    tiers = {s.labels["tier"] for s in exp.labelled("vllm:kvoffload_resident_bytes")}
    assert tiers == {"cpu", "disk0"}


def test_a_tier_filled_past_capacity_shows_its_evictions(run):
    _, (exp, stats), _ = run
    evicted = "vllm:kvoffload_evicted_blocks_total"
    assert exp.value("vllm:kvoffload_stored_blocks_total") == STORED
    assert exp.value(evicted, tier="cpu", destination="disk0") == STORED - CPU_SLOTS
    assert exp.value(evicted, tier="cpu", destination="dropped") == 0
    assert exp.value(evicted, tier="disk0", destination="dropped") == \
        STORED - CPU_SLOTS - DISK_BLOCKS
    assert exp.value("vllm:kvoffload_resident_blocks", tier="cpu") == CPU_SLOTS
    assert exp.value("vllm:kvoffload_resident_blocks", tier="disk0") == DISK_BLOCKS
    for tier, blocks, slot in (("cpu", CPU_SLOTS, SLOT), ("disk0", DISK_BLOCKS, DISK_SLOT)):
        assert exp.value("vllm:kvoffload_capacity_bytes", tier=tier) == blocks * slot
        assert exp.value("vllm:kvoffload_resident_bytes", tier=tier) == blocks * slot
    # The same counts as the engine's own stats.
    cpu, disk = stats["tiers"]
    assert exp.value(evicted, tier="cpu", destination="disk0") == \
        cpu["evictions"] - cpu["dropped"]
    assert exp.value(evicted, tier="disk0", destination="dropped") == disk["dropped"]
    assert exp.value("vllm:kv_offload_tiering_write_bytes_total", tier="disk0") == \
        disk["bytes_written"] == (STORED - CPU_SLOTS) * DISK_SLOT
    # Nothing was asked twice yet: no hit anywhere.
    for tier in ("cpu", "disk0"):
        assert exp.value("vllm:kv_offload_tiering_chunk_hits_total", tier=tier) == 0


def test_hits_equal_the_loads_and_bytes_equal_blocks_times_block_size(run):
    _, (before, _), (exp, stats) = run
    hits = "vllm:kv_offload_tiering_chunk_hits_total"
    queries = "vllm:kv_offload_tiering_chunk_queries_total"
    assert stats["loaded_blocks"] == LOADED
    assert exp.value("vllm:kvoffload_loaded_blocks_total") == LOADED
    # Document 1 was on disk0 only: every block loaded is a disk0 hit, and a miss in the
    # pinned tier first.
    assert exp.value(hits, tier="disk0") == LOADED
    assert exp.value(hits, tier="cpu") == 0
    assert exp.value(queries, tier="cpu") - before.value(queries, tier="cpu") == LOADED
    assert exp.value("vllm:kvoffload_misses_total", tier="cpu") == exp.value(queries, tier="cpu")
    block = tiny_model.BLOCK_BYTES
    assert exp.value("vllm:kvoffload_stored_bytes_total") == STORED * block
    assert exp.value("vllm:kvoffload_loaded_bytes_total") == LOADED * block
    # Read from disk0: the loaded block files (block + trailer, 4 KiB aligned), on top of what
    # cascading to disk0 read before.
    read = "vllm:kv_offload_tiering_read_bytes_total"
    assert exp.value(read, tier="disk0") - before.value(read, tier="disk0") == LOADED * DISK_SLOT
    assert exp.value("vllm:kv_offload_tiering_read_time_total", tier="disk0") > 0
    # Each load job was timed; at least one per request.
    assert exp.value("vllm:kvoffload_load_duration_seconds_count") >= len(AGAIN)
    assert exp.value("vllm:kvoffload_load_duration_seconds_sum") > 0
    assert exp.value("vllm:kvoffload_store_duration_seconds_count") >= DOCS
    for name in ("vllm:kvoffload_io_errors_total", "vllm:kvoffload_corrupt_blocks_total",
                 "vllm:kvoffload_refused_blocks_total", "vllm:kvoffload_lost_blocks_total"):
        assert exp.value(name, tier="disk0") == 0
    assert exp.value("vllm:kvoffload_failed_load_blocks_total") == 0


def test_a_block_that_failed_on_one_rank_is_counted_once():
    """Every rank moves its shard of the same blocks: bytes add up over ranks, blocks are
    counted once. A failure is one rank's (its file, its I/O) and fails the block: it counts
    where any rank has it, once even where several do."""
    def rank(failed_loads, lost, d2h):
        return {"failed_loads": failed_loads, "failed_stores": 0, "d2h_bytes": d2h,
                "h2d_bytes": 0, "stored_blocks": 5,
                "tiers": [{f: 0 for f in ("capacity_bytes", "used_bytes", "bytes_read",
                                          "bytes_written", "read_ns", "write_ns", "io_errors",
                                          "corrupt", "refused")} | {"lost": lost}]}
    one = metrics.combine([rank(0, 0, 100), rank(2, 3, 100)])
    assert (one["failed_loads"], one["tiers"][0]["lost"]) == (2, 3)
    both = metrics.combine([rank(2, 1, 100), rank(2, 3, 100)])
    assert (both["failed_loads"], both["tiers"][0]["lost"]) == (2, 3)
    assert (both["d2h_bytes"], both["stored_blocks"]) == (200, 5)
