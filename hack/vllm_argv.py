#!/usr/bin/env python3
"""Runs a pod's vLLM container launch the way the container would, with a stand-in `vllm` on
PATH, and reports the argv vLLM receives and every --kv-transfer-config in it.

  hack/vllm_argv.py POD.json [--container NAME] [--vllm-version 0.32.0]

POD.json is a Pod as JSON (`kubectl get pod -o json`, `kv-offload-webhook inject` output, a
golden file); `-` reads stdin. What it does, as the kubelet and the container would:
- the container's env (literal values; `valueFrom` entries are left unset) and `$(VAR)`
  references in env, command and args expanded by Kubernetes' rules (`$$` is a literal `$`);
- command + args executed as they stand: `/bin/bash -c SCRIPT ...` runs the real bash;
  a container without `command` runs the vLLM image's entrypoint, `vllm serve`;
- `vllm` is a stand-in that answers `--version` and records its argv; `python3 -m vllm...`
  is recorded the same way, so the exec form of the OpenAI server module is covered too;
- `getent hosts NAME` answers 10.244.0.10 for every name, as a cluster's DNS would answer the
  LeaderWorkerSet leader's name that KServe's multi-node launch resolves.
Prints one JSON object: {"argv": [...], "kvTransferConfigs": [...], "exitCode": N, "output": S},
where each config is the parsed JSON, or {"invalid": TEXT} when vLLM could not parse it."""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

FLAGS = ("--kv-transfer-config", "--kv_transfer_config")
# The vllm/vllm-openai image's ENTRYPOINT.
IMAGE_ENTRYPOINT = ["vllm", "serve"]

STANDIN = r"""#!/bin/bash
# Stand-in for vLLM: answers --version, records its argv NUL-separated and exits.
if [[ "$1" == "--version" ]]; then echo "${VLLM_STANDIN_VERSION}"; exit 0; fi
printf '%s\0' "$@" > "${VLLM_STANDIN_RECORD}"
"""
PYTHON_STANDIN = r"""#!/bin/bash
# python3 -m vllm.<module> ARGS is recorded as vLLM's argv; anything else runs the real python.
if [[ "$1" == "-m" && "$2" == vllm* ]]; then
  shift 2; printf '%s\0' "serve-module" "$@" > "${VLLM_STANDIN_RECORD}"; exit 0
fi
exec /usr/bin/python3 "$@"
"""

# KServe's multi-node launch resolves its LeaderWorkerSet leader's name (LWS_LEADER_ADDRESS)
# with getent, retrying for 30 s: no cluster DNS here, so every host name has one address.
GETENT_STANDIN = r"""#!/bin/bash
if [[ "$1" == hosts && $# -eq 2 ]]; then echo "10.244.0.10     $2"; exit 0; fi
exec /usr/bin/getent "$@"
"""

_VAR = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")


def expand(text: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, `$$` becomes `$`, the rest
    stays as written."""
    def sub(m):
        if m.group(1) == "$":
            return "$"
        return env.get(m.group(2), m.group(0))
    return _VAR.sub(sub, text)


def target_container(pod: dict, name: str | None) -> dict:
    containers = pod["spec"]["containers"]
    wanted = name or pod["metadata"].get("annotations", {}).get("kvoffload.io/container")
    for c in containers:
        if c["name"] == (wanted or "main"):
            return c
    if wanted:
        raise SystemExit(f"vllm_argv: no container named {wanted!r}")
    return containers[0]


def kv_transfer_configs(argv: list[str]) -> list:
    configs = []
    for i, a in enumerate(argv):
        value = None
        for f in FLAGS:
            if a == f:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            elif a.startswith(f + "="):
                value = a[len(f) + 1:]
        if value is None:
            continue
        try:
            configs.append(json.loads(value))
        except json.JSONDecodeError:
            configs.append({"invalid": value})
    return configs


def run(pod: dict, container: str | None = None, vllm_version: str = "0.32.0",
        env_from: dict | None = None, timeout: float = 30) -> dict:
    """`env_from`: what the container's envFrom sources hold (a ConfigMap, a Secret), which the
    pod does not show; its env entries override them, as the kubelet's do. `timeout`: seconds
    the launch may run before subprocess.TimeoutExpired is raised (a launch that waits for
    something the stand-in never gives would otherwise hang its caller)."""
    c = target_container(pod, container)
    env = dict(env_from or {})
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
    argv = [expand(a, env) for a in (c.get("command") or IMAGE_ENTRYPOINT) + c.get("args", [])]
    with tempfile.TemporaryDirectory(prefix="vllm-argv-") as tmp:
        bindir = pathlib.Path(tmp, "bin")
        bindir.mkdir()
        for name, text in (("vllm", STANDIN), ("python3", PYTHON_STANDIN),
                           ("python", PYTHON_STANDIN), ("getent", GETENT_STANDIN)):
            (bindir / name).write_text(text)
            (bindir / name).chmod(0o755)
        record = pathlib.Path(tmp, "argv")
        proc_env = dict(env, PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin", HOME=tmp,
                        VLLM_STANDIN_RECORD=str(record), VLLM_STANDIN_VERSION=vllm_version)
        proc = subprocess.run(argv, env=proc_env, cwd=tmp, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        got = record.read_text().split("\0")[:-1] if record.exists() else None
    return {"argv": got, "kvTransferConfigs": kv_transfer_configs(got or []),
            "exitCode": proc.returncode, "output": proc.stdout + proc.stderr}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pod")
    p.add_argument("--container")
    p.add_argument("--vllm-version", default="0.32.0")
    a = p.parse_args()
    text = sys.stdin.read() if a.pod == "-" else pathlib.Path(a.pod).read_text()
    result = run(json.loads(text), a.container, a.vllm_version)
    print(json.dumps(result, indent=2))
    return 0 if result["argv"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
