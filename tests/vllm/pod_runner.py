"""Runs a pod's container command on this machine, as the kubelet would start it: command,
args and env taken from a pod manifest (a webhook golden), with each volumeMount's path
replaced by a host directory wherever it appears (command, args, env values). Nothing else
of the pod is interpreted, so the launch form does not matter: exec form, or KServe's
`bash -c SCRIPT --` that passes its arguments on."""

import re
import subprocess


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
