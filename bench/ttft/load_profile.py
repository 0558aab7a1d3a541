#!/usr/bin/env python3
"""Where a pinned-tier load's time goes inside vLLM's CPU engine: the load span of
RESULTS.md section 7 (from the connector's submit of the load job to when vLLM sees it
finished) cut into its parts, from timestamps and a perf profile of the engine process.
Runs in the vLLM virtualenv (hack/vllm-venv.sh), as root or with perf_event_paranoid <= 1:

    load_profile.py BUILD_DIR OUT_DIR

One engine with the pinned tier alone (bench/ttft/worker.py, the model of run.py) gets a
prompt cold, then hits of it, vLLM's own prefix cache reset before each. The engine process
records, on CLOCK_MONOTONIC, when each load job was submitted, every poll of it and the poll
that saw it done; `perf record -k CLOCK_MONOTONIC` of the same process during the last
rounds adds on the same clock when the libkvoffload threads were woken and ran, and which
code ran on the cores during the loads. Then the same load runs outside vLLM as the
reference (standalone()). Writes OUT_DIR/profile.json and the perf data.

env: PROFILE_TOKENS (4096), PROFILE_HITS (20 timed without perf, then as many under perf),
     PROFILE_FREQ (perf sampling Hz, 10000), PROFILE_AB=1 (every other load without the
     adapter's yield while it polls a running load, reported apart)
"""
import atexit
import collections
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
# The model of run.py (its MODEL): 6 layers, hidden 384, 2 KV heads; a block is 192 KiB.
MODEL = dict(layers=6, hidden=384, intermediate=1536, heads=6, kv_heads=2)


def engine_main(spec_path: str, hooks_path: str) -> None:
    """The engine process: worker.py with the load, poll and wait calls timestamped."""
    sys.path[:0] = [str(HERE), str(REPO / "tests" / "vllm"),
                    str(REPO / "offload-agent" / "python")]
    from kvoffload import engine as engine_mod, transfer, vllm as adapter

    import worker

    events, threads = [], {}

    def tids() -> set[int]:
        return {int(t) for t in os.listdir("/proc/self/task")}

    # libkvoffload's threads: the host device's copy workers start first, then the engine's
    # job workers (Engine::Open); both are new threads of the process.
    engine_init = engine_mod.Engine.__init__

    def counted_init(self, options):
        before = tids()
        engine_init(self, options)
        threads["libkvoffload"] = sorted(tids() - before)

    engine_mod.Engine.__init__ = counted_init
    core = transfer.TransferCore
    load, poll, wait = core.load, core.poll, core.wait

    # With PROFILE_AB=1 every other load runs without the adapter's yield while it polls a
    # running load (KVOffloadWorker._yield_to_copies): both ways in one run, alternating.
    ab = os.environ.get("PROFILE_AB") == "1"
    finished = adapter.KVOffloadWorker.get_finished
    state = {"yield": True}

    def get_finished(self):
        if ab:
            self._yield_to_copies = state["yield"]
        return finished(self)

    adapter.KVOffloadWorker.get_finished = get_finished

    def timed_load(self, keys, ids, generation=0):
        if ab:
            state["yield"] = not state["yield"]
        t0 = time.monotonic()
        job = load(self, keys, ids, generation)
        events.append(["load", t0, time.monotonic(), job, len(keys), state["yield"]])
        return job

    def timed_poll(self, job):
        t0 = time.monotonic()
        done = poll(self, job)
        events.append(["poll", t0, time.monotonic(), job, done])
        return done

    def timed_wait(self, job):
        t0 = time.monotonic()
        wait(self, job)
        events.append(["wait", t0, time.monotonic(), job])

    core.load, core.poll, core.wait = timed_load, timed_poll, timed_wait
    atexit.register(lambda: pathlib.Path(hooks_path).write_text(
        json.dumps({"events": events, "threads": threads})))
    worker.main(spec_path)


def loads_from(events) -> list[dict]:
    """Per load job: submit call, the polls while it ran, the moment vLLM saw it done."""
    out, open_jobs = [], {}
    for ev in events:
        kind, t0, t1, job = ev[:4]
        if kind == "load":
            open_jobs[job] = {"job": job, "blocks": ev[4], "yield": ev[5], "submit": t0,
                              "submitted": t1, "polls": []}
        elif job in open_jobs:
            rec = open_jobs[job]
            if kind == "poll" and not ev[4]:
                rec["polls"].append(t0)
                continue
            rec["seen"] = t1
            rec["polls"].append(t0)
            out.append(open_jobs.pop(job))
    return out


def parse_perf(data: pathlib.Path) -> list[dict]:
    """perf script into records: tid, time (CLOCK_MONOTONIC), event, the call chain's frames
    ("symbol (dso)", leaf first) and the rest of the header line (sched_switch's fields)."""
    text = subprocess.run(["perf", "script", "-i", str(data), "-F",
                           "comm,tid,time,event,ip,sym,dso,trace"], check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    header = re.compile(r"^\s*.+?\s+(\d+)\s+(\d+\.\d+):\s+(?:\d+\s+)?([\w:-]+):\s*(.*)$")
    recs = []
    for line in text.splitlines():
        m = header.match(line)
        if m:
            tid, t, event, rest = m.groups()
            recs.append({"tid": int(tid), "t": float(t), "event": event, "stack": [],
                         "rest": rest})
        elif line.strip() and recs:
            recs[-1]["stack"].append(line.strip().split(" ", 1)[-1])
    return recs


def role_of_threads(lib_tids: list[int], copy_threads: int, pid: int) -> dict:
    roles = {t: "device worker" for t in lib_tids[:copy_threads]}
    roles.update({t: "engine worker" for t in lib_tids[copy_threads:]})
    roles[pid] = "vLLM main"
    return roles


def classify(r, roles) -> str:
    s = r["stack"]
    leaf = s[0] if s else ""
    role = roles.get(r["tid"], "other threads")
    if "memmove" in leaf or "memcpy" in leaf:
        return f"{role}: memcpy"
    if "libgomp" in leaf:  # torch's OpenMP threads spin-waiting for work
        return f"{role}: OpenMP spin-wait (libgomp)"
    if "kernel.kallsyms" in leaf:
        return f"{role}: kernel"
    if role == "vLLM main":
        if "kvo_" in " ".join(s):
            return "vLLM main: in libkvoffload calls"
        return "vLLM main: step loop (Python and torch)"
    return f"{role}: other"


def analyse(loads, recs, roles, freq) -> dict:
    period = 1.0 / freq
    cpu = collections.Counter()
    top = collections.Counter()
    window_s = 0.0
    wake_engine, wake_device, finish, first_copy, last_copy = [], [], [], [], []
    seen_after_done = []
    switches = [r for r in recs if r["event"] == "sched:sched_switch"]
    samples = [r for r in recs if r["event"] == "cpu-clock"]
    engine_tids = {t for t, role in roles.items() if role == "engine worker"}
    device_tids = {t for t, role in roles.items() if role == "device worker"}

    def next_pid(r):
        m = re.search(r"next_pid=(\d+)", r["rest"])
        return int(m.group(1)) if m else -1

    def prev_pid(r):
        m = re.search(r"prev_pid=(\d+)", r["rest"])
        return int(m.group(1)) if m else -1

    for ld in loads:
        a, b = ld["submit"], ld["seen"]
        if not samples or a < samples[0]["t"] or b > samples[-1]["t"]:
            continue
        window_s += b - a
        for r in samples:
            if a <= r["t"] <= b:
                cpu[classify(r, roles)] += period
                if r["stack"]:
                    top[(roles.get(r["tid"], "other threads"), r["stack"][0][:60])] += period
        sw = [r for r in switches if a <= r["t"] <= b]
        ins_e = [r["t"] for r in sw if next_pid(r) in engine_tids]
        ins_d = [r["t"] for r in sw if next_pid(r) in device_tids]
        # The engine worker going to sleep (not preempted): it finished the job.
        outs_e = [r["t"] for r in sw if prev_pid(r) in engine_tids and "prev_state=S" in r["rest"]]
        if ins_e:
            wake_engine.append(ins_e[0] - a)
        if ins_d:
            wake_device.append(ins_d[0] - a)
        if outs_e:
            finish.append(outs_e[-1] - a)
            seen_after_done.append(b - outs_e[-1])
        copies = [r["t"] for r in samples if a <= r["t"] <= b and classify(r, roles).endswith("memcpy")]
        if copies:
            first_copy.append(copies[0] - a)
            last_copy.append(copies[-1] - a)
    n = sum(1 for ld in loads if samples and samples[0]["t"] <= ld["submit"] and ld["seen"] <= samples[-1]["t"])
    med = lambda xs: round(statistics.median(xs) * 1e3, 3) if xs else None  # noqa: E731
    return {
        "loads_profiled": n, "window_ms_mean": round(window_s / max(n, 1) * 1e3, 3),
        "threads": {str(t): r for t, r in roles.items()},
        "cpu_ms_per_load": {k: round(v / max(n, 1) * 1e3, 3) for k, v in cpu.most_common()},
        "top_ms_per_load": [[role, sym, round(v / max(n, 1) * 1e3, 3)]
                            for (role, sym), v in top.most_common(15)],
        "median_ms_from_submit": {"engine worker switched in": med(wake_engine),
                                  "first device worker switched in": med(wake_device),
                                  "first memcpy sample": med(first_copy),
                                  "last memcpy sample": med(last_copy),
                                  "engine worker switched out (job done)": med(finish),
                                  "vLLM saw it done, after that": med(seen_after_done)},
    }


def timeline(loads) -> dict:
    med = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    gaps = [b - a for ld in loads for a, b in zip(ld["polls"], ld["polls"][1:])]
    return {"loads": len(loads),
            "span_ms": med([ld["seen"] - ld["submit"] for ld in loads]),
            "span_ms_min": round(min(ld["seen"] - ld["submit"] for ld in loads) * 1e3, 3),
            "submit_call_ms": med([ld["submitted"] - ld["submit"] for ld in loads]),
            "submit_to_first_poll_ms": med([ld["polls"][0] - ld["submitted"] for ld in loads]),
            "last_poll_gap_ms": med([ld["polls"][-1] - ld["polls"][-2] for ld in loads
                                     if len(ld["polls"]) > 1]),
            "polls_per_load": statistics.median(len(ld["polls"]) for ld in loads),
            "poll_interval_ms": med(gaps) if gaps else None,
            "poll_interval_ms_mean": round(statistics.mean(gaps) * 1e3, 3) if gaps else None}


def standalone(blocks: int, block: int, layers: int, hits: int) -> dict:
    """The same load without vLLM: the engine's TransferCore on tensors of vLLM's layout (one
    per layer, a block one 32 KiB row of each), either waited at once or polled in a busy loop
    as vLLM's in-process step loop polls it (and that loop with os.sched_yield() after each
    poll that finds it running). The ways alternate, load by load."""
    import torch
    from kvoffload import engine as engine_mod, transfer

    row = block // layers
    tensors = [torch.zeros(blocks + 8, row // 4) for _ in range(layers)]
    core = transfer.TransferCore(tensors, engine_mod.Fingerprint("profile", "0", "float32",
                                                                  "canonical", 0),
                                 cpu_bytes=(blocks + 16) * (-(-(block + 64) // 4096) * 4096))
    keys = [i.to_bytes(8, "big") for i in range(blocks)]
    ids = list(range(blocks))
    core.wait(core.store(keys, ids))

    def waited(job):
        core.wait(job)

    def polled(job):
        while not core.poll(job):
            pass

    def polled_yielding(job):
        while not core.poll(job):
            os.sched_yield()

    ways = {"waited": waited, "busy-polled": polled, "busy-polled, yielding": polled_yielding}
    got = {name: ([], []) for name in ways}
    for i in range(hits * len(ways)):
        name = list(ways)[i % len(ways)]
        before = core.stats()["h2d_ns"]
        t0 = time.monotonic()
        ways[name](core.load(keys, ids))
        got[name][0].append(time.monotonic() - t0)
        got[name][1].append((core.stats()["h2d_ns"] - before) / 1e9)
    core.close()
    gib = blocks * block / 2**30
    return {name: {"span_ms": round(statistics.median(spans) * 1e3, 3),
                   "span_ms_min": round(min(spans) * 1e3, 3),
                   "copies_ms": round(statistics.median(copies) * 1e3, 3),
                   "copies_ms_min": round(min(copies) * 1e3, 3),
                   "copies_gibps_best": round(gib / min(copies), 2)}
            for name, (spans, copies) in got.items()}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        return engine_main(sys.argv[2], sys.argv[3])
    build, out = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tokens = int(os.environ.get("PROFILE_TOKENS", "4096"))
    hits = int(os.environ.get("PROFILE_HITS", "20"))
    freq = int(os.environ.get("PROFILE_FREQ", "10000"))
    sys.path[:0] = [str(REPO / "tests" / "vllm")]
    import tiny_model

    model = out / "model"
    tiny_model.make(str(model), max_positions=tokens + 64, **MODEL)
    block = tiny_model.block_bytes(str(model))
    blocks = tokens // tiny_model.TOKENS_PER_BLOCK
    slot = -(-(block + 64) // 4096) * 4096
    spec = {"model": str(model), "gpu_blocks": blocks + 8, "max_model_len": tokens + 16,
            "connector": {}}
    (out / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOFFLOAD_")}
    env.update(KVOFFLOAD_LIBRARY=str(build / "offload-agent" / "libkvoffload.so"),
               KVOFFLOAD_CPU_BYTES=str((blocks + 16) * slot), KVOFFLOAD_TIERS="[]",
               PYTHONDONTWRITEBYTECODE="1")
    hooks = out / "hooks.json"
    proc = subprocess.Popen([sys.executable, __file__, "--engine", str(out / "spec.json"),
                             str(hooks)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(out / "engine.log", "w"), text=True, env=env)

    def ask(**req):
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine exited: {(out / 'engine.log').read_text()[-4000:]}")
        return json.loads(line)

    json.loads(proc.stdout.readline())  # ready
    cold = ask(op="ttft", tokens=tokens, seed=tokens)
    ask(op="stored", blocks=cold["before"]["stored_blocks"] + blocks, timeout_s=120)
    results = {"tokens": tokens, "block_bytes": block, "ttft_ms": {}, "copies_ms": {}}

    def rounds(label):
        ttft, copies = [], []
        for _ in range(hits):
            got = ask(op="ttft", tokens=tokens, seed=tokens)
            assert got["after"]["loaded_blocks"] - got["before"]["loaded_blocks"] == blocks
            ttft.append(got["ttft_s"] * 1e3)
            copies.append((got["after"]["h2d_ns"] - got["before"]["h2d_ns"]) / 1e6)
        results["ttft_ms"][label] = round(statistics.median(ttft), 3)
        results["copies_ms"][label] = {"median": round(statistics.median(copies), 3),
                                       "min": round(min(copies), 3)}
        if label == "plain" and os.environ.get("PROFILE_AB") == "1":
            # The engine flips the way at each load, starting without the yield.
            for way, first in ((False, 0), (True, 1)):
                part = copies[first::2]
                results["copies_ms"][f"plain, yield={way}"] = {
                    "median": round(statistics.median(part), 3), "min": round(min(part), 3)}

    rounds("plain")
    data = out / "perf.data"
    perf_cmd = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", str(freq), "-g",
                "-e", "cpu-clock", "-e", "sched:sched_switch", "-p", str(proc.pid),
                "-o", str(data)]
    perf = subprocess.Popen(perf_cmd, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    perf_start = time.monotonic()
    rounds("perf")
    perf.send_signal(signal.SIGINT)
    perf.wait()
    proc.stdin.write('{"op": "quit"}\n')
    proc.stdin.close()
    proc.wait(120)
    hooked = json.loads(hooks.read_text())
    loads = loads_from(hooked["events"])
    # The host device's pool: min(4, usable CPUs) (DefaultHostCopyThreads; the bench runs under
    # no cgroup CPU limit, so the affinity mask is what it uses).
    roles = role_of_threads(hooked["threads"]["libkvoffload"], min(4, len(os.sched_getaffinity(0))),
                            proc.pid)
    plain = [ld for ld in loads if ld["seen"] < perf_start and ld["blocks"] == blocks]
    profiled = [ld for ld in loads if ld["submit"] > perf_start and ld["blocks"] == blocks]
    results["timeline"] = {"plain": timeline(plain), "perf": timeline(profiled)}
    if os.environ.get("PROFILE_AB") == "1":
        for way in (True, False):
            results["timeline"][f"plain, yield={way}"] = timeline(
                [ld for ld in plain if ld["yield"] == way])
    results["profile"] = analyse(profiled, parse_perf(data), roles, freq)
    results["perf_command"] = " ".join(perf_cmd)
    results["loadavg"] = open("/proc/loadavg").read().split()[:3]
    os.environ["KVOFFLOAD_LIBRARY"] = env["KVOFFLOAD_LIBRARY"]
    sys.path.insert(0, str(REPO / "offload-agent" / "python"))
    results["without vLLM"] = standalone(blocks, block, MODEL["layers"], hits)
    results["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    (out / "profile.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
