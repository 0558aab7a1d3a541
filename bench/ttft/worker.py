"""One vLLM engine (CPU build, vllm.LLM in this process) for the TTFT benchmark, driven by
bench/ttft/run.py over stdin/stdout, one JSON object a line, so that the driver can keep
several configurations alive and alternate requests between them.

    python worker.py SPEC.json      (SPEC: tests/vllm/real_engine.py's RUN.json keys)

Requests: {"op": "ttft", "tokens": N, "seed": S} resets vLLM's own prefix cache (so a
repeated prompt can only hit through the connector), sends the prompt with max_tokens=1 and
answers {"ttft_s", "before", "after" (libkvoffload engine stats or null), "loads": [[submit,
done], ...] (the connector's load jobs of that request, monotonic seconds from the request's
start to the job's submission and to when vLLM saw it finished)}.
{"op": "stored", "blocks": K, "timeout_s": T} waits until the engine has stored K blocks
(stores are asynchronous, submitted in a later engine step) and answers its stats.
{"op": "quit"} ends the process."""

import json
import os
import sys
import time


def main(spec_path: str) -> None:
    global _replies
    # vLLM and torch print to stdout: the replies keep the original stdout to themselves.
    _replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spec = json.loads(open(spec_path).read())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    from vllm import SamplingParams

    import real_engine
    import tiny_model
    from kvoffload import transfer, vllm as adapter

    spans: list[list[float]] = []
    _time_loads(transfer, spans)
    llm = real_engine.build_llm(spec)
    first = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    reply({"ready": True, "stats": real_engine.engine_stats(adapter)})
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        if req["op"] == "stored":
            deadline = time.monotonic() + req["timeout_s"]
            while True:
                stats = real_engine.engine_stats(adapter)
                if stats["stored_blocks"] >= req["blocks"] or time.monotonic() > deadline:
                    break
                # The connector submits a finished request's stores in a later engine step:
                # a prompt shorter than a block (nothing of it is stored) makes one.
                llm.generate([{"prompt_token_ids": [1, 2, 3]}], first, use_tqdm=False)
                time.sleep(0.02)
            reply({"stats": stats})
            continue
        assert req["op"] == "ttft", f"unknown request {req!r}"
        # vLLM's own cache would serve a repeated prompt before the connector is asked.
        assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache"
        ids = tiny_model.random_prompt(req["tokens"], req["seed"])
        before = real_engine.engine_stats(adapter)
        spans.clear()
        start = time.monotonic()
        llm.generate([{"prompt_token_ids": ids}], first, use_tqdm=False)
        ttft = time.monotonic() - start
        reply({"ttft_s": ttft, "before": before, "after": real_engine.engine_stats(adapter),
               "loads": [[s - start, e - start] for s, e in spans]})
    llm.llm_engine.engine_core.shutdown()


_replies = sys.stdout


def reply(obj: dict) -> None:
    _replies.write(json.dumps(obj) + "\n")
    _replies.flush()


def _time_loads(transfer, spans: list[list[float]]) -> None:
    """Records, per load job, when the connector submitted it and when vLLM learned it had
    finished (poll or wait): the span the request waited on our tiers."""
    load, poll, wait = (transfer.TransferCore.load, transfer.TransferCore.poll,
                        transfer.TransferCore.wait)
    open_jobs: dict[int, list[float]] = {}

    def timed_load(core, block_keys, block_ids, generation=0):
        submitted = time.monotonic()
        job = load(core, block_keys, block_ids, generation)
        open_jobs[job] = [submitted, 0.0]
        return job

    def finish(job):
        span = open_jobs.pop(job, None)
        if span is not None:
            span[1] = time.monotonic()
            spans.append(span)

    def timed_poll(core, job):
        done = poll(core, job)
        if done:
            finish(job)
        return done

    def timed_wait(core, job):
        wait(core, job)
        finish(job)

    transfer.TransferCore.load = timed_load
    transfer.TransferCore.poll = timed_poll
    transfer.TransferCore.wait = timed_wait


if __name__ == "__main__":
    main(sys.argv[1])
