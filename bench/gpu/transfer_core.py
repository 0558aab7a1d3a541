"""GPU check of the vLLM adapter's transfer core (offload-agent/python/kvoffload/transfer.py):
CUDA KV tensors -> pinned host -> disk -> back, bytes compared, bandwidth reported; then loads
of 4096-token prompts from the pinned tier into KV tensors shaped as vLLM gives them for
Llama-3-8B, timed against one cudaMemcpy of as many bytes. Needs torch with CUDA and a
libkvoffload built with the cuda backend (KVOFFLOAD_LIBRARY); no vLLM.
Usage: transfer_core.py SCRATCH_DIR [OUT_JSON]. Exits non-zero on any mismatch."""

import json
import sys
import time

import torch

from kvoffload.engine import Fingerprint
from kvoffload.transfer import TransferCore

PAGE = 256 * 1024   # bytes per block per tensor: a typical 16-token page of an 8B model layer
TENSORS = 4
BLOCKS = 512        # rows per tensor: 512 MiB of KV in all
CPU_BLOCKS = 256    # pinned tier holds half the blocks (one row of every tensor each)

# Llama-3-8B in bf16 as vLLM's canonical layout gives it to the connector: one tensor per
# layer for keys and one for values, a 16-token page of 8 KV heads x 128 a row: 32 KiB pieces,
# 64 of them (2 MiB) a block. A request of 4096 tokens is 256 blocks.
LAYERS, PAGE_TOKENS, KV_HEADS, HEAD_DIM = 32, 16, 8, 128
REQUEST_BLOCKS = 256
REQUESTS = 4
ROUNDS = 3


def best_s(fn, reps=3):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pinned_loads(fp) -> dict:
    """Each request's blocks stored, then loaded back from the pinned tier REQUESTS at a time,
    ROUNDS times; each load timed from the submit to its wait returning with the copies done."""
    rows = REQUESTS * REQUEST_BLOCKS
    tensors = [torch.randn((rows, PAGE_TOKENS, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16,
                           device="cuda") for _ in range(2 * LAYERS)]
    expected = [t.clone() for t in tensors]
    block = sum(t[0].numel() * t.element_size() for t in tensors)
    core = TransferCore(tensors, fp, cpu_bytes=rows * (block + (64 << 10)))
    keys = [b"vllm-shape" + i.to_bytes(8, "big") for i in range(rows)]
    requests = [range(r * REQUEST_BLOCKS, (r + 1) * REQUEST_BLOCKS) for r in range(REQUESTS)]
    try:
        stores, loads = [], []
        for ids in requests:
            t0 = time.perf_counter()
            core.wait(core.store([keys[i] for i in ids], ids))
            stores.append(time.perf_counter() - t0)
        for t in tensors:
            t.zero_()
        torch.cuda.synchronize()
        submits, spans = [], []
        for _ in range(ROUNDS):
            for ids in requests:
                h2d_ns = core.engine.stats()["h2d_ns"]
                t0 = time.perf_counter()
                job = core.load([keys[i] for i in ids], ids)
                submits.append(time.perf_counter() - t0)
                core.wait(job)
                loads.append(time.perf_counter() - t0)
                spans.append((core.engine.stats()["h2d_ns"] - h2d_ns) / 1e9)
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(expected, tensors))
        cpu_blocks = core.engine.stats()["tiers"][0]["blocks"]
    finally:
        core.close()
    request_bytes = REQUEST_BLOCKS * block
    host = torch.empty(request_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(request_bytes, dtype=torch.uint8, device="cuda")

    def one_copy():
        dev.copy_(host)
        torch.cuda.synchronize()
    ceiling_s = best_s(one_copy, 5)
    for times in (loads, submits, spans):
        times.sort()
    return {"layers": LAYERS, "tensors": len(tensors), "piece_bytes": block // len(tensors),
            "block_bytes": block, "request_blocks": REQUEST_BLOCKS, "loads": len(loads),
            "identical": same, "cpu_tier_blocks": cpu_blocks,
            "load_best_ms": loads[0] * 1e3, "load_median_ms": loads[len(loads) // 2] * 1e3,
            "store_best_ms": min(stores) * 1e3,
            # Of a load: the submit call (keys hashed, pointers listed, the job queued) and
            # the engine's copy span (first copy started to the last one waited).
            "submit_median_ms": submits[len(submits) // 2] * 1e3,
            "copy_span_best_ms": spans[0] * 1e3,
            "copy_span_median_ms": spans[len(spans) // 2] * 1e3,
            "ceiling_ms": ceiling_s * 1e3,
            "load_GiBps": request_bytes / loads[0] / (1 << 30),
            "load_median_GiBps": request_bytes / loads[len(loads) // 2] / (1 << 30),
            "store_GiBps": request_bytes / min(stores) / (1 << 30),
            "ceiling_GiBps": request_bytes / ceiling_s / (1 << 30)}


def main() -> int:
    scratch = sys.argv[1]
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    tensors = [torch.randint(-128, 128, (BLOCKS, PAGE), dtype=torch.int8, device="cuda")
               for _ in range(TENSORS)]
    expected = [t.clone() for t in tensors]
    tiers = json.dumps([{"path": scratch, "kind": "emptyDir", "capacityBytes": 4 * BLOCKS *
                         TENSORS * PAGE, "persistent": False, "shared": False}])
    fp = Fingerprint("bench/model", "", "int8", "gpu-check", 0)
    core = TransferCore(tensors, fp, cpu_bytes=CPU_BLOCKS * (TENSORS * PAGE + 4096),
                        tiers_json=tiers)
    keys = [i.to_bytes(8, "big") for i in range(BLOCKS)]
    total = BLOCKS * TENSORS * PAGE
    try:
        t0 = time.perf_counter()
        core.wait(core.store(keys, range(BLOCKS)))
        store_s = time.perf_counter() - t0
        for t in tensors:
            t.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        core.wait(core.load(keys, range(BLOCKS)))
        load_s = time.perf_counter() - t0
        same = all(torch.equal(a, b) for a, b in zip(expected, tensors))
        # A load lands after what was queued before it on the current stream: rows zeroed
        # there behind a long kernel must not overwrite the loaded bytes afterwards.
        torch.cuda._sleep(200_000_000)  # cycles: about 0.1 s
        for t in tensors:
            t[:8].zero_()
        core.wait(core.load(keys[:8], range(8)))
        torch.cuda.synchronize()
        ordered = all(torch.equal(a[:8], b[:8]) for a, b in zip(expected, tensors))
        # vLLM 0.34 names the GPU side by its pages' CUDA addresses (DevicePointers, ref
        # major, a numpy uint64 array): rows 8..15 that way, mapped back by rows_at.
        pages = torch.tensor([t.data_ptr() + r * t.stride(0) for t in tensors
                              for r in range(8, 16)], dtype=torch.int64).numpy().view("uint64")
        rows = core.rows_at(pages, [8], [list(range(TENSORS))])
        for t in tensors:
            t[8:16].zero_()
        core.wait(core.load(keys[8:16], rows))
        torch.cuda.synchronize()
        by_address = all(torch.equal(a[8:16], b[8:16]) for a, b in zip(expected, tensors))
        same = same and ordered and by_address
        stats = core.engine.stats()
        result = {"describe": core.engine.describe(), "bytes": total, "identical": same,
                  "load_after_queued_writes": ordered, "load_by_page_address": by_address,
                  "store_GBps": total / store_s / 1e9, "load_GBps": total / load_s / 1e9,
                  "disk_blocks": stats["tiers"][1]["blocks"] if len(stats["tiers"]) > 1 else 0,
                  "d2h_GBps": stats["d2h_bytes"] / max(stats["d2h_ns"], 1),
                  "h2d_GBps": stats["h2d_bytes"] / max(stats["h2d_ns"], 1)}
    finally:
        core.close()
    del tensors, expected
    torch.cuda.empty_cache()
    result["pinned_loads"] = pinned_loads(fp)
    same = same and result["pinned_loads"]["identical"]
    print(json.dumps(result, indent=2))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(result, f, indent=2)
    return 0 if same and result["disk_blocks"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
