"""KVOffloadAgentSpec with its ranks in other processes than the scheduler (vLLM's 'mp'
executor, tensor parallelism): two worker processes, each with its own engine for its shard,
and this process as the scheduler, whose manager reaches the ranks over their sockets. The
workers are driven the way vLLM's OffloadingConnectorWorker drives them, with the specs the
manager made (pickled, as vLLM's connector metadata carries them)."""

import dataclasses
import json
import multiprocessing
import pickle
import threading
import uuid

import pytest
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, ReqContext
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload import ranks, settings
from kvoffload.engine import KvoError
from kvoffload.vllm import rank_share
from test_vllm_spec import (END_OF_STEP, MEDIUM_OF_TIER, PAGE, SLOT, TENSORS, agent_extra,
                            kv_caches, offload_keys, offloading_config, residency, scaled_env)

RANKS = 2


def rank_config(engine_id: str, rank: int):
    config = offloading_config(agent_extra(), world_size=RANKS, engine_id=engine_id)
    return dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, rank=rank))


def rank_main(engine_id: str, rank: int, conn) -> None:
    """One worker process: its spec, worker and KV tensors; runs the parent's orders."""
    spec = OffloadingSpecFactory.create_spec(rank_config(engine_id, rank))
    caches = kv_caches()
    tensors = [t.tensor for t in caches.tensors]
    worker = spec.get_worker(caches)
    conn.send("ready")
    while True:
        order = conn.recv()
        if order[0] == "shutdown":
            worker.shutdown()
            conn.send("closed")
            return
        kind, job_id, block_spec, rows, fill = order
        gpu = GPULoadStoreSpec(list(rows), group_sizes=[len(rows)], block_indices=[0])
        if kind == "store":
            for t in tensors:  # this rank's shard of each block: its own bytes
                t[rows] = fill + rank
            assert worker.submit_store(job_id, gpu, block_spec)
        else:
            for t in tensors:
                t[rows] = 0
            assert worker.submit_load(job_id, block_spec, gpu)
        worker.wait({job_id})
        results = [(r.job_id, r.success) for r in worker.get_finished()]
        conn.send((results, [[int(t[row, 0]) for t in tensors] for row in rows]))


@pytest.fixture
def two_ranks(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    engine_id = f"ranks-{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for rank in range(RANKS):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=rank_main, args=(engine_id, rank, child), daemon=True)
        p.start()
        procs.append(p)
        conns.append(parent)
    try:
        for c in conns:
            assert c.poll(120), "a rank process did not start"
            assert c.recv() == "ready"
        yield engine_id, conns
    finally:
        for p in procs:
            p.kill()
            p.join()


def order(conn, *message):
    conn.send(message)
    assert conn.poll(60), f"rank did not answer {message[:2]}"
    return conn.recv()


def held(engine_id: str, rank: int) -> int:
    r = ranks.RemoteRank(engine_id, rank)
    try:
        return r.call("stats")["held_blocks"]
    finally:
        r.close()


def test_a_block_is_a_hit_only_where_every_rank_has_it(two_ranks):
    engine_id, conns = two_ranks
    manager = OffloadingSpecFactory.create_spec(rank_config(engine_id, 0)).get_manager()
    keys = offload_keys(4, salt=b"ranks")
    ctx = ReqContext(req_id="r")
    out = manager.prepare_store(keys, ctx)
    assert out.keys_to_store == keys
    # Rank 1 keeps only the first two blocks: as if its store of the others had failed.
    results, _ = order(conns[0], "store", 1, out.store_spec, [0, 1, 2, 3], 10)
    assert results == [(1, True)]
    partial = type(out.store_spec)(keys[:2], out.store_spec.generation)
    results, _ = order(conns[1], "store", 1, partial, [0, 1], 10)
    assert results == [(1, True)]
    manager.complete_store(keys, ctx)

    assert [manager.lookup(k, ctx) for k in keys[:3]] == [
        LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]
    # The miss gave back the hold rank 0 took: each rank holds exactly the two hits.
    assert [held(engine_id, r) for r in range(RANKS)] == [2, 2]
    load_spec = manager.prepare_load(keys[:2], ctx)
    for rank, conn in enumerate(conns):
        results, rows = order(conn, "load", 2, load_spec, [5, 6], 0)
        assert results == [(2, True)]
        assert rows == [[10 + rank] * TENSORS] * 2, f"rank {rank} loaded another shard"
    # Each rank's worker gave back its own holds when its part of the load was done.
    assert [held(engine_id, r) for r in range(RANKS)] == [0, 0]
    manager.complete_load(keys[:2], ctx)
    manager.on_schedule_end(END_OF_STEP)
    assert [held(engine_id, r) for r in range(RANKS)] == [0, 0]

    # Metrics: block counts are rank 0's (4 stored, 3 lookups that hit: rank 1's miss is not
    # rank 0's), bytes are every rank's shard summed (rank 1 stored 2 blocks), capacities add
    # up to the pod's, and the checks before storing are not lookups.
    got = manager.get_stats().data["data"]
    block = PAGE * TENSORS
    hits = got["vllm:kv_offload_tiering_chunk_hits"]
    assert sum(hits.values()) == 3, hits
    assert got["vllm:kv_offload_tiering_chunk_queries"][("cpu",)] == 3
    assert got["vllm:kvoffload_stored_blocks"][()] == 4
    assert got["vllm:kvoffload_stored_bytes"][()] == (4 + 2) * block
    assert got["vllm:kvoffload_loaded_blocks"][()] == 2
    assert got["vllm:kvoffload_loaded_bytes"][()] == 2 * RANKS * block
    assert got["vllm:kvoffload_capacity_bytes"][("cpu",)] == 2 * SLOT
    assert got["vllm:kvoffload_capacity_bytes"][("disk0",)] == 16 * SLOT
    assert len(got["vllm:kvoffload_load_duration_seconds"][()]) == 1, "rank 0's load job"
    assert len(got["vllm:kvoffload_store_duration_seconds"][()]) == 1

    # A block not on every rank is offered for storing again (the ranks that have it skip it).
    assert manager.prepare_store(keys, ctx).keys_to_store == keys[2:]

    # A rank that is gone fails the manager's next call loudly, naming the rank.
    assert order(conns[1], "shutdown") == "closed"
    with pytest.raises(RuntimeError, match="rank 1"):
        manager.lookup(keys[0], ctx)
    # vLLM's scheduler shutdown closes the links, the one to a rank already gone too.
    manager.shutdown()
    with pytest.raises(RuntimeError, match="rank 0 is gone"):
        manager.lookup(keys[0], ctx)


def test_a_block_first_seen_at_a_hit_is_announced_where_rank_0_has_it(two_ranks):
    """The KV events are rank 0's residency feed. A block this scheduler did not store (as
    after a restart on a persistent tier) is announced at its first hit, in rank 0's tier of
    it, even where another rank keeps its shard elsewhere; the load still counts the farthest
    tier."""
    engine_id, conns = two_ranks
    keys = offload_keys(3, salt=b"announce")
    storing = OffloadingSpecFactory.create_spec(rank_config(engine_id, 0)).get_manager()
    ctx = ReqContext(req_id="r")
    out = storing.prepare_store(keys[:1], ctx)
    for conn in conns:
        assert order(conn, "store", 1, out.store_spec, [0], 10)[0] == [(1, True)]
    storing.complete_store(keys[:1], ctx)
    # Rank 1 alone stores two more blocks: its 2 pinned slots push the first one to disk.
    more = type(out.store_spec)(keys[1:], out.store_spec.generation)
    assert order(conns[1], "store", 2, more, [1, 2], 20)[0] == [(2, True)]
    group = ranks.RankGroup([ranks.RemoteRank(engine_id, r) for r in range(RANKS)])
    assert group.hold(keys[0], 0) == [0, 1]
    group.release([keys[0]], 0)
    group.close()
    # Only rank 0's feed is read, so only rank 0 keeps one (up to 24 MiB of events each).
    rank1 = ranks.RemoteRank(engine_id, 1)
    assert rank1.call("take_events") == []
    rank1.close()

    manager = OffloadingSpecFactory.create_spec(rank_config(engine_id, 0)).get_manager()
    assert manager.lookup(keys[0], ctx) is LookupResult.HIT
    assert manager.get_load_source(keys[0], ctx) is CacheHitSource.DISK
    assert residency(manager.take_events()) == {keys[0]: {MEDIUM_OF_TIER[0]}}
    manager.on_schedule_end(END_OF_STEP)
    assert [held(engine_id, r) for r in range(RANKS)] == [0, 0]


def test_ranks_out_of_reach_refuse_the_start(tmp_path, monkeypatch):
    """No worker answers (vLLM's 'ray' executor with workers on other nodes): the scheduler
    refuses to start, naming the setting, instead of failing the first request."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    monkeypatch.setattr(ranks, "CONNECT_TIMEOUT_S", 0.2)
    spec = OffloadingSpecFactory.create_spec(rank_config(f"nowhere-{uuid.uuid4().hex}", 0))
    with pytest.raises(ValueError, match="rank 0 answers.*--distributed-executor-backend=mp"):
        spec.get_manager()


def test_a_second_worker_of_one_engine_and_rank_is_refused(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    config = rank_config(f"twice-{uuid.uuid4().hex}", 1)
    first = OffloadingSpecFactory.create_spec(config).get_worker(kv_caches())
    try:
        # Its engine meets the first's at the rank's private tier directory, which one engine
        # at a time may have open; without disk tiers, at the rank's address.
        with pytest.raises(KvoError, match="another engine has this directory open"):
            OffloadingSpecFactory.create_spec(config).get_worker(kv_caches())
        monkeypatch.delenv("KVOFFLOAD_TIERS")
        with pytest.raises(ValueError, match="needs its own kv_transfer_config.engine_id"):
            OffloadingSpecFactory.create_spec(config).get_worker(kv_caches())
    finally:
        first.shutdown()
    # Shut down, the rank's address is free again.
    OffloadingSpecFactory.create_spec(config).get_worker(kv_caches()).shutdown()


def test_a_client_without_the_engines_key_is_turned_away(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    engine_id = f"key-{uuid.uuid4().hex}"
    worker = OffloadingSpecFactory.create_spec(rank_config(engine_id, 0)).get_worker(kv_caches())
    try:
        from multiprocessing.connection import Client
        with pytest.raises(multiprocessing.AuthenticationError):
            Client(ranks.address(engine_id, 0), family="AF_UNIX", authkey=b"another engine")
        # The server still serves its own manager afterwards.
        assert held(engine_id, 0) == 0
    finally:
        worker.shutdown()


def test_each_rank_gets_its_share_of_the_pods_tiers():
    """Every rank is started with the pod's KVOFFLOAD_* env; each stores half of every block,
    so it gets half of each capacity and a directory of its own in each disk tier."""
    pod = settings.from_env({
        "KVOFFLOAD_CPU_BYTES": "1000", "KVOFFLOAD_TIERS": json.dumps([
            {"path": "/mnt/kv-cache-0", "kind": "emptyDir", "capacityBytes": 4000}])})
    assert rank_share(pod, 0, 1) == pod
    share = rank_share(pod, 1, 2)
    assert share.cpu_bytes == 500
    assert [(t.path, t.capacity_bytes, t.kind) for t in share.tiers] == [
        ("/mnt/kv-cache-0/rank1", 2000, "emptyDir")]
    # Two data-parallel engines in the pod, each of 2 ranks: a quarter each, and the engine's
    # directory above the rank's.
    share = rank_share(pod, 1, 2, engine=1, engines=2)
    assert share.cpu_bytes == 250
    assert [(t.path, t.capacity_bytes) for t in share.tiers] == [
        ("/mnt/kv-cache-0/dp1/rank1", 1000)]
    share = rank_share(pod, 0, 1, engine=0, engines=2)
    assert share.cpu_bytes == 500
    assert [(t.path, t.capacity_bytes) for t in share.tiers] == [("/mnt/kv-cache-0/dp0", 2000)]
    # A share under a byte stays 1 byte, not 0 (the engine's "size from the file system",
    # which gave every rank the whole disk): the engine refuses it as too small for a block.
    tiny = dataclasses.replace(pod, tiers=(dataclasses.replace(pod.tiers[0], capacity_bytes=3),))
    assert rank_share(tiny, 3, 4).tiers[0].capacity_bytes == 1


class _Touch:
    """A pickle that creates a file when it is loaded: what anyone who can reach a rank's
    socket could send if the link carried pickles (the key comes from the engine id, which is
    in the pod's command line: it keeps engines apart, it is no secret)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_call_on_the_link_is_data_never_code(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    engine_id = f"code-{uuid.uuid4().hex}"
    worker = OffloadingSpecFactory.create_spec(rank_config(engine_id, 0)).get_worker(kv_caches())
    try:
        from multiprocessing.connection import Client
        marker = tmp_path / "ran"
        conn = Client(ranks.address(engine_id, 0), family="AF_UNIX",
                      authkey=ranks._authkey(engine_id))
        try:
            conn.send((_Touch(marker), ()))
            assert conn.poll(10), "the rank did not answer"
            answer = conn.recv_bytes()
        finally:
            conn.close()
        assert not marker.exists()
        assert b"not a call" in answer
        # The server still serves its own manager afterwards.
        assert held(engine_id, 0) == 0
    finally:
        worker.shutdown()


def _impostor(engine_id: str, answer):
    """A listener on rank 0's address that takes the manager's connection and answers its
    first call with `answer` (bytes), or never when it is None."""
    from multiprocessing.connection import Listener
    listener = Listener(ranks.address(engine_id, 0), family="AF_UNIX",
                        authkey=ranks._authkey(engine_id))
    conns = []

    def serve():
        conn = listener.accept()
        conns.append(conn)
        conn.recv_bytes()
        if answer is not None:
            conn.send_bytes(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, conns


def test_an_answer_on_the_link_is_data_never_code(tmp_path):
    engine_id = f"answer-{uuid.uuid4().hex}"
    marker = tmp_path / "ran"
    listener, conns = _impostor(engine_id, pickle.dumps(("ok", _Touch(marker))))
    try:
        rank = ranks.RemoteRank(engine_id, 0)
        with pytest.raises(RuntimeError, match="rank 0 answered stats with no answer"):
            rank.call("stats")
        assert not marker.exists()
        rank.close()
    finally:
        listener.close()


def test_a_rank_that_stops_answering_fails_the_call_in_time(monkeypatch):
    """A worker that is alive but whose engine never answers (stuck under a lock) must not
    hang vLLM's scheduler for ever: the call fails, naming the rank, and the link is not used
    again (a late answer would be taken for the next call's)."""
    monkeypatch.setattr(ranks, "CALL_TIMEOUT_S", 0.3)
    engine_id = f"stuck-{uuid.uuid4().hex}"
    listener, conns = _impostor(engine_id, None)
    try:
        rank = ranks.RemoteRank(engine_id, 0)
        outcome = []

        def call():
            try:
                rank.call("stats")
            except RuntimeError as e:
                outcome.append(str(e))

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), "the call still waits"
        assert outcome and "rank 0 did not answer stats within 0.3 s" in outcome[0]
        with pytest.raises(RuntimeError, match="rank 0 did not answer"):
            rank.call("stats")
        rank.close()
    finally:
        listener.close()
