"""Shared fixtures of the vLLM adapter tests. run.sh sets KVOFFLOAD_LIBRARY to the build
tree's libkvoffload.so and PYTHONPATH to offload-agent/python."""

import json
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "webhook" / "testdata"


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


def golden_kv_transfer_config(case: str) -> dict:
    flag = "--kv-transfer-config="
    args = [a for a in golden_container(case)["args"] if a.startswith(flag)]
    assert len(args) == 1, f"{case}: want one {flag} arg, got {args}"
    return json.loads(args[0][len(flag):])
