#!/usr/bin/env python3
"""hack/oci-image.py: the archive is an OCI image layout whose digests hold, its layers are the
given trees owned by root with their modes, and its configuration is what the Dockerfiles that
`make images` uses say (so the node's images run like the docker-built ones)."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "hack", "oci-image.py")


def build(tmp, *args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, cwd=tmp)


class OciImageTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.base = os.path.join(self.tmp, "base")
        self.payload = os.path.join(self.tmp, "payload")
        os.makedirs(os.path.join(self.base, "lib"))
        with open(os.path.join(self.base, "lib", "libc.so.6"), "wb") as f:
            f.write(b"not really glibc")
        os.makedirs(os.path.join(self.payload, "usr", "local", "bin"))
        exe = os.path.join(self.payload, "usr", "local", "bin", "kv-offload-webhook")
        with open(exe, "wb") as f:
            f.write(b"#!/bin/false\n")
        os.chmod(exe, 0o755)
        os.symlink("kv-offload-webhook", os.path.join(self.payload, "usr", "local", "bin", "alias"))

    def tearDown(self):
        self._tmp.cleanup()

    def archive(self, dockerfile, *extra):
        out = os.path.join(self.tmp, "img.oci.tar")
        r = build(self.tmp, "--name", "docker.io/kv-offload/webhook:t", "--dockerfile",
                  os.path.join(REPO, dockerfile), "--layer", self.base, "--layer", self.payload,
                  "--out", out, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        blobs = {}
        with tarfile.open(out) as t:
            names = t.getnames()
            self.assertIn("oci-layout", names)
            index = json.load(t.extractfile("index.json"))
            for m in t.getmembers():
                if m.isfile() and m.name.startswith("blobs/sha256/"):
                    data = t.extractfile(m).read()
                    # Content addressing holds for every blob.
                    self.assertEqual(hashlib.sha256(data).hexdigest(), m.name.rsplit("/", 1)[1])
                    blobs["sha256:" + m.name.rsplit("/", 1)[1]] = data
        (desc,) = index["manifests"]
        self.assertEqual(desc["annotations"]["io.containerd.image.name"], "docker.io/kv-offload/webhook:t")
        self.assertEqual(desc["platform"], {"architecture": "amd64", "os": "linux"})
        manifest = json.loads(blobs[desc["digest"]])
        config = json.loads(blobs[manifest["config"]["digest"]])
        layers = [blobs[l["digest"]] for l in manifest["layers"]]
        self.assertEqual(config["rootfs"]["diff_ids"], [l["digest"] for l in manifest["layers"]])
        return config["config"], layers

    def test_webhook_config_comes_from_its_dockerfile(self):
        cfg, layers = self.archive("webhook/Dockerfile")
        self.assertEqual(cfg["Entrypoint"], ["/usr/local/bin/kv-offload-webhook"])
        self.assertEqual(cfg["Cmd"], ["serve"])
        self.assertEqual(cfg["User"], "65532:65532")
        self.assertIn("LD_LIBRARY_PATH=/usr/local/lib/kv-offload", cfg["Env"])
        self.assertTrue(any(e.startswith("PATH=") for e in cfg["Env"]))
        self.assertEqual(sorted(cfg["ExposedPorts"]), ["8443/tcp", "9090/tcp"])
        self.assertEqual(len(layers), 2)

    def test_agent_config_comes_from_its_dockerfile(self):
        cfg, _ = self.archive("offload-agent/Dockerfile")
        self.assertEqual(cfg["Entrypoint"], ["/opt/kvoffload/bin/kvoffload-install"])
        self.assertEqual(cfg["Cmd"], ["/kvoffload-dest"])
        self.assertEqual(cfg["User"], "65532:65532")

    def test_layers_hold_the_trees_root_owned_with_modes_and_links(self):
        _, layers = self.archive("webhook/Dockerfile")
        path = os.path.join(self.tmp, "layer.tar")
        with open(path, "wb") as f:
            f.write(layers[1])
        with tarfile.open(path) as t:
            exe = t.getmember("usr/local/bin/kv-offload-webhook")
            self.assertEqual((exe.uid, exe.gid, exe.mode & 0o777), (0, 0, 0o755))
            self.assertEqual(t.extractfile(exe).read(), b"#!/bin/false\n")
            link = t.getmember("usr/local/bin/alias")
            self.assertTrue(link.issym())
            self.assertEqual(link.linkname, "kv-offload-webhook")

    def test_flags_override_the_dockerfile(self):
        cfg, _ = self.archive("webhook/Dockerfile", "--entrypoint", '["/pause"]', "--user", "65535",
                              "--env", "LD_LIBRARY_PATH=/x")
        self.assertEqual(cfg["Entrypoint"], ["/pause"])
        self.assertEqual(cfg["User"], "65535")
        self.assertEqual([e for e in cfg["Env"] if e.startswith("LD_LIBRARY_PATH=")], ["LD_LIBRARY_PATH=/x"])

    def test_bad_input_names_the_flag_and_the_value(self):
        out = os.path.join(self.tmp, "x.tar")
        r = build(self.tmp, "--name", "kv-offload/webhook", "--layer", self.base, "--out", out)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--name 'kv-offload/webhook'", r.stderr)
        r = build(self.tmp, "--name", "docker.io/a/b:t", "--layer", os.path.join(self.tmp, "nope"),
                  "--out", out)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--layer", r.stderr)
        self.assertIn("not a directory", r.stderr)
        r = build(self.tmp, "--name", "docker.io/a/b:t", "--layer", self.base, "--entrypoint",
                  "/pause", "--out", out)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--entrypoint '/pause': want a JSON array", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
