"""GPU check of the vLLM adapter's transfer core (offload-agent/python/kvoffload/transfer.py):
CUDA KV tensors -> pinned host -> disk -> back, bytes compared, bandwidth reported. Needs torch
with CUDA and a libkvoffload built with the cuda backend (KVOFFLOAD_LIBRARY); no vLLM.
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
        stats = core.engine.stats()
        result = {"describe": core.engine.describe(), "bytes": total, "identical": same,
                  "store_GBps": total / store_s / 1e9, "load_GBps": total / load_s / 1e9,
                  "disk_blocks": stats["tiers"][1]["blocks"] if len(stats["tiers"]) > 1 else 0,
                  "d2h_GBps": stats["d2h_bytes"] / max(stats["d2h_ns"], 1),
                  "h2d_GBps": stats["h2d_bytes"] / max(stats["h2d_ns"], 1)}
    finally:
        core.close()
    print(json.dumps(result, indent=2))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(result, f, indent=2)
    return 0 if same and result["disk_blocks"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
