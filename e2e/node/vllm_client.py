#!/usr/bin/env python3
"""The client side of case 33: OpenAI API requests to a pod running the real `vllm serve`.

  vllm_client.py URL DOCS

Waits for URL/health, then asks one question about each of DOCS documents, twice in a row
(tests/vllm/tiny_model.py: each document is PREFIX_BLOCKS full blocks, the question a partial
block that is never offloaded). The pod's command line caps vLLM's own KV cache below one
round's blocks, so by the second round every document has left vLLM's cache and its prefix can
only come back through the connector. Prints one line, "KVOFFLOAD-E2E-VLLM <json>", with each
round's texts and cached tokens, vLLM's counters of tokens the connector supplied, and
`failures`: what did not hold (the case asserts it is empty).

Standard library only: it runs with the host's Python, beside the cluster, not in the venv."""

import json
import pathlib
import re
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "vllm"))
import tiny_model  # noqa: E402  (prompt_text needs no torch)


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_ready(base, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(f"{base}/health", 2)
            return
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise SystemExit(f"vllm_client: {base}/health not answering after {timeout} s")
            time.sleep(1)


def complete(base, model, doc):
    body = json.dumps({"model": model, "prompt": tiny_model.prompt_text(doc, 0), "max_tokens": 4,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    details = out["usage"].get("prompt_tokens_details") or {}
    return out["choices"][0]["text"], details.get("cached_tokens", 0)


def counter(metrics, name):
    """The sum of a Prometheus counter over its label sets."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(metrics))


def main():
    base, docs = sys.argv[1].rstrip("/"), int(sys.argv[2])
    wait_ready(base, 600)
    model = json.loads(get(f"{base}/v1/models"))["data"][0]["id"]
    rounds = [[complete(base, model, d) for d in range(docs)] for _ in range(2)]
    metrics = get(f"{base}/metrics")
    prefix = tiny_model.PREFIX_BLOCKS * tiny_model.TOKENS_PER_BLOCK
    result = {
        "model": model,
        "texts": [[t for t, _ in r] for r in rounds],
        "cachedTokens": [[c for _, c in r] for r in rounds],
        "externalQueries": counter(metrics, "vllm:external_prefix_cache_queries_total"),
        "externalHits": counter(metrics, "vllm:external_prefix_cache_hits_total"),
        "prefixTokens": prefix,
    }
    failures = []
    if result["cachedTokens"][0] != [0] * docs:
        failures.append("the first round found cached tokens in a fresh server")
    if result["cachedTokens"][1] != [prefix] * docs:
        failures.append(f"the second round did not get every {prefix}-token prefix back")
    if result["texts"][1] != result["texts"][0]:
        failures.append("completions with loaded KV differ from the computed ones")
    if result["externalHits"] != prefix * docs:
        failures.append(f"the connector supplied {result['externalHits']:g} tokens, "
                        f"not the {prefix * docs} of the second round's prefixes")
    result["failures"] = failures
    print("KVOFFLOAD-E2E-VLLM " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
