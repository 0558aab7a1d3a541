#!/usr/bin/env python3
"""Reads rendered manifests (YAML, stdin) and prints the webhook configurations (the mutating one
and the validating one) as a JSON List with each entry's clientConfig.service rewritten to a url
on a local webhook process plus caBundle, as controller-runtime's envtest does.
The validating configuration is installed as kv-offload-webhook-local: case 10 server-side
dry-runs the rendered manifests, and an entry with both the installed url and the rendered
service is invalid, so the rendered one must not merge into the installed one.
Usage: webhook_config_for_url.py BASE_URL CA_FILE"""
import base64
import json
import sys

import yaml

base_url, ca_file = sys.argv[1].rstrip("/"), sys.argv[2]
with open(ca_file, "rb") as f:
    ca = base64.b64encode(f.read()).decode()
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
configs = []
for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        sys.exit(f"expected one {kind}, found {len(found)}")
    configs.append(found[0])
for cfg in configs:
    for hook in cfg["webhooks"]:
        svc = hook["clientConfig"].pop("service", None)
        if svc is None:
            sys.exit(f"webhook {hook['name']} has no service reference to rewrite")
        hook["clientConfig"] = {"url": base_url + svc.get("path", "/"), "caBundle": ca}
configs[1]["metadata"]["name"] += "-local"
json.dump({"apiVersion": "v1", "kind": "List", "items": configs}, sys.stdout, indent=1)
