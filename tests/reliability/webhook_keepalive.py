#!/usr/bin/env python3
"""Who closes an idle keep-alive connection: the webhook or the API server's HTTP client.

The API server reaches webhooks through client-go transports, which keep Go's defaults:
keep-alive connections, closed after 90 s idle (IdleConnTimeout). A webhook that closes an idle
connection first races the client's next request on it; Go does not resend a POST it has
written, so that admission fails (the pod is refused, or with failurePolicy Ignore starts
without offloading). The webhook's --idle-timeout (120 s) is therefore above 90 s.

Both orders are run through Go's real client (keepalive/main.go), time scaled down a
thousandfold, with requests spaced around the deadlines so that every gap is a chance to race:
  server-first  the webhook's idle deadline is the shorter one (as with a 5 s one):
                the control, which must see failures, or the run proves nothing
  client-first  client idle 90 ms, webhook idle 120 ms (the defaults' order): 0 failures
Prints one JSON object; exits 1 when client-first fails any request or the control fails none.
usage: webhook_keepalive.py BINARY [--requests 1000]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import trial_args  # beside this file

from webhook_hostile import free_port, make_pki, review_body, wait_listening

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# name: (webhook --idle-timeout, client IdleConnTimeout, shortest gap, longest gap)
SCENARIOS = {
    "server-first": ("100ms", "90s", "99ms", "101500us"),
    "client-first": ("120ms", "90ms", "80ms", "130ms"),
}


def build_client(out):
    go_bin = subprocess.run([ROOT / "hack" / "go-toolchain.sh"], check=True, capture_output=True,
                            text=True).stdout.strip()
    subprocess.run([f"{go_bin}/go", "build", "-o", out, "."], cwd=HERE / "keepalive", check=True,
                   env={"PATH": f"{go_bin}:/usr/bin:/bin", "HOME": str(pathlib.Path.home()),
                        "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"})


def run(binary, client, d, body_file, name, requests):
    idle, client_idle, gap_min, gap_max = SCENARIOS[name]
    port = free_port()
    proc = subprocess.Popen([binary, "serve", "--bind-address=127.0.0.1", f"--port={port}",
                             "--metrics-port=-1", f"--tls-cert-file={d}/tls.crt",
                             f"--tls-key-file={d}/tls.key", "--log-level=error",
                             "--shutdown-delay=0s", f"--idle-timeout={idle}"])
    try:
        wait_listening(port)
        out = subprocess.run([client, f"--url=https://127.0.0.1:{port}/mutate-pods",
                              f"--ca={d}/tls.crt", f"--body={body_file}", f"--gap-min={gap_min}",
                              f"--gap-max={gap_max}", f"--requests={requests}",
                              f"--client-idle={client_idle}"],
                             check=True, capture_output=True, text=True).stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = json.loads(out)
    result.update({"scenario": name, "webhook_idle": idle})
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", type=trial_args.webhook_binary)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        make_pki(d)
        body_file = f"{d}/review.json"
        pathlib.Path(body_file).write_bytes(review_body())
        client = f"{d}/keepalive"
        build_client(client)
        results = {name: run(args.binary, client, d, body_file, name, args.requests)
                   for name in SCENARIOS}
    failures = []
    if results["client-first"]["failed"]:
        failures.append(f"client-first: {results['client-first']['failed']} failed admissions")
    if not results["server-first"]["failed"]:
        failures.append("server-first: no admission failed, so the race was not exercised")
    print(json.dumps({"scenarios": list(results.values()), "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
