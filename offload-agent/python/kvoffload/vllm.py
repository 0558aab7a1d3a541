"""vLLM adapter: `KVOffloadAgentSpec`, the OffloadingConnector spec that agent mode names in
--kv-transfer-config ({"spec_name":"KVOffloadAgentSpec","spec_module_path":"kvoffload.vllm"}).
Written against vLLM 0.33.0 (vllm/v1/kv_offload/base.py); other releases are not supported.

vLLM splits offloading in two: a scheduler-side OffloadingManager that answers lookups and
hands out load/store specs, and a worker-side OffloadingWorker that moves the bytes. Here the
bytes and the index both live in one libkvoffload engine per worker (the C++ engine owns the
pinned tier, the disk tiers and eviction), so the manager asks the worker's engine directly.
That needs the worker in the scheduler's process: one worker (world size 1, vLLM's
single-process executor). Larger worlds are refused with a message saying so."""

import logging
import os
import threading
import time
from collections.abc import Collection, Iterable

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from kvoffload import settings as settings_mod
from kvoffload.engine import Fingerprint, KvoError
from kvoffload.transfer import TransferCore

logger = logging.getLogger(__name__)

# engine_id -> the transfer core of that engine's worker, so the scheduler-side manager of
# the same vLLM engine (same process) reads the index the worker writes.
_cores: dict[str, TransferCore] = {}
_cores_lock = threading.Lock()


class KVOffloadLoadStoreSpec(LoadStoreSpec):
    """The blocks of a transfer on the engine side: their vLLM offload keys, in the order of
    the GPU block ids the scheduler pairs them with. Pickled to the workers."""

    def __init__(self, keys: list[OffloadKey]):
        self.keys = keys

    def __repr__(self) -> str:
        return f"KVOffloadLoadStoreSpec({len(self.keys)} keys)"


def resolve_settings(extra_config, env=os.environ) -> settings_mod.Settings:
    """KVOFFLOAD_* (set by the webhook) win; without them the connector's extra config
    (cpu_bytes_to_use, eviction_policy, kvoffload_tiers) configures a hand-written setup."""
    merged = dict(env)
    if "KVOFFLOAD_CPU_BYTES" not in merged and "cpu_bytes_to_use" in extra_config:
        merged["KVOFFLOAD_CPU_BYTES"] = str(extra_config["cpu_bytes_to_use"])
    if "KVOFFLOAD_EVICTION_POLICY" not in merged and "eviction_policy" in extra_config:
        merged["KVOFFLOAD_EVICTION_POLICY"] = str(extra_config["eviction_policy"])
    if "KVOFFLOAD_TIERS" not in merged and "kvoffload_tiers" in extra_config:
        merged["KVOFFLOAD_TIERS"] = str(extra_config["kvoffload_tiers"])
    return settings_mod.from_env(merged)


def fingerprint(config: OffloadingConfig, extra_config) -> Fingerprint:
    """The model fingerprint: blocks of another model, revision, dtype, block size, layout or
    rank never hit. OffloadingConfig carries no model revision, so it comes from the extra
    config's "revision" (empty when unset: the model name alone then scopes)."""
    p = config.parallel
    tokens = ",".join(str(g.tokens_per_block) for g in config.groups)
    layout = (f"{config.kv_cache_layout or 'default'};tokens_per_block={tokens};"
              f"tokens_per_hash={config.cache.tokens_per_hash};tp={p.tp_size};pp={p.pp_size};"
              f"pcp={p.pcp_size};dcp={p.dcp_size};canonical={int(config.canonical_layout)}")
    return Fingerprint(model=config.model.name, revision=str(extra_config.get("revision", "")),
                       dtype=str(config.model.dtype), layout=layout, rank=p.rank)


def _require_single_worker(config: OffloadingConfig) -> None:
    if config.parallel.world_size != 1:
        raise ValueError(
            f"KVOffloadAgentSpec: world size {config.parallel.world_size} (tp={config.parallel.tp_size}, "
            f"pp={config.parallel.pp_size}) is not supported yet: the scheduler reads the "
            "worker's engine in-process, which needs exactly one worker")


class KVOffloadManager(OffloadingManager):
    """Scheduler side. Lookups go to the engine; keys being stored are tracked here so they
    are not stored twice; loads in flight are counted for complete_load. Eviction happens in
    the engine, which reports no per-block feed through the C API: prepare_store returns no
    evicted keys and only stores produce events."""

    def __init__(self, engine_id: str, enable_events: bool):
        self._engine_id = engine_id
        self._enable_events = enable_events
        self._storing: set[OffloadKey] = set()
        self._loading: dict[OffloadKey, int] = {}
        self._events: list[OffloadingEvent] = []

    def _core(self) -> TransferCore:
        with _cores_lock:
            core = _cores.get(self._engine_id)
        if core is None:
            raise RuntimeError(
                f"KVOffloadAgentSpec: no worker engine for vLLM engine {self._engine_id!r} in "
                "this process; the worker registers it when vLLM registers its KV caches")
        return core

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.HIT_PENDING
        return LookupResult.HIT if self._core().stored_prefix([key]) == 1 else LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey],
                     req_context: ReqContext) -> LoadStoreSpec:
        for key in keys:
            self._loading[key] = self._loading.get(key, 0) + 1
        return KVOffloadLoadStoreSpec(list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext):
        for key in keys:
            left = self._loading.get(key, 0) - 1
            if left > 0:
                self._loading[key] = left
            else:
                self._loading.pop(key, None)

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        core = self._core()
        # Order matters: the scheduler pairs these keys with GPU block ids in its own order,
        # which is the order it passed them in.
        todo = [k for k in keys if k not in self._storing and core.stored_prefix([k]) == 0]
        self._storing.update(todo)
        return PrepareStoreOutput(keys_to_store=todo, store_spec=KVOffloadLoadStoreSpec(todo),
                                  evicted_keys=[])

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True):
        self._storing.difference_update(keys)
        if success and self._enable_events and keys:
            self._events.append(OffloadingEvent(keys=list(keys), medium=Medium.CPU,
                                                removed=False))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events

    def loads_in_flight(self) -> int:
        return len(self._loading)


class KVOffloadWorker(OffloadingWorker):
    """Worker side: submits engine jobs and polls them. vLLM asserts that every transfer
    succeeded. A failed store is reported as done (the block is simply not offloaded, lookups
    miss it, the engine counts the failure); a failed load is reported as failed, because the
    GPU blocks would otherwise hold stale KV."""

    def __init__(self, core: TransferCore, engine_id: str):
        self._core = core
        self._engine_id = engine_id
        # vLLM job id -> (engine job, is_store, bytes, start time)
        self._jobs: dict[int, tuple[int, bool, int, float]] = {}
        self._finished: list[TransferResult] = []

    def _submit(self, job_id: int, keys: list[OffloadKey], block_ids, is_store: bool) -> bool:
        if len(keys) != len(block_ids):
            logger.error("kvoffload: job %d pairs %d keys with %d GPU blocks", job_id,
                         len(keys), len(block_ids))
            return False
        start = time.perf_counter()
        try:
            fn = self._core.store if is_store else self._core.load
            engine_job = fn(keys, block_ids)
        except KvoError as e:
            logger.error("kvoffload: job %d not submitted: %s", job_id, e)
            if is_store:
                self._finished.append(TransferResult(job_id, True, 0, 0.0))
                return True
            return False
        self._jobs[job_id] = (engine_job, is_store, self._core.transfer_bytes(len(keys)), start)
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KVOffloadLoadStoreSpec), dst_spec
        return self._submit(job_id, dst_spec.keys, src_spec.block_ids, is_store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        # The engine runs jobs in submission order on its workers; an expedited load is
        # waited on right away by vLLM, which is all the priority it gets here.
        assert isinstance(src_spec, KVOffloadLoadStoreSpec), src_spec
        return self._submit(job_id, src_spec.keys, dst_spec.block_ids, is_store=False)

    def _finish(self, job_id: int, ok: bool, error: Exception | None) -> None:
        _, is_store, size, start = self._jobs.pop(job_id)
        if error is not None:
            logger.warning("kvoffload: %s job %d failed: %s", "store" if is_store else "load",
                           job_id, error)
        self._finished.append(TransferResult(job_id, ok or is_store, size if ok else 0,
                                             time.perf_counter() - start))

    def get_finished(self) -> list[TransferResult]:
        for job_id, (engine_job, *_rest) in list(self._jobs.items()):
            try:
                if self._core.poll(engine_job):
                    self._finish(job_id, True, None)
            except KvoError as e:
                self._finish(job_id, False, e)
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            if job_id not in self._jobs:
                continue
            try:
                self._core.wait(self._jobs[job_id][0])
                self._finish(job_id, True, None)
            except KvoError as e:
                self._finish(job_id, False, e)

    def shutdown(self) -> None:
        with _cores_lock:
            if _cores.get(self._engine_id) is self._core:
                del _cores[self._engine_id]
        self._core.close()


class KVOffloadAgentSpec(OffloadingSpec):
    """The spec vLLM instantiates on both sides from kv_connector_extra_config."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"KVOffloadAgentSpec: blocks_per_chunk={self.blocks_per_chunk}; libkvoffload "
                "offloads one vLLM block per key, remove block_size/blocks_per_chunk from "
                "kv_connector_extra_config")
        self.settings = resolve_settings(self.extra_config)
        self.fingerprint = fingerprint(config, self.extra_config)
        self._manager: KVOffloadManager | None = None
        self._worker: KVOffloadWorker | None = None

    def get_manager(self) -> OffloadingManager:
        _require_single_worker(self.config)
        if self._manager is None:
            self._manager = KVOffloadManager(self.config.engine_id,
                                             self.kv_events_config.enable_kv_cache_events)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        _require_single_worker(self.config)
        if self._worker is None:
            pages = {t.page_size_bytes for t in kv_caches.tensors}
            if len(pages) != 1:
                raise ValueError(f"KVOffloadAgentSpec: KV tensors with page sizes "
                                 f"{sorted(pages)}; one engine needs one block size")
            s = self.settings
            core = TransferCore([t.tensor for t in kv_caches.tensors], self.fingerprint,
                                cpu_bytes=s.cpu_bytes, eviction_policy=s.eviction_policy,
                                tiers_json=s.tiers_json(),
                                disk_io=str(self.extra_config.get("disk_io", "auto")),
                                block_bytes=pages.pop())
            logger.info("kvoffload: %s", core.engine.describe())
            with _cores_lock:
                _cores[self.config.engine_id] = core
            self._worker = KVOffloadWorker(core, self.config.engine_id)
        return self._worker
