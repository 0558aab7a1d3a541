#!/usr/bin/env python3
"""Writes bench/RESULTS.md from the JSON files of one `make bench` run: one table per
benchmark, each figure beside the limit measured in the same run, its ratio, the target and
whether it was met. A miss is printed with its explanation, never dropped.

usage: report.py RESULTS_DIR OUT_MD COMMAND WALL_SECONDS [--only=4,5]

With --only, only the numbered sections are regenerated (from RESULTS_DIR) and spliced into the
existing OUT_MD, each marked with when and by which command; the other sections and the header
stay as that run wrote them. For re-measuring one benchmark without rerunning them all.
"""
import datetime
import json
import os
import platform
import re
import subprocess
import statistics
import sys
import xml.etree.ElementTree as ET

if len(sys.argv) < 5 or sys.argv[1] in ("-h", "--help"):
    sys.exit("usage: report.py RESULTS_DIR OUT_MD COMMAND WALL_SECONDS [--only=4,5]")
RESULTS, OUT, COMMAND, WALL = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ONLY = None
for arg in sys.argv[5:]:
    if not arg.startswith("--only="):
        sys.exit(f"report.py: unexpected argument {arg!r}; usage: ... [--only=4,5]")
    ONLY = {int(x) for x in arg[len("--only="):].split(",") if x}


def load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def met(ok):
    return "met" if ok else "**missed**"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def split_row(name, sp):
    """The half-rate row measured with the client on one core and the server on another."""
    r, n = sp["half"], sp["nginx_half"]
    failed = sp["half_failed"]
    ours_runs = ", ".join(f"{x:.0f}" for x in sp["half_p99_us"])
    nginx_runs = ", ".join(f"{x:.0f}" for x in sp["nginx_half_p99_us"])
    value = (f"p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us, p99.9 {r['p999_us']:.0f} us, "
             f"{failed} failed ({r['target_rate']:.0f} req/s, half of {sp['rps']:.0f} on the server's "
             f"core, {sp['errors']} errors, nginx with one worker there {sp['nginx_rps']:.0f}; nginx at "
             f"the half rate: p99 {n['p99_us']:.0f} us, p99.9 {n['p999_us']:.0f} us); the median p99 of "
             f"{len(sp['half_p99_us'])} alternating runs, ours {ours_runs} us, nginx {nginx_runs} us")
    return [f"{name} at half the max req/s, client on CPU {sp['client_cpu']}, server on CPU "
            f"{sp['server_cpu']}", value, "5000 us", f"{r['p99_us'] / 5000:.2f}", "p99 <= 5 ms, 0 failed",
            met(r["p99_us"] <= 5000 and failed == 0)]


def webhook(w):
    lines = ["## 1. Webhook (admission) against nginx serving the same answer",
             "", "Command: `python3 bench/webhook/run.py BUILD build/bench-results/webhook.json`: "
             "wrk -t2 -c64 over TLS keep-alive against our server and against nginx answering the same "
             "bytes with the same certificate (the ceiling; three alternating 5 s runs of each, "
             "the best of each), then kvoffload-loadgen (open loop, 64 "
             "connections on one event-driven thread, latency from the time each request was due) "
             "at fixed rates, and at half our saturation rate alternating with nginx (three runs "
             "each, the run with the median p99 shown, the worst run's p99 judged), and that once more with the client (wrk -t1, "
             "then kvoffload-loadgen) on one core and our server (or nginx with one worker) on "
             "another, saturation and half rate measured that way; pods without a "
             "mode annotation, so the server's --default-mode decides (agent, the default, or "
             "vllm-native). One admission's instructions: kvoffload-admission-cost (the server's "
             "handler and allocator, no network) under callgrind, 201 admissions minus 101, over "
             "100. Then tests/reliability/webhook_hostile.py: admissions on fresh "
             "connections (a TLS handshake each, 50/s for 5 s) while 1000 hostile connections of "
             "one kind are held open (reopened when cut off; handshake, request and idle deadlines 3 s).", ""]
    if w is None:
        return lines + ["Not run (no webhook.json).", ""]
    rows = []
    if "healthz_rps" in w:
        floor = w["healthz_rps"] / w["nginx_healthz_rps"]
        rows.append(["GET /healthz at saturation", f"{w['healthz_rps']:.0f} req/s",
                     f"nginx {w['nginx_healthz_rps']:.0f} req/s", f"{floor:.2f}", ">= 0.80", met(floor >= 0.8)])
    for name, b in w["bodies"].items():
        # Errors count: a server answering fast errors would reach any rate.
        rows.append([f"{name} pod ({b['request_bytes']} B) at saturation", f"{b['rps']:.0f} req/s, {b['errors']} errors",
                     f"nginx {b['nginx_rps']:.0f} req/s", f"{b['ratio']:.2f}", ">= 0.50, 0 errors",
                     met(b["ratio"] >= 0.5 and b["errors"] == 0)])
        for label, r in b["rates"].items():
            judged = label in ("1000", "half")
            limit = 2000 if label == "1000" else 5000
            # A half-rate row is its median run, but a failure in any of its runs misses it.
            failed = b.get("half_failed", r["errors"]) if label == "half" else r["errors"]
            # Judged on the worst of the alternating runs: the median's p99 passed a target
            # that one run in three missed (7.7 ms against 5).
            p99 = max(b["half_p99_us"]) if label == "half" and b.get("half_p99_us") else r["p99_us"]
            value = (f"p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us, p99.9 {r['p999_us']:.0f} us, "
                     f"{failed} failed")
            if label == "half" and "nginx_half" in b:
                n = b["nginx_half"]
                value += (f" ({r['target_rate']:.0f} req/s; nginx at that rate: p99 {n['p99_us']:.0f} us, "
                          f"p99.9 {n['p999_us']:.0f} us)")
                if len(b.get("half_p99_us", [])) > 1:
                    ours_runs = ", ".join(f"{x:.0f}" for x in b["half_p99_us"])
                    nginx_runs = ", ".join(f"{x:.0f}" for x in b["nginx_half_p99_us"])
                    value += (f"; the median run's figures; p99 of {len(b['half_p99_us'])} "
                              f"alternating runs, ours {ours_runs} us, nginx {nginx_runs} us, the "
                              "worst judged; failed: the runs' total")
            rows.append([f"{name} at {'half the max' if label == 'half' else label} req/s", value,
                         f"{limit} us" if judged else "", f"{p99 / limit:.2f}" if judged else "",
                         f"p99 <= {limit // 1000} ms, 0 failed" if judged else "",
                         met(p99 <= limit and failed == 0) if judged else ""])
        if "split" in b:
            rows.append(split_row(name, b["split"]))
    instructions = w.get("instructions")
    if "instructions" in w and not instructions:
        # Not measured (no valgrind) is not met: the target went from the table without a word.
        rows.append(["one admission, kserve pod, callgrind", "not measured (valgrind missing)",
                     "150k", "", "< 150k", met(False)])
    if instructions:
        for name, n in instructions.items():
            body = w["bodies"][name]["request_bytes"]
            judged = name == "kserve"
            rows.append([f"one admission, {name} pod ({body} B), callgrind", f"{n / 1000:.0f}k instructions",
                         "150k" if judged else "", f"{n / 150000:.2f}" if judged else "",
                         "< 150k" if judged else "", met(n < 150000) if judged else ""])
    rows.append(["ready after start", f"{w['ready_ms']:.0f} ms", "100 ms", f"{w['ready_ms'] / 100:.2f}",
                 "< 100 ms", met(w["ready_ms"] < 100)])
    peak_mib = w["rss_peak_kib"] / 1024
    rows.append(["RSS idle / peak under load", f"{w['rss_idle_kib'] / 1024:.1f} / {peak_mib:.1f} MiB", "50 MiB",
                 f"{peak_mib / 50:.2f}", "< 50 MiB", met(peak_mib < 50)])
    for h in (w.get("hostile") or {}).get("scenarios", []):
        life = h["trickler_lifetime_s"]
        rows.append([f"admissions under 1000 hostile: {h['kind']}",
                     f"{h['admissions']} sent, {h['failed']} failed; p50 {h['p50_ms']:.1f} ms, "
                     f"p99 {h['p99_ms']:.1f} ms; server fds {h['server_fds']}"
                     + (f"; tricklers cut after {life[0]}-{life[1]} s" if life else ""),
                     "50 ms", f"{h['p99_ms'] / 50:.2f}", "0 failed, p99 < 50 ms",
                     met(h["failed"] == 0 and h["p99_ms"] < 50)])
    # The hostile run's own criteria (a trickler outliving the deadline, a connection cap
    # broken, idle connections not all open) were read only for its p99 and failures.
    for failure in (w.get("hostile") or {}).get("failures", []):
        if "failed admissions" in failure or ": p99 " in failure:
            continue  # judged in the scenario's row
        rows.append(["hostile-connection criterion", failure, "", "", "met", met(False)])
    idle = (w.get("hostile") or {}).get("idle")
    if idle:
        rows.append([f"RSS with {idle['idle_connections']} idle connections", f"{idle['rss_mib']:.1f} MiB",
                     "100 MiB", f"{idle['rss_mib'] / 100:.2f}", "< 100 MiB", met(idle["rss_mib"] < 100)])
    counts = {name: f"{n / 1e6:.3f}M" for name, n in (instructions or {}).items()}
    why = ("Reading the figures: GET /healthz, the transport alone (TLS, parse, answer), is the "
           "floor; the gap between it and an admission is the admission itself (parse the review "
           "with simdjson and read the pod in its tape, resolve, mutate, hash, write the answer: "
           f"{counts.get('kserve', '?')} instructions for the KServe pod and "
           f"{counts.get('small', '?')} for the small one under "
           "callgrind with the server's allocator, mimalloc, down from 0.72M and 0.31M when the "
           "pod was copied into an nlohmann DOM and the spec's tiers, hash and flag and the launch "
           "plan were made for every pod instead of once per workload per thread, and from 0.167M "
           "for the KServe pod before its env names were read in one pass over the document and "
           "searched once for all the names we set (2026-12-03); of the KServe pod's, simdjson's "
           "parse of the 12 KB review is 0.075M, in the Haswell kernel that callgrind runs "
           "(valgrind has no AVX-512), which nginx, "
           "returning stored bytes, does not do. The latency rows are the noisiest: on "
           "2026-11-29 one binary alternated with an older one at 1000 req/s gave p99 from 1.6 "
           "to 79 ms, and the older one 4 to 66 ms, so one run's tail says as much about the "
           "machine's other tenants as about the server. At half the saturation rate the machine "
           "itself is part of the figure: client and server share its 2 cores, so the same client "
           "at the same rate is also run against nginx, which does no work per request, and its "
           "p99 is printed beside ours. Since 2026-12-06 each half-rate row is also measured with "
           "the client on one core and the server on the other, as a cluster runs them (the API "
           "server is not on the webhook's cores), saturation measured that way too: in that "
           "day's run ours gave p99 0.11-2.7 ms in all twelve runs, 0.11-0.21 ms in nine, beside "
           "nginx's 0.11-0.51 ms, while with both on both cores ours crossed 5 ms in four of "
           "twelve (1.6-7.7 ms) and nginx's stayed at 0.09-2.6 ms. So what takes our tail past "
           "5 ms on shared cores is the client's and our threads queueing for the same two "
           "cores: ours has more of them runnable (two I/O threads and up to two computing "
           "workers against nginx's two single-threaded workers), and each admission crosses "
           "between an I/O thread and a worker. Until 2026-12-03 kvoffload-loadgen blocked a thread per "
           "connection (16) and used a whole core at 20,000 req/s, so a queue built in the client "
           "before the server was busy; it now runs 64 connections on one Asio thread, about 0.55 "
           "of a core at that rate (its own CPU time is in webhook.json as client_cpu_s). Until "
           "2026-12-04 the server closed connections idle for 5 s, among them the client's least "
           "used ones, and 1-13 of the 10,000 admissions at 1000 req/s failed as the client sent "
           "on a connection being closed (the race the API server's client would hit; "
           "docs/decisions.md): the idle deadline is now 120 s and a row with a failure is "
           "missed. Until 2026-12-05 each keep-alive request re-set its connection's deadline "
           "timer at each of its four phases, and Asio queues a cancelled wait's completion like "
           "any other, so every request woke the other I/O thread (two futex calls), updated the "
           "timerfd and interrupted epoll; and OpenSSL read each record in two read()s. With the "
           "timer set lazily and TLS read-ahead (docs/decisions.md) a request costs a read, a "
           "write and an epoll_ctl: GET /healthz went from 0.65-0.92 of nginx (single runs on "
           "2026-12-04) to parity, and the admissions at saturation from 0.70-0.90 of nginx to "
           "about 1, which also raised the half rate each latency row is measured at (the KServe "
           "pod's from about 15,000 to 19,000 req/s). The run just before this one "
           "(2026-12-05 00:37 UTC) gave GET /healthz 0.99 of nginx and half-rate medians of 2.8, "
           "5.8, 4.1 and 5.4 ms (runs 2.4-127 ms, nginx's 1.4-4.4 ms bar one of 32 ms): at these "
           "rates the rows sit at the 5 ms limit, about 1.5-2x nginx's p99. Where our tail is "
           "still above nginx's at "
           "the same rate, the likeliest cause is the admission's hand-off: each one moves from "
           "an I/O thread to a worker and back (about 2 context switches per request against "
           "nginx's 0.6). Answering on the I/O thread instead halved the switches and saved 12% "
           "of the server's CPU at 20,000 req/s, but the p99 at 26,000 req/s got worse (9-54 ms "
           "against 3-5 ms, alternating binaries, 2026-12-03), likely because while both I/O "
           "threads compute admissions no connection is read or written, so the worker pool "
           "stays. "
           "The hostile rows measure the client's own handshake too, and on a loaded "
           "machine the prober (Python, sharing the 2 cores with 1000 hostile clients and the "
           "server) is itself starved: the count of admissions sent in 5 s shows how much. Their "
           "slowest admissions fall where the server cuts the trickling clients, all opened "
           "together and so all cut together, and a thousand new TLS handshakes arrive at once "
           "(timestamped on 2026-12-04: every admission over 15 ms came 2.5-3.7 s into the "
           "run, the tricklers' deadline being 3 s). Since 2026-12-04 each connection's handshake "
           "and request deadlines are stretched by its own share of up to a tenth, so tricklers "
           "opened together are cut over 0.3 s (docs/decisions.md): in five alternating pairs of "
           "binaries the trickled-body row's p99 went from 16-58 ms to 12-30 ms and its slowest "
           "admission from 92-142 ms to 19-64 ms. A full handshake costs the server "
           "0.43-0.54 ms of CPU and nginx 0.47-0.74 ms (openssl s_time -new, same "
           "certificate, alternating), so such a storm takes the two cores about a quarter of a "
           "second whoever serves it; the server resumes no sessions and sends no tickets "
           "(docs/decisions.md), which cut its share by a sixth. Client "
           "and server share the same 2 cores, as they do for nginx.")
    return lines + [table(["figure", "value", "limit", "ratio", "target", ""], rows), "", why, ""]


def disk_state(row):
    """A disk row's tier state as the table names it."""
    return {"step": "full, steps", "mixed": "full, mixed"}.get(row["state"], row["state"])


def shape_references(rows):
    """Each row against fio driven in the engine's own client shape in the same run: a
    reference beside the limit (fio at depth qd), which stays the target's. Runs before
    2026-12-06 measured no such reference."""
    shaped = [r for r in rows if "fio_threads_read_gibps" in r or "fio_burst_read_gibps" in r]
    if not shaped:
        return []
    out = []
    for r in shaped:
        a = r["agent"]
        kind = "burst" if r["state"] == "step" else "threads"
        for what, got, rw in (("store", a["store_gibps"], "write"), ("load", a["load_gibps"], "read")):
            ref = r[f"fio_{kind}_{rw}_gibps"]
            shape = ("bursts of `qd`" if kind == "burst" else "`qd` jobs at depth 1")
            out.append([f"{what} {r['block_size']}", disk_state(r), f"{got:.2f} GiB/s",
                        f"fio {rw} in {shape} {ref:.2f} GiB/s", f"{got / ref:.3f}"])
    two = [r for r in shaped if r["block_size"] == "2M"]
    cmds = list(dict.fromkeys(r[f"fio_{k}_command"] for r in two
                              for k in ("threads_write", "threads_read", "burst_write", "burst_read")
                              if f"fio_{k}_command" in r))
    return ["The same rows against fio driven as the engine's clients drive it, in the same run "
            "(a reference beside the limit above, not the target's limit): for the *empty* and "
            "*full* rows `qd` fio jobs that each keep one transfer in flight over their own "
            "file (a `qd`-th of the pass each), as the bench's `qd` client threads each keep "
            "one one-block job (for the *full, mixed* rows each job reads and writes, half "
            "each, `--rw=rw`); for the *full, steps* rows `qd` transfers submitted together "
            "and all awaited before the next `qd`, as one job of `qd` blocks at a time. Where "
            "the agent reaches fio in its own shape, what separates it from the limit is the "
            "shape, which costs fio as much on this machine.", "",
            table(["figure", "tier", "agent", "fio in the same shape", "ratio"], out), "",
            "Commands (2 MiB shown):", "",
            *[f"    {c}" for c in cmds], ""]


def disk(d):
    lines = ["## 2. Agent disk tier against fio (O_DIRECT, io_uring, same directory, block size "
             "and queue depth)", ""]
    if d is None:
        return lines + ["Not run.", ""]
    when = (f" Measured at {d['measured_utc']} UTC (load average {d['loadavg']} after it)."
            if "measured_utc" in d else "")
    # Each block size's pass (at least 256 blocks since 2026-12-04), smallest first.
    passes = {}
    for r in d["rows"]:
        passes.setdefault(r.get("total", d["total"]), []).append(r["block_size"])
    per = ", ".join(f"{total} at {' and '.join(dict.fromkeys(sizes))}"
                    for total, sizes in passes.items())
    lines += [f"Directory `{d['dir']}` ({d['fstype']}), queue depth {d['qd']}, a pass of {per} "
              "(at least 256 blocks: the pinned tier fills before the first disk write and up "
              "to `qd` writes are in flight when the stores end, neither counted in the store "
              "figure), best of alternating runs. As fio keeps `qd` transfers queued, the "
              "engine gets `qd` workers and `qd` client threads that each keep one one-block "
              f"job in flight, for stores and for loads.{when} Two states of the tier: "
              "*empty* (just opened; nothing is evicted from disk) and *full* (its steady state "
              "under traffic: the tier holds one pass of blocks and an untimed pass fills it "
              "first, so every timed store evicts a block from disk, and the loads read a full "
              "tier). The write limit for each is fio's in the same state: writing a new file "
              "(empty), or over a file it wrote whole first (`--overwrite=1`, full). Target: "
              ">= 0.90 of fio for store and load in both. The *full, steps* rows drive the full "
              "tier as vLLM does: a step's blocks in one job (`qd` of them), one job at a time, "
              "so a store job's evictions are written together and a load job's reads are "
              "queued together; they have the same limits as *full*. The pinned tier in front "
              "of the disk tier has 4 x `qd` slots and demotes ahead in batches of `qd` "
              "(`--demote-batch`): its demoter thread writes victims to disk before stores need "
              "their slots, and a store that finds no slot free writes a victim of its own "
              "meanwhile (docs/decisions.md). The *full, mixed* rows store and load at once, "
              "as a tier serving traffic does: after the same fill, the `qd` clients take "
              "one-block jobs in turn, a store of a new block (which evicts one from disk) and "
              "a load of a resident one, a pass of each; the figures are the bytes written and "
              "read while they ran, and their limits fio's writes and reads in one run of "
              "`--rw=rw` (half of each) at the same depth over a file of a pass that it wrote "
              "whole first, moving two passes.", ""]
    rows, missed = [], set()
    for r in d["rows"]:
        a = r["agent"]
        for what, got, lim, ratio in (("store", a["store_gibps"], r["fio_write_gibps"], r["store_ratio"]),
                                      ("load", a["load_gibps"], r["fio_read_gibps"], r["load_ratio"])):
            if ratio < 0.9:
                missed.add((what, r["state"]))
            during = " (with reads)" if r["state"] == "mixed" and what == "store" else (
                " (with writes)" if r["state"] == "mixed" else "")
            rows.append([f"{what} {r['block_size']}", disk_state(r), f"{got:.2f} GiB/s",
                         f"fio {'write' if what == 'store' else 'read'}{during} {lim:.2f} GiB/s",
                         f"{ratio:.3f}", ">= 0.90", met(ratio >= 0.9)])
    lines += [table(["figure", "tier", "agent", "limit", "ratio", "target", ""], rows), ""]
    shown = [r for r in d["rows"] if r["block_size"] == "2M"]
    lines += ["Commands (2 MiB shown; the others differ only in the block size and the pass):", "",
              *[f"    {r['command']}" for r in shown],
              *[f"    {c}" for c in dict.fromkeys(r["fio_write_command"] for r in shown)],
              f"    {shown[0]['fio_read_command']}", ""]
    lines += ["The tier is an emptyDir tier, so its blocks live in one slot file (FORMAT.md, "
              "Slot file): a store is one O_DIRECT write into a slot of a file that is "
              "`fallocate`d 64 MiB at a time while the tier fills (as fio lays out its own file "
              "before writing), a load one read of a slot; no file is created, renamed, opened "
              "or closed per block. A slot holds the payload alone (its checksum stays in the "
              "engine's index), so a block moves its size rounded up to 4 KiB, as fio's "
              "transfers do.", ""]
    lines += shape_references(d["rows"])
    steps = [r for r in d["rows"] if r["state"] == "step"]
    if any(min(r["store_ratio"], r["load_ratio"]) < 0.9 for r in steps):
        burst = "; ".join(
            f"{r['block_size']}: fio {r['fio_burst_write_gibps']:.2f} GiB/s in bursts against "
            f"{r['fio_write_gibps']:.2f} steady, the steps stores "
            f"{r['agent']['store_gibps'] / r['fio_burst_write_gibps']:.2f} of the bursts"
            for r in steps if "fio_burst_write_gibps" in r)
        lines += ["Where a *full, steps* row misses: with one job at a time, the disk queue "
                  "fills when a job submits its blocks' transfers and drains to nothing before "
                  "the job ends, and the job's own work on the CPU (checksums, copies) runs "
                  "while its disk is idle. For reference, fio in that shape (`qd` writes "
                  "submitted together, all awaited before the next `qd`): "
                  + (burst + ". " if burst else "")
                  + "A steps load of small blocks pays one more cost: a core's first read of "
                  "memory this machine's disk has just written is slow (12-15 us per 64K block "
                  "for the checksum, timed in a build for the experiment, where the same CRC-32C "
                  "over 64 MiB of 64K buffers the bench has written itself takes 2-3 us a block: "
                  "`kvoffload-bench crc --total=64M`, 28 GB/s on 2026-12-06), and fio never "
                  "reads what it reads. Measured on 2026-12-06 in builds made for the "
                  "experiment, three alternating runs each: a 64K steps job's reads took 224-310 "
                  "us with the verification and the copies skipped, as fio's bursts, against "
                  "378-469 us with them, and 291-310 us with the same checksum run over other "
                  "cold memory instead (docs/decisions.md). "
                  "vLLM does not wait for one step's job before it queues the next, so on the "
                  "engine's two workers two jobs can overlap, which this shape does not credit.",
                  ""]
    mixed_missed = [r["block_size"] for r in d["rows"]
                    if r["state"] == "mixed" and min(r["store_ratio"], r["load_ratio"]) < 0.9]
    if mixed_missed:
        lines += [f"Where a *full, mixed* row misses ({', '.join(mixed_missed)}): fio's `--rw=rw` "
                  "sends two perfectly sequential streams, and this disk rewards order (fio's "
                  "`--rw=randrw` at the same depth moved 1.74-1.97 GiB/s in all at 64K on "
                  "2026-12-06, against 2.59-2.72 sequential). The engine's `qd` clients submit "
                  "their one-block reads in whatever order they run (41% followed the previous "
                  "read on the disk, in a `perf` trace of the block layer) and its demoter's "
                  "writes of adjacent slots reach the disk merged into 256-512K requests: the "
                  "disk took 227 us per read against fio's 193 and 355 us per write against 264. "
                  "Each read then waits about 110 us more on the CPU (its checksum over memory "
                  "just written by the disk, and its thread's wake-up on 2 shared cores). fio in "
                  "the clients' own shape (table of references above) moves about what the "
                  "engine does. What was tried: docs/decisions.md.", ""]
    full_store_missed = [r["block_size"] for r in d["rows"]
                         if r["state"] in ("full", "step") and r["store_ratio"] < 0.9]
    if full_store_missed:
        lines += [f"Where a full tier's store misses ({', '.join(dict.fromkeys(full_store_missed))}): "
                  "the engine writes in order, but not in fio's shape. Its 64K write offsets, traced "
                  "in three runs of the full row (2026-12-04): 88-90% of writes went to the slot "
                  "after the one written before them and 98-99% within 8 slots of it, so the "
                  "victims' slots are not what differs from fio; 52-54% were single writes, each "
                  "by a store that found no pinned slot free and wrote a victim of its own (why "
                  "stores do that: docs/decisions.md), the rest the demoter's batches of `qd`. In "
                  "the *full, steps* row every write followed its predecessor's slot, in batches "
                  "of `qd` (bursts, above). fio in the first shape, `qd` jobs each keeping one write "
                  "in flight over its own file, is in the table of references above; it ran at "
                  "0.63-0.81 of one job at depth 8 in five alternating pairs at 64K on 2026-12-04, "
                  "likely because with one write per thread each completion waits for its thread "
                  "to wake (at 64K, one every 25-30 us on 2 cores), where one thread at depth 8 "
                  "reaps and resubmits several at a time.", ""]
    # Loads only: a store's disk write runs on the demoter as often as on its client, so
    # a write's time is not part of a client's time in flight.
    slow = [(r, "load") for r in d["rows"]
            if r["load_ratio"] < 0.9 and "disk_read_us_per_block" in r["agent"]]
    if slow:
        parts = []
        for r, what in slow:
            a = r["agent"]
            disk_us = a["disk_read_us_per_block"]
            flight_us = a["load_us_per_block_in_flight"]
            # Half of a mixed run's transfers are reads: about qd / 2 of them in flight.
            depth = d["qd"] / 2 if r["state"] == "mixed" else d["qd"]
            fio_us = depth * a["block_bytes"] / (r["fio_read_gibps"] * 2**30) * 1e6
            burst = r.get("fio_burst_read_gibps")
            burst_us = (f", {d['qd'] * a['block_bytes'] / (burst * 2**30) * 1e6:.0f} us in bursts"
                        if burst else "")
            parts.append(f"{what} {r['block_size']} {disk_state(r)}: {disk_us:.0f} us of "
                         f"{flight_us:.0f} (fio's: {fio_us:.0f} us each{burst_us})")
        lines += ["Where a load cell misses, the time per block says where it goes: how long "
                  "the block's disk read took (with its checksum; in a steps job, from the "
                  "submission of the job's reads to the end of the last, as the job's blocks "
                  "are all read together) against how long its client "
                  "had it in flight, and how long each of fio's reads took at the same depth "
                  "(depth x block size / fio's rate). The rest of the time in flight is the "
                  "engine's own work per block (the index and policy, the copy to the device, "
                  "waking the thread whose read finished), during which that block has no read "
                  "queued; small blocks pay it most often per byte. " + "; ".join(parts) + ".",
                  ""]
    return lines


def cpu(c):
    lines = ["## 3. Agent CPU (pinned) tier: store + load against memcpy of the same bytes", ""]
    if c is None:
        return lines + ["Not run.", ""]
    rows, misses = [], False
    for r in c["rows"]:
        x = r["result"]
        misses |= x["ratio"] < 0.8
        rows.append([r["block_size"], f"{x['store_gibps']:.2f} / {x['load_gibps']:.2f} GiB/s",
                     f"{x['store_load_gibps']:.2f} GiB/s", f"memcpy {x['memcpy_gibps']:.2f} GiB/s",
                     f"{x['ratio']:.3f}", ">= 0.80", met(x["ratio"] >= 0.8)])
    lines += ["Host device (copies on the device's pool of worker threads and the waiter; the "
              "memcpy limit runs on as many threads, "
              f"{c['rows'][0]['result'].get('memcpy_threads', 1)} here), best of "
              f"{c['rows'][0]['result']['reps']} alternating rounds after a warm round.", "",
              table(["block", "store / load", "store+load", "limit", "ratio", "target", ""], rows), "",
              "Command: " + " ; ".join(f"`{r['command']}`" for r in c["rows"]), ""]
    if misses:
        lines += ["Why the miss: the host device copies on its worker threads while the "
                  "engine's job threads do their bookkeeping on the same two cores the "
                  "memcpy baseline has to itself between rounds; on this shared machine "
                  "single rounds varied by 2x, so the ratio is within the noise of the run.", ""]
    return lines


def policy(p):
    lines = ["## 4. Policy cost at 1M resident blocks (ns per operation, thread CPU time)", ""]
    if p is None:
        return lines + ["Not run.", ""]
    rows, misses = [], False
    for r in p["rows"]:
        runs = r["results"]
        at_target = r["blocks"] == 1 << 20
        loop = r.get("loop", 0)
        traffic = f"loop of {loop / r['blocks']:.1f}x" if loop else "new keys"
        for op in ("lookup", "insert", "evict"):
            each = sorted(x[f"{op}_ns"] for x in runs)
            ns = statistics.median(each)
            spread = f" ({each[0]:.0f}-{each[-1]:.0f})" if len(each) > 1 else ""
            misses |= at_target and ns > 150
            rows.append([r["policy"], f"{r['blocks'] >> 10}K", traffic, op, f"{ns:.0f} ns{spread}",
                         "150 ns", f"{ns / 150:.2f}", "<= 150 ns" if at_target else "(reference)",
                         met(ns <= 150) if at_target else ""])
    lines += [f"Median of {p['rounds']} rounds, each running every row once (the range of the "
              "rounds in parentheses): at 1M blocks one run's figure moves with the other tenants' "
              "load on the memory system, so a row's runs are spread over the whole section.", "",
              table(["policy", "resident", "stored", "operation", "measured", "limit", "ratio to limit",
                     "target", ""], rows), "",
              "Command: " + " ; ".join(f"`{r['command']}`" for r in p["rows"]), "",
              "Steady state: filled to 1M first, then rounds of 1024 lookups of random resident "
              "blocks (handed to the policy as the engine's loads hand them: chains of 16, one "
              "OnAccessBatch call each), 1024 evictions and 1024 inserts, timed per batch once "
              "twice the "
              "resident count was evicted (before that the victims are the fill's keys in the "
              "order they were stored, and the ghost queues are not full yet). The inserts store "
              "new keys, or (*loop*, `--loop`) keys of a cycle 1.5x the tier again, skipping "
              "resident ones: evicted blocks come back, ghosts are hit, and adaptive policies "
              "leave their LRU mode (each row's end state is `state` in agent-policy.json).", ""]
    if misses:
        lines += ["Why the misses (reasoned, not profiled): at 1M blocks the policies' tables "
                  "(tens of MiB) are far beyond the few MiB of cache the shared machine leaves us, "
                  "so an operation costs its chain of dependent cache misses. On the key lists "
                  "that lru, arc and chain-lru share (src/key_list.h) a lookup is index slot -> "
                  "list node -> its neighbours, three in a row; an eviction or insert pays one or "
                  "two. A load's blocks reach the policy in one call (OnAccessBatch), and the "
                  "list policies walk it with the slots, nodes and neighbours of the keys 24, 16 "
                  "and 8 places ahead loading, so a lookup waits for little of its chain: lru's "
                  "took 101-165 ns one call per block and 47-60 in chains of 16, lirs's 168-259 "
                  "and 59-67, lru-tinylfu's 191-386 and 139-189 (`--lookup-calls=each` against "
                  "the default `chain`, three alternating rounds, 2026-12-04). "
                  "Stores and evictions come one block at a time, each between the tier's own "
                  "work, so each still waits for its own cache misses: the list policies' evictions "
                  "measured 147-172 ns "
                  "in four runs of this section on 2026-12-04, at the limit whichever side of it "
                  "one run falls. s3fifo keeps one entry per key in its table and "
                  "its queues as rings "
                  "(src/s3fifo_policy.cc): a lookup or an insert is one miss, an eviction's misses "
                  "are prefetched a few ring positions ahead. The CPU overlaps the misses of "
                  "consecutive operations, so a figure is well under their sum, but it moves with "
                  "the memory system's load from other tenants, which the load average does not "
                  "show: the same binary measured s3fifo evictions at 177 ns on 2026-12-02 04:35 "
                  "UTC and at 139-144 ns twelve hours later, lru's at 204 and 166 ns. The 64K "
                  "rows, in cache, separate that from the code's cost. lru-tinylfu pays lru's list "
                  "and, on every call, two more lines of use counts (its doorkeeper word and sketch "
                  "line, 12 MiB at 1M blocks), twice for an insert while its filter is on, and on "
                  "one call in 256 (one in four below 32K blocks) the two miniature caches' "
                  "lists: the most misses of the policies, and the slowest lookups. With its "
                  "counts spread over seven lines instead of two its lookups took 400 ns, and "
                  "sampling one key in four at every size 330 ns. An insert loads its misses "
                  "together from its start, and how far the CPU overlaps them with the next "
                  "insert's is set by the instructions in between (its reorder window holds a "
                  "few hundred): with the count update inlined and the key counted before it is "
                  "linked, loop inserts took 158-171 ns against 198-201 (five alternating runs, "
                  "2026-12-05), the same decisions. lirs runs on the same key lists "
                  "(its ghosts and each key's last-use time in them) and pays lru's misses, a read "
                  "of the LIR list's end, a relink when a promotion demotes a block, and on one call "
                  "in 256 (one in two below 16K blocks) its four miniature caches; at 64K those take "
                  "one key in 16 and their lists (up to 7 MiB with their ghosts) push its own out "
                  "of the cache, as its 64K row shows. New keys leave it in its LRU mode, where "
                  "its lookups one call per block cost more than lru's (above), each miss taking "
                  "longer, not more misses (docs/decisions.md). The loop rows run "
                  "it as LIRS (a 2% FIFO share): an insert that meets its ghost is promoted and "
                  "demotes the least recent LIR block, its most expensive call, while evictions "
                  "take the FIFO's oldest block, the cheapest. Its loop rows move most between runs: "
                  "three on 2026-12-03 (20:55 UTC, load average under 0.5, one call per lookup) "
                  "gave lookups of 164-248 ns and inserts of 198-287 ns, lru's 136-142 and 68-70 "
                  "alternating with them; twenty-eight on 2026-12-04 (21:05-21:15 UTC, chains of 16) "
                  "gave inserts of 133-266 ns, a third of them 133-157 and most of the rest "
                  "174-205, every one ending in the same state (the policy is deterministic: what "
                  "moved is the machine). Eight runs in a row of one binary on 2026-12-05 fell in "
                  "two groups, 126-139 ns and 163-173, with the same count of page faults (so not "
                  "a want of huge pages) and on either core alike (`taskset`): likely where a run's "
                  "tables land in the host's memory picks the group, not its code.", ""]
    return lines


TRACE_WHAT = {
    "mixed": "multi-turn chats sharing 8 system prompts, Zipf(1.0) documents and a 3000-block "
             "one-time scan every 2000 requests",
    "chat": "multi-turn chat with think time: sessions of 1-16 turns, each turn re-reading the "
            "system prompt and the whole history, 40 s mean think time between turns",
    "agent": "agentic tool loops: 6 agents' 32-96-block tool prefixes, tasks of 4-40 steps, each "
             "step re-reading the whole context and appending action and tool result",
    "rag": "RAG: a system prompt, three documents out of 20000 (Zipf 0.9 for the first, 0.6 for "
           "the others, chained), a unique question",
    # Trace files, by name (BENCH_TRACE_FILES; bench/README.md, "Production traces").
    "conversation_trace.jsonl": "Mooncake's production trace of its conversation service (FAST'25 "
                                "release: an hour of requests, 512-token blocks; not in this "
                                "repository, see bench/README.md)",
    "synthetic_trace.jsonl": "Mooncake's synthetic trace (FAST'25 release: multi-turn requests "
                             "built from public datasets, Poisson arrivals, 512-token blocks; not "
                             "in this repository, see bench/README.md)",
}


GENERATED_SHAPES = {"mixed", "chat", "agent", "rag"}


def trace_title(x):
    """A generated shape's name, or a trace file's base name."""
    return os.path.basename(x["trace"]) if x.get("from_file") else x["trace"]


def best_policy(runs):
    """The policy (other than lru) with the highest mean prefix-usable fraction of OPT."""
    scores = {}
    for run in runs:
        for row in run["result"]["results"]:
            for name in run["result"]["policies"]:
                if name != "lru":
                    scores.setdefault(name, []).append(row[name]["prefix_of_opt"])
    if not scores:
        return None
    return max(scores, key=lambda n: sum(scores[n]) / len(scores[n]))


# Section 5's caches where the target asks for a gain over LRU; at the others, only no loss.
GAIN_CACHES = ("2%", "5%")


def gain(hits, lru):
    """hits as a multiple of LRU's: equal where both are 0 (0/0 is no gain, and was counted
    as an infinite one)."""
    if lru:
        return hits / lru
    return 1.0 if hits == 0 else float("inf")


def trace_target_met(cache, vs_lru, of_opt, opt_vs_lru):
    """Section 5's target for one cell, as the issue states it: never below LRU, and at 2% and
    5% >= 1.2x LRU's prefix hits, or >= 0.90 of OPT's where 1.2x cannot exist (OPT itself under
    1.2x LRU). It took >= 0.90 of OPT anywhere, which judged RAG at 2% and 5% met at 1.16x and
    1.09x LRU though OPT is 1.28x and 1.21x there."""
    if vs_lru < 1.0:
        return False
    if cache in GAIN_CACHES:
        return vs_lru >= 1.2 or (opt_vs_lru < 1.2 and of_opt >= 0.9)
    return True


def death_reading(missed):
    """Which missed cells LRU+death would meet: where knowing which blocks die is enough, and
    where OPT's lead is knowing when blocks come back, which no policy can see."""
    def cell(title, r, lru):
        d = r["lru_death"]
        return (f"{title} at {r['cache']} ({d['prefix_hit_ratio'] / lru:.2f}x LRU, "
                f"{d['prefix_of_opt']:.3f} of OPT)")

    def meets(r, lru):
        d = r["lru_death"]
        return trace_target_met(r["cache"], d["prefix_hit_ratio"] / lru, d["prefix_of_opt"],
                                r["opt"]["prefix_hit_ratio"] / lru)
    short = [m for m in missed if not meets(m[1], m[2])]
    enough = [cell(*m) for m in missed if meets(m[1], m[2])]
    lines = []
    if short:
        lines.append(f"Where not even LRU+death meets the target ({len(short)} of the "
                     f"{len(missed)} missed cells): " + "; ".join(cell(*m) for m in short) +
                     ". There most of OPT's lead comes from knowing when a live block is read "
                     "next, not which blocks die.")
        if any(m[0] in GENERATED_SHAPES for m in short):
            lines.append("The generated shapes are memoryless there: the gaps between a "
                         "session's turns and a task's steps are exponential (in mixed, each "
                         "turn goes to one of the open conversations at random), so how long a "
                         "block has been idle says nothing of when it is read next.")
    if enough:
        lines.append(f"Where LRU+death meets it ({len(enough)} cells): " + "; ".join(enough)
                     + ". There a policy that told dead blocks from live ones would: what "
                     "limits ours is predicting which blocks die.")
    return [" ".join(lines), ""] if lines else []


def trace(t):
    lines = ["## 5. Hit ratio on trace shapes, as a fraction of Belady's OPT", ""]
    runs = (t or {}).get("runs") or []
    if not runs:
        return lines + ["Not run." if t is None else "Not run: agent-trace.json holds no runs.", ""]
    best = best_policy(runs)
    lines += ["Each trace is replayed on every registered policy and on OPT at caches of 2%, 5% and "
              "10% of its distinct blocks. Two hit ratios: per block (every resident block read "
              "counts) and prefix-usable (only the leading run of resident blocks of a request "
              "counts: the engine recomputes everything after the first miss). OPT is Belady's MIN "
              "with demand paging (every block admitted), optimal per block; its prefix-usable "
              "figure is the reference for the other column, not a proven bound. LRU+death, the "
              "other offline reference, is LRU told which blocks are never read again (it evicts "
              "one of those first): the part of OPT's lead that knowing which blocks die gives, "
              "the rest coming from knowing when the others are read next. Four shapes are "
              "generated (bench/agent/trace.h, trace_shapes.cc); trace files named in "
              "BENCH_TRACE_FILES, such as Mooncake's production traces (bench/README.md), are "
              "replayed after them with `--trace-file`, full blocks only (a prompt's partial last "
              "block is never cached).", ""]
    if best:
        lines += [f"Target, for the best policy we ship (**{best}**: highest mean prefix-usable "
                  "fraction of OPT over all shapes and sizes): prefix-usable >= 1.2x LRU's at 2% and "
                  "5% (or >= 0.90 of OPT where 1.2x cannot exist: OPT itself under 1.2x LRU), never "
                  "below LRU.", ""]
    verdicts = []
    missed = []  # (trace, row, LRU's prefix-usable ratio) of each cell the best policy misses
    for run in runs:
        x = run["result"]
        title = trace_title(x)
        origin = "" if x.get("from_file") else f"; seed {x['seed']}"
        lines += [f"### {title}", "",
                  f"{TRACE_WHAT.get(title, 'trace file ' + title)}; {x['requests']} requests, "
                  f"{x['accesses']} block accesses, {x['distinct_blocks']} distinct blocks{origin}.", ""]
        rows = []
        for r in x["results"]:
            lru = r["lru"]["prefix_hit_ratio"]
            opt = r["opt"]["prefix_hit_ratio"]
            rows.append([r["cache"], r["cache_blocks"], "OPT", f"{r['opt']['hit_ratio']:.3f}",
                         "1" if r["opt"]["hit_ratio"] else "", f"{opt:.3f}", "1" if opt else "",
                         f"{opt / lru:.2f}" if lru else "", ""])
            if "lru_death" in r:
                d = r["lru_death"]
                rows.append(["", "", "LRU+death", f"{d['hit_ratio']:.3f}", f"{d['of_opt']:.3f}",
                             f"{d['prefix_hit_ratio']:.3f}", f"{d['prefix_of_opt']:.3f}",
                             f"{d['prefix_hit_ratio'] / lru:.2f}" if lru else "", ""])
            for name in x["policies"]:
                p = r[name]
                vs_lru = gain(p["prefix_hit_ratio"], lru)
                # Under other namings of the keys (--labelings): the verdict is the worst one's.
                lab = p.get("over_labelings")
                low, high = lab["prefix_hit_ratio"] if lab else (p["prefix_hit_ratio"],) * 2
                low_of_opt, high_of_opt = lab["prefix_of_opt"] if lab else (p["prefix_of_opt"],) * 2
                low_vs_lru = gain(low, lru)
                varies = high - low > 0
                verdict = ""
                if name == best and not opt:
                    # No policy can hit where OPT does not: no cell to meet or miss.
                    verdict = "n/a: OPT has no prefix hits"
                elif name == best:
                    ok = trace_target_met(r["cache"], low_vs_lru, low_of_opt, gain(opt, lru))
                    target = ((">= 1.2x LRU" if gain(opt, lru) >= 1.2 else
                               ">= 0.90 OPT (OPT under 1.2x LRU)")
                              if r["cache"] in GAIN_CACHES else ">= LRU")
                    verdict = f"{target}: {met(ok)}"
                    if low_vs_lru < 1.0:  # a hair below LRU reads 1.00 in the column
                        verdict += f" (below LRU: {low_vs_lru:.5f}x)"
                    verdicts.append(ok)
                    if not ok and "lru_death" in r:
                        missed.append((title, r, lru))
                rows.append(["", "", name, f"{p['hit_ratio']:.3f}", f"{p['of_opt']:.3f}",
                             f"{p['prefix_hit_ratio']:.3f}",
                             f"{p['prefix_of_opt']:.3f}"
                             + (f" ({low_of_opt:.3f}-{high_of_opt:.3f})" if varies else ""),
                             f"{vs_lru:.2f}"
                             + (f" ({low_vs_lru:.3f}-{high / lru:.3f})" if varies and lru else ""),
                             verdict])
        lines += [table(["cache", "blocks", "policy", "per block", "/ OPT", "prefix-usable", "/ OPT",
                         "prefix / LRU", "target"], rows), "", f"Command: `{run['command']}`", ""]
    if verdicts:
        lines += [f"Targets met in {sum(verdicts)} of {len(verdicts)} cells.", ""]
    elif best:
        lines += ["No cell to judge: OPT has no prefix hits at these sizes.", ""]
    if missed:
        lines += death_reading(missed)
    # The reading below was written from the run of the generated shapes and Mooncake's two
    # traces recorded in docs/decisions.md, with its figures: it is printed only for that set,
    # never beside tables of other traces that it does not describe.
    if verdicts and not all(verdicts) and (
            best != "lirs" or not GENERATED_SHAPES <= {trace_title(r["result"]) for r in runs}):
        lines += ["Why the target is missed: not analysed for this set of traces (the reading "
                  "in docs/decisions.md is of the four generated shapes and Mooncake's traces, "
                  "with lirs the best policy); the cells above are this run's.", ""]
    elif verdicts and not all(verdicts):
        lines += ["Why the target is missed (a reading of the run of the generated shapes and "
                  "Mooncake's traces in docs/decisions.md; its figures are that run's, the "
                  "tables above this one's). On the generated shapes OPT itself is only 1.1-1.5x "
                  "LRU at 2-5% (the OPT rows' last column), so 1.2x LRU asks for nearly all of OPT's "
                  "lead. Mooncake's production traces are another picture: most stored blocks are "
                  "never read again (three in four of the conversation trace's), the median re-read "
                  "comes 5480 new blocks after the one before (more than a 2% tier holds), and OPT "
                  "is 1.9-4.1x LRU there (LRU reaches 0.25-0.53 of OPT): the headroom exists. "
                  "lirs (LIRS: blocks ranked by how soon they last came back, the rest passing "
                  "a small FIFO and remembered as ghosts, with that FIFO's share of the tier "
                  "chosen by four miniature caches, one of them LRU, so that it is LRU where LRU "
                  "wins; docs/decisions.md) has the best mean and takes the most where the tier "
                  "is too small for the prompts and sessions that come back: 1.85x LRU on the "
                  "conversation trace at 2%, 1.09-1.16x on RAG at 2-5% (0.901-0.905 of OPT over "
                  "the namings of the keys, short of 1.2x LRU where OPT is 1.21-1.28x), 1.10x on "
                  "the generated chat at 2%. It leaves LRU "
                  "for another share only when that share's miniature wins by more than chance "
                  "would give, so where none is better it stays LRU (the generated chat at 10%: "
                  "1.000x under every naming); it is below LRU on the synthetic trace at 5% "
                  "(0.990-1.019x over the namings) and, by 14 block reads in 2.6 million, on the "
                  "agent loops at 5%, where every policy is within 0.03% of OPT. Its parameters were "
                  "chosen on these traces (docs/decisions.md). lru-tinylfu (LRU whose new "
                  "blocks enter only if their "
                  "recent use count beats the victim's, switched the same way) gains 1.61x on "
                  "the conversation trace at 2% and 1.09x on the generated chat, and otherwise "
                  "stays within 3% of LRU. Nothing we ship gains 1.2x at 5% or on the synthetic "
                  "trace, where OPT's lead comes from knowing which of many once-read documents "
                  "come back, nor on the generated chat at 5% or agent loops at 2%, where the "
                  "next use of a session follows an exponential think time that no past reuse "
                  "distance predicts. arc gains up to 17% on the conversation trace and 11% on "
                  "RAG, and falls below LRU on the generated chat at 5-10% (its T2 keeps old "
                  "sessions). s3fifo (new blocks pass a small FIFO of a tenth of the tier) is "
                  "good on RAG and on the conversation trace at 2%, but falls below LRU where "
                  "blocks come back after more than a tenth of the tier went by (conversation and "
                  "chat at 5-10%). chain-lru (a request's deepest block first) is never below LRU "
                  "and gains at most 3%. Measured and not shipped (docs/decisions.md): W-TinyLFU, a "
                  "segmented chain-lru and SIEVE on the shapes; LIRS with a fixed FIFO share "
                  "(1.1-1.9x on RAG and conversation at 2%, but 3-16% below LRU at 10% on chat "
                  "and conversation); on the production traces the admission filter without its "
                  "switch (1.88x on conversation at 2% with exact counts, 0.63-0.96x elsewhere), "
                  "ARC with ghosts of 2-8x the tier (at most 1.53x, below LRU on chat) and LFU "
                  "with dynamic aging (at most 1.42x). Recommendation from these numbers: keep "
                  "`lru` as the default (the KServe field's); in agent mode `lirs`, which gains where "
                  "a tier is small against chat-service and RAG traffic and was below LRU in "
                  "one cell (the synthetic trace at 5%, at worst 0.990x); `chain-lru` where a "
                  "policy must never lose to LRU by construction.", ""]
    return lines


def gpu_run():
    """What bench/gpu/run.sh left beside gpu-bench.json: the CUDA tests' result, memcheck's
    summary, the driver, and the transfer core's figures (None where a file is missing)."""
    info = {"core": load("transfer_core.json")}
    for name, key in (("agent_cuda_device_test.xml", "tests"),
                      ("transfer_core_tests.xml", "core_tests")):
        path = os.path.join(RESULTS, name)
        if not os.path.exists(path):
            continue
        root = ET.parse(path).getroot()
        cases = list(root.iter("testcase"))
        # Passed: neither failed nor skipped (gtest marks a skip in an attribute, pytest in
        # an element).
        passed = [c for c in cases if c.find("failure") is None and c.find("error") is None
                  and c.find("skipped") is None and c.get("result") != "skipped"]
        info[key] = (len(passed), len(cases))
        if key == "tests":
            info["when"] = root.get("timestamp", "")[:16].replace("T", " ")
    for name, key, pattern in (("compute-sanitizer.log", "memcheck", r"(ERROR SUMMARY: .*)"),
                               ("compute-sanitizer.log", "leaks", r"(LEAK SUMMARY: .*)"),
                               ("nvidia-smi.txt", "driver", r"Driver Version: (\S+)")):
        path = os.path.join(RESULTS, name)
        if os.path.exists(path):
            found = re.search(pattern, open(path).read())
            info[key] = found.group(1).strip() if found else None
    return info


def gpu(g):
    lines = ["## 6. GPU: D2H / H2D through the cuda device against one large cudaMemcpy", ""]
    cmd = ("`make agent-gpu-bundle`, then on a GPU node `OUT=<dir> bench/gpu/run.sh` with the "
           "checkout and .cache/gpu-bundle; copy <dir>/* to the results dir and "
           "rerun bench/report.py")
    if g is None:
        return lines + [f"**Not run: this run had no GPU; to fill it:** {cmd}.", "",
                        "Targets: batched >= 0.90 of the ceiling at >= 2 MiB; batched >= 5x "
                        "per-block at 16 KiB.", ""]
    run = gpu_run()
    rows = []
    for label in ("d2h", "h2d"):
        ceiling = g[label]["ceiling_gibps"]
        for b in g[label]["blocks"]:
            size = b["block_bytes"]
            target = ""
            if size >= 2 << 20:
                target = f">= 0.90: {met(b['batched_of_ceiling'] >= 0.9)}"
            elif size == 16 << 10:
                target = f"speedup >= 5: {met(b['batched_speedup'] >= 5)}"
            rows.append([label, f"{size >> 10} KiB", f"{b['per_block_gibps']:.1f}",
                         f"{b['batched_gibps']:.1f}", f"{ceiling:.1f}",
                         f"{b['batched_of_ceiling']:.2f}", f"{b['batched_speedup']:.1f}x", target])
    tests = "not in the results"
    if "tests" in run:
        tests = "{} of {} passed".format(*run["tests"])
    lines += [f"Measured {run.get('when', '?')} UTC on one {g.get('gpu', '?')} (driver "
              f"{run.get('driver', '?')}, the bundle's CUDA 13.0 runtime); `make bench` on a "
              "machine without a GPU keeps this section as it is. The backend: "
              f"\"{g['device']}\". Each shape copies min(1 GiB, 16384 blocks) between device memory "
              "and the pinned pool, one `CopyAsync` per block (per-block) or per 256 blocks "
              "(batched, the engine's shape: one call per job), all in flight before the first "
              "wait, best of 3; the ceiling is one `cudaMemcpy` of the whole 1 GiB buffer in the "
              "same run.", "",
              table(["dir", "block", "per-block GiB/s", "batched GiB/s", "ceiling GiB/s",
                     "batched / ceiling", "batched / per-block", "target"], rows), "",
              f"CUDA tests (agent_cuda_device_test: batched copies both ways; the cascade from GPU "
              "memory to the pinned tier and a disk tier, with the psync and the io_uring backends, "
              f"the pool registered as io_uring fixed buffers, and back, bytes compared): {tests}; "
              f"the same under compute-sanitizer's memcheck: {run.get('memcheck') or 'not run'}, "
              f"{run.get('leaks') or ''}. The vLLM adapter's transfer-core tests "
              "(tests/vllm/test_transfer_core.py) with CUDA tensors: "
              + ("{} of {} passed.".format(*run["core_tests"])
                 if "core_tests" in run else "not run."), ""]
    core = run.get("core")
    if core:
        lines += [f"The vLLM adapter's transfer core on CUDA tensors (bench/gpu/transfer_core.py, "
                  f"the node's torch): {core['bytes'] >> 20} MiB of KV in 1 MiB blocks of four "
                  "256 KiB rows, half of them kept by the pinned tier and "
                  f"{core['disk_blocks']} pushed to an emptyDir disk tier on the node's disk, stored "
                  "and loaded back "
                  f"{'identical' if core['identical'] else '**not identical**'}: store "
                  f"{core['store_GBps']:.2f} GB/s and load {core['load_GBps']:.2f} GB/s end to end, "
                  "which the disk's half bounds; the engine's device-to-host copies ran at "
                  f"{core['d2h_GBps']:.1f} GB/s (its host-to-device figure, "
                  f"{core['h2d_GBps']:.1f}, spans the disk reads each copy waits for).", ""]
        pl = core.get("pinned_loads")
        if pl:
            ratio = pl["load_GiBps"] / pl["ceiling_GiBps"]
            lines += [f"Prompts of {pl['request_blocks'] * 16} tokens loaded from the pinned tier "
                      f"into KV tensors shaped as vLLM gives Llama-3-8B (bf16, {pl['tensors']} "
                      f"tensors: keys and values of {pl['layers']} layers, 16-token pages, "
                      f"{pl['piece_bytes'] >> 10} KiB pieces, {pl['block_bytes'] >> 20} MiB a "
                      f"block; {pl['request_blocks']} blocks a load, {pl['loads']} loads), from the "
                      "submit to the wait's return: best "
                      f"{pl['load_best_ms']:.1f} ms ({pl['load_GiBps']:.1f} GiB/s), median "
                      f"{pl['load_median_ms']:.1f} ms ({pl['load_median_GiBps']:.1f} GiB/s), against "
                      f"{pl['ceiling_ms']:.1f} ms for one `cudaMemcpy` of as many bytes from pinned "
                      f"memory ({pl['ceiling_GiBps']:.1f} GiB/s): {ratio:.2f} of it; bytes "
                      f"{'identical' if pl['identical'] else '**not identical**'}. Stores of the "
                      f"same requests: best {pl['store_best_ms']:.1f} ms "
                      f"({pl['store_GiBps']:.1f} GiB/s)."
                      + (f" Of a load: the submit call (keys hashed, pointers made, the job "
                         f"queued) {pl['submit_median_ms']:.2f} ms median; the engine's copy "
                         f"span (first copy started to last one waited) "
                         f"{pl['copy_span_best_ms']:.1f} ms at best, "
                         f"{pl['copy_span_median_ms']:.1f} median."
                         if "submit_median_ms" in pl else ""),
                      "", "These loads vary from run to run on the same node: over the five runs "
                      "of this check on 2026-12-04 with the copies in calls of 256, 10.6-16.0 ms "
                      "at best and 10.6-18.9 median, the cudaMemcpy 9.7-10.0 ms; one `CopyAsync` "
                      "of the same 16384 "
                      "pieces of 32 KiB (`kvoffload-bench gpu --sizes=32K --batch=16384 "
                      "--total=512M`) ran at 50.3 GiB/s, so the backend's calls of 256 keep the "
                      "copy engine busy. Before the pointers of a job were made in one tensor "
                      "operation, the submit call alone took 2.7 ms median on this node.", ""]
    lines += ["One stream per direction. The backend spread its batches over 4 streams a "
              "direction; on this GPU, batches of 16 KiB host-to-device copies then ran at 4.1-4.7 "
              "GiB/s (2 or 4 streams; four runs: two of a stand-alone experiment, two of this "
              "bench) and at 16.9-30.1 on one stream (ten runs); with "
              "both directions at once on one stream each, 16.6 GiB/s each way. From 32 KiB up, "
              "and device-to-host at every size, the stream count changed nothing beyond the runs' "
              "spread. A job's copies are also cut into calls of at most 256: a load of 4096 "
              "tokens above (16384 pieces) in one call took 20.2-22.1 ms at best (medians "
              "25.4-25.6), in calls of 256 12.3-12.8 (two runs each, alternating builds). 16 KiB is a typical piece of a KV block (one layer's keys or values of a "
              "16-token page). What is left at 16 KiB: a gather kernel reading the pinned pool "
              "through its mapped address (an experiment, not in the backend, which has no device "
              "code and no device compiler in its build) moved 16 KiB blocks at 47.1-47.6 GiB/s "
              "host-to-device and 48.8-49.0 device-to-host in one run (docs/decisions.md).", "",
              f"Command: {cmd}", ""]
    return lines


def ttft(t):
    lines = ["## 7. TTFT: prefix hits from each tier against recomputing, on vLLM's CPU engine", ""]
    if t is None:
        return lines + ["Not run (no ttft.json): `python3 bench/ttft/run.py BUILD RESULTS` in the "
                        "vLLM virtualenv (hack/vllm-venv.sh).", ""]
    m = t["model"]
    lines += [f"Measured {t['measured_utc']} UTC (load average {t['loadavg']} after it), "
              f"{t['wall_s']:.0f} s. Model: Llama with random weights made and saved by the run "
              f"(tests/vllm/tiny_model.py), {m['layers']} layers, hidden {m['hidden']}, MLP "
              f"{m['intermediate']}, {m['heads']} query / {m['kv_heads']} KV heads, "
              f"{m['params_m']:.0f}M parameters, fp32; one {m['tokens_per_block']}-token block of KV "
              f"is {m['block_bytes'] >> 10} KiB ({m['slot_bytes'] >> 10} KiB in a slot or a file). "
              "vllm.LLM, one engine per configuration in its own process, all alive at once: no "
              "connector (recompute); the pinned tier alone; a pinned tier of "
              f"{t['engine']['disk_pinned_slots']} blocks in front of an emptyDir disk tier. Each "
              "prompt is sent cold to each, then in rounds to each in turn (order rotating), vLLM's "
              "own prefix cache reset before every request, so a repeat can only hit through the "
              "connector; the engine's stats must show every full block loaded and, for the disk "
              "engine, all but the pinned tier's few read from disk, or the run fails. TTFT: "
              f"`generate` with max_tokens=1, best of {t['rounds']} rounds. Load: from the "
              "connector's submit of the load job to when vLLM saw it finished; its bandwidth is "
              "the KV bytes delivered over that span (in brackets: the engine's own span from its "
              "first host-to-device copy to the last, which for a disk hit covers the reads, as "
              "each copy starts when its read completes), against memcpy of the same block size "
              f"on the host device's thread count (`kvoffload-bench cpu`, "
              f"{t['memcpy_gibps']:.2f} GiB/s) and fio O_DIRECT reads of "
              f"what the disk tier reads per block (the payload: an emptyDir tier keeps its "
              f"blocks in a slot file) in its file system ({t['fio_read_gibps']:.2f} "
              "GiB/s), each best of a run before and one after the rounds. Targets at 4k tokens: "
              "pinned >= 10x faster than recompute, disk >= 5x, loads >= 0.70 of the tier's "
              "limit.", ""]
    rows, missed = [], []
    for s in t["engine"]["sizes"]:
        b = s["best"]
        rec = b["recompute"]["ttft_s"]
        judged = s["tokens"] == 4096
        n = len(s["rounds"]["recompute"])
        rows.append([f"{s['tokens']}" + (f" ({n} rounds)" if n != t["rounds"] else ""), "recompute", f"{rec * 1000:.0f} ms", "1", "", "", "", "",
                     f"cold {s['cold_s']['recompute'] * 1000:.0f} ms"])
        for tier, limit, want in (("pinned", t["memcpy_gibps"], 10), ("disk", t["fio_read_gibps"], 5)):
            x = b[tier]
            speedup = rec / x["ttft_s"]
            frac = x["load_gibps"] / limit
            verdict = ""
            if judged:
                ok_s, ok_b = speedup >= want, frac >= 0.7
                verdict = f">= {want}x: {met(ok_s)}; >= 0.70: {met(ok_b)}"
                if not ok_s:
                    missed.append(f"{tier} speed-up")
                if not ok_b:
                    missed.append(f"{tier} load bandwidth")
            src = (f"{x['from_disk_blocks']} of {x['loaded_blocks']} from disk"
                   if tier == "disk" else f"{x['loaded_blocks']} pinned")
            copy = f" (copies {x['copy_s'] * 1000:.1f})" if "copy_s" in x else ""
            rows.append(["", tier, f"{x['ttft_s'] * 1000:.1f} ms", f"{speedup:.1f}x",
                         f"{x['bytes'] / 2**20:.1f} MiB ({src})",
                         f"{x['load_s'] * 1000:.1f} ms{copy}",
                         f"{x['load_gibps']:.2f} GiB/s", f"{frac:.2f}",
                         f"cold {s['cold_s'][tier] * 1000:.0f} ms; {verdict}".rstrip("; ")])
    lines += [table(["tokens", "KV from", "TTFT (best)", "speed-up", "loaded", "load (engine copies)",
                     "load bandwidth", "of limit", "cold / target"], rows), ""]
    if t["engine"].get("skipped"):
        lines += [f"Skipped: {', '.join(str(x) for x in t['engine']['skipped'])} tokens, whose "
                  f"recomputes would not have fit the section's {t['engine']['budget_s']:.0f} s "
                  "(estimated from the size before, scaled by the tokens squared).", ""]
    lines += ["Command: `\"$(hack/vllm-venv.sh)/bin/python\" bench/ttft/run.py build "
              "build/bench-results` (part of `make bench`); limits: "
              f"`{t['memcpy_command']}` ; `{t['fio_command']}`", ""]
    sv = t.get("serve")
    if sv:
        lines += ["### Through `vllm serve`, as the webhook starts it", "",
                  f"The golden agent-mode pod ({sv['golden']}): its container command line and "
                  "injected env, run on this machine by tests/vllm/pod_runner.py (volume paths to "
                  "host directories), with the model flags and tier sizes for this model appended "
                  "as tests/vllm/test_entry_point.py does for its tiny one, and "
                  "VLLM_SERVER_DEV_MODE=1 for POST /reset_prefix_cache (vLLM's own cache only), "
                  "sent before every request. Two servers at once: pinned tier alone, and a "
                  f"{sv['cpu_slots']['disk']}-block pinned tier in front of the disk tiers. TTFT is "
                  "measured by the client: from sending a streaming /v1/completions request to the "
                  "first chunk with text. Recompute: a prompt the pod has never seen (a miss, "
                  "stores included), on the pinned server. The API's cached_tokens must equal the "
                  "prompt's full blocks for every hit, and be 0 for every miss.", ""]
        rows = []
        for s in sv["sizes"]:
            b = s["best"]
            rec = b["recompute"]
            rows.append([f"{s['tokens']}", f"{rec * 1000:.0f} ms",
                         f"{b['pinned'] * 1000:.0f} ms", f"{rec / b['pinned']:.1f}x",
                         f"{b['disk'] * 1000:.0f} ms", f"{rec / b['disk']:.1f}x"])
        lines += [table(["tokens", "recompute (miss)", "pinned hit", "speed-up", "disk hit",
                         "speed-up"], rows), ""]
        # The golden's KServe launch script is long: its arguments after it are what was added.
        argv = [f"'<{a.count(chr(10)) + 1}-line launch script of the golden pod>'" if "\n" in a
                else a for a in sv["argv"]["pinned"]]
        lines += ["Command line (pinned server; host paths under the bench scratch directory):", "",
                  "    " + " ".join(argv), ""]
    for kind in ("pinned", "disk"):
        if any(m.startswith(kind) for m in missed):
            lines += [TTFT_WHY[kind], ""]
    return lines


# Where the time of a load goes: the pinned paragraph from bench/ttft/load_profile.py (timestamps
# and perf of pinned 4096-token hits in vLLM, 2026-12-01 13:32-13:50 UTC, load average 10-17
# from other tenants) and `kvoffload-bench scatter`; the disk paragraph from a profile and the
# engine's stats of the same load path outside vLLM (2026-12-01, load average 9-10).
TTFT_WHY = {
    "pinned": "Why pinned loads miss the bandwidth target, from a profile "
              "(`PROFILE_AB=1 \"$(hack/vllm-venv.sh)/bin/python\" bench/ttft/load_profile.py build "
              "build/load-profile`: one pinned engine of this model, 40 hits of 4096 tokens timed "
              "on CLOCK_MONOTONIC, then 40 under `perf record -k CLOCK_MONOTONIC -F 10000 -g -e "
              "cpu-clock -e sched:sched_switch` of the engine process; 2026-12-01 13:48 UTC, load "
              "average 12-17 from other tenants' builds, so its spans are longer than this "
              "table's). A pinned load is nothing but copies by the host device (the CPU "
              "stand-in for a GPU's DMA): 128 blocks, each six 32 KiB pieces into rows of vLLM's "
              "six per-layer tensors, cut into 256 KiB chunks that the device's 2 worker threads "
              "and the engine's job thread copy together. The copies reach memcpy speed when "
              "they have the cores: the same load outside vLLM, waited at once (the script's "
              "reference), copied in 1.74-2.22 ms at best (two runs), memcpy of the same pieces "
              "into a destination as large as the load took 1.87-2.04 ms on 2 threads and 2.81 "
              "ms on one (whole blocks 1.62-1.79 and 2.77 ms; `build/bench/kvoffload-bench "
              "scatter --block-size=196608 --blocks=128 --pieces=6 --threads=2 --reps=300`, three "
              "runs at 13:45, load average 12). Inside vLLM, without the yield described below "
              "(the code this table measured), the copies took 2.9 ms at best, 3.9 median (one "
              "thread's memcpy), and the span 3.6 ms at best, 6.5 median. Per load, medians "
              "from the submit under perf (hits with and without the yield alternating): the job "
              "thread ran and copied from about 0.8 ms (the submit call's Python, 0.22 ms at "
              "best, then the wake-up; woken, the job thread often takes the submitting vLLM "
              "thread's core, whose call then returns only after the copies), the device's "
              "workers joined at 1.4 ms, the last "
              "memcpy sample came at 5.2 ms, the job thread slept at 6.3 ms, and vLLM saw the "
              "job done 0.45 ms after that (it polls every 0.14 ms). While the loads ran, perf "
              "counted per load 6.2 ms of CPU in vLLM's step loop (the Python interpreter: "
              "`vllm.LLM` steps in process without sleeping while the request waits for its KV), "
              "4.1 ms of memcpy (device workers 2.7, job thread 1.4), 0.5 ms of torch's OpenMP "
              "worker spin-waiting in libgomp, 0.9 ms in the kernel (wake-ups and switches) and "
              "0.15 ms of libkvoffload's other work. So the copies are not slow: they wait for "
              "cores that vLLM's polling loop, torch's OpenMP pool and the other tenants hold, "
              "and each hand-off between threads waits for a core too. The adapter now yields "
              "the core once per poll that finds a load running, and builds a load's arrays in C "
              "(the submit call's Python 0.39 -> 0.22 ms); the table above was measured before "
              "both. With hits alternating with and without the yield in one run (`PROFILE_AB=1`, "
              "four runs at load average 8-17), the span's median fell 13.3 -> 8.8, 7.9 -> 7.4, "
              "6.5 -> 3.9 and 6.7 -> 4.6 ms, its best 3.3 -> 2.4, 4.0 -> 3.5, 3.6 -> 2.1 and 4.0 "
              "-> 3.8 ms. The limit "
              "column, memcpy in `kvoffload-bench cpu`, copies whole blocks into a 6 MiB device "
              "buffer that stays in the cache (32 MiB of L3 here), while a 4k-token load writes "
              "24 MiB of rows once: the scatter figures, not that column, are what a load with "
              "both cores could reach (12.5 GiB/s at best at load average 12; the column was "
              "measured on a quiet machine, so the two are from different runs). The speed-up "
              "targets do not depend on it (a hit's TTFT is mostly vLLM's own step for the last "
              "token); on a GPU this copy is an H2D transfer (section 6).",
    "disk": "Why disk loads miss the bandwidth target: a disk hit waits on the disk, whose speed "
            "moves between the fio runs that set the limit and the rounds. The load's shape "
            "outside vLLM, one job of 124 blocks of 192 KiB read from the emptyDir tier's slot "
            "file (`kvoffload-bench disk --block-size=192K --qd=8 --total=256M --state=full "
            "--load-batch=124 --load-jobs=1`, 2026-12-06, two runs), read 1.81-1.90 GiB/s "
            "where fio at depth 64 read 1.84 on the same file system, and no faster with the "
            "blocks' verification and copies skipped (1.59-1.80, a build made for the "
            "experiment): the reads, not the engine's work on them, set its pace. Copies start "
            "as each read completes, so they hide behind the reads.",
}


def crc(c):
    lines = ["## 8. Block checksum (CRC-32C) per core: ISA-L against the one-stream loop it replaced", ""]
    if c is None:
        return lines + ["Not run (no agent-crc.json).", ""]
    x = c["result"]

    def size(n):
        return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
    rows = [[size(r["buffer_bytes"]), str(r["buffers"]), f"{r['isal_gbps']:.2f} GB/s",
             f"{r['one_stream_gbps']:.2f} GB/s", f"{r['speedup']:.2f}x"] for r in x["results"]]
    lines += ["Every block's payload and trailer are checksummed on store and verified on load. One "
              f"thread, best of {x['reps']} alternating passes over 256 MiB of buffers of each size; "
              "GB/s is 10^9 bytes per second of the thread's CPU time (other tenants' time excluded). "
              "Both give the same checksums or the run fails.", "",
              table(["buffer", "buffers", "ISA-L crc32_iscsi", "one-stream loop (before)", "speedup"], rows),
              "", f"Command: `{c['command']}`", "",
              "KV blocks are 64 KiB and larger (192 KiB in section 7; a 16-token block of an 8B model "
              "with 32 layers and 8 KV heads of 128 is 2 MiB), where ISA-L's interleaved streams pay "
              "off; on 4 KiB buffers the one-stream loop was faster on this machine.", "",
              "aarch64 (Grace hosts): ISA-L runs another kernel there, built on the CRC32C and PMULL "
              "instructions. `make check-aarch64` (in CI) cross-builds the checksum tests for aarch64 "
              "and runs them under qemu-user: the same vectors pass, and qemu's trace shows the "
              "`crc32cx` instruction executed. No aarch64 machine is at hand, so its GB/s is not "
              "measured here; an emulator's figure would mean nothing.", ""]
    return lines


def listed_in(describe):
    """The disk tier's words on how its directory was listed, from the engine's description."""
    at = describe.find("blocks recovered")
    return describe[at:describe.find(";", at)] if at >= 0 else "not described"


def recovery(r):
    lines = ["## 9. Restart: opening a persistent tier of 1M blocks", ""]
    if r is None:
        return lines + ["Not run (no agent-recovery.json).", ""]
    x = r["result"]
    n = x["blocks"]
    warm, cold = x["warm"], x["cold"]
    rows = [["open, warm (entries and inodes cached)", f"{warm['median_s']:.3f} s",
             f"{warm['min_s']:.3f}-{warm['max_s']:.3f} s", f"{warm['cpu_median_s']:.3f} s",
             "< 1 s", met(warm["median_s"] < 1.0)]]
    if cold.get("measured"):
        rows.append(["open, cold (`echo 3 > /proc/sys/vm/drop_caches` first)",
                     f"{cold['median_s']:.3f} s", f"{cold['min_s']:.3f}-{cold['max_s']:.3f} s",
                     f"{cold['cpu_median_s']:.3f} s", "< 1 s", met(cold["median_s"] < 1.0)])
    else:
        rows.append(["open, cold", "not measured", cold.get("reason", ""), "", "< 1 s", ""])
    rows.append(["first eviction of a recovered block after the open returned (cold when "
                 f"measured): the {x['sample_blocks']} sample reads, then a store into the full "
                 "tier, whose demotion waits until the recovered files are checked and ordered",
                 f"{x['first_eviction_after_open_s']:.3f} s", "", "", "", ""])
    build = x["build"]
    built = ("reused from an earlier run (checked: every block found, a sample read back)"
             if build["reused"] else
             f"built by this run in {build['build_s']:.0f} s ({build['build_blocks_per_s']:.0f} blocks/s "
             "through the engine)")
    lines += [f"{n} blocks of {x['block_bytes']} bytes: one {x['file_bytes']}-byte file each, "
              f"{x['tier_bytes'] / 2**30:.1f} GiB, in one fingerprint directory on {r['fstype']}; "
              f"the tree was {built}. Time from `Engine::Open`'s call to its return, when lookups "
              f"and loads of the recovered blocks are served; median of {x['reps']} opens, each "
              "a fresh engine. Measured "
              f"{r['measured_utc']} UTC, load average {r['loadavg']}.", "",
              table(["what", "median (wall)", "range", "CPU (process)", "target", ""], rows), "",
              f"Command: `{r['command']}`", "",
              "The open lists the directory (names and entry types) and indexes the blocks from "
              "their names; nothing is `stat`ed per file before serving. Sizes and modification "
              "times are read afterwards by the tier's own thread (offload-agent/FORMAT.md, "
              "Start-up), which is what the first eviction of a recovered block waits for; lookups, "
              "loads and writes that fit do not wait. With cold caches that thread reads every "
              "recovered inode, the reads the open used to do before it served anything: the "
              "first eviction row. Before this, the open `stat`ed every file by path and served "
              "nothing until done: 12.6 s warm and 57.5 s cold at 1M blocks on this machine "
              "(one run each, same tree), 1.1-1.3 s and 3.3-4.3 s at 100k.", "",
              "The CPU column is the process's CPU time over the open: the opening thread, which "
              "parses the names and indexes the keys, and the threads that list the directory "
              "(getdents64, 256 KiB at a time) a few buffers ahead of it. A hashed ext4 directory "
              "is listed by up to 8 streams at once (the `describe` line: "
              f"\"{listed_in(x['describe'])}\"), each over its own part of the hash space, which "
              "ext4 takes as the listing position; the kernel's share (reading the directory's "
              "blocks, hashing and sorting every entry of each as it returns it) is then spread "
              "over them, and cold, their reads of the directory's blocks overlap where one stream "
              "read them one at a time. One stream before this, measured the day before on a tree "
              "built by the same command: 0.633 s warm (0.556-0.672) and 2.147 s cold "
              "(2.006-2.320). A bare getdents64 loop over the 1M entries: cold 2.0-2.4 s with one "
              "stream, 0.6-0.7 s with 8; warm 0.51 s and 0.19 s. What is left is the opening "
              "thread's indexing: warm and cold now take about the same wall time, and warm is "
              "slower than with one stream, since on 2 cores the listing threads take turns with "
              "the indexing one (still under 1 s). With 2 streams the warm open was 0.48-0.66 s "
              "and the cold 1.13-1.30 s; with the listing threads at a lower priority (nice 10) "
              "0.49-0.71 s warm and 0.82-1.25 s cold: one run of 3 opens each, same tree, same "
              "hour, on a shared machine. Below 1 s cold is the target, so 8 streams at normal "
              "priority stay. On a busy machine the wall time is the other tenants' (see the "
              "load average).", ""]
    return lines


def main():
    fstype = subprocess.run(["df", "--output=fstype", "."], stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    with open("/proc/loadavg") as f:
        loadavg = f.read().split()[:3]
    head = [
        "# Benchmark results", "",
        "Generated by `bench/report.py` from one `make bench` run; every figure is a ratio to a "
        "limit measured in the same run on the same machine. Do not edit by hand: rerun.", "",
        "| | |", "|---|---|",
        f"| date (UTC) | {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} |",
        f"| machine | {os.cpu_count()} cores, {cpu_model()}, kernel {platform.release()} |",
        f"| file system (bench dir) | {fstype} |",
        f"| load average at the end | {' '.join(loadavg)} |",
        f"| command | `{COMMAND}` |",
        f"| wall time | {float(WALL):.0f} s |", "",
        "These machines are shared and noisy (the load average above includes the benchmark's own "
        "clients): absolute figures move between runs; the ratios (limit measured in the same run, "
        "alternating, best of each) are the figures to read.", ""]
    sections = [webhook(load("webhook.json")), disk(load("agent-disk.json")), cpu(load("agent-cpu.json")),
                policy(load("agent-policy.json")), trace(load("agent-trace.json")), gpu(load("gpu-bench.json")),
                ttft(load("ttft.json")), crc(load("agent-crc.json")),
                recovery(load("agent-recovery.json"))]
    # A GPU is seldom where make bench runs: without one, the last GPU run's section stays.
    kept_gpu = old_sections().get(6)
    if load("gpu-bench.json") is None and kept_gpu and any("batched / ceiling" in line for line in kept_gpu):
        sections[5] = kept_gpu
    if ONLY is not None:
        sections = splice(sections)
        head = open(OUT).read().split("\n## 1.", 1)[0].split("\n")
    parts = head + [line for section in sections for line in section]
    with open(OUT, "w") as f:
        f.write("\n".join(parts))
    # A run that misses a target is a failed run (make bench exits non-zero), with RESULTS.md
    # written all the same to say where and by how much.
    missed = sum(line.count("**missed**") for line in parts)
    if missed:
        sys.exit(f"report.py: {missed} target(s) missed; see {OUT}")


def old_sections():
    """OUT's sections as they are, by number, as lists of lines."""
    if not os.path.exists(OUT):
        return {}
    old = {}
    for chunk in open(OUT).read().split("\n## ")[1:]:
        number = int(chunk.split(".", 1)[0])
        old[number] = ("## " + chunk).rstrip("\n").split("\n") + [""]
    return old


def splice(sections):
    """Keeps the sections of OUT not named in --only; marks the regenerated ones."""
    old = old_sections()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    with open("/proc/loadavg") as f:
        loadavg = " ".join(f.read().split()[:3])
    out = []
    for number, lines in enumerate(sections, start=1):
        if number in ONLY:
            out.append(lines[:2] + [f"Regenerated {when} UTC by `{COMMAND}` (load average {loadavg} at the "
                                    "end); the other sections are from the run in the header.", ""] + lines[2:])
        else:
            out.append(old.get(number, lines))
    return out


if __name__ == "__main__":
    main()
