#!/usr/bin/env python3
"""Reads rendered manifests (YAML, stdin) and prints the MutatingWebhookConfiguration as JSON with
each entry's clientConfig.service rewritten to a url on a local webhook process plus caBundle,
as controller-runtime's envtest does. Usage: webhook_config_for_url.py BASE_URL CA_FILE"""
import base64
import json
import sys

import yaml

base_url, ca_file = sys.argv[1].rstrip("/"), sys.argv[2]
with open(ca_file, "rb") as f:
    ca = base64.b64encode(f.read()).decode()
configs = [d for d in yaml.safe_load_all(sys.stdin)
           if d and d.get("kind") == "MutatingWebhookConfiguration"]
if len(configs) != 1:
    sys.exit(f"expected one MutatingWebhookConfiguration, found {len(configs)}")
cfg = configs[0]
for hook in cfg["webhooks"]:
    svc = hook["clientConfig"].pop("service", None)
    if svc is None:
        sys.exit(f"webhook {hook['name']} has no service reference to rewrite")
    hook["clientConfig"] = {"url": base_url + svc.get("path", "/"), "caBundle": ca}
json.dump(cfg, sys.stdout, indent=1)
