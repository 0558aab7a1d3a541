#!/usr/bin/env python3
"""Webhook under load and faults, against the real binary.

Phase 1: N admissions at concurrency C while the serving certificate is replaced every
ROTATE seconds; each client reconnects every RECONNECT requests so that handshakes happen
throughout, against old and new certificates. Counts failed requests, failed handshakes, and
the server's RSS after warm-up and at the end.
Phase 2: SIGTERM during load. A poller watches /readyz; clients keep sending for one second
after it reports not ready (endpoint propagation), then stop, as the API server does once the
endpoint is gone. Every request sent must succeed, and readiness must turn false before the
listener closes.

Prints one JSON object; exits 1 when a criterion fails.
usage: webhook_load.py BINARY [--requests 100000] [--concurrency 64] [--rotate 10]
"""
import argparse
import http.client
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import trial_args  # beside this file

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "webhook" / "testdata"


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_pki(d):
    """A CA and `n` serving certificates for 127.0.0.1 signed by it (rotation targets)."""
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "1", "-subj", "/CN=load-ca")


def issue(d, i):
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", f"{d}/s{i}.key", "-out", f"{d}/s{i}.csr", "-subj", f"/CN=webhook-{i}")
    with open(f"{d}/ext", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    sh("openssl", "x509", "-req", "-in", f"{d}/s{i}.csr", "-CA", f"{d}/ca.crt", "-CAkey",
       f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/s{i}.crt", "-days", "1",
       "-extfile", f"{d}/ext")


def install(d, i):
    """Atomically replaces the served pair, as a kubelet Secret update does (rename)."""
    for ext in ("crt", "key"):
        tmp = f"{d}/tls.{ext}.new"
        with open(f"{d}/s{i}.{ext}", "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.rename(tmp, f"{d}/tls.{ext}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def review_body():
    pod = json.loads((TESTDATA / "annotation-emptydir.pod.json").read_text())
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "load", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "default", "operation": "CREATE", "object": pod}}).encode()


def start(binary, d, port, delay):
    proc = subprocess.Popen([binary, "serve", f"--port={port}", "--metrics-port=-1",
                             f"--tls-cert-file={d}/tls.crt", f"--tls-key-file={d}/tls.key",
                             "--cert-reload-interval=1s", f"--shutdown-delay={delay}",
                             "--default-mode=agent", "--agent-image=registry.example/agent:1",
                             "--log-level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(f"{d}/webhook.log", "ab"))
    ctx = client_context(d)
    for _ in range(200):
        try:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("webhook did not become ready; see " + f"{d}/webhook.log")


def client_context(d):
    ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
    ctx.check_hostname = False  # the SAN is an IP; the CA pins who may answer
    return ctx


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = self.failed = self.handshakes = self.failed_handshakes = self.sent = 0
        self.errors = {}

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def error(self, what):
        with self.lock:
            self.errors[what] = self.errors.get(what, 0) + 1


def client(port, ctx, body, next_index, total, reconnect, counters, stop):
    conn, used = None, 0
    while not stop.is_set():
        if next_index() >= total:
            break
        if conn is None or used >= reconnect:
            if conn is not None:
                conn.close()
            conn, used = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10), 0
            try:
                conn.connect()
                counters.add(handshakes=1)
            except (OSError, ssl.SSLError) as e:
                counters.add(handshakes=1, failed_handshakes=1)
                counters.error(f"handshake: {type(e).__name__}: {e}")
                conn = None
                continue
        used += 1
        counters.add(sent=1)
        try:
            conn.request("POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status == 200 and b'"allowed":true' in data and b'"patch"' in data:
                counters.add(ok=1)
            else:
                counters.add(failed=1)
                counters.error(f"status {r.status}: {data[:200]!r}")
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            counters.add(failed=1)
            counters.error(f"request: {type(e).__name__}: {e}")
            conn = None
    if conn is not None:
        conn.close()


def run_clients(port, ctx, body, total, concurrency, reconnect, counters, stop):
    lock, state = threading.Lock(), {"i": 0}

    def next_index():
        with lock:
            state["i"] += 1
            return state["i"] - 1
    threads = [threading.Thread(target=client, args=(port, ctx, body, next_index, total, reconnect,
                                                     counters, stop)) for _ in range(concurrency)]
    for t in threads:
        t.start()
    return threads


def phase_rotation(binary, d, args):
    port = free_port()
    proc = start(binary, d, port, "1s")
    ctx, body, counters, stop = client_context(d), review_body(), Counters(), threading.Event()
    # Warm-up: the allocator's steady state, so growth measures leaks, not first use.
    warm = run_clients(port, ctx, body, 5000, args.concurrency, args.reconnect, Counters(), stop)
    for t in warm:
        t.join()
    rss_start = rss_kib(proc.pid)
    begin = time.monotonic()
    threads = run_clients(port, ctx, body, args.requests, args.concurrency, args.reconnect, counters, stop)
    rotations, rss_peak = 0, rss_start
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        rss_peak = max(rss_peak, rss_kib(proc.pid))
        if time.monotonic() - begin >= args.rotate * (rotations + 1):
            rotations += 1
            # A pair of its own each time: alternating two pairs, an even count ended on the
            # pair served at start, which a webhook that never reloaded served too.
            issue(d, rotations)
            install(d, rotations)
    elapsed = time.monotonic() - begin
    rss_end = rss_kib(proc.pid)
    # Proof the rotations took: the certificate served now is the last one installed.
    time.sleep(2)  # --cert-reload-interval=1s
    with socket.create_connection(("127.0.0.1", port)) as raw, ctx.wrap_socket(raw) as tls:
        served_cn = dict(x[0] for x in tls.getpeercert()["subject"])["commonName"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    growth = (rss_end - rss_start) / rss_start * 100
    return {"requests": counters.sent, "ok": counters.ok, "failed_requests": counters.failed,
            "handshakes": counters.handshakes, "failed_handshakes": counters.failed_handshakes,
            "cert_rotations": rotations, "served_cert": served_cn,
            "expected_cert": f"webhook-{rotations}", "seconds": round(elapsed, 1),
            "rate_per_s": round(counters.sent / elapsed), "rss_start_kib": rss_start,
            "rss_end_kib": rss_end, "rss_peak_kib": rss_peak, "rss_growth_pct": round(growth, 2),
            "errors": dict(list(counters.errors.items())[:10])}


def phase_sigterm(binary, d, args):
    port = free_port()
    proc = start(binary, d, port, "3s")
    ctx, body, counters, stop = client_context(d), review_body(), Counters(), threading.Event()
    threads = run_clients(port, ctx, body, 10**9, args.concurrency, args.reconnect, counters, stop)
    time.sleep(3)
    sent_before = counters.sent
    t_term = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    t_not_ready = t_refused = None
    while t_refused is None and time.monotonic() - t_term < 30:
        try:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
            c.request("GET", "/readyz")
            status = c.getresponse().status
            c.close()
            if status != 200 and t_not_ready is None:
                t_not_ready = time.monotonic()
            # The endpoint leaves the Service about a second after readiness turns false; until
            # then the API server keeps sending, and those requests must succeed too.
            if t_not_ready is not None and time.monotonic() - t_not_ready >= 1.0:
                stop.set()
        except (ConnectionRefusedError, ssl.SSLError, OSError, http.client.HTTPException):
            if t_refused is None:
                t_refused = time.monotonic()
            stop.set()
        time.sleep(0.02)
    for t in threads:
        t.join()
    rc = proc.wait(timeout=30)
    return {"requests": counters.sent, "requests_before_sigterm": sent_before,
            "failed_in_flight": counters.failed, "failed_handshakes": counters.failed_handshakes,
            "not_ready_after_s": None if t_not_ready is None else round(t_not_ready - t_term, 3),
            "refused_after_s": None if t_refused is None else round(t_refused - t_term, 3),
            "readiness_false_first": t_not_ready is not None and (t_refused is None or t_not_ready < t_refused),
            "exit_code": rc, "errors": dict(list(counters.errors.items())[:10])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary", type=trial_args.webhook_binary)
    p.add_argument("--requests", type=int, default=100000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rotate", type=float, default=10)
    p.add_argument("--reconnect", type=int, default=50, help="requests per connection")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        make_pki(d)
        issue(d, 0)
        install(d, 0)
        rot = phase_rotation(args.binary, d, args)
        term = phase_sigterm(args.binary, d, args)
    ok = (rot["served_cert"] == rot["expected_cert"] and rot["cert_rotations"] > 0
          and rot["failed_requests"] == 0 and rot["failed_handshakes"] == 0 and rot["rss_growth_pct"] < 10
          and rot["requests"] >= args.requests and term["failed_in_flight"] == 0
          and term["failed_handshakes"] == 0 and term["readiness_false_first"] and term["exit_code"] == 0)
    print(json.dumps({"rotation": rot, "sigterm": term, "pass": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
