"""Runs vLLM's engine (vllm.LLM, CPU build) on the tiny model in a process of its own, so that
each configuration starts from nothing, as a pod does. test_real_engine.py calls it:
    python real_engine.py RUN.json RESULT.json
RUN.json: {"model", "connector": extra config or null, "executor": "uni" | "mp",
"tensor_parallel": ranks (default 1), "gpu_blocks", "max_model_len" (optional, 512),
"beside": a connector's config to run first in a MultiConnector with ours (optional),
"corrupt_loads": bool, "log_stats": bool (vLLM's metrics on, as `vllm serve` has them),
"phases": [["generate", [[doc, question], ...]] | ["reset_connector"] | ["stats"] |
["metrics"]]}. RESULT.json: per phase the generated token ids (none for "stats"), the
libkvoffload engine stats of rank 0 ("stats") and of every rank ("rank_stats") after it;
"metrics" adds "exposition", vLLM's Prometheus registry rendered as its /metrics serves it; "startup_error" when the engine refused
to start; "shutdown_s" and, with the worker in this process, "closed" (the engine's stats
when vLLM's shutdown closed it, and its write-back report).

vLLM's CPU platform replaces the "uni" executor by "mp" unless
VLLM_ENABLE_V1_MULTIPROCESSING=0; "uni" here sets that, so the worker runs in this process
and its engine's stats are read directly. With "mp" (the default of vLLM's CPU build, and
the only layout for more than one rank) the engine core and each worker run in processes
of their own, and the stats are asked from each rank's socket, as the scheduler asks it."""

import json
import os
import sys
import time
import traceback


def main(run_path: str, result_path: str) -> None:
    run = json.loads(open(run_path).read())
    executor = run.get("executor", "uni")
    if executor == "uni":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    tp = run.get("tensor_parallel", 1)
    if tp > 1:
        # vLLM's CPU build binds each rank's OpenMP threads to a NUMA node of its own and
        # refuses to start when there are fewer nodes than ranks (one on a CI machine).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["HF_HUB_OFFLINE"] = "1"

    import torch
    from vllm import SamplingParams

    import tiny_model
    from kvoffload import transfer, vllm as adapter

    result = {"phases": []}
    _record_close(transfer, result)
    if run.get("corrupt_loads"):
        _corrupt_every_load(transfer, torch)
    engine_id = f"real-engine-{os.getpid()}"
    try:
        llm = build_llm(run, engine_id)
    except Exception as e:  # what a refused start says is the result
        result["startup_error"] = "".join(traceback.format_exception_only(e))
        open(result_path, "w").write(json.dumps(result))
        return
    if run.get("connector") is None:
        def stats():
            return {"stats": None, "rank_stats": []}
    elif executor == "uni":
        def stats():
            only = _settled(lambda: [engine_stats(adapter)])[0]
            return {"stats": only, "rank_stats": [only]}
    else:
        def stats():
            per_rank = _settled_rank_stats(engine_id, tp)
            return {"stats": per_rank[0], "rank_stats": per_rank}
    greedy = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    for phase in run["phases"]:
        if phase[0] == "generate":
            tokens = []
            # One request at a time: the order of stores, evictions and loads is then the
            # order of the list, and so are the exact counts the test expects.
            for doc, question in phase[1]:
                out = llm.generate([{"prompt_token_ids": tiny_model.prompt(doc, question)}],
                                   greedy, use_tqdm=False)
                tokens.append(list(out[0].outputs[0].token_ids))
            result["phases"].append({"tokens": tokens, **stats()})
        elif phase[0] == "stats":
            result["phases"].append(stats())
        elif phase[0] == "metrics":
            result["phases"].append({"exposition": exposition(llm, stats), **stats()})
        elif phase[0] == "reset_connector":
            assert llm.reset_prefix_cache(reset_connector=True), "vLLM refused the reset"
            result["phases"].append(stats())
        else:
            raise ValueError(f"unknown phase {phase!r}")
    start = time.monotonic()
    llm.llm_engine.engine_core.shutdown()
    result["shutdown_s"] = time.monotonic() - start
    open(result_path, "w").write(json.dumps(result))


def build_llm(run: dict, engine_id: str | None = None):
    """vllm.LLM as RUN.json describes it; also the TTFT benchmark's engine (bench/ttft).
    vLLM's own KV cache gets exactly "gpu_blocks" blocks of the model at run["model"]. The
    engine id names the ranks' sockets, which the stats of an "mp" run are read from."""
    from vllm import LLM

    import tiny_model

    kwargs = {}
    if run.get("connector") is not None:
        ours = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"spec_name": "KVOffloadAgentSpec",
                                              "spec_module_path": "kvoffload.vllm",
                                              **run["connector"]}}
        if run.get("beside") is not None:
            # Ours second in vLLM's MultiConnector, another connector first: how KServe's
            # P/D sample runs offloading beside NixlConnector.
            ours = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"connectors": [run["beside"], ours]}}
        kwargs["kv_transfer_config"] = {**ours, **({"engine_id": engine_id} if engine_id else {})}
    blocks = run["gpu_blocks"]
    return LLM(model=run["model"], skip_tokenizer_init=True, enforce_eager=True,
               dtype="float32", seed=0, block_size=tiny_model.TOKENS_PER_BLOCK,
               # vLLM's own KV cache: so few blocks that a prefix is evicted before it
               # comes back (the CPU backend sizes it in bytes, the scheduler in blocks).
               num_gpu_blocks_override=blocks,
               kv_cache_memory_bytes=blocks * tiny_model.block_bytes(run["model"]),
               gpu_memory_utilization=0.05, max_model_len=run.get("max_model_len", 512),
               max_num_seqs=4, enable_prefix_caching=True,
               tensor_parallel_size=run.get("tensor_parallel", 1),
               distributed_executor_backend=run.get("executor", "uni"),
               disable_log_stats=not run.get("log_stats", False), **kwargs)


def exposition(llm, stats) -> str:
    """vLLM's Prometheus text once the connector's counters reached it. The scheduler hands
    vLLM the connector's stats at each step, and the last step of a request may come before
    its stores finished: wait until the engines are idle (stats() returns once they settle),
    then step vLLM once more with a request shorter than one block (nothing to look up, store
    or load) so that the scheduler reports the engines' final counters."""
    from prometheus_client import REGISTRY, generate_latest
    from vllm import SamplingParams

    stats()
    llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                 SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                 use_tqdm=False)
    return generate_latest(REGISTRY).decode()


def engine_stats(adapter) -> dict | None:
    """The stats of the worker engine in this process (the "uni" executor)."""
    cores = list(adapter._cores.values())
    assert len(cores) <= 1, f"{len(cores)} worker engines in one process"
    return cores[0].stats() if cores else None


def _settled_rank_stats(engine_id: str, ranks: int) -> list[dict]:
    """Every rank's engine stats once they stop changing: with the engine core in another
    process, its last steps (the deferred stores of the last request) may still be running
    when generate() returns here."""
    from kvoffload.ranks import RemoteRank

    links = [RemoteRank(engine_id, r) for r in range(ranks)]
    try:
        return _settled(lambda: [link.call("stats") for link in links])
    finally:
        for link in links:
            link.close()


def _settled(read) -> list[dict]:
    """read() (every rank's engine stats) once it stops changing and no job is queued: the
    engines may still be running the last request's stores when generate() returns, in this
    process too (on a busy machine, 16 of the 32 blocks of test_loads_from_a_disk_tier's
    first questions had not reached the disk tier yet)."""
    last, same = None, 0
    deadline = time.monotonic() + 30
    while same < 3 and time.monotonic() < deadline:
        now = read()
        same = same + 1 if now == last and all(s["queue_depth"] == 0 for s in now) else 0
        last = now
        time.sleep(0.1)
    return last


def _record_close(transfer, result: dict) -> None:
    """Keeps, in result["closed"], the engine's stats as vLLM's shutdown closes it and the
    report of its write-back."""
    close = transfer.TransferCore.close

    def recorded_close(core, write_back_s=0.0):
        stats = core.engine.stats()
        report = close(core, write_back_s)
        result["closed"] = {"stats": stats, "write_back": report}
        return report

    transfer.TransferCore.close = recorded_close


def _corrupt_every_load(transfer, torch) -> None:
    """The negative control: once a load job has finished, overwrite the KV rows it wrote with
    noise before vLLM reads them, so that a test can see whether attention reads what was
    loaded (the output changes) or recomputes it (it would not)."""
    load, poll, wait = (transfer.TransferCore.load, transfer.TransferCore.poll,
                        transfer.TransferCore.wait)
    targets: dict[int, list[int]] = {}

    def scramble(core, job):
        for row in targets.pop(job, []):
            for t in core.tensors:
                t[row].copy_(torch.randn(t[row].shape).to(t.dtype))

    def load_and_remember(core, block_keys, block_ids, generation=0):
        job = load(core, block_keys, block_ids, generation)
        targets[job] = [int(b) for b in block_ids]
        return job

    def poll_and_scramble(core, job):
        done = poll(core, job)
        if done:
            scramble(core, job)
        return done

    def wait_and_scramble(core, job):
        wait(core, job)
        scramble(core, job)

    transfer.TransferCore.load = load_and_remember
    transfer.TransferCore.poll = poll_and_scramble
    transfer.TransferCore.wait = wait_and_scramble


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
