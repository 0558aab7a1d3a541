"""KVOffloadAgentSpec under vLLM 0.32.0's own scheduler: the real
vllm.v1.core.sched.scheduler.Scheduler, configured with the golden agent-mode pod's
--kv-transfer-config, builds its OffloadingConnector in role SCHEDULER (our manager), and a
second OffloadingConnector in role WORKER (our worker, over CPU tensors) executes what the
scheduler asks. test_vllm_spec.py calls our manager directly; here only vLLM calls it, so what
is checked is the contract as vLLM 0.32.0 uses it:

- Scheduler.schedule() -> get_num_new_matched_tokens (manager.lookup per block key),
  update_state_after_alloc (prepare_load), build_connector_meta (prepare_store for the
  computed blocks, on_request_finished, on_schedule_end);
- OffloadingConnector(WORKER): register_kv_caches (vLLM turns per-layer KV tensors into
  CanonicalKVCaches and calls our get_worker), handle_preemptions, start_load_kv (deferred
  store submission, async loads), wait_for_save, get_transfer_results,
  build_connector_worker_meta;
- Scheduler.update_from_output() -> update_connector_output (complete_store/complete_load
  from the worker's completed jobs) and finished_recving, which wakes a request whose KV
  was loading.

No model runs. EngineCoreLoop below plays vLLM's engine core and model runner: it calls the
worker connector in the order KVConnectorModelRunnerMixin does, and its "forward" writes
random bytes into the KV slots of exactly the tokens a step computes, so the bytes a load
brings back can be compared with what request A's forward wrote.

No Hugging Face hub (conftest sets HF_HUB_OFFLINE=1): ModelConfig reads a 2-layer llama
config.json written under tmp_path, with skip_tokenizer_init (no tokenizer files) and no
weights (nothing loads the model). On a machine's first run vLLM's model registry inspects
LlamaForCausalLM in a subprocess (about 20 s here) and caches the result under
VLLM_CACHE_ROOT; later runs skip that."""

import contextlib
import dataclasses
import json
import os
import time
from collections import Counter

import pytest
import torch
import vllm
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.utils import yield_req_data
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.kv_offload.base import get_offload_block_hash, make_offload_key
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from conftest import AGENT_CASE, golden_kv_transfer_config, scaled_env
from kvoffload.transfer import engine_key
from kvoffload.vllm import KVOffloadAgentSpec

TOKENS_PER_BLOCK = 16
NUM_GPU_BLOCKS = 32
KV_HEADS = 4
HEAD_SIZE = 16
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
# One model layer's KV of one block: 16 tokens x 4 heads x (K + V) x 16 x fp16 = 4 KiB.
ATTENTION = FullAttentionSpec(block_size=TOKENS_PER_BLOCK, num_kv_heads=KV_HEADS,
                              head_size=HEAD_SIZE, dtype=torch.float16)
PAGE = ATTENTION.page_size_bytes
# A's prompt: this many full blocks, then a partial one that is never offloaded.
FULL_BLOCKS = 4
SAMPLED_TOKEN = 7
RUNNER_OUTPUT_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def tiny_llama(tmp_path) -> str:
    """A model directory ModelConfig accepts without the hub: config.json only."""
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": KV_HEADS * HEAD_SIZE, "intermediate_size": 128,
        "num_hidden_layers": len(LAYERS), "num_attention_heads": KV_HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": 128, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16", "tie_word_embeddings": False,
    }))
    return str(model)


def vllm_config(model: str, kv_events: bool = False) -> VllmConfig:
    """kv_events: vLLM publishes KV cache events (--kv-events-config), the connector's in
    the self-describing form (token ids and parent hashes, from vLLM's event tracker), as a
    KV-aware router consuming them would configure it."""
    transfer = golden_kv_transfer_config(AGENT_CASE)
    if kv_events:
        transfer["kv_connector_extra_config"]["self_describing_kv_events"] = True
    config = VllmConfig(
        model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16",
                                 seed=0, max_model_len=512),
        cache_config=CacheConfig(block_size=TOKENS_PER_BLOCK, enable_prefix_caching=True),
        # A budget above every prompt: each prefill completes in one step.
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                         max_model_len=512, is_encoder_decoder=False),
        kv_transfer_config=KVTransferConfig(**transfer),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=kv_events, publisher="null"),
        device_config=DeviceConfig("cpu"))
    # The engine core resolves the layout before any connector is built, taking the one the
    # OffloadingConnector asks for (get_required_kvcache_layout) when the backend allows.
    config.cache_config.kv_cache_layout = "LBHNC"
    config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    return config


def kv_cache_config() -> KVCacheConfig:
    """One full-attention group over both layers, in one layer-outermost allocation, the
    way vLLM's KV cache config for this model would place them."""
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=len(LAYERS) * NUM_GPU_BLOCKS * PAGE,
                                        layers=list(LAYERS),
                                        layer_stride=NUM_GPU_BLOCKS * PAGE, block_stride=PAGE)],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), ATTENTION)])


class EngineCoreLoop:
    """vLLM's Scheduler and, in place of the model runner, this loop calling the
    worker-side OffloadingConnector. kv is the "GPU" KV cache: (layer, block, head, token,
    K+V bytes), vLLM's logical per-layer shape stacked over the layers."""

    def __init__(self, config: VllmConfig, kv_config: KVCacheConfig):
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(TOKENS_PER_BLOCK, hash_fn)
        self.kv = torch.zeros(len(LAYERS), *compute_layer_kv_cache_shape_bytes(
            ATTENTION, NUM_GPU_BLOCKS), dtype=torch.int8)
        # The worker first, as vLLM's engine core does: the adapter's manager finds the
        # worker's engine when the Scheduler builds it.
        self.worker = OffloadingConnector(config, KVConnectorRole.WORKER, kv_config)
        with set_current_vllm_config(config):
            self.worker.register_kv_caches(dict(zip(LAYERS, self.kv)))
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=TOKENS_PER_BLOCK, log_stats=True)
        self.block_tables: dict[str, list[int]] = {}
        self.outputs: dict[str, list] = {}
        # vLLM's connector prefix-cache stats of every step: cached prompt tokens by source.
        self.hits_by_source: Counter[CacheHitSource] = Counter()
        self.finished_recving: set[str] = set()
        # Prompt and output tokens each request's forward computed, over all its steps.
        self.computed_tokens: Counter[str] = Counter()
        # The KV cache events the scheduler published, GPU's and the connector's.
        self.kv_events: list = []
        self.scheduler.kv_event_publisher.publish = \
            lambda batch: self.kv_events.extend(batch.events)
        self._random = torch.Generator().manual_seed(0)

    def add(self, req_id: str, prompt: list[int], max_tokens: int,
            kv_transfer_params: dict | None = None) -> None:
        """kv_transfer_params: what a client sends in its request's kv_transfer_params field,
        which vLLM's OpenAI server passes on in the sampling parameters' extra_args."""
        extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
        self.scheduler.add_request(Request(
            request_id=req_id, prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra),
            pooling_params=None, block_hasher=self.block_hasher))

    def _forward(self, out) -> None:
        """Writes the KV of the tokens this step computes, and only those, into their slots
        of the request's blocks, as the model would."""
        # yield_req_data's flag says "resumed" (the ids replace the table); a new request's
        # ids are its whole table too.
        new_reqs = {r.req_id for r in out.scheduled_new_reqs}
        for req_id, block_ids, resumed in yield_req_data(out):
            if resumed or req_id in new_reqs:
                self.block_tables[req_id] = list(block_ids[0])
            elif block_ids is not None:
                self.block_tables[req_id].extend(block_ids[0])
        computed = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, n in out.num_scheduled_tokens.items():
            self.computed_tokens[req_id] += n
            table = self.block_tables[req_id]
            for pos in range(computed[req_id], computed[req_id] + n):
                slot = self.kv[:, table[pos // TOKENS_PER_BLOCK], :, pos % TOKENS_PER_BLOCK]
                slot.copy_(torch.randint(-128, 128, slot.shape, dtype=torch.int8,
                                         generator=self._random))

    def step(self) -> bool:
        """One engine step; False when it computed nothing (only transfers moved)."""
        out = self.scheduler.schedule()
        worker = self.worker
        worker.handle_preemptions(out.kv_connector_metadata)
        worker.bind_connector_metadata(out.kv_connector_metadata)
        # Sync loads feed this step's forward; async ones start after it.
        if out.has_sync_kv_loads:
            worker.start_load_kv(None)
        self._forward(out)
        if not out.has_sync_kv_loads:
            worker.start_load_kv(None)
        worker.wait_for_save()
        results = worker.get_transfer_results(out.finished_req_ids)
        connector_output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            # The loads that failed (vLLM 0.34's connector reports them; 0.32's has no such
            # field and asserts instead) and the blocks they left unloaded.
            failed_recving=getattr(results, "failed_recving", set()),
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta())
        worker.clear_connector_metadata()
        self.finished_recving |= results.finished_recving
        if out.total_num_scheduled_tokens:
            # Every prefill completes in its step (see the token budget), so every
            # scheduled request samples one token.
            req_ids = list(out.num_scheduled_tokens)
            # vLLM 0.34 dropped req_id_to_index (the index is the position in req_ids).
            index = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
                     if "req_id_to_index" in RUNNER_OUTPUT_FIELDS else {})
            runner_output = ModelRunnerOutput(
                req_ids=req_ids, **index,
                sampled_token_ids=[[SAMPLED_TOKEN] for _ in req_ids],
                kv_connector_output=connector_output)
        else:
            runner_output = ModelRunnerOutput.with_kv_conn_output_only(connector_output)
        for outputs in self.scheduler.update_from_output(out, runner_output).values():
            for o in outputs.outputs:
                self.outputs.setdefault(o.request_id, []).append(o)
            stats = outputs.scheduler_stats
            if stats is not None and stats.connector_prefix_cache_stats is not None:
                self.hits_by_source.update(stats.connector_prefix_cache_stats.hits_by_source)
        return out.total_num_scheduled_tokens > 0

    def run_until_idle(self, what: str, timeout: float = 30.0) -> None:
        """Steps while the scheduler has work, as the engine core does: unfinished requests
        or, through the connector, transfer jobs not yet reported complete."""
        deadline = time.monotonic() + timeout
        while self.scheduler.has_requests():
            assert time.monotonic() < deadline, f"{what}: not done after {timeout} s"
            if not self.step():
                # Transfers run on libkvoffload's threads: leave them the CPU.
                time.sleep(0.001)

    def prefill_stats(self, req_id: str):
        stats = [o.prefill_stats for o in self.outputs.get(req_id, []) if o.prefill_stats]
        assert len(stats) == 1, f"{req_id}: want one prefill report, got {stats}"
        return stats[0]

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()


@pytest.fixture
def engine(tmp_path, monkeypatch):
    # A's FULL_BLOCKS blocks exceed the pinned RAM scaled_env leaves: the engine cascades
    # some of them to the emptyDir tier, and B's load has to read those from disk.
    scaled_env(tmp_path, monkeypatch, block_bytes=len(LAYERS) * PAGE)
    loop = EngineCoreLoop(vllm_config(tiny_llama(tmp_path)), kv_cache_config())
    yield loop
    loop.shutdown()


def test_scheduler_loads_what_it_stored_through_the_spec(engine):
    assert type(engine.worker.connector_worker.spec) is KVOffloadAgentSpec
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt_a, max_tokens=2)
    # Idle means A finished and every store job the scheduler made was reported complete.
    engine.run_until_idle("request A and its stores")
    assert [o.new_token_ids for o in engine.outputs["A"]] == [[SAMPLED_TOKEN]] * 2
    assert engine.prefill_stats("A").num_external_cached_tokens == 0
    # What A's forward wrote into its full blocks; its partial last block is never stored.
    held = engine.kv[:, engine.block_tables["A"][:FULL_BLOCKS]].clone()
    tiers = engine.worker.connector_worker.worker._core.engine.stats()["tiers"]
    assert tiers[1]["blocks"] > 0, f"none of A's blocks reached disk tier 0: {tiers}"

    # Empties the GPU prefix cache only (the connector keeps its blocks), as vLLM's
    # /reset_prefix_cache does by default: otherwise B would hit A's blocks in GPU memory and
    # never ask the connector. Zeroed, the GPU blocks can only hold what a load writes.
    assert engine.scheduler.reset_prefix_cache()
    engine.kv.zero_()
    prompt_b = prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101, 102, 103, 104, 105]
    engine.add("B", prompt_b, max_tokens=1)
    engine.run_until_idle("request B")

    stats = engine.prefill_stats("B")
    assert stats.num_local_cached_tokens == 0
    assert stats.num_external_cached_tokens == FULL_BLOCKS * TOKENS_PER_BLOCK
    # vLLM's count of cached prompt tokens by source (vllm:prompt_tokens_cached_by_source):
    # the blocks pinned RAM could not keep came from disk.
    by_source = engine.hits_by_source
    assert set(by_source) <= {CacheHitSource.HOST, CacheHitSource.DISK}, by_source
    assert sum(by_source.values()) == FULL_BLOCKS * TOKENS_PER_BLOCK
    assert by_source.get(CacheHitSource.DISK, 0) > 0, by_source
    assert "B" in engine.finished_recving, "B's load never completed through finished_recving"
    loaded = engine.kv[:, engine.block_tables["B"][:FULL_BLOCKS]]
    differ = [i for i in range(FULL_BLOCKS) if not torch.equal(held[:, i], loaded[:, i])]
    assert not differ, f"B's blocks {differ} (of {FULL_BLOCKS} loaded) differ from A's"


def _core(engine):
    return engine.worker.connector_worker.worker._core


@contextlib.contextmanager
def b_after_a_with_its_files(tmp_path, monkeypatch, before_b_loads):
    """A's prompt stored on the golden pod's persistent, shared tier only; the GPU prefix
    cache reset and zeroed; then B, A's full blocks and two tokens more, with before_b_loads
    applied to every block file between B's lookup and its load. Yields the engine after B,
    A's KV of its full blocks and the files handed to before_b_loads."""
    scaled_env(tmp_path, monkeypatch, block_bytes=len(LAYERS) * PAGE, persistent_only=True)
    engine = EngineCoreLoop(vllm_config(tiny_llama(tmp_path)), kv_cache_config())
    try:
        prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
        engine.add("A", prompt_a, max_tokens=2)
        engine.run_until_idle("request A and its stores")
        held = engine.kv[:, engine.block_tables["A"][:FULL_BLOCKS]].clone()
        assert engine.scheduler.reset_prefix_cache()
        engine.kv.zero_()
        worker = engine.worker.connector_worker.worker
        submit_load = worker.submit_load
        files = []

        def between_lookup_and_load(*args, **kwargs):
            for f in tmp_path.glob("kv-cache-*/**/*.blk"):
                before_b_loads(f)
                files.append(f)
            return submit_load(*args, **kwargs)

        worker.submit_load = between_lookup_and_load
        engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1)
        engine.run_until_idle("request B")
        assert files, "none of A's blocks was on the persistent tier"
        yield engine, held, files
    finally:
        engine.shutdown()


def test_shared_tier_block_removed_by_another_replica_after_the_hit_still_loads(
        tmp_path, monkeypatch):
    """The golden pod's pvcRef tier is shared by every replica, and a replica evicts by
    unlinking a block's file: our hold cannot stop it. vLLM 0.32.0 asserts that every load
    succeeds, so a block reported as a hit must still load after that: here every block file is
    removed between B's lookup and B's load, and B still gets A's KV."""
    with b_after_a_with_its_files(tmp_path, monkeypatch, os.unlink) as (engine, held, _):
        assert engine.prefill_stats("B").num_external_cached_tokens == \
            FULL_BLOCKS * TOKENS_PER_BLOCK
        assert torch.equal(held, engine.kv[:, engine.block_tables["B"][:FULL_BLOCKS]])
        assert _core(engine).engine.stats()["held_blocks"] == 0


@pytest.mark.skipif(not vllm.__version__.startswith("0.34"),
                    reason="vLLM 0.32 and 0.33 assert on a failed load (their engine stops); "
                           "runs under 0.34, which recomputes the request (ctest "
                           "vllm.0.34.0.test_vllm_scheduler)")
def test_a_load_that_fails_on_disk_is_recomputed(tmp_path, monkeypatch):
    """Every block file of the persistent tier torn (truncated) between B's lookup and its
    load: the engine's checks fail the load rather than hand back wrong KV, and vLLM 0.34
    takes the failure (its failed_recving) and, under the webhook's kv_load_failure_policy,
    recomputes B's prompt instead of ending B with an error."""
    with b_after_a_with_its_files(tmp_path, monkeypatch,
                                  lambda f: os.truncate(f, 100)) as (engine, _, _):
        stats = _core(engine).engine.stats()
        assert stats["failed_loads"] > 0, stats
        assert [o.new_token_ids for o in engine.outputs["B"]] == [[SAMPLED_TOKEN]]
        # Recomputed: B's forward computed every token of its prompt, the loaded ones again.
        assert engine.computed_tokens["B"] >= FULL_BLOCKS * TOKENS_PER_BLOCK + 2, \
            engine.computed_tokens
        assert stats["held_blocks"] == 0


def test_connector_reset_drops_what_was_offloaded(engine):
    """reset_prefix_cache(reset_connector=True) (vLLM's /reset_prefix_cache?reset_external=true,
    and pausing with clear_cache around a weight update) must stop the connector serving
    KV computed before it."""
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt_a, max_tokens=2)
    engine.run_until_idle("request A and its stores")
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)
    engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1)
    engine.run_until_idle("request B")
    assert engine.prefill_stats("B").num_external_cached_tokens == 0, \
        "blocks offloaded before the reset were served after it"
    assert _core(engine).engine.stats()["held_blocks"] == 0


def test_connector_reset_while_loading_releases_the_load_holds(engine):
    """A reset while B's load is in flight: vLLM 0.32.0 skips the completion of every job it
    made before the reset (complete_load never comes) and has no on_reset_flushed, so nothing
    on the scheduler's side says when that load is over. Its blocks must still stop being held
    once it is: a hold left behind pins a block in the tier for good, and every reset during a
    load would shrink the tier."""
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt_a, max_tokens=2)
    engine.run_until_idle("request A and its stores")
    assert engine.scheduler.reset_prefix_cache()  # the GPU's copy only: B must load
    engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1)
    worker = engine.worker.connector_worker.worker
    # B's load is not reported done in the step that starts it, as with a load from a slow
    # disk: the reset below then comes while it is in flight.
    worker.get_finished = lambda: []
    engine.step()
    del worker.get_finished
    assert _core(engine).engine.stats()["held_blocks"] == FULL_BLOCKS, "B's load holds"
    assert engine.scheduler.reset_connector_cache()
    engine.run_until_idle("request B after a reset in mid-load", timeout=15)
    assert "B" in engine.finished_recving
    assert _core(engine).engine.stats()["held_blocks"] == 0, "holds outlived the reset's load"


def test_connector_reset_while_storing_leaves_no_block_pending(engine):
    """A reset while A's store job is in flight: vLLM skips that job's completion, so nothing
    may wait for it (a key left "being stored" would defer every request with that prefix
    forever). vLLM stores A's blocks again after the reset, under the new generation, and B
    loads those."""
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt_a, max_tokens=2)
    engine.step()  # A's prefill: the scheduler makes its store job, the worker defers it
    # The connector half of reset_prefix_cache(reset_connector=True), whose GPU half refuses
    # while A runs.
    assert engine.scheduler.reset_connector_cache()
    engine.run_until_idle("request A")
    held = engine.kv[:, engine.block_tables["A"][:FULL_BLOCKS]].clone()
    assert engine.scheduler.reset_prefix_cache()
    engine.kv.zero_()
    engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1)
    engine.run_until_idle("request B after a reset in mid-store", timeout=15)
    assert engine.prefill_stats("B").num_external_cached_tokens == FULL_BLOCKS * TOKENS_PER_BLOCK
    assert torch.equal(held, engine.kv[:, engine.block_tables["B"][:FULL_BLOCKS]])
    assert _core(engine).engine.stats()["held_blocks"] == 0


@pytest.mark.parametrize("tiers, disk_serves", [([], False), ([{"medium": "cpu"}], False),
                                                ([{"medium": "STORAGE"}], True), (None, True)])
def test_a_requests_kv_load_tiers_choose_the_tiers_it_loads_from(engine, tiers, disk_serves):
    """A client (a router such as llm-d) can restrict where one request's KV may load from
    with kv_transfer_params {"kv_load_tiers": [...]}: vLLM parses it into the request's tier
    filter. As in vLLM's own tiering the CPU tier always serves; a block only the disk tiers
    hold is a miss unless the filter admits STORAGE."""
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt_a, max_tokens=2)
    engine.run_until_idle("request A and its stores")
    assert engine.scheduler.reset_prefix_cache()
    # Where A's blocks are now: the pinned tier keeps 2 of them, the rest went to disk.
    tiers_of_a = _core(engine).engine.where(
        [engine_key(k) for k in offload_keys_of(engine, prompt_a)[:FULL_BLOCKS]])
    assert sorted(tiers_of_a) == [0, 0, 1, 1], tiers_of_a
    engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1,
               kv_transfer_params=None if tiers is None else {"kv_load_tiers": tiers})
    engine.run_until_idle("request B")
    served = FULL_BLOCKS if disk_serves else \
        next((i for i, t in enumerate(tiers_of_a) if t != 0), FULL_BLOCKS)
    assert engine.prefill_stats("B").num_external_cached_tokens == served * TOKENS_PER_BLOCK
    assert _core(engine).engine.stats()["held_blocks"] == 0


def test_a_cpu_only_filter_loads_what_the_pinned_tier_holds(engine):
    """The other half of the tier filter: with only the CPU tier admitted, blocks the pinned
    tier holds are loaded (above, A's leading blocks were on disk, so a filter that refused
    every block passed the CPU-only cases too)."""
    prompt = list(range(1, 1 + 2 * TOKENS_PER_BLOCK + 5))
    engine.add("A", prompt, max_tokens=2)
    engine.run_until_idle("request A and its stores")
    assert engine.scheduler.reset_prefix_cache()
    keys = [engine_key(k) for k in offload_keys_of(engine, prompt)[:2]]
    assert _core(engine).engine.where(keys) == [0, 0], "both in the pinned tier"
    engine.add("B", prompt[:2 * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1,
               kv_transfer_params={"kv_load_tiers": [{"medium": "cpu"}]})
    engine.run_until_idle("request B")
    assert engine.prefill_stats("B").num_external_cached_tokens == 2 * TOKENS_PER_BLOCK
    assert _core(engine).engine.stats()["held_blocks"] == 0


def offload_keys_of(engine, prompt):
    """The offload keys vLLM's connector gives the full blocks of a prompt (one block per key,
    group 0)."""
    req = Request(request_id="keys", prompt_token_ids=prompt,
                  sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                  block_hasher=engine.block_hasher)
    return [make_offload_key(h, 0) for h in req.block_hashes]


def test_kv_events_of_a_restarted_pod_follow_the_blocks_it_did_not_store(tmp_path, monkeypatch):
    """A pod restarted on its persistent tier serves blocks stored before the restart. vLLM's
    event tracker (self-describing KV events, what a KV-aware router reads) records what it
    needs to describe every block hit, and keeps it until an event says the block left every
    tier. Such a block is announced in the tier it is found in at its first hit, and its moves
    and removals after that are reported, so the router hears of it and the tracker forgets it
    when it is gone (without the events it stayed in the scheduler's memory for the life of
    the process)."""
    scaled_env(tmp_path, monkeypatch, block_bytes=len(LAYERS) * PAGE, persistent_only=True)
    # LRU, so that new blocks push the hit ones out (ARC keeps a hit block against them).
    monkeypatch.setenv("KVOFFLOAD_EVICTION_POLICY", "lru")
    model = tiny_llama(tmp_path)
    prompt_a = list(range(1, 1 + FULL_BLOCKS * TOKENS_PER_BLOCK + 5))
    before = EngineCoreLoop(vllm_config(model), kv_cache_config())
    try:
        before.add("A", prompt_a, max_tokens=2)
        before.run_until_idle("request A and its stores")
    finally:
        before.shutdown()

    engine = EngineCoreLoop(vllm_config(model, kv_events=True), kv_cache_config())
    try:
        engine.add("B", prompt_a[:FULL_BLOCKS * TOKENS_PER_BLOCK] + [100, 101], max_tokens=1)
        engine.run_until_idle("request B")
        assert engine.prefill_stats("B").num_external_cached_tokens == \
            FULL_BLOCKS * TOKENS_PER_BLOCK
        keys = offload_keys_of(engine, prompt_a)[:FULL_BLOCKS]
        hashes = [maybe_convert_block_hash(BlockHash(get_offload_block_hash(k))) for k in keys]
        offloaded = [e for e in engine.kv_events if getattr(e, "medium", None) != "GPU"]
        announced = {h: e.token_ids for e in offloaded if isinstance(e, BlockStored)
                     for h in e.block_hashes}
        for i, h in enumerate(hashes):
            assert announced.get(h) == prompt_a[i * TOKENS_PER_BLOCK:(i + 1) * TOKENS_PER_BLOCK], \
                f"block {i} of A, hit after the restart, is not described in a stored event"

        # New prompts (another first token: no block in common with A) push A's blocks out.
        seen = len(engine.kv_events)
        for j in range(8):
            engine.add(f"C{j}", [110 + j] + prompt_a[1:], max_tokens=1)
            engine.run_until_idle(f"request C{j}")
        core = _core(engine)
        assert core.engine.where([engine_key(k) for k in keys]) == [-1] * FULL_BLOCKS, \
            "A's blocks are still in a tier"
        removed = {h for e in engine.kv_events[seen:] if isinstance(e, BlockRemoved)
                   and e.medium != "GPU" for h in e.block_hashes}
        assert set(hashes) <= removed, "A's blocks left the tiers without a removed event"
        tracker = engine.scheduler.connector.connector_scheduler._events_tracker
        kept = list(tracker._pending_event_metadata)
        where = core.engine.where([engine_key(k) for k in kept])
        assert [k.hex() for k, t in zip(kept, where) if t < 0] == [], \
            "vLLM's event tracker keeps blocks that are in no tier"
    finally:
        engine.shutdown()
