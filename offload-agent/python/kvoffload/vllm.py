"""vLLM adapter: `KVOffloadAgentSpec`, the OffloadingConnector spec that agent mode names in
--kv-transfer-config ({"spec_name":"KVOffloadAgentSpec","spec_module_path":"kvoffload.vllm"}).
Written against vLLM 0.32.0 (vllm/v1/kv_offload/base.py), 0.33 and 0.34: 0.33's changes to the
interfaces used here only add to them, 0.34 hands the worker page addresses instead of block ids
(KVOffloadWorker._rows). 0.32 runs real engines in the tests; 0.33 and 0.34 have no CPU build,
and their Python sources run the scheduler and connector tests (tests/vllm/CMakeLists.txt).
Any other release is refused on import, naming the release and what to do.

vLLM splits offloading in two: a scheduler-side OffloadingManager that answers lookups and
hands out load/store specs, and a worker-side OffloadingWorker that moves the bytes. Here each
worker (rank) owns one libkvoffload engine for its shard of the KV cache (the C++ engine owns
the pinned tier, the disk tiers and eviction), and the manager asks every rank's engine
(ranks.py): directly when the only worker runs in the scheduler's process (the 'uni'
executor), over a local socket otherwise (the 'mp' executor, tensor and pipeline parallelism).
A block is a hit only when every rank has its shard, and it is held on every rank from the
lookup until its load is done."""

import dataclasses
import difflib
import hashlib
import json
import logging
import math
import multiprocessing
import os
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

import vllm

# The vLLM releases (major.minor) whose offloading interfaces this adapter implements: 0.32 and
# 0.33 hand the worker GPU block ids, 0.34 resolved device pointers (KVOffloadWorker takes
# both). Each release changes these interfaces; one this adapter was not written for would
# fail on its first transfer, deep inside vLLM's model runner: refused here, before vLLM builds
# anything.
SUPPORTED_VLLM_RELEASES = ("0.32", "0.33", "0.34")


def check_vllm_release(version: str) -> None:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or f"{m[1]}.{m[2]}" not in SUPPORTED_VLLM_RELEASES:
        raise ImportError(
            f"kvoffload.vllm: this image runs vLLM {version}, and agent mode's adapter "
            f"supports vLLM {', '.join(SUPPORTED_VLLM_RELEASES[:-1])} and "
            f"{SUPPORTED_VLLM_RELEASES[-1]} only (vLLM's offloading "
            "interfaces change between releases): run this pod in vllm-native mode "
            "(annotation kvoffload.io/mode: vllm-native), or on an image with a supported "
            "vLLM")


# Before the imports below: another release may lack the names they take.
check_vllm_release(vllm.__version__)

from vllm.config import get_current_vllm_config_or_none
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
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
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload import metrics as metrics_mod
from kvoffload import ranks as ranks_mod
from kvoffload import settings as settings_mod
from kvoffload.engine import Fingerprint, KvoError
from kvoffload.transfer import TransferCore, engine_key

# Under vLLM's logger: vLLM configures handlers (and VLLM_LOGGING_LEVEL) for "vllm" only, so a
# logger of our own package name would print nothing in a `vllm serve` pod's log.
logger = logging.getLogger("vllm.kvoffload")

# Residency events the engine keeps between two take_events() of the scheduler (one step):
# 24 bytes each, so at most 24 MiB; a step that moves more blocks than this loses events
# (counted in the engine's events_dropped), never blocks.
EVENT_CAPACITY = 1 << 20

# Graceful shutdown: how long the worker may spend writing pinned-only blocks to a persistent
# tier before its engine closes (extra config "write_back_seconds"). Kubernetes gives a pod 30 s
# between SIGTERM and SIGKILL by default, and vLLM needs some of it for itself.
DEFAULT_WRITE_BACK_SECONDS = 10.0
# A worker of vLLM's multiproc executor (tensor or pipeline parallel ranks: processes named
# VllmWorker-<rank>) gets VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5) to exit once the
# executor shuts down, then SIGTERM and, 4 s later, SIGKILL: a write-back longer than that
# was killed part way, before the engine closed. The budget there ends this long before it.
WORKER_EXIT_MARGIN_SECONDS = 1.0


def write_back_budget(configured: float) -> tuple[float, str | None]:
    """The write-back budget this process can spend at shutdown, and why it is less than
    `configured` (None when it is not)."""
    if not multiprocessing.current_process().name.startswith("VllmWorker-"):
        return configured, None
    raw = os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = 5.0  # vLLM itself fails on it first
    budget = max(0.0, timeout - WORKER_EXIT_MARGIN_SECONDS)
    if budget >= configured:
        return configured, None
    return budget, (f"vLLM's multiproc executor waits VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS="
                    f"{raw} s for a worker to exit, so the shutdown write-back gets {budget:g} "
                    f"s of its {configured:g}; set that variable to "
                    f"{configured + WORKER_EXIT_MARGIN_SECONDS:g} or more for all of it")
# The most either duration of the extra config may be: an hour is past any pod's grace period
# and any sensible metrics interval, and inf (or 1e20) s overflowed the engine's milliseconds
# at shutdown, after the last step, leaving the engine unclosed and nothing written back.
MAX_SECONDS = 3600.0

# How often the manager reads the engines' counters for vLLM's metrics (extra config
# "metrics_interval_seconds"; 0 = every scheduler step). vLLM asks every step and a read is a
# few counters per tier (one round trip per other rank). Every step by default: vLLM stops
# stepping when idle, so what a skipped read missed stayed off /metrics until the next request
# (a 1 s default showed a burst shorter than that as nothing at all).
DEFAULT_METRICS_INTERVAL_SECONDS = 0.0

# engine_id -> the transfer core of that engine's worker, so the scheduler-side manager of
# the same vLLM engine calls it directly when both run in one process.
_cores: dict[str, TransferCore] = {}
_cores_lock = threading.Lock()


class KVOffloadLoadStoreSpec(LoadStoreSpec):
    """The blocks of a transfer on the engine side: their vLLM offload keys, in the order of
    the GPU block ids the scheduler pairs them with, and the manager's key generation when it
    made the spec (a store prepared before a cache reset lands where nothing finds it). A load
    also carries the keys whose holds it owns: every rank's worker releases them in its own
    engine when its part of the load is over. Pickled to the workers."""

    def __init__(self, keys: list[OffloadKey], generation: int,
                 held: list[OffloadKey] | None = None):
        self.keys = keys
        self.generation = generation
        self.held = held or []

    def __repr__(self) -> str:
        return f"KVOffloadLoadStoreSpec({len(self.keys)} keys, generation {self.generation})"


# The extra config's keys that stand for a KVOFFLOAD_* variable.
_EXTRA_SETTINGS = {"KVOFFLOAD_CPU_BYTES": "cpu_bytes_to_use",
                   "KVOFFLOAD_EVICTION_POLICY": "eviction_policy",
                   "KVOFFLOAD_TIERS": "kvoffload_tiers"}
# Every extra-config key the spec reads, and those of them whose near misses are refused.
_SPEC_KEYS = frozenset([*_EXTRA_SETTINGS.values(), "disk_io", "revision", "write_back_seconds",
                        "metrics_interval_seconds"])
_NEAR_MISS_KEYS = sorted(_SPEC_KEYS - {"cpu_bytes_to_use"})


def resolve_settings(extra_config, env=os.environ) -> settings_mod.Settings:
    """KVOFFLOAD_* (set by the webhook) win; without them the connector's extra config
    (cpu_bytes_to_use, eviction_policy, kvoffload_tiers) configures a hand-written setup.
    A value from the extra config may be JSON of any type (kvoffload_tiers a list, as
    --kv-transfer-config carries it, or that list as a string), and its errors name its key."""
    # The extra config also carries vLLM's keys and the spec's others (write_back_seconds, ...),
    # so only keys of ours are checked: a misspelt one read as absent would run without tiers.
    ours = {key for key in _EXTRA_SETTINGS.values() if key.startswith("kvoffload_")}
    unknown = sorted(k for k in extra_config if k.startswith("kvoffload_") and k not in ours)
    if unknown:
        raise ValueError(f"kv_connector_extra_config.{unknown[0]}: unknown key; the keys of "
                         f"KVOffloadAgentSpec's own are {', '.join(sorted(ours))}")
    # The extra config is vLLM's too, so other keys pass; but one that is nearly ours (case,
    # '-' for '_', a letter off, our prefix left out) ran the pod with no disk tier or with lru.
    # (A near miss of cpu_bytes_to_use is named below where no size is found.)
    for key in extra_config:
        if not isinstance(key, str) or key in _SPEC_KEYS:
            continue
        norm = key.lower().replace("-", "_")
        near = difflib.get_close_matches(norm, _NEAR_MISS_KEYS, n=1, cutoff=0.85)
        if not near and f"kvoffload_{norm}" in _NEAR_MISS_KEYS:
            near = [f"kvoffload_{norm}"]
        if near:
            raise ValueError(f"kv_connector_extra_config.{key}: unknown key; did you mean "
                             f"{near[0]}?")
    # An empty variable is an unset one (libkvoffload reads it so too): KVOFFLOAD_TIERS=""
    # left by a shell or a pod spec does not drop the tiers the extra config gives.
    merged, names = {var: value for var, value in env.items() if value != ""}, {}
    for var, key in _EXTRA_SETTINGS.items():
        if var in merged or key not in extra_config:
            continue
        value = extra_config[key]
        # vLLM's --kv-offloading-size writes cpu_bytes_to_use as GiB * 2^30, a float, and its
        # own CPU spec reads it with int(): read the same.
        if key == "cpu_bytes_to_use" and isinstance(value, float) and math.isfinite(value):
            value = int(value)
        merged[var] = value if isinstance(value, str) else json.dumps(value)
        names[var] = f"kv_connector_extra_config.{key}"
    if "KVOFFLOAD_CPU_BYTES" not in merged:
        near = difflib.get_close_matches("cpu_bytes_to_use", [str(k) for k in extra_config], n=1)
        raise ValueError(
            "the pinned CPU tier's size is not set: KVOFFLOAD_CPU_BYTES (the webhook sets it in "
            "agent mode from kvCacheOffloading.cpu) or kv_connector_extra_config.cpu_bytes_to_use "
            "(vLLM's --kv-offloading-size sets it, in GiB)"
            + (f"; the extra config has {near[0]!r}: did you mean cpu_bytes_to_use?" if near
               else ""))
    if "KVOFFLOAD_TIERS" not in merged and "secondary_tiers" in extra_config:
        raise ValueError("kv_connector_extra_config.secondary_tiers is the key of vLLM's "
                         "TieringOffloadingSpec; KVOffloadAgentSpec reads its disk tiers from "
                         "KVOFFLOAD_TIERS or kv_connector_extra_config.kvoffload_tiers (a JSON "
                         "array of {path, kind, capacityBytes, persistent, shared})")
    return settings_mod.from_env(merged, names)


def rank_share(settings: settings_mod.Settings, rank: int, world_size: int,
               engine: int = 0, engines: int = 1) -> settings_mod.Settings:
    """What one rank of `world_size`, in engine `engine` of the `engines` vLLM engines the pod
    runs (data-parallel replicas started by one server), gets of the pod's tiers. The webhook
    sizes pinned RAM and each disk tier for the pod, and every rank of every engine is started
    with the same KVOFFLOAD_* env: each engine gets 1/engines of every capacity and each of
    its ranks, which stores 1/world_size of every block, that share of it (the pod's memory
    request holds), and a directory of its own in each disk tier (dp<engine>/rank<rank>, each
    part only where there are several), so that opening one engine, which empties a
    non-persistent tier, never removes another's blocks, and each counts only its own
    files."""
    parts = world_size * engines
    if parts == 1:
        return settings
    sub = ([f"dp{engine}"] if engines > 1 else []) + ([f"rank{rank}"] if world_size > 1 else [])
    # Never 0, which the engine takes as "size the tier from its file system": a share too
    # small for a block is refused by the engine, naming the share.
    tiers = tuple(dataclasses.replace(t, path=os.path.join(t.path, *sub),
                                      capacity_bytes=max(1, t.capacity_bytes // parts))
                  for t in settings.tiers)
    return dataclasses.replace(settings, cpu_bytes=settings.cpu_bytes // parts, tiers=tiers)


def pod_engines(parallel, vllm_config) -> tuple[int, int]:
    """(this engine's index among the data-parallel engines of this pod, how many there are).
    vLLM runs one engine per data-parallel rank; `--data-parallel-size-local` of them in one
    server (all of them without it, unless each rank is a server of its own, as with external
    load balancing), each building its own spec from the same env. OffloadingConfig carries
    the global size only; the local one comes from the vLLM config that vLLM's worker sets as
    current while it initialises its KV cache (get_worker). Without that config the global
    size is the safe assumption: never more than the pod's budget, at worst a share of it."""
    if parallel.data_parallel_size <= 1:
        return 0, 1
    if vllm_config is not None:
        engines = max(1, vllm_config.parallel_config.data_parallel_size_local)
    else:
        engines = parallel.data_parallel_size
        logger.warning("kvoffload: data-parallel engine %d of %d: no vLLM config to tell how "
                       "many run in this pod; taking 1/%d of the pod's tiers",
                       parallel.data_parallel_index, engines, engines)
    local = parallel.data_parallel_rank_local
    return (parallel.data_parallel_index if local is None else local) % engines, engines


# Files of a model directory that say which weights it holds (model_digest), and how much of
# each is read: a weight file at its start (for safetensors, its header: names, shapes),
# middle and end, each this long.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_DIGEST_SAMPLE_BYTES = 64 * 1024


def model_digest(path: str) -> str | None:
    """A digest of the weights in model directory `path`, or None when it is not a directory
    (a hub name) or holds no weight file. KServe starts every model as `vllm serve
    /mnt/models`, so the model name scopes nothing there: without this, a persistent tier
    kept across a change of the LLMInferenceService's model (a fine-tune of the same
    architecture, or two services on one PVC) would serve one model's KV to the other.

    Read: config.json and the weight files (their names relative to `path`, sizes, and 64
    KiB at the start, the middle and the end of each), a few MiB for a large model; hidden
    directories (the hub's download metadata) and modification times are left out, so a
    storage initializer that downloads the same model again on every pod start keeps the
    tier's blocks."""
    if not os.path.isdir(path):
        return None
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [os.path.join(root, n) for n in sorted(names)
                  if n == "config.json" or n.endswith(_WEIGHT_SUFFIXES)]
    if not any(f.endswith(_WEIGHT_SUFFIXES) for f in files):
        return None
    digest = hashlib.blake2b(digest_size=16)
    for f in files:
        size = os.path.getsize(f)
        digest.update(f"{os.path.relpath(f, path)}\0{size}\0".encode())
        with open(f, "rb") as data:
            for offset in sorted({0, max(0, size // 2 - _DIGEST_SAMPLE_BYTES // 2),
                                  max(0, size - _DIGEST_SAMPLE_BYTES)}):
                data.seek(offset)
                digest.update(data.read(_DIGEST_SAMPLE_BYTES))
    return digest.hexdigest()


def fingerprint(config: OffloadingConfig, extra_config) -> Fingerprint:
    """The model fingerprint: blocks of another model, revision, weights, dtype, block size,
    layout or rank never hit. OffloadingConfig carries no model revision, so it comes from
    the extra config's "revision"; a model directory adds the digest of its weights
    (model_digest), so a directory whose weights changed scopes anew."""
    p = config.parallel
    tokens = ",".join(str(g.tokens_per_block) for g in config.groups)
    layout = (f"{config.kv_cache_layout or 'default'};tokens_per_block={tokens};"
              f"tokens_per_hash={config.cache.tokens_per_hash};tp={p.tp_size};pp={p.pp_size};"
              f"pcp={p.pcp_size};dcp={p.dcp_size};canonical={int(config.canonical_layout)}")
    revision = str(extra_config.get("revision", ""))
    weights = model_digest(config.model.name)
    if weights is not None:
        revision = f"{revision};weights={weights}" if revision else f"weights={weights}"
    return Fingerprint(model=config.model.name, revision=revision,
                       dtype=str(config.model.dtype), layout=layout, rank=p.rank)


class KVOffloadManager(OffloadingManager):
    """Scheduler side, answered from the engines of every rank (a RankGroup).

    Protection: each engine evicts on its own store threads, outside vLLM's manager lock, so a
    lookup HIT holds the block in every rank's engine right away (kvo_hold); nothing evicts it
    until released. A block some rank lacks is a miss, and the holds taken on the other ranks
    are given back at once. prepare_load hands one of this step's lookup holds to the load,
    whose workers release it when they have read the block (not complete_load: vLLM 0.32.0
    never completes a job made before a cache reset, and nothing else then says when its
    load is over); lookup holds no load took are released at on_schedule_end, vLLM's last
    manager call of a step.

    Events: rank 0's residency feed says which block entered or left which tier; they are
    reported as vLLM OffloadingEvents, the pinned host tier as Medium.CPU and disk tier i as
    Medium.STORAGE owned by "disk<i>". A block is named by the OffloadKey it was stored under
    in this process; one this process did not store (recovered from a persistent tier at
    start, or a shared tier's block from another replica) is announced at its first hit.

    Per-request tier choice: a request's kv_load_tiers (vLLM's load_tier_filter) can leave
    the disk tiers out; a block found only on disk is then a miss for that request."""

    def __init__(self, ranks: ranks_mod.RankGroup, enable_events: bool,
                 metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_SECONDS):
        self._ranks = ranks
        self._enable_events = enable_events
        self._metrics = metrics_mod.MetricsReporter(metrics_interval_s)
        self._storing: set[OffloadKey] = set()
        self._step_holds: Counter[OffloadKey] = Counter()
        self._hit_tiers: dict[OffloadKey, int] = {}  # this step's hits: the tier of each
        self._generation = 0  # key generation, moved on by reset_cache
        # For events: engine key -> OffloadKey, and the tiers each named block is in now.
        self._names: dict[tuple[int, int], OffloadKey] = {}
        self._residency: dict[tuple[int, int], set[int]] = {}
        # Blocks named at a hit on a disk tier and not in the CPU tier since. vLLM's event
        # tracker counts every hit block as in its CPU tier (vLLM's own tiering promotes each
        # hit there) and keeps what it recorded of it until an event removes it from there;
        # our load promotes too, but not when no pinned slot is free: such a block's last
        # removal then comes with a CPU one.
        self._hit_on_disk: set[tuple[int, int]] = set()
        self._events: list[OffloadingEvent] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.HIT_PENDING
        tiers = self._ranks.hold(key, self._generation)
        if tiers is None:
            return LookupResult.MISS
        tier = max(tiers)  # where the load has to read it from on some rank
        if tier > 0 and not req_context.load_tier_filter.allows(*_DISK_TIER_PLACE):
            # The request's kv_load_tiers leave the disk tiers out (vLLM parses it from its
            # kv_transfer_params; [] or [{"medium": "CPU"}] mean pinned RAM only). As in
            # vLLM's own tiering, the CPU tier always serves. The engines counted the hold as
            # a hit: the block was there.
            self._ranks.release([key], self._generation)
            return LookupResult.MISS
        self._step_holds[key] += 1
        self._hit_tiers[key] = tier
        if self._enable_events:
            self._announce(key, tiers[0])  # the events are rank 0's
        return LookupResult.HIT

    def _announce(self, key: OffloadKey, tier: int) -> None:
        """A hit on a block this process did not store (recovered from a persistent tier at
        start, or stored by another replica in a shared one) names it from now on, and
        reports it stored in the tier it was found in: the residency feed then has a name
        for its later changes, and vLLM's event tracker, which keeps what it recorded of
        a hit block until a removal event for it, gets that event."""
        k = engine_key(key, self._generation)
        if k in self._names:
            return
        self._names[k] = key
        self._residency[k] = {tier}
        if tier > 0:
            self._hit_on_disk.add(k)
        event = _offloading_event(tier, removed=False)
        event.keys.append(key)
        self._events.append(event)

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        """Where this step's hit on the block comes from, for vLLM's per-source count of
        cached prompt tokens (vllm:prompt_tokens_cached_by_source): HOST for the pinned tier,
        DISK for a disk tier, as vLLM's own tiering reports them."""
        tier = self._hit_tiers.get(key)
        if tier is None:
            return CacheHitSource.EXTERNAL_UNSPECIFIED
        return CacheHitSource.HOST if tier == 0 else CacheHitSource.DISK

    def prepare_load(self, keys: Collection[OffloadKey],
                     req_context: ReqContext) -> LoadStoreSpec:
        held = []
        for key in keys:
            if self._step_holds[key] > 0:
                self._step_holds[key] -= 1
            elif self._ranks.hold(key, self._generation) is None:
                # vLLM loads only what a lookup reported; this block was not looked up this
                # step and is gone now. Its load fails and vLLM reports it.
                logger.error("kvoffload: block %s is loaded without a lookup hit and is not "
                             "offloaded", key.hex())
                continue
            held.append(key)
        self._step_holds = +self._step_holds  # drop zero counts
        return KVOffloadLoadStoreSpec(list(keys), self._generation, held)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._hit_tiers.clear()
        if self._step_holds:
            self._ranks.release(list(self._step_holds.elements()), self._generation)
            self._step_holds.clear()

    def reset_cache(self) -> None:
        """vLLM drops every offloaded block (a cache reset, e.g. around a weight update). The
        manager moves to the next key generation: every block stored before, and every store
        still in flight (its spec carries the old generation), is unreachable at once, and is
        the first to age out of the tiers since nothing touches it again. After a restart the
        generation starts from 0 again: a persistent tier then serves what was stored before
        the first reset, with the weights a restart loads. Each later generation is drawn at
        random, not counted: counted, every process's first reset was generation 1, and a
        restart or another replica on a shared tier served the blocks that another process
        stored after its reset, made by other weights. Holds of this step's lookups end now;
        those of loads in flight end with the loads, in the workers."""
        if self._step_holds:
            self._ranks.release(list(self._step_holds.elements()), self._generation)
        self._step_holds = Counter()
        self._hit_tiers.clear()
        # Keys stored under the old generation never complete_store (vLLM skips stale jobs):
        # left here they would answer HIT_PENDING forever.
        self._storing.clear()
        self._names.clear()
        self._residency.clear()
        self._hit_on_disk.clear()
        self._events.clear()
        # 63 bits, never 0 (the generation a restart starts with) nor the current one.
        previous = self._generation
        while self._generation in (0, previous):
            self._generation = secrets.randbits(63)

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        # Order matters: the scheduler pairs these keys with GPU block ids in its own order,
        # which is the order it passed them in. Evictions happen in the engines when the
        # store runs; they reach vLLM as events, so none are returned here. A block some rank
        # lacks is stored again: the ranks that have it skip it.
        gen = self._generation
        candidates = [k for k in keys if k not in self._storing]
        todo = [k for k, everywhere in zip(candidates, self._ranks.stored(candidates, gen))
                if not everywhere]
        self._storing.update(todo)
        if self._enable_events:
            for key in todo:
                self._names[engine_key(key, gen)] = key
        return PrepareStoreOutput(keys_to_store=todo,
                                  store_spec=KVOffloadLoadStoreSpec(todo, gen), evicted_keys=[])

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True):
        self._storing.difference_update(keys)
        if self._enable_events:
            # The job is over, so its events are in the feed: a key with no tier after them
            # was not stored (no room, copy error) and needs no name.
            self._drain_events()
            for key in keys:
                k = engine_key(key, self._generation)
                if k not in self._residency:
                    self._names.pop(k, None)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def get_stats(self):
        """The engines' counters since the last call, as vLLM connector stats (kvoffload.
        metrics); vLLM's Prometheus logger exports them on /metrics."""
        return self._metrics.take(self._ranks.take_metrics)

    def shutdown(self) -> None:
        """vLLM's scheduler stops: its links to the ranks' engines close here (each worker
        closes its engine in its own shutdown)."""
        self._ranks.close()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._enable_events:
            self._drain_events()
        events, self._events = self._events, []
        return events

    def _drain_events(self) -> None:
        run: OffloadingEvent | None = None
        run_tier = -1
        for ev in self._ranks.take_events():
            name = self._names.get(ev.key)
            if name is None:
                continue
            from_cpu_too = False
            if ev.removed:
                tiers = self._residency.get(ev.key)
                if tiers is None or ev.tier not in tiers:
                    # A block named at a hit was reported in one tier only: a removal
                    # from another (or an older one still in the feed) was never announced.
                    continue
                tiers.discard(ev.tier)
                if not tiers:  # gone from every tier
                    del self._residency[ev.key]
                    del self._names[ev.key]
                    from_cpu_too = ev.key in self._hit_on_disk
                    self._hit_on_disk.discard(ev.key)
            else:
                self._residency.setdefault(ev.key, set()).add(ev.tier)
                if ev.tier == 0:
                    self._hit_on_disk.discard(ev.key)
            # Consecutive changes of one tier and direction become one OffloadingEvent.
            if run is None or run.removed != ev.removed or run_tier != ev.tier:
                run, run_tier = _offloading_event(ev.tier, ev.removed), ev.tier
                self._events.append(run)
            run.keys.append(name)
            if from_cpu_too:
                run, run_tier = _offloading_event(0, removed=True), 0
                self._events.append(run)
                run.keys.append(name)


# Where vLLM's per-request tier filter (kv_load_tiers) sees every disk tier: a file system
# mounted in the pod, whether emptyDir or a PVC shared with other replicas.
_DISK_TIER_PLACE = (Medium.STORAGE, Locality.LOCAL)


def _offloading_event(tier: int, removed: bool) -> OffloadingEvent:
    if tier == 0:
        return OffloadingEvent(keys=[], medium=Medium.CPU, removed=removed)
    medium, locality = _DISK_TIER_PLACE
    return OffloadingEvent(keys=[], medium=medium, removed=removed,
                           locality=locality, ownership=f"disk{tier - 1}",
                           removal_expected=True)


class _Job(NamedTuple):
    """A vLLM transfer job in one rank's engine."""
    engine_job: int
    is_store: bool
    size: int  # bytes moved
    start: float  # time.perf_counter()
    spec: KVOffloadLoadStoreSpec


class KVOffloadWorker(OffloadingWorker):
    """Worker side: submits engine jobs and polls them. vLLM 0.32 and 0.33 assert that every
    transfer succeeded (0.34 recomputes a request whose load failed). A failed store is
    reported as done (the block is simply not offloaded, lookups miss it, the engine counts
    the failure); a failed load is reported as failed, because the GPU blocks would otherwise
    hold stale KV."""

    def __init__(self, core: TransferCore, engine_id: str, rank: int, write_back_s: float,
                 group_tensors: list[list[int]]):
        self._core = core
        # Per KV cache group, the tensor of each of its data refs, in vLLM's order: how vLLM
        # 0.34 lays out a transfer's page addresses (rows_at).
        self._group_tensors = group_tensors
        self._engine_id = engine_id
        # The manager reaches this rank's index here when it runs in another process.
        self._server = ranks_mod.RankServer(core, engine_id, rank)
        self._write_back_s = write_back_s
        self._jobs: dict[int, _Job] = {}  # by vLLM job id
        self._finished: list[TransferResult] = []
        self._yield_to_copies = core.device == "host"

    def _release_load_holds(self, spec: KVOffloadLoadStoreSpec) -> None:
        """A load is over on this rank (done, failed or refused): the holds the manager
        handed it end here, in this rank's engine. Never raises: it runs where vLLM waits
        for a job's result, and an error let out there ended the worker (the job was already
        gone when the handler tried to finish it again: a KeyError)."""
        if spec.held:
            try:
                self._core.release(spec.held, spec.generation)
            except KvoError as e:
                logger.error("kvoffload: releasing a load's holds: %s", e)

    def _rows(self, gpu) -> Sequence[int]:
        """The GPU blocks of a transfer as rows of the KV tensors: vLLM 0.32 and 0.33 give
        their block ids (GPULoadStoreSpec), 0.34 their pages' addresses (DevicePointers)."""
        if isinstance(gpu, GPULoadStoreSpec):
            return gpu.block_ids
        if tuple(gpu.group_data_ref_counts) != tuple(len(t) for t in self._group_tensors):
            raise ValueError(f"page addresses for groups of {list(gpu.group_data_ref_counts)} "
                             f"data refs; the KV caches registered "
                             f"{[len(t) for t in self._group_tensors]}")
        return self._core.rows_at(gpu.ptrs, gpu.group_block_counts, self._group_tensors)

    def _submit(self, job_id: int, spec: KVOffloadLoadStoreSpec, gpu, is_store: bool) -> bool:
        keys = spec.keys
        start = time.perf_counter()
        try:
            block_ids = self._rows(gpu)
            if len(keys) != len(block_ids):
                raise ValueError(f"{len(keys)} keys paired with {len(block_ids)} GPU blocks")
            fn = self._core.store if is_store else self._core.load
            engine_job = fn(keys, block_ids, generation=spec.generation)
        except (KvoError, ValueError, IndexError) as e:
            # ValueError: a job whose GPU side does not match its keys, or page addresses
            # that name no row of the registered tensors, which are neither read nor written;
            # IndexError: a block id past the KV tensors' rows. Let out, the load's holds
            # were never released.
            logger.error("kvoffload: job %d not submitted: %s", job_id, e)
            if not is_store:
                self._release_load_holds(spec)
            # Submitted, and finished at once: a store as done (not offloaded), a load as
            # failed. vLLM asserts on a refused submission; on a failed load 0.34 recomputes
            # the request's blocks (0.32 and 0.33 assert on that too).
            self._finished.append(TransferResult(job_id, is_store, 0, 0.0))
            return True
        self._jobs[job_id] = _Job(engine_job, is_store, self._core.transfer_bytes(len(keys)),
                                  start, spec)
        return True

    # src_spec of a store and dst_spec of a load: a GPULoadStoreSpec (vLLM 0.32, 0.33) or
    # DevicePointers (0.34), see _rows.
    def submit_store(self, job_id: int, src_spec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KVOffloadLoadStoreSpec), dst_spec
        return self._submit(job_id, dst_spec, src_spec, is_store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec,
                    expedited: bool = False) -> bool:
        # The engine runs jobs in submission order on its workers; an expedited load is
        # waited on right away by vLLM, and a job waited on before a worker took it runs on
        # the waiting thread if fewer jobs than the engine's worker threads are running (two
        # by default): that is the priority it gets here. Behind two running stores it waits
        # for one of them to end.
        assert isinstance(src_spec, KVOffloadLoadStoreSpec), src_spec
        return self._submit(job_id, src_spec, dst_spec, is_store=False)

    def _finish(self, job_id: int, ok: bool, error: Exception | None) -> None:
        _, is_store, size, start, spec = self._jobs.pop(job_id)
        if not is_store:
            self._release_load_holds(spec)  # this rank has read the blocks, or never will
        seconds = time.perf_counter() - start
        if error is not None:
            logger.warning("kvoffload: %s job %d failed: %s", "store" if is_store else "load",
                           job_id, error)
        else:
            self._core.record_latency(is_store, seconds)
        self._finished.append(TransferResult(job_id, ok or is_store, size if ok else 0,
                                             seconds))

    def get_finished(self) -> list[TransferResult]:
        load_running = False
        for job_id, (engine_job, is_store, *_rest) in list(self._jobs.items()):
            try:
                done = self._core.poll(engine_job)
            except KvoError as e:
                self._finish(job_id, False, e)
                continue
            if done:
                self._finish(job_id, True, None)
            else:
                load_running |= not is_store
        if load_running and self._yield_to_copies:
            # The host device copies a load on the engine's threads, on the cores that run
            # vLLM. A request waiting for it leaves vLLM nothing to run, and its in-process
            # step loop then polls again at once, without sleeping: that loop took a core's
            # share from the copies (bench/RESULTS.md section 7). Yielding here hands the core
            # to a copy thread when one is waiting for it, and costs one system call when none
            # is.
            os.sched_yield()
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            if job_id not in self._jobs:
                continue
            try:
                self._core.wait(self._jobs[job_id].engine_job)
            except KvoError as e:
                self._finish(job_id, False, e)
                continue
            self._finish(job_id, True, None)

    def shutdown(self) -> None:
        with _cores_lock:
            if _cores.get(self._engine_id) is self._core:
                del _cores[self._engine_id]
        self._server.close()
        # vLLM shuts the connector down after its last step; jobs still running are waited
        # by the engine's close, and write-back covers what only pinned RAM holds.
        start = time.monotonic()
        report = self._core.close(self._write_back_s)
        if report is not None:
            logger.info("kvoffload: shutdown wrote %d pinned-only blocks to the persistent "
                        "tier in %.2f s (%d failed, %d not written: colder than the tier "
                        "holds, or past the %.0f s budget)",
                        report["written"], time.monotonic() - start, report["failed"],
                        report["left"], self._write_back_s)


class KVOffloadAgentSpec(OffloadingSpec):
    """The spec vLLM instantiates on both sides from kv_connector_extra_config."""

    @classmethod
    def build_metric_definitions(cls, extra_config) -> dict:
        """The metrics the manager reports (kvoffload.metrics), for vLLM's Prometheus
        logger."""
        return metrics_mod.definitions()

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"KVOffloadAgentSpec: blocks_per_chunk={self.blocks_per_chunk}; libkvoffload "
                "offloads one vLLM block per key, remove block_size/blocks_per_chunk from "
                "kv_connector_extra_config")
        self.settings = resolve_settings(self.extra_config)
        # Checked at start: a bad write_back_seconds would otherwise surface at shutdown.
        self._write_back_s()
        self._metrics_interval_s()
        self._manager: KVOffloadManager | None = None
        self._worker: KVOffloadWorker | None = None

    def _seconds(self, key: str, default: float, zero_means: str) -> float:
        value = self.extra_config.get(key, default)
        # A number, or its digits as text: float() also took True (1 s), "1_0" (10 s), " 2 ".
        seconds = -1.0
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
            seconds = float(value)
        if not 0 <= seconds <= MAX_SECONDS:
            raise ValueError(f"KVOffloadAgentSpec: kv_connector_extra_config.{key}="
                             f"{value!r} is not a number of seconds from 0 to {MAX_SECONDS:g}; "
                             f"{zero_means}")
        return seconds

    def _write_back_s(self) -> float:
        return self._seconds("write_back_seconds", DEFAULT_WRITE_BACK_SECONDS,
                             "0 turns the shutdown write-back off")

    def _metrics_interval_s(self) -> float:
        return self._seconds("metrics_interval_seconds", DEFAULT_METRICS_INTERVAL_SECONDS,
                             "0 reads the engines' counters every scheduler step")

    def _events_enabled(self) -> bool:
        return bool(self.kv_events_config.enable_kv_cache_events)

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = KVOffloadManager(self._connect_ranks(), self._events_enabled(),
                                             self._metrics_interval_s())
        return self._manager

    def _connect_ranks(self) -> ranks_mod.RankGroup:
        """vLLM's engine core creates its executor and registers the workers' KV caches
        (get_worker) before it builds the scheduler (get_manager), so every rank serves its
        engine by now: a worker in this process is called directly, the others are
        connected to; one that cannot be reached refuses the start, not the first request."""
        p = self.config.parallel
        with _cores_lock:
            local = _cores.get(self.config.engine_id)
        if p.world_size == 1 and local is not None:
            return ranks_mod.RankGroup([local])
        try:
            return ranks_mod.RankGroup([ranks_mod.RemoteRank(self.config.engine_id, rank)
                                        for rank in range(p.world_size)])
        except ConnectionError as e:
            raise ValueError(
                f"KVOffloadAgentSpec: {e}: the scheduler asks every worker's engine over a "
                f"socket of this node, so vLLM's {p.world_size} worker(s) (tp={p.tp_size}, "
                f"pp={p.pp_size}) must run on the scheduler's node: use "
                "--distributed-executor-backend=mp (or uni at world size 1), not ray across "
                "nodes") from None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            pages = {t.page_size_bytes for t in kv_caches.tensors}
            if len(pages) != 1:
                raise ValueError(f"KVOffloadAgentSpec: KV tensors with page sizes "
                                 f"{sorted(pages)}; one engine needs one block size")
            # A block id of any KV cache group is a row of every tensor here. That holds
            # where the groups share their tensors (vLLM's layout for sliding-window and
            # full-attention layers: a row holds one layer of each group); where groups own
            # different tensors, loading one group's block would write over another's rows.
            groups = {frozenset(ref.tensor_idx for ref in refs)
                      for refs in kv_caches.group_data_refs}
            if len(groups) > 1:
                raise ValueError(
                    "KVOffloadAgentSpec: this model's KV cache groups use different tensors "
                    f"({sorted(sorted(g) for g in groups)}); agent mode offloads models whose "
                    "groups share them (full and sliding-window attention): run this pod in "
                    "vllm-native mode (annotation kvoffload.io/mode: vllm-native)")
            write_back_s, cut = write_back_budget(self._write_back_s())
            if cut is not None:
                logger.warning("kvoffload: %s", cut)
            p = self.config.parallel
            # A tier's directory is its volume's mount (the webhook mounts /mnt/kv-cache-<i>);
            # the rank's directory below it is made here, and libkvoffload refuses a directory
            # that does not exist. Missing itself, the volume is not mounted there, and the
            # tier would fill the container's own file system, and a persistent one would lose
            # its blocks at every restart.
            for i, t in enumerate(self.settings.tiers):
                if not os.path.isdir(t.path):
                    raise ValueError(
                        f"KVOffloadAgentSpec: disk tier {i}'s directory {t.path} does not exist: "
                        "mount the tier's volume there (the webhook mounts tier i at "
                        "/mnt/kv-cache-<i>)")
            engine, engines = pod_engines(p, get_current_vllm_config_or_none())
            s = rank_share(self.settings, p.rank, p.world_size, engine, engines)
            for t in s.tiers:
                os.makedirs(t.path, exist_ok=True)
            # Here, not in __init__: only the worker's engine uses it, and the weights' digest
            # reads the model's files.
            try:
                core = TransferCore([t.tensor for t in kv_caches.tensors],
                                    fingerprint(self.config, self.extra_config),
                                    cpu_bytes=s.cpu_bytes, eviction_policy=s.eviction_policy,
                                    tiers_json=s.tiers_json(),
                                    disk_io=str(self.extra_config.get("disk_io", "auto")),
                                    page_bytes=pages.pop(),
                                    # The manager reads rank 0's feed alone.
                                    event_capacity=EVENT_CAPACITY
                                    if self._events_enabled() and p.rank == 0 else 0)
            except KvoError as e:
                # The library names its own inputs; these came by the extra config (disk_io
                # always does), and a rank's sizes are its share of the pod's.
                message = re.sub(r"(?<![\w.])disk_io=", "kv_connector_extra_config.disk_io=",
                                 s.as_configured(e.message))
                if s is not self.settings:
                    message += (f" (rank {p.rank}'s share: the pod's sizes are divided among "
                                "its ranks and data-parallel engines)")
                raise KvoError(e.call, e.status, message) from e
            try:
                worker = KVOffloadWorker(core, self.config.engine_id, self.config.parallel.rank,
                                         write_back_s,
                                         [[ref.tensor_idx for ref in refs]
                                          for refs in kv_caches.group_data_refs])
            except BaseException:  # e.g. the rank's address is taken: free the pinned tier
                core.close()
                raise
            with _cores_lock:
                _cores[self.config.engine_id] = core
            self._worker = worker
        return self._worker
