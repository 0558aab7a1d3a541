#!/usr/bin/env python3
"""Legitimate admissions while hostile connections are held open, against the real binary.

For each scenario, HOSTILE connections of one kind are opened and kept at that number
(reopened when the server cuts them off), then admissions are sent on fresh connections
(a new TLS handshake each, as after an API server restart) at RATE per second for SECONDS.
Kinds:
  silent   TCP open, nothing sent
  tls-idle TLS handshake done, nothing sent
  headers  request headers, one byte a second
  body     headers declaring a 100 KB body, then the body one byte a second
  mixed    a quarter of each
Per scenario: failed admissions, p50/p99/max latency (connect to answer), the server's open
connections and RSS, and how long the server let one trickling client live (its total request
deadline, not per read). Then IDLE silent connections at once for the memory figure.

Prints one JSON object; exits 1 when a criterion fails: a failed admission, p99 over
--p99-limit-ms, a trickler living past the request deadline + slack, RSS over --rss-limit-mib.
usage: webhook_hostile.py BINARY [--hostile 1000] [--rate 50] [--seconds 5] [--idle 10000]
"""
import argparse
import asyncio
import json
import os
import pathlib
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import trial_args  # beside this file

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "webhook" / "testdata"
KINDS = ("silent", "tls-idle", "headers", "body")


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_pki(d):
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.crt", "-days", "1", "-subj", "/CN=127.0.0.1",
       "-addext", "subjectAltName=IP:127.0.0.1")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port):
    """Returns once something accepts on 127.0.0.1:port (or after 5 s)."""
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.01)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def review_body():
    pod = json.loads((TESTDATA / "annotation-emptydir.pod.json").read_text())
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "hostile", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "default", "operation": "CREATE", "object": pod}}).encode()


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


class Hostile:
    """Keeps `count` connections of `kind` open until stopped; records trickler lifetimes."""

    def __init__(self, port, ctx, kind, count):
        self.port, self.ctx, self.kind, self.count = port, ctx, kind, count
        self.open = 0
        self.lifetimes = []  # seconds from the first request byte to the server's close
        self.stop = asyncio.Event()

    async def one(self, kind):
        while not self.stop.is_set():
            try:
                tls = kind != "silent"
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, ssl=self.ctx if tls else None)
            except (OSError, ssl.SSLError, asyncio.TimeoutError):
                await asyncio.sleep(0.2)
                continue
            self.open += 1
            started = time.monotonic()
            try:
                if kind in ("silent", "tls-idle"):
                    # Read until the server closes (its handshake or idle deadline) or we stop.
                    stop = asyncio.ensure_future(self.stop.wait())
                    read = asyncio.ensure_future(reader.read(1))
                    await asyncio.wait({stop, read}, return_when=asyncio.FIRST_COMPLETED)
                    for f in (stop, read):
                        f.cancel()
                else:
                    head = b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    if kind == "body":
                        writer.write(head + b"Content-Length: 100000\r\n\r\n")
                        await writer.drain()
                        started = time.monotonic()
                        drip = b"{" + b" " * 99999
                    else:
                        drip = head + b"X-Slow: " + b"a" * 100000
                    for b in drip:
                        if self.stop.is_set():
                            break
                        writer.write(bytes([b]))
                        await writer.drain()
                        # The answer (408-like close) or the close itself ends the trickle.
                        try:
                            await asyncio.wait_for(reader.read(1), timeout=1.0)
                            break  # an answer or the close: cut off
                        except asyncio.TimeoutError:
                            pass
                    if not self.stop.is_set():
                        self.lifetimes.append(time.monotonic() - started)
            except (OSError, ssl.SSLError, ConnectionError):
                if not self.stop.is_set() and kind in ("headers", "body"):
                    self.lifetimes.append(time.monotonic() - started)
            finally:
                self.open -= 1
                writer.close()

    def start(self):
        kinds = KINDS if self.kind == "mixed" else (self.kind,)
        return [asyncio.ensure_future(self.one(kinds[i % len(kinds)])) for i in range(self.count)]


def admission(port, ctx, body):
    """One admission on a fresh connection (new TCP and TLS handshake); (ok, seconds)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        ok = data.startswith(b"HTTP/1.1 200") and b'"allowed":true' in data
    except (OSError, ssl.SSLError):
        ok = False
    return ok, time.monotonic() - t0


async def hostile_role(port, cafile, kind, count):
    """The hostile side, in its own process so its event loop never delays the prober."""
    ctx = ssl.create_default_context(cafile=cafile)
    hostile = Hostile(port, ctx, kind, count)
    tasks = hostile.start()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), done.set)
    for _ in range(400):
        if hostile.open >= count * 0.95 or done.is_set():
            break
        await asyncio.sleep(0.05)
    print(json.dumps({"open": hostile.open}), flush=True)
    await done.wait()
    hostile.stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"lifetimes": hostile.lifetimes}), flush=True)


def scenario(args, port, pid, cafile, kind, body):
    child = subprocess.Popen([sys.executable, __file__, "--role=hostile", f"--port={port}",
                              f"--cafile={cafile}", f"--kinds={kind}", f"--hostile={args.hostile}", args.binary],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    opened = json.loads(child.stdout.readline())["open"]
    ctx = ssl.create_default_context(cafile=cafile)
    results = []
    t_end = time.monotonic() + args.seconds
    next_at = time.monotonic()
    while time.monotonic() < t_end:
        results.append(admission(port, ctx, body))
        next_at += 1.0 / args.rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    fds = open_fds(pid)
    rss = rss_mib(pid)
    child.stdin.write("stop\n")
    child.stdin.flush()
    lifetimes = json.loads(child.stdout.readline())["lifetimes"]
    child.wait(timeout=60)
    lat = [r[1] * 1000 for r in results if r[0]]
    return {"kind": kind, "hostile": args.hostile, "hostile_open_at_start": opened,
            "admissions": len(results), "failed": sum(1 for r in results if not r[0]),
            "p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
            "max_ms": max(lat) if lat else None,
            "server_fds": fds, "rss_mib": round(rss, 1),
            "trickler_lifetime_s": [round(min(lifetimes), 2), round(max(lifetimes), 2)]
            if lifetimes else None}


def idle_memory(port, pid, count):
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port)))
        except OSError:
            break
    time.sleep(1.0)
    out = {"idle_connections": len(socks), "server_fds": open_fds(pid), "rss_mib": round(rss_mib(pid), 1)}
    for s in socks:
        s.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", type=trial_args.webhook_binary)
    ap.add_argument("--hostile", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--kinds", default="silent,tls-idle,headers,body,mixed")
    ap.add_argument("--request-timeout", type=float, default=3.0)
    ap.add_argument("--p99-limit-ms", type=float, default=50)
    ap.add_argument("--role", default="driver")  # internal: "hostile" runs the hostile side
    ap.add_argument("--port", type=int)
    ap.add_argument("--cafile")
    ap.add_argument("--rss-limit-mib", type=float, default=100)
    args = ap.parse_args()
    # Our side holds hostile + idle sockets too.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.role == "hostile":
        asyncio.run(hostile_role(args.port, args.cafile, args.kinds, args.hostile))
        return 0

    with tempfile.TemporaryDirectory() as d:
        make_pki(d)
        port = free_port()
        proc = subprocess.Popen([args.binary, "serve", "--bind-address=127.0.0.1", f"--port={port}",
                                 "--metrics-port=-1", f"--tls-cert-file={d}/tls.crt",
                                 f"--tls-key-file={d}/tls.key", "--log-level=error",
                                 "--shutdown-delay=0s", f"--request-timeout={int(args.request_timeout * 1000)}ms",
                                 f"--handshake-timeout={int(args.request_timeout * 1000)}ms",
                                 f"--idle-timeout={int(args.request_timeout * 1000)}ms",
                                 f"--max-connections={max(args.idle, args.hostile) + 1000}"])
        try:
            wait_listening(port)
            body = review_body()
            out = {"scenarios": []}
            for kind in args.kinds.split(","):
                out["scenarios"].append(scenario(args, port, proc.pid, f"{d}/tls.crt", kind, body))
                time.sleep(0.5)
            if args.idle:
                out["idle"] = idle_memory(port, proc.pid, args.idle)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    out["request_timeout_s"] = args.request_timeout
    failures = []
    for s in out["scenarios"]:
        if s["failed"]:
            failures.append(f"{s['kind']}: {s['failed']} failed admissions")
        if s["p99_ms"] is None or s["p99_ms"] > args.p99_limit_ms:
            failures.append(f"{s['kind']}: p99 {s['p99_ms']} ms over {args.p99_limit_ms}")
        if s["trickler_lifetime_s"] and s["trickler_lifetime_s"][1] > args.request_timeout + 2.0:
            failures.append(f"{s['kind']}: a trickling client lived {s['trickler_lifetime_s'][1]} s")
        # A server that never cuts a trickler records no lifetime at all: the check above was
        # then skipped, in exactly the case it is for.
        if (s["kind"] in ("headers", "body", "mixed") and not s["trickler_lifetime_s"]
                and args.seconds > args.request_timeout + 1.0):
            failures.append(f"{s['kind']}: no trickling client was cut off")
        # Admissions under no load prove nothing: the hostile connections must have opened.
        if s["hostile_open_at_start"] < 0.95 * args.hostile:
            failures.append(f"{s['kind']}: only {s['hostile_open_at_start']} of {args.hostile} "
                            "hostile connections open")
    if "idle" in out and out["idle"]["rss_mib"] > args.rss_limit_mib:
        failures.append(f"RSS {out['idle']['rss_mib']} MiB with {out['idle']['idle_connections']} idle")
    if "idle" in out and out["idle"]["idle_connections"] < args.idle:
        failures.append(f"only {out['idle']['idle_connections']} of {args.idle} idle connections open")
    out["failures"] = failures
    print(json.dumps(out, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
