#!/usr/bin/env python3
"""An emptyDir tier filled by the agent stays under the sizeLimit the kubelet enforces.

The webhook injects an agent-mode pod with a 32Mi emptyDir tier; the agent, configured from that
pod's own KVOFFLOAD_* env, stores twice the tier's size in 4 KiB blocks (the smallest). Then,
while the engine is open (a clean close removes an emptyDir tier's slot file), `du -sb` (apparent
bytes) and `du -sB1` (allocated bytes, what the kubelet's du-based accounting counts) of the
tier stay under sizeLimit, while the tier is full to within one block of its capacityBytes. A
control run with capacityBytes = sizeLimit (no headroom) goes over: the check can fail.

  tier_size_limit_test.py WEBHOOK_BINARY LIBKVOFFLOAD SCRATCH_DIR
Needs a real disk file system (ext4) for SCRATCH_DIR, as the agent's tiers use."""

import ctypes
import json
import os
import pathlib
import shutil
import subprocess
import sys
import unittest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "offload-agent" / "python"))

WEBHOOK, SCRATCH = "", pathlib.Path()
SIZE_LIMIT = "32Mi"
SIZE_LIMIT_BYTES = 32 << 20
BLOCK = 4096 - 64  # payload + the 64-byte trailer = one 4 KiB file
BATCH = 256


def injected_env() -> dict:
    spec = {"cpu": "1Mi", "secondary": [{"fileSystem": {"emptyDir": {"size": SIZE_LIMIT}}}]}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "fill", "annotations": {"kvoffload.io/config": json.dumps(spec),
                                                        "kvoffload.io/vllm": "true"}},
           "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.33.0",
                                    "args": ["--model", "/mnt/models"]}]}}
    out = subprocess.run([WEBHOOK, "inject", "-f", "-", "--default-mode=agent"],
                         input=json.dumps(pod), capture_output=True, text=True, check=True)
    patched = json.loads(out.stdout)
    assert patched["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == SIZE_LIMIT
    return {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]
            if "value" in e}


def du(path: pathlib.Path, *flags: str) -> int:
    out = subprocess.run(["du", "-s", *flags, str(path)], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[0])


def fill(tier_dir: pathlib.Path, env: dict) -> dict:
    """Stores 2 x sizeLimit of blocks through an engine made from the pod's env, with the tier
    moved from /mnt/kv-cache-0 to tier_dir; measures the tier before the engine closes."""
    from kvoffload import settings
    from kvoffload.engine import Engine, EngineOptions, Fingerprint
    env = dict(env, KVOFFLOAD_TIERS=env["KVOFFLOAD_TIERS"].replace("/mnt/kv-cache-0",
                                                                   str(tier_dir)))
    s = settings.from_env(env)
    tier_dir.mkdir(exist_ok=True)  # the tier's volume: libkvoffload refuses a missing one
    opts = EngineOptions(block_bytes=BLOCK, cpu_bytes=s.cpu_bytes,
                         eviction_policy=s.eviction_policy, tiers_json=s.tiers_json(),
                         fingerprint=Fingerprint("fill/model", "r1", "uint8", "test", 0))
    buf = ctypes.create_string_buffer(BLOCK * BATCH)
    base = ctypes.addressof(buf)
    n_blocks = 2 * SIZE_LIMIT_BYTES // 4096
    with Engine(opts) as engine:
        for first in range(0, n_blocks, BATCH):
            keys = [(7, first + i) for i in range(BATCH)]
            engine.wait(engine.store(keys, [base + i * BLOCK for i in range(BATCH)]))
        return {"capacity": s.tiers[0].capacity_bytes, "stats": engine.stats(),
                "apparent": du(tier_dir, "-b"), "allocated": du(tier_dir, "-B1"),
                "used": engine.stats()["tiers"][1]["used_bytes"]}


class TierSizeLimitTest(unittest.TestCase):
    def setUp(self):
        self.dir = SCRATCH / "tier_size_limit"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_filled_tier_stays_under_size_limit(self):
        env = injected_env()
        got = fill(self.dir / "tier", env)
        capacity = got["capacity"]
        self.assertLess(capacity, SIZE_LIMIT_BYTES)
        apparent, allocated = got["apparent"], got["allocated"]
        print(f"sizeLimit {SIZE_LIMIT_BYTES}, capacityBytes {capacity}, du -sb {apparent}, "
              f"du -sB1 {allocated}, blocks' bytes {got['used']}")
        # Full: its blocks reach capacity to within one block, and are on disk.
        self.assertGreater(got["used"], capacity - 4096)
        self.assertGreaterEqual(allocated, got["used"])
        self.assertLess(apparent, SIZE_LIMIT_BYTES)
        self.assertLess(allocated, SIZE_LIMIT_BYTES)

    def test_without_headroom_du_passes_size_limit(self):
        env = injected_env()
        tiers = json.loads(env["KVOFFLOAD_TIERS"])
        tiers[0]["capacityBytes"] = SIZE_LIMIT_BYTES
        got = fill(self.dir / "tier", dict(env, KVOFFLOAD_TIERS=json.dumps(tiers)))
        self.assertGreater(got["apparent"], SIZE_LIMIT_BYTES)


if __name__ == "__main__":
    WEBHOOK, lib, SCRATCH = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]).resolve()
    os.environ["KVOFFLOAD_LIBRARY"] = lib
    del sys.argv[1:4]
    unittest.main(verbosity=2)
