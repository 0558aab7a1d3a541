#!/usr/bin/env python3
"""Time to first token on vLLM's CPU engine with hits from each tier against recomputing.
Runs in the vLLM virtualenv (hack/vllm-venv.sh); writes RESULTS_DIR/ttft.json.

    run.py BUILD_DIR RESULTS_DIR

Part 1, vllm.LLM: three engines of one model (random weights, made and saved here, sized so
that a 4k-token prefill takes a few seconds on 2 cores) live side by side, each in its own
process (worker.py): no connector (recompute), the pinned tier alone (large enough for every
prompt), and a pinned tier of PINNED_SLOTS_DISK blocks in front of one disk tier (so a hit is
read from disk). Each prompt size is first sent cold to each, then in ROUNDS rounds to each in
turn (the order rotates), every time after vLLM's own prefix cache was reset: a repeated prompt
can only hit through the connector. The libkvoffload engine's stats say which tier served it.
The tier limits are measured in the same run: memcpy of the same block size
(`kvoffload-bench cpu`) and fio reads in the disk tier's directory.

Part 2, `vllm serve`: the agent-mode golden pod's container command line (the webhook's
output) started twice, pinned tier only and disk, with the tiny-model flags of
tests/vllm/test_entry_point.py resized for this model; TTFT is the time from sending a
streaming /v1/completions request to its first token. Recompute is a prompt the server has
never seen, measured on the pinned server.

env: BENCH_TTFT_TOKENS (prompt sizes, default 1024,4096,16384), BENCH_TTFT_ROUNDS (3),
     BENCH_TTFT_BUDGET_S (600: a size that would not fit runs fewer rounds or is skipped),
     BENCH_TTFT_SERVE_TOKENS (4096; empty: no part 2), BENCH_TTFT_DIR (scratch directory on
     a disk, default BUILD_DIR/bench-scratch-ttft)
"""
import http.client
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests" / "vllm"), str(REPO / "offload-agent" / "python")]
import pod_runner  # noqa: E402
import tiny_model  # noqa: E402

BUILD, RESULTS = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
LIBRARY = BUILD / "offload-agent" / "libkvoffload.so"
SCRATCH = pathlib.Path(os.environ.get("BENCH_TTFT_DIR", BUILD / "bench-scratch-ttft")).resolve()
TOKENS = [int(x) for x in os.environ.get("BENCH_TTFT_TOKENS", "1024,4096,16384").split(",") if x]
ROUNDS = int(os.environ.get("BENCH_TTFT_ROUNDS", "3"))
SERVE_TOKENS = [int(x) for x in os.environ.get("BENCH_TTFT_SERVE_TOKENS", "4096").split(",") if x]
# The section's budget: a prompt size whose recomputes (cold, then one a round) would not fit
# in what is left, less SERVE_RESERVE_S for part 2, runs fewer rounds, or none (recorded).
BUDGET_S = float(os.environ.get("BENCH_TTFT_BUDGET_S", "600"))
SERVE_RESERVE_S = 180
# The model: 6 layers, hidden 384, MLP 1536, 6 query heads and 2 KV heads of 64 (GQA, as
# current models have): about 13M parameters. A 4096-token prefill takes about 2 s on the
# 2-core bench machine; one 32-token block of KV is 192 KiB (fp32).
MODEL = dict(layers=6, hidden=384, intermediate=1536, heads=6, kv_heads=2)
# The disk engine's pinned tier: a few blocks, so a hit is read from the disk tier.
PINNED_SLOTS_DISK = 4
FIO_TOTAL = "256M"
# A load job keeps up to 64 reads in flight (one io_uring ring, offload-agent/src/uring_io.cc).
FIO_QD = 64


def rel(text: str) -> str:
    """A command as RESULTS.md shows it: paths relative to the repository root."""
    return text.replace(f"{REPO}/", "")


def log(msg):
    print(f"[bench ttft] {msg}", file=sys.stderr, flush=True)


def slot_bytes(block: int) -> int:
    """A block in a pinned slot or a block file: payload + 64-byte trailer, 4 KiB aligned."""
    return -(-(block + 64) // 4096) * 4096


def disk_read_bytes(block: int) -> int:
    """What the disk tier reads for one block: an emptyDir tier keeps its blocks in one slot
    file, a slot holding the payload alone, 4 KiB aligned (offload-agent/FORMAT.md)."""
    return -(-block // 4096) * 4096


def blocks_of(tokens: int) -> int:
    return tokens // tiny_model.TOKENS_PER_BLOCK


def hit_blocks(tokens: int) -> int:
    """Blocks a repeated prompt loads: every full one (vLLM then recomputes the last token,
    which it needs to sample from, on top of the loaded KV)."""
    return tokens // tiny_model.TOKENS_PER_BLOCK


class Worker:
    """One engine configuration in its own process (worker.py)."""

    def __init__(self, name: str, spec: dict, env: dict):
        self.name = name
        path = SCRATCH / f"{name}.spec.json"
        path.write_text(json.dumps(spec))
        self.log = SCRATCH / f"{name}.log"
        self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "w"), text=True, env=env)

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} engine exited {self.proc.wait()}:\n"
                               f"{self.log.read_text()[-6000:]}")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.recv()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def make_model() -> str:
    path = SCRATCH / "model"
    shutil.rmtree(path, ignore_errors=True)  # made afresh: the longest prompt sets its length
    tiny_model.make(str(path), max_positions=max(TOKENS + SERVE_TOKENS) + 64, **MODEL)
    return str(path)


def engine_env(cpu_bytes: int | None, tiers: list) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOFFLOAD_")}
    env["KVOFFLOAD_LIBRARY"] = str(LIBRARY)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "vllm"),
                                         str(REPO / "offload-agent" / "python")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if cpu_bytes is not None:
        env["KVOFFLOAD_CPU_BYTES"] = str(cpu_bytes)
        env["KVOFFLOAD_TIERS"] = json.dumps(tiers)
    return env


def disk_tier(path: pathlib.Path, capacity: int) -> dict:
    path.mkdir(parents=True, exist_ok=True)
    return {"path": str(path), "kind": "emptyDir", "capacityBytes": capacity,
            "persistent": False, "shared": False}


def memcpy_limit(block: int) -> tuple[float, str]:
    cmd = [str(BUILD / "bench" / "kvoffload-bench"), "cpu", f"--block-size={block}",
           "--total=256M"]
    out = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)
    return out["memcpy_gibps"], rel(" ".join(cmd))


def fio_limit(directory: pathlib.Path, block_read: int) -> tuple[float, str]:
    cmd = ["fio", "--name=kvoffload-ttft-read", f"--directory={directory}", "--rw=read",
           f"--bs={block_read}", f"--iodepth={FIO_QD}", "--direct=1", "--ioengine=io_uring",
           f"--size={FIO_TOTAL}", "--unlink=1", "--output-format=json"]
    job = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                                    text=True).stdout)["jobs"][0]
    return job["read"]["bw_bytes"] / 2**30, rel(" ".join(shlex.quote(c) for c in cmd))


def delta(after: dict, before: dict, field: str, tier: int | None = None) -> int:
    if tier is None:
        return after[field] - before[field]
    return after["tiers"][tier][field] - before["tiers"][tier][field]


def check_hit(name: str, tokens: int, got: dict, block: int) -> dict:
    """Which tier served a repeated prompt, from the engine's stats; refuses a run where the
    hit did not come (all of it) from the intended tier."""
    before, after = got["before"], got["after"]
    want = hit_blocks(tokens)
    loaded = delta(after, before, "loaded_blocks")
    assert loaded == want, f"{name} {tokens}: loaded {loaded} blocks, expected {want}"
    assert delta(after, before, "failed_loads") == 0, f"{name} {tokens}: failed loads"
    from_disk = 0
    if name == "disk":
        from_disk = delta(after, before, "bytes_read", 1) // disk_read_bytes(block)
        # At most the pinned tier's few slots can have kept blocks of this prompt.
        assert from_disk >= want - PINNED_SLOTS_DISK, (
            f"disk {tokens}: only {from_disk} of {want} blocks were read from disk")
    else:
        assert len(after["tiers"]) == 1, "the pinned engine has a disk tier"
    spans = got["loads"]
    assert spans, f"{name} {tokens}: no load job was timed"
    load_s = max(e for _, e in spans) - min(s for s, _ in spans)
    moved = loaded * block
    # The engine's own span of host-to-device copies (from the first to the last): what of the
    # load vLLM waited on was the copies, and what submission, disk reads and polling.
    copy_s = delta(after, before, "h2d_ns") / 1e9
    return {"ttft_s": got["ttft_s"], "loaded_blocks": loaded, "from_disk_blocks": from_disk,
            "copy_s": copy_s,
            "bytes": moved, "disk_bytes_read": delta(after, before, "bytes_read", 1)
            if name == "disk" else 0, "load_s": load_s, "load_gibps": moved / load_s / 2**30,
            "jobs": len(spans)}


def rounds_within_budget(tokens: int, done: list, started: float) -> int:
    """Rounds of `tokens` that fit the budget, from the last size's best recompute scaled by
    the token count squared (attention dominates long prompts; an upper bound for short
    ones). A size costs about 3 recomputes cold (the connectors' cold prefills) + one a round."""
    if not done:
        return ROUNDS
    last = done[-1]
    estimate = last["best"]["recompute"]["ttft_s"] * (tokens / last["tokens"]) ** 2
    left = BUDGET_S - SERVE_RESERVE_S * bool(SERVE_TOKENS) - (time.monotonic() - started)
    return max(0, min(ROUNDS, int(left / estimate) - 3))


def engine_part(model: str, block: int, started: float) -> dict:
    gpu_blocks = blocks_of(max(TOKENS)) + 8
    base = {"model": model, "gpu_blocks": gpu_blocks, "max_model_len": max(TOKENS) + 16}
    pinned_slots = sum(blocks_of(t) for t in TOKENS) + 16
    disk_dir = SCRATCH / "disk-tier"
    shutil.rmtree(disk_dir, ignore_errors=True)
    tiers = [disk_tier(disk_dir, 4 * pinned_slots * slot_bytes(block))]
    workers = {
        "recompute": Worker("recompute", {**base, "connector": None}, engine_env(None, [])),
        "pinned": Worker("pinned", {**base, "connector": {}},
                         engine_env(pinned_slots * slot_bytes(block), [])),
        "disk": Worker("disk", {**base, "connector": {}},
                       engine_env(PINNED_SLOTS_DISK * slot_bytes(block), tiers)),
    }
    names = list(workers)
    sizes, skipped = [], []
    try:
        for w in workers.values():
            w.recv()  # ready
        log("engines ready")
        for tokens in TOKENS:
            rounds_here = rounds_within_budget(tokens, sizes, started)
            if rounds_here == 0:
                skipped.append(tokens)
                log(f"{tokens}: skipped, it would not fit the {BUDGET_S:.0f} s budget")
                continue
            seed = tokens
            cold = {}
            for name, w in workers.items():
                got = w.ask(op="ttft", tokens=tokens, seed=seed)
                cold[name] = got["ttft_s"]
                if name != "recompute":
                    stored = got["before"]["stored_blocks"] + blocks_of(tokens)
                    s = w.ask(op="stored", blocks=stored, timeout_s=120)["stats"]
                    assert s["stored_blocks"] >= stored and s["failed_stores"] == 0, (
                        f"{name} {tokens}: stored {s['stored_blocks']} blocks, expected "
                        f"{stored}; failed stores {s['failed_stores']}")
                log(f"{tokens} cold {name}: {got['ttft_s']:.3f} s")
            rounds = {n: [] for n in names}
            for r in range(rounds_here):
                # Alternating, the order rotating: the shared machine's neighbours come and go.
                for name in names[r % 3:] + names[:r % 3]:
                    got = workers[name].ask(op="ttft", tokens=tokens, seed=seed)
                    if name == "recompute":
                        rounds[name].append({"ttft_s": got["ttft_s"]})
                    else:
                        rounds[name].append(check_hit(name, tokens, got, block))
                    log(f"{tokens} round {r} {name}: {got['ttft_s']:.3f} s")
            best = {n: min(rounds[n], key=lambda x: x["ttft_s"]) for n in names}
            sizes.append({"tokens": tokens, "hit_blocks": hit_blocks(tokens), "cold_s": cold,
                          "rounds": rounds, "best": best})
    finally:
        for w in workers.values():
            w.close()
    return {"gpu_blocks": gpu_blocks, "pinned_slots": pinned_slots,
            "disk_pinned_slots": PINNED_SLOTS_DISK, "disk_dir": rel(str(disk_dir)), "sizes": sizes,
            "skipped": skipped, "budget_s": BUDGET_S}


# ---- part 2: vllm serve from the golden agent-mode pod --------------------------------------

def serve_launch(pod, volumes, port, log, model_blocks, max_len, cpu_bytes, first_tier_bytes,
                 block):
    """The golden pod's command line and env on this machine (pod_runner), with the tier
    sizes and the model flags for this model, as tests/vllm/test_entry_point.py does for the
    tiny one; VLLM_SERVER_DEV_MODE for POST /reset_prefix_cache (vLLM's own cache only)."""
    argv, env = pod_runner.host_launch(pod, volumes)
    tiers = json.loads(env["KVOFFLOAD_TIERS"])
    for i, t in enumerate(tiers):
        t["capacityBytes"] = first_tier_bytes if i == 0 else 16 * slot_bytes(block)
    env["KVOFFLOAD_TIERS"] = json.dumps(tiers)
    env["KVOFFLOAD_CPU_BYTES"] = str(cpu_bytes)
    env.update(PATH=f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(log.parent),
               HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_SERVER_DEV_MODE="1")
    argv += ["--port", str(port), "--host", "127.0.0.1", "--max-model-len", str(max_len),
             "--dtype", "float32", "--enforce-eager", "--block-size",
             str(tiny_model.TOKENS_PER_BLOCK), "--num-gpu-blocks-override", str(model_blocks),
             "--kv-cache-memory-bytes", str(model_blocks * block),
             "--enable-prompt-tokens-details", "--shutdown-timeout", "30"]
    return pod_runner.start(argv, env, str(log)), argv


def post(port, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    assert r.status == 200, f"POST {path}: {r.status} {data[:500]!r}"
    return data


def stream_ttft(port, model, tokens, seed) -> tuple[float, int]:
    """Seconds from sending a streaming completion to the first token chunk, and the prompt
    tokens the server reports as cached (only the connector can have them: vLLM's own cache
    was reset)."""
    post(port, "/reset_prefix_cache")
    # Token ids: vLLM bounds a text prompt by 4 characters a token before tokenizing, and this
    # model's words ("t17") are longer.
    body = {"model": model, "prompt": tiny_model.random_prompt(tokens, seed),
            "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    payload = json.dumps(body)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body=payload,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, f"completion: {r.status} {r.read()[:500]!r}"
    first, cached = None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = time.monotonic() - start
        if chunk.get("usage"):
            cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    conn.close()
    assert first is not None, "the stream carried no token"
    return first, cached


def serve_part(model: str, block: int) -> dict:
    from conftest import AGENT_CASE, GOLDEN

    os.environ["KVOFFLOAD_LIBRARY"] = str(LIBRARY)
    pod = json.loads((GOLDEN / f"{AGENT_CASE}.patched.json").read_text())
    container = pod_runner.target_container(pod)
    root = SCRATCH / "serve"
    shutil.rmtree(root, ignore_errors=True)
    max_len = max(SERVE_TOKENS) + 16
    model_blocks = blocks_of(max_len) + 8
    slots = sum(blocks_of(t) for t in SERVE_TOKENS) * 2 + 16
    servers, out = {}, {}
    try:
        for name, cpu_slots in (("pinned", slots), ("disk", PINNED_SLOTS_DISK)):
            volumes = {m["name"]: str(root / name / m["name"]) for m in container["volumeMounts"]}
            for path in volumes.values():
                os.makedirs(path, exist_ok=True)
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/mnt/models")
            volumes[mount["name"]] = model
            volumes["kvoffload-agent"] = str(pod_runner.stage_agent(root / name / "dist"))
            port, log_path = pod_runner.free_port(), root / name / "serve.log"
            proc, argv = serve_launch(pod, volumes, port, log_path, model_blocks, max_len,
                                      cpu_slots * slot_bytes(block), 4 * slots * slot_bytes(block),
                                      block)
            servers[name] = (proc, port, log_path)
            out.setdefault("argv", {})[name] = [rel(a) for a in argv]
        for name, (proc, port, log_path) in servers.items():
            pod_runner.wait_ready(proc, port, log_path)
        log("servers ready")
        sizes = []
        for tokens in SERVE_TOKENS:
            seed = 1000 + tokens
            names = ["recompute", "pinned", "disk"]
            models = {n: pod_runner.served_model(servers[n][1]) for n in ("pinned", "disk")}
            for n in ("pinned", "disk"):  # cold: stores the prompt
                pod_runner_port = servers[n][1]
                t, cached = stream_ttft(pod_runner_port, models[n], tokens, seed)
                assert cached == 0, f"serve {n}: a fresh prompt found {cached} cached tokens"
                log(f"serve {tokens} cold {n}: {t:.3f} s")
            time.sleep(2)  # stores are asynchronous
            rounds = {n: [] for n in names}
            for r in range(ROUNDS):
                for n in names[r % 3:] + names[:r % 3]:
                    if n == "recompute":
                        # A prompt nobody has seen: what a miss costs in this pod.
                        port = servers["pinned"][1]
                        t, cached = stream_ttft(port, models["pinned"], tokens,
                                                seed + 100 + r)
                        assert cached == 0, f"serve recompute: {cached} cached tokens"
                    else:
                        t, cached = stream_ttft(servers[n][1], models[n], tokens, seed)
                        want = hit_blocks(tokens) * tiny_model.TOKENS_PER_BLOCK
                        assert cached == want, (f"serve {n} {tokens}: {cached} cached tokens, "
                                                f"expected {want}")
                    rounds[n].append({"ttft_s": t, "cached_tokens": cached})
                    log(f"serve {tokens} round {r} {n}: {t:.3f} s")
            sizes.append({"tokens": tokens, "rounds": rounds,
                          "best": {n: min(x["ttft_s"] for x in rounds[n]) for n in names}})
        out["sizes"] = sizes
    finally:
        for proc, port, log_path in servers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    # The disk server's tiers: which served the hits is in its log only; its pinned tier of
    # PINNED_SLOTS_DISK blocks cannot hold a prompt, so its hits were read from disk.
    out.update(cpu_slots={"pinned": slots, "disk": PINNED_SLOTS_DISK},
               model_blocks=model_blocks, golden=AGENT_CASE)
    return out


def main():
    if not TOKENS:
        sys.exit("run.py: BENCH_TTFT_TOKENS names no prompt size (e.g. 1024,4096)")
    start = time.monotonic()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = make_model()
    block = tiny_model.block_bytes(model)
    log(f"model {MODEL}, block {block} bytes")
    memcpy = [memcpy_limit(block)]
    (SCRATCH / "fio").mkdir(exist_ok=True)
    fio = [fio_limit(SCRATCH / "fio", disk_read_bytes(block))]
    h, i, layers = MODEL["hidden"], MODEL["intermediate"], MODEL["layers"]
    kv = MODEL["kv_heads"] * h // MODEL["heads"]
    result = {
        "model": {**MODEL, "block_bytes": block, "slot_bytes": slot_bytes(block),
                  "params_m": (layers * (2 * h * h + 2 * h * kv + 3 * h * i)
                               + 2 * tiny_model.VOCAB * h) / 1e6,
                  "vocab": tiny_model.VOCAB, "tokens_per_block": tiny_model.TOKENS_PER_BLOCK},
        "rounds": ROUNDS, "engine": engine_part(model, block, start),
        "serve": None}
    # The limits again after the engines' rounds, best of the two: the same run, alternating.
    memcpy.append(memcpy_limit(block))
    fio.append(fio_limit(SCRATCH / "fio", disk_read_bytes(block)))
    result.update(memcpy_gibps=max(x for x, _ in memcpy), memcpy_command=memcpy[0][1],
                  fio_read_gibps=max(x for x, _ in fio), fio_command=fio[0][1])

    def write():
        result.update(measured_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                      loadavg=" ".join(f"{x:.2f}" for x in os.getloadavg()),
                      wall_s=time.monotonic() - start)
        (RESULTS / "ttft.json").write_text(json.dumps(result, indent=2))

    write()  # part 1 stays on record if part 2 fails
    if SERVE_TOKENS:
        result["serve"] = serve_part(model, block)
        write()
    shutil.rmtree(SCRATCH / "disk-tier", ignore_errors=True)
    shutil.rmtree(SCRATCH / "serve", ignore_errors=True)
    log(f"wrote {RESULTS / 'ttft.json'} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
