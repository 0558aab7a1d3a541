#!/usr/bin/env python3
"""Agent benchmarks, each figure beside its limit measured in the same run on the same machine:
disk tier vs fio (O_DIRECT, same file system, block size and queue depth), pinned tier vs
memcpy, policy ns/op at 1M blocks, hit ratios vs Belady's OPT on four trace shapes (mixed, chat,
agent, rag; see bench/agent/trace.h), the block checksum's GB/s per core vs the one-stream loop
it replaced, the time to reopen a persistent tier of 1M blocks against the 1 s target. Writes
one JSON per benchmark into RESULTS_DIR (agent-disk.json, agent-cpu.json, agent-policy.json,
agent-trace.json, agent-crc.json, agent-recovery.json).

usage: run.py BUILD_DIR RESULTS_DIR
env:   BENCH_DISK_DIR (default BUILD_DIR/bench-scratch: must not be tmpfs), BENCH_DISK_TOTAL
       (bytes per block size, default 256M, at least 256 blocks), BENCH_DISK_QD (8),
       BENCH_CPU_TOTAL (256M),
       BENCH_DISK_REPS (3: agent and fio alternate, best of each), BENCH_POLICY_OPS (1000000),
       BENCH_POLICY_ROUNDS (5: every policy row once a round, the median reported),
       BENCH_TRACE_REQUESTS (20000 per trace shape), BENCH_TRACE_FILES (colon-separated JSONL
       traces replayed after the shapes, such as Mooncake's; bench/README.md),
       BENCH_RECOVERY_BLOCKS (1048576),
       BENCH_RECOVERY_DIR (default BUILD_DIR/bench-recovery, kept: the 4 GiB tree takes minutes
       to build and is reused by the next run), BENCH_AGENT_ONLY (comma-separated subset of
       disk,cpu,policy,trace,crc,recovery; default all)
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

BUILD, RESULTS = sys.argv[1], sys.argv[2]
BENCH = os.path.join(BUILD, "bench", "kvoffload-bench")
# Relative as given (kvoffload-bench makes it absolute): the commands go into RESULTS.md.
DISK_DIR = os.environ.get("BENCH_DISK_DIR", os.path.join(BUILD, "bench-scratch"))
DISK_TOTAL = os.environ.get("BENCH_DISK_TOTAL", "256M")
QD = int(os.environ.get("BENCH_DISK_QD", "8"))
DISK_REPS = int(os.environ.get("BENCH_DISK_REPS", "3"))
CPU_TOTAL = os.environ.get("BENCH_CPU_TOTAL", "256M")
POLICY_OPS = os.environ.get("BENCH_POLICY_OPS", "1000000")
POLICY_ROUNDS = int(os.environ.get("BENCH_POLICY_ROUNDS", "5"))
TRACE_REQUESTS = os.environ.get("BENCH_TRACE_REQUESTS", "20000")
TRACE_FILES = [x for x in os.environ.get("BENCH_TRACE_FILES", "").split(":") if x]
RECOVERY_BLOCKS = int(os.environ.get("BENCH_RECOVERY_BLOCKS", str(1 << 20)))
# Relative as given: the command line goes into RESULTS.md.
RECOVERY_DIR = os.environ.get("BENCH_RECOVERY_DIR", os.path.join(BUILD, "bench-recovery"))
ONLY = [x for x in os.environ.get("BENCH_AGENT_ONLY", "").split(",") if x]


def log(msg):
    print(f"[bench agent] {msg}", file=sys.stderr, flush=True)


def bench(*args):
    """Runs kvoffload-bench; returns (its JSON, the exact command line)."""
    cmd = [BENCH, *args]
    log(" ".join(shlex.quote(a) for a in cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out), " ".join(shlex.quote(a) for a in cmd)


# A pass is at least this many blocks. The store figure counts the bytes that reached the disk
# while the stores ran: the pinned tier (4 x QD slots) fills before the first disk write, and
# up to QD writes are still in flight when the last store returns. With 8 MiB blocks a 256M
# pass was 32 blocks (the bench makes it 64), half of them in the pinned tier, and stores came
# to 0.61-0.93 of fio where 2 GiB passes gave 0.95-1.46 (alternating, 2026-12-04).
DISK_MIN_BLOCKS = 256
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(text):
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def pass_size(bs):
    """The bytes of one pass at block size bs, as kvoffload-bench and fio take them."""
    total = max(size_bytes(DISK_TOTAL), DISK_MIN_BLOCKS * size_bytes(bs))
    for unit in "GMK":
        if total % UNITS[unit] == 0:
            return f"{total // UNITS[unit]}{unit}"
    return str(total)


def run_fio(cmd):
    """Runs fio (--output-format=json); returns its one job's (or group's) results."""
    log(" ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)["jobs"][0]


def fio(rw, bs, overwrite=False, burst=False, threads=False):
    """fio's bandwidth in GiB/s for one sequential pass (pass_size), O_DIRECT, io_uring.
    overwrite: the file is written whole before the timed pass, which then writes over
    allocated blocks, as a full tier does. burst: QD transfers submitted together and all
    awaited before the next QD, the shape of one engine job of QD blocks at a time. threads:
    QD jobs at depth 1, each over its own file of a QD-th of the pass, the shape of the bench's
    QD client threads with one one-block job each (a reference beside the limit, not the
    limit: fio at depth QD is that)."""
    total = size_bytes(pass_size(bs))
    cmd = ["fio", f"--name=kvoffload-{rw}", f"--directory={DISK_DIR}", f"--rw={rw}", f"--bs={bs}",
           *([f"--numjobs={QD}", "--iodepth=1", f"--size={total // QD}", "--group_reporting"]
             if threads else [f"--iodepth={QD}", f"--size={pass_size(bs)}"]),
           "--direct=1", "--ioengine=io_uring",
           *(["--overwrite=1"] if overwrite else []),
           *([f"--iodepth_batch_submit={QD}", f"--iodepth_batch_complete_min={QD}"] if burst else []),
           "--unlink=1", "--output-format=json"]
    job = run_fio(cmd)
    return job["read" if rw == "read" else "write"]["bw_bytes"] / 2**30, " ".join(cmd)


def fio_mixed(bs, threads=False):
    """fio's read and write bandwidth in GiB/s with reads and writes together, half each
    (--rw=rw), over a file of a pass that it wrote whole first, moving two passes in all
    (wrapping around the file): the limit of the bench's "mixed" state, which stores a pass
    (each store evicting) while it loads another. threads: QD jobs at depth 1 over their own
    files, as in fio()."""
    total = size_bytes(pass_size(bs))
    size = total // QD if threads else total
    cmd = ["fio", "--name=kvoffload-rw", f"--directory={DISK_DIR}", "--rw=rw", "--rwmixread=50",
           f"--bs={bs}",
           *([f"--numjobs={QD}", "--iodepth=1", "--group_reporting"] if threads
             else [f"--iodepth={QD}"]),
           f"--size={size}", f"--io_size={2 * size}", "--direct=1", "--ioengine=io_uring",
           "--overwrite=1", "--unlink=1", "--output-format=json"]
    job = run_fio(cmd)
    return job["read"]["bw_bytes"] / 2**30, job["write"]["bw_bytes"] / 2**30, " ".join(cmd)


def references(state, limit, ref, ref_cmd):
    """The fio references in a row's own client shape: bursts for "step", threads otherwise."""
    if state == "step":
        keys = {"burst_write": "burst_write", "burst_read": "burst_read"}
    elif state == "mixed":
        keys = {"threads_write": "threads_mixed_write", "threads_read": "threads_mixed_read"}
    else:
        keys = {"threads_write": f"threads_write_{limit}", "threads_read": "threads_read"}
    out = {}
    for name, key in keys.items():
        out[f"fio_{name}_gibps"] = ref[key]
        out[f"fio_{name}_command"] = ref_cmd[key]
    return out


def fs_type(path):
    return subprocess.run(["df", "--output=fstype", path], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.split()[-1]


def disk():
    os.makedirs(DISK_DIR, exist_ok=True)
    fstype = fs_type(DISK_DIR)
    if fstype == "tmpfs":
        sys.exit(f"run.py: {DISK_DIR} is tmpfs (no O_DIRECT); set BENCH_DISK_DIR to a disk")
    rows = []
    for bs in ("64K", "256K", "2M", "8M"):
        # Alternating runs, best of each: the machine is shared and its neighbours come and go.
        # Both states of the tier (empty; full, so that every store evicts) share fio's figures.
        # Each state's write limit: fio writing a new file (empty) or over a written one (full).
        # "step" is the full tier as vLLM drives it: a step's blocks in one job (QD of them),
        # one job at a time, for stores and for loads.
        agent, cmds, fio_write, fio_read = {}, {}, {"empty": 0.0, "full": 0.0}, 0.0
        # References in the engine's client shapes, beside the limits: fio in "step" jobs'
        # shape (bursts of QD) and in the QD one-block client threads' shape (QD jobs, depth 1).
        ref = {key: 0.0 for key in ("burst_write", "burst_read", "threads_write_empty",
                                    "threads_write_full", "threads_read", "threads_mixed_read",
                                    "threads_mixed_write")}
        # "mixed": stores (each evicting) and loads at once; its limits are fio's reads and
        # writes at once (fio_mixed).
        mixed = {"read": 0.0, "write": 0.0}
        ref_cmd = {}
        fio_write_cmd = {}
        shapes = {"empty": ["--state=empty"], "full": ["--state=full"],
                  "step": ["--state=full", f"--store-batch={QD}", "--store-jobs=1",
                           f"--load-batch={QD}", "--load-jobs=1"],
                  "mixed": ["--state=mixed"]}
        for _ in range(DISK_REPS):
            for state, flags in shapes.items():
                got, cmds[state] = bench("disk", f"--dir={DISK_DIR}", f"--block-size={bs}",
                                         f"--qd={QD}", f"--total={pass_size(bs)}", *flags)
                # A tier on a file system refusing O_DIRECT runs buffered: its loads would be
                # the page cache's, measured against fio's reads from the disk.
                if "O_DIRECT on" not in got["describe"]:
                    sys.exit(f"run.py: the disk tier in {DISK_DIR} runs without O_DIRECT "
                             f"({got['describe']}); set BENCH_DISK_DIR to a disk that takes it")
                best = agent.setdefault(state, got)
                # Each direction's best run, with that run's time per block.
                for what, disk_us in (("store", "disk_write_us_per_block"),
                                      ("load", "disk_read_us_per_block")):
                    if got[f"{what}_gibps"] > best[f"{what}_gibps"]:
                        for key in (f"{what}_gibps", disk_us, f"{what}_us_per_block_in_flight"):
                            best[key] = got[key]
            for state in ("empty", "full"):
                w, fio_write_cmd[state] = fio("write", bs, overwrite=state == "full")
                fio_write[state] = max(fio_write[state], w)
            r, fio_read_cmd = fio("read", bs)
            fio_read = max(fio_read, r)
            r, w, fio_mixed_cmd = fio_mixed(bs)
            mixed = {"read": max(mixed["read"], r), "write": max(mixed["write"], w)}
            r, w, ref_cmd["threads_mixed_read"] = fio_mixed(bs, threads=True)
            ref_cmd["threads_mixed_write"] = ref_cmd["threads_mixed_read"]
            ref["threads_mixed_read"] = max(ref["threads_mixed_read"], r)
            ref["threads_mixed_write"] = max(ref["threads_mixed_write"], w)
            for key, rw, shape in (("burst_write", "write", {"overwrite": True, "burst": True}),
                                   ("burst_read", "read", {"burst": True}),
                                   ("threads_write_empty", "write", {"threads": True}),
                                   ("threads_write_full", "write",
                                    {"overwrite": True, "threads": True}),
                                   ("threads_read", "read", {"threads": True})):
                got, ref_cmd[key] = fio(rw, bs, **shape)
                ref[key] = max(ref[key], got)
        for state in shapes:
            limit = "empty" if state == "empty" else "full"  # "step" writes over a full tier
            a = agent[state]
            if state == "mixed":
                w, r, w_cmd, r_cmd = mixed["write"], mixed["read"], fio_mixed_cmd, fio_mixed_cmd
            else:
                w, r = fio_write[limit], fio_read
                w_cmd, r_cmd = fio_write_cmd[limit], fio_read_cmd
            rows.append({"block_size": bs, "state": state, "total": pass_size(bs),
                         "agent": a, "command": cmds[state],
                         "fio_write_gibps": w, "fio_read_gibps": r,
                         "fio_write_command": w_cmd, "fio_read_command": r_cmd,
                         **references(state, limit, ref, ref_cmd),
                         "store_ratio": a["store_gibps"] / w,
                         "load_ratio": a["load_gibps"] / r})
            log(f"disk {bs} {state}: store {a['store_gibps']:.2f} GiB/s vs fio {w:.2f}; "
                f"load {a['load_gibps']:.2f} vs fio {r:.2f}")
    shutil.rmtree(DISK_DIR, ignore_errors=True)
    # When, and how busy the machine was: the shared disk's figures move with its neighbours.
    return {"dir": DISK_DIR, "fstype": fstype, "qd": QD, "total": DISK_TOTAL, "rows": rows,
            "measured_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def cpu():
    rows = []
    for bs in ("256K", "2M"):
        out, cmd = bench("cpu", f"--block-size={bs}", f"--total={CPU_TOTAL}")
        rows.append({"block_size": bs, "result": out, "command": cmd})
    return {"rows": rows}


def policy():
    rows = []
    names = bench("policies")[0]["policies"]
    # 1M is the target, with new keys stored and with a loop of 1.5x the tier stored again (where
    # adaptive policies leave their LRU mode); 64K (index and list in cache) separates the
    # size's cost from the code's.
    for blocks, loop in ((1048576, 0), (1048576, 1572864), (65536, 0)):
        for name in names:
            rows.append({"policy": name, "blocks": blocks, "loop": loop, "results": []})
    # Rounds over every row rather than repeats of one row: at 1M blocks a figure moves with the
    # other tenants' load on the memory system (one binary gave lirs's loop inserts 133-287 ns
    # in five runs within five minutes), so each row's runs are spread over the whole section.
    for _ in range(POLICY_ROUNDS):
        for r in rows:
            out, r["command"] = bench("policy", f"--policy={r['policy']}", f"--blocks={r['blocks']}",
                                      f"--ops={POLICY_OPS}",
                                      *([f"--loop={r['loop']}"] if r["loop"] else []))
            r["results"].append(out)
    return {"rows": rows, "rounds": POLICY_ROUNDS}


# Every registered policy, at caches of 2%, 5% and 10% of each trace's distinct blocks: the
# regime of a CPU tier in front of a large working set. Each also under 3 other namings of the
# keys: the adaptive policies sample keys by hash, and a cell is met only if it is met whatever
# the keys are called.
TRACE_SHAPES = ("mixed", "chat", "agent", "rag")
TRACE_LABELINGS = "--labelings=4"


def trace():
    runs = []
    for shape in TRACE_SHAPES:
        out, cmd = bench("trace", f"--trace={shape}", f"--requests={TRACE_REQUESTS}",
                         "--cache-blocks=2%,5%,10%", TRACE_LABELINGS)
        runs.append({"result": out, "command": cmd})
    for path in TRACE_FILES:
        if not os.path.isfile(path):
            sys.exit(f"run.py: BENCH_TRACE_FILES names {path}, which is not a file")
        out, cmd = bench("trace", f"--trace-file={path}", "--cache-blocks=2%,5%,10%",
                         TRACE_LABELINGS)
        runs.append({"result": out, "command": cmd})
    return {"runs": runs}


def crc():
    out, cmd = bench("crc")
    return {"result": out, "command": cmd}


def recovery():
    """Seconds to reopen a persistent tier of RECOVERY_BLOCKS 4 KiB block files, warm and cold."""
    os.makedirs(RECOVERY_DIR, exist_ok=True)
    fstype = fs_type(RECOVERY_DIR)
    free = shutil.disk_usage(RECOVERY_DIR).free
    need = RECOVERY_BLOCKS * 4096
    built = os.path.isdir(os.path.join(RECOVERY_DIR, "kvoffload-v1"))
    if not built and free < need + (2 << 30):
        sys.exit(f"run.py: {RECOVERY_DIR} has {free >> 20} MiB free; the recovery tree needs "
                 f"{need >> 20} MiB and 2 GiB to spare: set BENCH_RECOVERY_BLOCKS lower")
    out, cmd = bench("recovery", f"--dir={RECOVERY_DIR}", f"--blocks={RECOVERY_BLOCKS}")
    return {"result": out, "command": cmd, "fstype": fstype,
            "measured_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def main():
    os.makedirs(RESULTS, exist_ok=True)
    benches = (("disk", disk), ("cpu", cpu), ("policy", policy), ("trace", trace), ("crc", crc),
               ("recovery", recovery))
    unknown = set(ONLY) - {name for name, _ in benches}
    if unknown:
        sys.exit(f"run.py: BENCH_AGENT_ONLY names {sorted(unknown)}; known: "
                 f"{', '.join(name for name, _ in benches)}")
    for name, fn in benches:
        if ONLY and name not in ONLY:
            continue
        with open(os.path.join(RESULTS, f"agent-{name}.json"), "w") as f:
            json.dump(fn(), f, indent=2)


if __name__ == "__main__":
    main()
