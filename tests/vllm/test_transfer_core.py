"""The transfer core with plain torch tensors and no vLLM. KVOFFLOAD_TEST_DEVICE=cuda runs the
same tests with CUDA tensors where torch sees a GPU; the GPU machine's own check is
bench/gpu/transfer_core.py (run by bench/gpu/run.sh)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import slot_bytes
from kvoffload.engine import Fingerprint
from kvoffload.transfer import TransferCore, engine_key

DEVICE = os.environ.get("KVOFFLOAD_TEST_DEVICE", "cpu")
PAGE = 4096          # bytes per block per tensor
TENSORS = 2          # e.g. K and V of one layer
BLOCKS = 16          # rows of each KV tensor
# One engine block is one row of every tensor.
SLOT = slot_bytes(PAGE * TENSORS)
FP = Fingerprint(model="test/model", revision="r1", dtype="float16", layout="test", rank=0)


def kv_tensors():
    return [torch.zeros(BLOCKS, PAGE, dtype=torch.uint8, device=DEVICE) for _ in range(TENSORS)]


def fill(tensors, rows, seed):
    g = torch.Generator().manual_seed(seed)
    for t in tensors:
        for r in rows:
            t[r] = torch.randint(0, 256, (PAGE,), dtype=torch.uint8, generator=g).to(t.device)


def tiers(tmp_path, persistent=False, blocks=64):
    return json.dumps([{"path": str(tmp_path / "disk0"), "kind": "pvcRef" if persistent else
                        "emptyDir", "capacityBytes": blocks * PAGE * 2,
                        "persistent": persistent, "shared": False}])


def keys(n, prefix=b"blk"):
    return [prefix + i.to_bytes(4, "big") for i in range(n)]


def test_does_not_import_vllm():
    # A fresh interpreter: in this one pytest may have imported vLLM for other test files.
    code = "import sys, kvoffload.transfer; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", "the transfer core must stay importable without vLLM"


def test_engine_key_is_stable():
    assert engine_key(b"a") == engine_key(b"a")
    assert engine_key(b"a") != engine_key(b"b")
    # Generation 0 is the plain key (what persistent tiers hold); a reset's next one differs.
    assert engine_key(b"a", 0) == engine_key(b"a")
    assert engine_key(b"a", 1) not in (engine_key(b"a"), engine_key(b"a", 2))
    # Fixed value: a change would orphan every block on a persistent tier.
    assert engine_key(b"a") == (0x27C35E6E9373877F, 0x29E562464E46497E)


def test_store_evict_to_disk_load_back_identical(tmp_path):
    (tmp_path / "disk0").mkdir()
    src = kv_tensors()
    fill(src, range(8), seed=1)
    # 4 blocks of pinned host for 8 blocks: half cascade to disk.
    core = TransferCore(src, FP, cpu_bytes=4 * SLOT, tiers_json=tiers(tmp_path))
    try:
        core.wait(core.store(keys(8), range(8)))
        assert core.stored_prefix(keys(8)) == 8
        stats = core.engine.stats()
        assert stats["tiers"][1]["blocks"] == 4, f"want 4 blocks (files) on disk: {stats}"
        expected = [t[:8].clone() for t in src]
        for t in src:
            t.zero_()
        # Into other rows than they came from, so a no-op load cannot pass.
        core.wait(core.load(keys(8), range(8, 16)))
        for want, t in zip(expected, src):
            assert torch.equal(want.cpu(), t[8:16].cpu())
        assert core.engine.stats()["loaded_blocks"] == 8
    finally:
        core.close()


def test_restart_hits_from_persistent_tier_and_fingerprint_scopes(tmp_path):
    (tmp_path / "disk0").mkdir()
    src = kv_tensors()
    fill(src, range(8), seed=2)
    core = TransferCore(src, FP, cpu_bytes=2 * SLOT, tiers_json=tiers(tmp_path, True))
    core.wait(core.store(keys(8), range(8)))
    core.close()
    # Blocks still in pinned memory die with the process; those evicted to disk survive.
    core = TransferCore(kv_tensors(), FP, cpu_bytes=2 * SLOT, tiers_json=tiers(tmp_path, True))
    try:
        hits = [k for k in keys(8) if core.stored_prefix([k]) == 1]
        assert len(hits) >= 6, f"only {len(hits)} of 8 blocks found after restart"
        idx = [int.from_bytes(k[-4:], "big") for k in hits]
        core.wait(core.load(hits, idx))
        for s, d in zip(src, core.tensors):
            assert torch.equal(s[idx].cpu(), d[idx].cpu())
    finally:
        core.close()
    other = Fingerprint(**{**FP.__dict__, "revision": "r2"})
    core = TransferCore(kv_tensors(), other, cpu_bytes=2 * SLOT,
                        tiers_json=tiers(tmp_path, True))
    try:
        assert [core.stored_prefix([k]) for k in keys(8)] == [0] * 8
    finally:
        core.close()


def test_block_ids_as_vllm_gives_them():
    """vLLM's GPULoadStoreSpec holds its block ids in a numpy int32 array; rows in any order
    land where the ids say, each block's row of every tensor together."""
    src = kv_tensors()
    fill(src, range(BLOCKS), seed=3)
    expected = [t.clone() for t in src]
    stored = np.array([5, 0, 11, 3], dtype=np.int32)
    core = TransferCore(src, FP, cpu_bytes=8 * SLOT)
    try:
        core.wait(core.store(keys(4), stored))
        for t in src:
            t.zero_()
        into = np.array([2, 15, 7, 9], dtype=np.int32)
        core.wait(core.load(keys(4), into))
        for want, t in zip(expected, src):
            for s, d in zip(stored, into):
                assert torch.equal(want[s].cpu(), t[d].cpu()), f"row {s} -> {d}"
            untouched = [r for r in range(BLOCKS) if r not in set(into.tolist())]
            assert not t[untouched].any(), "a load wrote rows it was not given"
        with pytest.raises(IndexError, match="block ids -1..2 outside a KV tensor of 16 blocks"):
            core.load(keys(2), np.array([2, -1], dtype=np.int32))
    finally:
        core.close()


def page_addresses(tensors, groups):
    """A transfer's pages in vLLM 0.34's DevicePointers order: for each group (rows, the
    tensor of each data ref), for each data ref, each block's page start."""
    out = []
    for rows, refs in groups:
        for t in refs:
            out += [tensors[t].data_ptr() + r * tensors[t].stride(0) for r in rows]
    return np.array(out, dtype=np.uint64)


def test_page_addresses_as_vllm_034_gives_them():
    """vLLM 0.34 hands the worker each page's address, ref major within each KV cache group,
    instead of block ids: they map back to the rows (block ids) they start, whatever order a
    group lists its tensors in; an address that starts no row, or refs of one block that name
    different rows, are refused and nothing is copied."""
    tensors = kv_tensors()
    core = TransferCore(tensors, FP, cpu_bytes=4 * SLOT)
    try:
        # Full attention's group lists the tensors in order, the sliding window's the other
        # way round; an empty group between them (no block of it in this transfer).
        layout = [[0, 1], [1, 0], [0, 1]]
        groups = [([5, 0], [0, 1]), ([], [1, 0]), ([11, 3, 15], [0, 1])]
        rows = core.rows_at(page_addresses(tensors, groups), [2, 0, 3], layout)
        assert rows.tolist() == [5, 0, 11, 3, 15]

        good = page_addresses(tensors, [([5, 0], [0, 1])])
        for bad, why in [
                (good + np.uint64(8), "not one row of each"),           # inside a page
                (np.concatenate([good[:2], good[2:][::-1]]), "not one row of each"),
                (good + np.uint64(BLOCKS * PAGE), "rows 16..21, outside KV tensors of 16"),
                (good[:3], "fewer than"),
                (np.append(good, good[0]), "5 page addresses for 4 pages")]:
            with pytest.raises(ValueError, match=why):
                core.rows_at(bad, [2], [[0, 1]])
        with pytest.raises(ValueError, match="no data refs"):
            core.rows_at(np.array([], dtype=np.uint64), [2], [[]])
    finally:
        core.close()


def test_mismatched_inputs_are_refused(tmp_path):
    core = TransferCore(kv_tensors(), FP, cpu_bytes=4 * PAGE)
    try:
        with pytest.raises(ValueError, match="2 block keys but 1 block ids"):
            core.store(keys(2), [0])
        with pytest.raises(IndexError, match="outside a KV tensor of 16 blocks"):
            core.store(keys(1), [16])
    finally:
        core.close()
    with pytest.raises(ValueError, match="different page sizes"):
        TransferCore([torch.zeros(4, PAGE, dtype=torch.uint8),
                      torch.zeros(4, 2 * PAGE, dtype=torch.uint8)], FP, cpu_bytes=PAGE)
