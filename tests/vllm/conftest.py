"""Shared fixtures of the vLLM adapter tests. run.sh sets KVOFFLOAD_LIBRARY to the build
tree's libkvoffload.so and PYTHONPATH to offload-agent/python."""

import json
import os
import pathlib
import sys

import pytest

from kvoffload.engine import DEFAULT_LIBRARY

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "webhook" / "testdata"
# The golden pod that agent mode produces by default: its env and --kv-transfer-config.
AGENT_CASE = "agent-mode-default"

# No adapter test may reach the Hugging Face hub (CI has no route to it). huggingface_hub reads
# this when first imported, so it is set here, before any test module imports vLLM.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session", autouse=True)
def library():
    path = os.environ.get("KVOFFLOAD_LIBRARY")
    assert path and os.path.isfile(path), (
        f"KVOFFLOAD_LIBRARY={path!r} is not a file; run through tests/vllm/run.sh")
    return path


def golden_container(case: str) -> dict:
    """The target container of a golden agent-mode pod, as the webhook patched it."""
    pod = json.loads((GOLDEN / f"{case}.patched.json").read_text())
    return pod["spec"]["containers"][0]


def golden_env(case: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in golden_container(case)["env"] if "value" in e}


def golden_kv_transfer_configs(case: str) -> list[dict]:
    """Every --kv-transfer-config vLLM receives when the golden pod's launch runs (bash and
    KServe's script with a stand-in vllm, hack/vllm_argv.py): not the text in args, which is
    quoted for the script's eval."""
    sys.path.insert(0, str(REPO / "hack"))
    import vllm_argv

    pod = json.loads((GOLDEN / f"{case}.patched.json").read_text())
    return vllm_argv.run(pod)["kvTransferConfigs"]


def golden_kv_transfer_config(case: str) -> dict:
    """The one --kv-transfer-config of the golden pod's vLLM (golden_kv_transfer_configs)."""
    got = golden_kv_transfer_configs(case)
    assert len(got) == 1 and "invalid" not in got[0], f"{case}: vLLM would receive {got}"
    return got[0]


def slot_bytes(block_bytes: int) -> int:
    """What one engine block of block_bytes occupies in pinned RAM and in a persistent or
    shared disk tier (a file per block): payload plus a 64-byte trailer, rounded up to 4 KiB
    (offload-agent/FORMAT.md)."""
    return -(-(block_bytes + 64) // 4096) * 4096


def tier_block_bytes(block_bytes: int, kind: str) -> int:
    """What one block occupies in a disk tier of this kind: an emptyDir or pvcSpec tier keeps
    the payload alone in a slot, rounded up to 4 KiB (FORMAT.md, Slot file); a pvcRef tier a
    block file."""
    return -(-block_bytes // 4096) * 4096 if kind in ("emptyDir", "pvcSpec") else \
        slot_bytes(block_bytes)


def scaled_env(tmp_path, monkeypatch, block_bytes: int, persistent_only=False) -> dict[str, str]:
    """The golden agent-mode pod's env, set in this process, with its tier paths moved under
    tmp_path and its sizes shrunk to a few vLLM blocks of block_bytes (10 GiB of pinned RAM
    would not fit a CI machine): pinned RAM holds 2 blocks, each disk tier 16, so a handful
    of stored blocks already cascades to disk. Names, kinds and flags stay."""
    env = golden_env(AGENT_CASE)
    tiers = json.loads(env["KVOFFLOAD_TIERS"])
    if persistent_only:
        tiers = [t for t in tiers if t["persistent"]]
    for i, t in enumerate(tiers):
        t["path"] = str(tmp_path / f"kv-cache-{i}")
        (tmp_path / f"kv-cache-{i}").mkdir(exist_ok=True)
        t["capacityBytes"] = 16 * slot_bytes(block_bytes)
    env["KVOFFLOAD_TIERS"] = json.dumps(tiers)
    env["KVOFFLOAD_CPU_BYTES"] = str(2 * slot_bytes(block_bytes))
    # Where agent mode installs the library and the package; here they come from the build
    # tree and the source tree (run.sh), so these two are checked, not applied.
    assert env.pop("KVOFFLOAD_LIBRARY") == DEFAULT_LIBRARY
    assert env.pop("PYTHONPATH").split(":")[0] == "/opt/kvoffload/python"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env
