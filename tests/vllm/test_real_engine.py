"""vLLM's engine for real (the CPU build's vllm.LLM) with KVOffloadAgentSpec: a tiny Llama
with random weights (tiny_model.py) and vLLM's own KV cache cut to 24 blocks, so that a
document's prefix is evicted from it before a second question about that document comes back.

Workload: eight documents of 4 full blocks each are asked one question each (32 blocks
offloaded; vLLM's cache keeps only the newest), then documents 0-2 a second question: their 12
prefix blocks are gone from vLLM's cache, so every one of them is loaded through the connector,
and the generated tokens must equal those of the same run without a connector. Counts come
from the libkvoffload engine's stats; each configuration runs in a fresh process
(real_engine.py), like a pod."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import tiny_model
from conftest import slot_bytes, tier_block_bytes

HERE = pathlib.Path(__file__).resolve().parent
GPU_BLOCKS = 24
DOCS = 8
FIRST = [[d, 0] for d in range(DOCS)]
AGAIN = [[d, 1] for d in range(3)]
STORED = DOCS * tiny_model.PREFIX_BLOCKS
LOADED = len(AGAIN) * tiny_model.PREFIX_BLOCKS
# A pinned slot and a block file: the block plus its 64-byte trailer, 4 KiB aligned.
SLOT = slot_bytes(tiny_model.BLOCK_BYTES)
# A block in an emptyDir tier's slot file: the payload alone, 4 KiB aligned.
DISK_SLOT = tier_block_bytes(tiny_model.BLOCK_BYTES, "emptyDir")
# With two tensor-parallel ranks each rank holds half the KV heads: half a block per slot.
SHARD_SLOT = -(-(tiny_model.BLOCK_BYTES // 2 + 64) // 4096) * 4096


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.make(str(tmp_path_factory.mktemp("tiny-llama")))


def run_engine(tmp_path, name, model, phases, cpu_slots=None, tiers=(), executor="uni",
               corrupt_loads=False, extra=None, tensor_parallel=1, log_stats=False,
               max_model_len=512, beside=None):
    """One vLLM engine in a fresh process; cpu_slots None = no connector. Tier settings reach
    the adapter as the webhook passes them, through KVOFFLOAD_* env. With two ranks the pod's
    pinned RAM is cpu_slots shard slots per rank: each rank gets its share."""
    slot = SHARD_SLOT if tensor_parallel == 2 else SLOT
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KVOFFLOAD_") or k == "KVOFFLOAD_LIBRARY"}
    env["PYTHONPATH"] = f"{HERE}{os.pathsep}{env.get('PYTHONPATH', '')}"
    if cpu_slots is not None:
        env["KVOFFLOAD_CPU_BYTES"] = str(cpu_slots * slot * tensor_parallel)
        env["KVOFFLOAD_TIERS"] = json.dumps(list(tiers))
    spec = {"model": model, "connector": None if cpu_slots is None else (extra or {}),
            "executor": executor, "tensor_parallel": tensor_parallel, "gpu_blocks": GPU_BLOCKS, "corrupt_loads": corrupt_loads,
            "log_stats": log_stats, "max_model_len": max_model_len, "beside": beside,
            "phases": phases}
    run_file, result_file = tmp_path / f"{name}.run.json", tmp_path / f"{name}.result.json"
    run_file.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(HERE / "real_engine.py"), str(run_file),
                           str(result_file)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and result_file.exists(), (
        f"{name}: real_engine.py exited {proc.returncode}\n{proc.stdout[-4000:]}\n"
        f"{proc.stderr[-8000:]}")
    result = json.loads(result_file.read_text())
    # No caller expects a refused start: say why, with vLLM's own traceback of the process that
    # failed (the exception alone says only "see root cause above").
    assert "startup_error" not in result, (
        f"{name}: the engine did not start: {result['startup_error']}\n{proc.stderr[-8000:]}")
    result["stderr"] = proc.stderr
    return result


def disk_tier(tmp_path, name, blocks, kind="emptyDir", slot=None):
    """A tier that holds `blocks` blocks of `slot` bytes (by default what one block takes in
    a tier of this kind)."""
    slot = slot or tier_block_bytes(tiny_model.BLOCK_BYTES, kind)
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    return {"path": str(path), "kind": kind, "capacityBytes": blocks * slot,
            "persistent": kind == "pvcRef", "shared": False}


@pytest.fixture(scope="module")
def baseline(model, tmp_path_factory):
    """The tokens without a connector: vLLM recomputes every evicted prefix."""
    r = run_engine(tmp_path_factory.mktemp("baseline"), "baseline", model,
                   [["generate", FIRST], ["generate", AGAIN]])
    return [p["tokens"] for p in r["phases"]]


def test_loads_from_the_pinned_tier_and_resets(model, baseline, tmp_path):
    r = run_engine(tmp_path, "pinned", model,
                   [["generate", FIRST], ["generate", AGAIN], ["reset_connector"],
                    ["generate", AGAIN]], cpu_slots=64)
    first, again, reset, after_reset = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    assert first["stats"]["stored_blocks"] == STORED
    assert first["stats"]["loaded_blocks"] == 0
    assert again["stats"]["loaded_blocks"] == LOADED
    assert again["stats"]["tiers"][0]["blocks"] == STORED
    assert again["stats"]["failed_loads"] == 0
    # After a connector reset nothing stored before is served: the second questions are
    # recomputed (same tokens) and their prefixes stored again under the new generation.
    assert after_reset["tokens"] == baseline[1]
    assert after_reset["stats"]["loaded_blocks"] == LOADED
    assert after_reset["stats"]["stored_blocks"] == STORED + LOADED
    assert r["closed"]["stats"]["held_blocks"] == 0


def test_serves_beside_another_connector_in_a_multi_connector(model, baseline, tmp_path):
    """KServe's P/D pods pass their own --kv-transfer-config (NixlConnector: decode pods
    kv_consumer, prefill kv_producer); offloading runs beside it only inside vLLM's
    MultiConnector, theirs first, ours second, as KServe's own P/D sample composes it. A
    connector that never has anything to load (nothing_handed_over.py) stands for a decode
    pod's Nixl with a request no prefill pod handed over: every hit is then ours, and the
    tokens are those without any connector."""
    beside = {"kv_connector": "NothingHandedOver", "kv_role": "kv_consumer",
              "kv_connector_module_path": "nothing_handed_over"}
    r = run_engine(tmp_path, "multi", model, [["generate", FIRST], ["generate", AGAIN]],
                   cpu_slots=64, beside=beside)
    first, again = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    assert first["stats"]["stored_blocks"] == STORED
    assert again["stats"]["loaded_blocks"] == LOADED
    assert again["stats"]["failed_loads"] == 0


def test_loads_from_a_disk_tier(model, baseline, tmp_path):
    # 8 pinned slots: of the 32 blocks the first questions store, the newest 8 stay pinned
    # and the 24 before them (documents 0-5) cascade to the emptyDir tier.
    r = run_engine(tmp_path, "disk", model, [["generate", FIRST], ["generate", AGAIN]],
                   cpu_slots=8, tiers=[disk_tier(tmp_path, "kv-cache-0", 64)])
    first, again = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    assert first["stats"]["tiers"][1]["blocks"] == STORED - 8
    disk = again["stats"]["tiers"][1]
    assert again["stats"]["loaded_blocks"] == LOADED
    assert disk["bytes_read"] - first["stats"]["tiers"][1]["bytes_read"] == LOADED * DISK_SLOT
    assert disk["corrupt"] == 0 and disk["io_errors"] == 0


def test_corrupted_loads_change_the_output(model, baseline, tmp_path):
    """The negative control: noise written over every loaded block before vLLM reads it.
    Had vLLM recomputed the prefix instead of reading the loaded KV, nothing would change."""
    r = run_engine(tmp_path, "corrupt", model, [["generate", FIRST], ["generate", AGAIN]],
                   cpu_slots=64, corrupt_loads=True)
    first, again = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["stats"]["loaded_blocks"] == LOADED
    changed = [a != b for a, b in zip(again["tokens"], baseline[1])]
    assert all(changed), f"output unchanged by corrupted KV for requests {changed}"


def test_restart_on_a_persistent_tier_hits_every_block(model, baseline, tmp_path):
    """Graceful shutdown writes the blocks only pinned RAM holds to the persistent tier, so a
    new engine on that tier loads every block the first one stored. Then other weights in the
    same model directory (a KServe pod always serves /mnt/models): none of them is loaded."""
    model = str(shutil.copytree(model, tmp_path / "mnt-models"))
    tiers = [disk_tier(tmp_path, "kv-cache-0", 64, kind="pvcRef")]
    before = run_engine(tmp_path, "before-restart", model, [["generate", FIRST]],
                        cpu_slots=8, tiers=tiers)
    assert before["phases"][0]["tokens"] == baseline[0]
    assert before["closed"]["write_back"] == {"written": 8, "failed": 0, "left": 0}
    again_all = [[d, 1] for d in range(DOCS)]
    after = run_engine(tmp_path, "after-restart", model, [["generate", again_all]],
                       cpu_slots=8, tiers=tiers)
    stats = after["phases"][0]["stats"]
    assert stats["loaded_blocks"] == STORED
    assert stats["stored_blocks"] == 0
    assert after["phases"][0]["tokens"][:len(AGAIN)] == baseline[1]
    # The engine's start line names the weights' digest in its fingerprint.
    assert f"(model {model}, revision weights=" in after["stderr"], after["stderr"][-4000:]

    tiny_model.make(model, seed=1)
    new_weights = run_engine(tmp_path, "new-weights", model, [["generate", again_all]],
                             cpu_slots=8, tiers=tiers)
    stats = new_weights["phases"][0]["stats"]
    assert stats["loaded_blocks"] == 0, "blocks of the old weights were loaded"
    assert stats["stored_blocks"] == STORED


def test_mp_executor_loads_from_the_pinned_tier(model, baseline, tmp_path):
    """vLLM's default layout on its CPU build: the worker in a process of its own, apart from
    the scheduler, whose manager reaches the worker's engine over its socket."""
    r = run_engine(tmp_path, "mp", model, [["generate", FIRST], ["generate", AGAIN]],
                   cpu_slots=64, executor="mp")
    first, again = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    assert first["stats"]["stored_blocks"] == STORED
    assert again["stats"]["loaded_blocks"] == LOADED
    assert again["stats"]["tiers"][0]["blocks"] == STORED
    assert again["stats"]["failed_loads"] == 0
    assert again["stats"]["held_blocks"] == 0


def test_tensor_parallel_ranks_agree_on_every_hit(model, baseline, tmp_path):
    """Two ranks (tensor_parallel_size=2, a worker process each), each offloading its own
    shard of every block to a persistent tier of its own fingerprint. Then a restart after
    one rank's shard files are gone: the other rank still has every block, but none is a hit
    anywhere, so no rank loads a block the other cannot; blocks stored again on both are."""
    # The pod's tier, 64 shard slots for each rank.
    tiers = [disk_tier(tmp_path, "kv-cache-0", 64, kind="pvcRef", slot=2 * SHARD_SLOT)]
    r = run_engine(tmp_path, "tp", model, [["generate", FIRST], ["generate", AGAIN]],
                   cpu_slots=8, tiers=tiers, executor="mp", tensor_parallel=2)
    first, again = r["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    for rank, (before, after) in enumerate(zip(first["rank_stats"], again["rank_stats"])):
        assert before["stored_blocks"] == STORED, f"rank {rank}"
        assert before["tiers"][1]["blocks"] == STORED - 8, f"rank {rank}"
        assert after["loaded_blocks"] == LOADED, f"rank {rank}"
        assert after["failed_loads"] == 0 and after["held_blocks"] == 0, f"rank {rank}"

    # A directory per rank (and fingerprint); the shutdown wrote each rank's pinned-only
    # blocks there. Remove rank 1's shards.
    shards = sorted({f.parent for f in pathlib.Path(tiers[0]["path"]).rglob("*.blk")})
    assert [s.relative_to(tiers[0]["path"]).parts[0] for s in shards] == ["rank0", "rank1"]
    gone = list(shards[1].glob("*.blk"))
    assert len(gone) == STORED, f"{len(gone)} files for {STORED} blocks in {shards[1]}"
    for f in gone:
        f.unlink()
    again_all = [[d, 1] for d in range(DOCS)]
    r = run_engine(tmp_path, "tp-restart", model,
                   [["stats"], ["generate", again_all], ["generate", AGAIN]],
                   cpu_slots=8, tiers=tiers, executor="mp", tensor_parallel=2)
    started, restart, stored_again = r["phases"]
    # Rank 0 recovered every block from its shard files, rank 1 none ...
    assert [s["tiers"][1]["blocks"] for s in started["rank_stats"]] == [STORED, 0]
    assert restart["tokens"][:len(AGAIN)] == baseline[1]
    assert stored_again["tokens"] == baseline[1]
    for rank, (s, s2) in enumerate(zip(restart["rank_stats"], stored_again["rank_stats"])):
        # ... and no rank loaded any, until both had them again.
        assert s["loaded_blocks"] == 0, f"rank {rank} loaded a block the other rank lacks"
        assert s2["loaded_blocks"] == LOADED, f"rank {rank}"
        assert s2["failed_loads"] == 0, f"rank {rank}"


def test_a_model_with_sliding_window_layers_loads_both_cache_groups(tmp_path):
    """Gemma 3's layout (tiny_model.make_hybrid): vLLM keeps the sliding-window layers and the
    full-attention ones in two KV cache groups, and its scheduler offloads and loads each
    group's blocks under keys of their own, the sliding-window group only those its window
    reaches. The same workload as the Llama's: tokens equal to the run without a connector,
    and noise over the loaded blocks changes every second answer."""
    model = tiny_model.make_hybrid(str(tmp_path / "tiny-gemma3"))
    phases = [["generate", FIRST], ["generate", AGAIN]]
    # vLLM's memory check for two groups in 24 blocks admits at most 352 tokens a request.
    runs = {name: run_engine(tmp_path, name, model, phases, max_model_len=320, **kw)
            for name, kw in (("baseline", {}), ("pinned", {"cpu_slots": 64}),
                             ("corrupt", {"cpu_slots": 64, "corrupt_loads": True}))}
    baseline = [p["tokens"] for p in runs["baseline"]["phases"]]
    first, again = runs["pinned"]["phases"]
    assert first["tokens"] == baseline[0]
    assert again["tokens"] == baseline[1], "tokens differ from the run without a connector"
    # Per document: its prefix's blocks in the full-attention group, and in the sliding-window
    # group the ones holding the last SLIDING_WINDOW tokens of the prefix.
    per_doc = tiny_model.PREFIX_BLOCKS + tiny_model.SLIDING_WINDOW // tiny_model.TOKENS_PER_BLOCK
    assert first["stats"]["stored_blocks"] == DOCS * per_doc
    assert again["stats"]["loaded_blocks"] == len(AGAIN) * per_doc
    assert again["stats"]["failed_loads"] == 0
    # vLLM looks the sliding-window group up from the prompt's end, not as a prefix: every
    # hold those lookups took has ended too.
    assert runs["pinned"]["closed"]["stats"]["held_blocks"] == 0
    corrupt = runs["corrupt"]["phases"][1]
    assert corrupt["stats"]["loaded_blocks"] == len(AGAIN) * per_doc
    changed = [a != b for a, b in zip(corrupt["tokens"], baseline[1])]
    assert all(changed), f"output unchanged by corrupted KV for requests {changed}"
