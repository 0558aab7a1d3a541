#!/usr/bin/env python3
"""Writes an OCI image archive (an image layout in one tar, as `ctr images import` and
`podman load` read it) from directories, without a registry or a container engine.

    oci-image.py --name docker.io/kv-offload/webhook:e2e --dockerfile webhook/Dockerfile \
        --layer ROOTFS_DIR --layer dist/webhook --out webhook.oci.tar

Each --layer directory becomes one uncompressed layer, in order, every file owned by root (the
image's USER decides who runs). The image configuration (Env, User, WorkingDir, Entrypoint,
Cmd, ExposedPorts) is read from the last stage of --dockerfile, so the archive runs like the
image `make images` builds from the same staged trees; --entrypoint/--cmd/--env/--user, when
given, replace what the Dockerfile says (for test-only images that have no Dockerfile).
"""

import argparse
import hashlib
import io
import json
import os
import shlex
import sys
import tarfile
import tempfile


def die(msg):
    sys.exit(f"oci-image: error: {msg}")


def dockerfile_config(path):
    """Env, User, WorkingDir, Entrypoint, Cmd and ExposedPorts of the last stage."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        die(f"--dockerfile {path}: {e.strerror}")
    # Join continuation lines, drop comments and parser directives.
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    stages = [i for i, l in enumerate(lines) if l.split(None, 1)[0].upper() == "FROM"]
    if not stages:
        die(f"--dockerfile {path}: no FROM line")
    cfg = {"Env": []}
    for line in lines[stages[-1] + 1:]:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ENV":
            # ENV k=v [k=v...] (the legacy "ENV k v" form too).
            parts = shlex.split(rest)
            if parts and "=" not in parts[0]:
                parts = [f"{parts[0]}={' '.join(parts[1:])}"]
            for p in parts:
                name = p.split("=", 1)[0]
                cfg["Env"] = [e for e in cfg["Env"] if e.split("=", 1)[0] != name] + [p]
        elif word == "USER":
            cfg["User"] = rest
        elif word == "WORKDIR":
            cfg["WorkingDir"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                die(f"--dockerfile {path}: {word} must use the JSON (exec) form, got: {rest}")
            cfg["Entrypoint" if word == "ENTRYPOINT" else "Cmd"] = value
        elif word == "EXPOSE":
            for port in rest.split():
                cfg.setdefault("ExposedPorts", {})[port if "/" in port else f"{port}/tcp"] = {}
    return cfg


def _root_owned(info):
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_layer(directory, out):
    """Tars directory's contents (paths relative to it) into out; returns (digest, size)."""
    if not os.path.isdir(directory):
        die(f"--layer {directory}: not a directory")
    h = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            h.update(b)
            out.write(b)
            return len(b)

    with tarfile.open(fileobj=Hashing(), mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(directory)):
            tar.add(os.path.join(directory, entry), arcname=entry, filter=_root_owned)
    out.flush()
    return "sha256:" + h.hexdigest(), out.tell()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="full reference, e.g. docker.io/x/y:tag")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layer", action="append", default=[], help="directory, repeatable")
    ap.add_argument("--dockerfile")
    ap.add_argument("--entrypoint", help="JSON array")
    ap.add_argument("--cmd", help="JSON array")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE, repeatable")
    ap.add_argument("--user")
    a = ap.parse_args()
    if not a.layer:
        die("at least one --layer is needed")
    if "/" not in a.name or ":" not in a.name.rsplit("/", 1)[-1]:
        die(f"--name {a.name!r}: want a full reference with a tag (docker.io/kv-offload/x:tag)")

    cfg = dockerfile_config(a.dockerfile) if a.dockerfile else {"Env": []}
    for flag in ("entrypoint", "cmd"):
        v = getattr(a, flag)
        if v is not None:
            try:
                cfg[flag.capitalize() if flag == "cmd" else "Entrypoint"] = json.loads(v)
            except json.JSONDecodeError:
                die(f"--{flag} {v!r}: want a JSON array")
    for e in a.env:
        if "=" not in e:
            die(f"--env {e!r}: want NAME=VALUE")
        cfg["Env"] = [x for x in cfg["Env"] if x.split("=", 1)[0] != e.split("=", 1)[0]] + [e]
    if a.user is not None:
        cfg["User"] = a.user
    if not any(x.startswith("PATH=") for x in cfg["Env"]):
        cfg["Env"].insert(0, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.out))) as tmp:
        blobs = os.path.join(tmp, "blobs", "sha256")
        os.makedirs(blobs)

        def put(data):
            d = hashlib.sha256(data).hexdigest()
            with open(os.path.join(blobs, d), "wb") as f:
                f.write(data)
            return {"digest": "sha256:" + d, "size": len(data)}

        layers = []
        for i, d in enumerate(a.layer):
            part = os.path.join(tmp, f"layer{i}.tar")
            with open(part, "wb") as f:
                digest, size = write_layer(d, f)
            os.rename(part, os.path.join(blobs, digest.split(":")[1]))
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                           "digest": digest, "size": size})
        config = {"architecture": "amd64", "os": "linux", "config": cfg,
                  "rootfs": {"type": "layers", "diff_ids": [l["digest"] for l in layers]}}
        cdesc = put(json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cdesc},
                    "layers": layers}
        mdesc = put(json.dumps(manifest, sort_keys=True).encode())
        # containerd reads the full name from its own annotation; other readers take the tag.
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                **mdesc, "platform": {"architecture": "amd64", "os": "linux"},
                                "annotations": {
                                    "io.containerd.image.name": a.name,
                                    "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[1]}}]}
        with open(os.path.join(tmp, "index.json"), "w") as f:
            json.dump(index, f)
        with open(os.path.join(tmp, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        with tarfile.open(a.out + ".tmp", "w", format=tarfile.PAX_FORMAT) as tar:
            for entry in ("oci-layout", "index.json", "blobs"):
                tar.add(os.path.join(tmp, entry), arcname=entry, filter=_root_owned)
        os.replace(a.out + ".tmp", a.out)
    print(f"oci-image: {a.name} -> {a.out} ({len(layers)} layers)")


if __name__ == "__main__":
    main()
