"""Runs a pod's container command on this machine, as the kubelet would start it: command,
args and env taken from a pod manifest (a webhook golden), with each volumeMount's path
replaced by a host directory wherever it appears (command, args, env values). Nothing else
of the pod is interpreted, so the launch form does not matter: exec form, or KServe's
`bash -c SCRIPT --` that passes its arguments on. Also the lifecycle of a `vllm serve`
started that way (ready, served model name, SIGTERM), shared by test_entry_point.py and the
TTFT benchmark (bench/ttft)."""

import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]


def target_container(pod: dict) -> dict:
    """The container the webhook patches: annotation kvoffload.io/container, else the one
    named main, else the first."""
    containers = pod["spec"]["containers"]
    wanted = pod.get("metadata", {}).get("annotations", {}).get("kvoffload.io/container")
    for name in (wanted, "main"):
        for c in containers:
            if name is not None and c["name"] == name:
                return c
    return containers[0]


def _substitute(text: str, mounts: dict[str, str]) -> str:
    # Longest mount path first; a path matches only whole (/mnt/kv-cache-1 is not the start
    # of /mnt/kv-cache-10).
    for path in sorted(mounts, key=len, reverse=True):
        text = re.sub(re.escape(path) + r"(?![\w.-])", lambda _: mounts[path], text)
    return text


def host_launch(pod: dict, volumes: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and env of the target container with every volumeMount path replaced by the host
    directory given for its volume name. Every mounted volume needs one (KeyError naming it
    otherwise); env entries that use valueFrom have no value here and are refused."""
    c = target_container(pod)
    mounts = {}
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            raise KeyError(f"volumeMount {m['name']!r} at {m['mountPath']}: no host directory "
                           "given for it")
        mounts[m["mountPath"]] = volumes[m["name"]]
    argv = [_substitute(a, mounts) for a in c.get("command", []) + c.get("args", [])]
    env = {}
    for e in c.get("env", []):
        if "value" not in e:
            raise ValueError(f"env {e['name']}: valueFrom cannot be resolved outside a cluster")
        env[e["name"]] = _substitute(e["value"], mounts)
    return argv, env


def start(argv: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: a port the kernel hands
    out (bind to 0) can be taken again, as a connection's or a ZMQ socket's own port (vLLM's
    engine opens several), in the seconds before `vllm serve` binds it (EADDRINUSE in CI)."""
    low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(10000, low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in 10000-{low - 1} after 200 tries")


def stage_agent(dest: pathlib.Path) -> pathlib.Path:
    """`make agent-dist` into dest, from the build tree of the library in KVOFFLOAD_LIBRARY
    (the one the tests and the benchmark load); returns the staged /opt/kvoffload."""
    build = pathlib.Path(os.environ["KVOFFLOAD_LIBRARY"]).resolve().parents[1]
    subprocess.run([str(REPO / "hack" / "stage-agent.sh"), str(build), str(dest)], check=True,
                   capture_output=True)
    return dest / "opt" / "kvoffload"


def wait_ready(proc, port, log, timeout=420):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vllm serve exited {proc.returncode}:\n{log.read_text()[-6000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"vllm serve not ready after {timeout} s:\n{log.read_text()[-6000:]}")


def served_model(port) -> str:
    """A model name the pod's command line serves under, whatever the launch form (KServe's
    script serves the model under more than one name)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        models = json.loads(r.read())["data"]
    assert models, "vllm serve lists no model"
    return models[0]["id"]


def stop(proc, log, timeout=120) -> float:
    """SIGTERM, as the kubelet sends it; the seconds until the server exited."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"vllm serve ignored SIGTERM for {timeout} s:\n"
                             f"{log.read_text()[-6000:]}")
    assert rc == 0, f"vllm serve exited {rc} after SIGTERM:\n{log.read_text()[-6000:]}"
    return time.monotonic() - start
