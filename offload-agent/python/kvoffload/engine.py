"""ctypes binding of include/kvoffload/c.h. ctypes rather than a compiled extension so the
package works with whatever Python the vLLM image ships. Thread-safe as the C API is: one
Engine may be shared by threads."""

import array
import ctypes
import os
from dataclasses import dataclass

DEFAULT_LIBRARY = "/opt/kvoffload/lib/libkvoffload.so"

KVO_OK = 0
KVO_PENDING = 100
_STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "NOT_FOUND", 3: "ALREADY_EXISTS", 4: "IO_ERROR",
    5: "RESOURCE_EXHAUSTED", 6: "CORRUPTION", 7: "UNAVAILABLE", 8: "FAILED_PRECONDITION",
    9: "DEADLINE_EXCEEDED", 10: "UNIMPLEMENTED", 11: "INTERNAL", 100: "PENDING",
}
MAX_TIERS = 16


class KvoError(RuntimeError):
    """A C API call failed; `status` is the kvo_status, the message is kvo_last_error()."""

    def __init__(self, call: str, status: int, message: str):
        super().__init__(f"{call}: {_STATUS_NAMES.get(status, status)}: {message}")
        self.call = call
        self.status = status
        self.message = message


class Key(ctypes.Structure):
    _fields_ = [("hi", ctypes.c_uint64), ("lo", ctypes.c_uint64)]


class _Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("block_bytes", ctypes.c_size_t),
        ("model", ctypes.c_char_p),
        ("revision", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("layout", ctypes.c_char_p),
        ("rank", ctypes.c_int32),
        ("device", ctypes.c_char_p),
        ("disk_io", ctypes.c_char_p),
        ("from_env", ctypes.c_int),
        ("cpu_bytes", ctypes.c_uint64),
        ("eviction_policy", ctypes.c_char_p),
        ("tiers_json", ctypes.c_char_p),
        ("event_capacity", ctypes.c_uint64),
        ("segments", ctypes.c_uint64),
    ]


_TIER_FIELDS = ["capacity_bytes", "used_bytes", "blocks", "hits", "misses", "evictions",
                "dropped", "io_errors", "corrupt", "bytes_read", "bytes_written", "read_ns",
                "write_ns"]
_STATS_FIELDS = ["stored_blocks", "loaded_blocks", "failed_loads", "failed_stores", "d2h_bytes",
                 "d2h_ns", "h2d_bytes", "h2d_ns", "queue_depth", "held_blocks",
                 "events_dropped"]


class _TierStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _TIER_FIELDS]


class _Stats(ctypes.Structure):
    _fields_ = ([("struct_size", ctypes.c_size_t), ("num_tiers", ctypes.c_uint32),
                 ("tiers", _TierStats * MAX_TIERS)]
                + [(name, ctypes.c_uint64) for name in _STATS_FIELDS]
                + [("tier_refused", ctypes.c_uint64 * MAX_TIERS)]
                + [("tier_lost", ctypes.c_uint64 * MAX_TIERS)])


class _Event(ctypes.Structure):
    _fields_ = [("key", Key), ("tier", ctypes.c_int32), ("removed", ctypes.c_int32)]


@dataclass(frozen=True)
class TierEvent:
    """A block entered (removed=False) or left (removed=True) a tier: 0 = pinned host,
    1 + i = disk tier i."""
    key: tuple[int, int]
    tier: int
    removed: bool


_lib = None


def library_path() -> str:
    return os.environ.get("KVOFFLOAD_LIBRARY") or DEFAULT_LIBRARY


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError(
            f"KVOFFLOAD_LIBRARY={path!r}: cannot load libkvoffload ({e}); agent mode installs it "
            f"at {DEFAULT_LIBRARY}, tests point KVOFFLOAD_LIBRARY at the build tree") from e
    u64p = ctypes.POINTER(ctypes.c_uint64)
    keyp = ctypes.POINTER(Key)
    ptrs = ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "kvo_last_error": (ctypes.c_char_p, []),
        "kvo_engine_create": (ctypes.c_int, [ctypes.POINTER(_Options),
                                             ctypes.POINTER(ctypes.c_void_p)]),
        "kvo_engine_destroy": (None, [ctypes.c_void_p]),
        "kvo_store": (ctypes.c_int, [ctypes.c_void_p, keyp, ptrs, ctypes.c_size_t, u64p]),
        "kvo_load": (ctypes.c_int, [ctypes.c_void_p, keyp, ptrs, ctypes.c_size_t, u64p]),
        "kvo_lookup": (ctypes.c_int, [ctypes.c_void_p, keyp, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_size_t),
                                      ctypes.POINTER(ctypes.c_int32)]),
        "kvo_where": (ctypes.c_int, [ctypes.c_void_p, keyp, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_int32)]),
        "kvo_hold": (ctypes.c_int, [ctypes.c_void_p, keyp, ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(ctypes.c_int32)]),
        "kvo_release": (ctypes.c_int, [ctypes.c_void_p, keyp, ctypes.c_size_t]),
        "kvo_take_events": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_Event),
                                           ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "kvo_job_poll": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
        "kvo_job_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
        "kvo_get_stats": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_Stats)]),
        "kvo_describe": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
        "kvo_write_back": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, u64p, u64p, u64p]),
        "kvo_policy_names": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = lib
    return lib


def policy_names() -> tuple[str, ...]:
    """The eviction policies the loaded libkvoffload registers (kvo_policy_names), sorted."""
    lib = _load()
    size = lib.kvo_policy_names(None, 0) + 1
    buf = ctypes.create_string_buffer(size)
    lib.kvo_policy_names(buf, size)
    return tuple(buf.value.decode().split(","))


def _check(call: str, status: int) -> None:
    if status != KVO_OK:
        raise KvoError(call, status, _load().kvo_last_error().decode(errors="replace"))


@dataclass(frozen=True)
class Fingerprint:
    """What scopes every key: a block stored under one fingerprint is never served under
    another. block_bytes is part of the engine options, so it scopes too."""
    model: str
    revision: str
    dtype: str
    layout: str
    rank: int


@dataclass(frozen=True)
class EngineOptions:
    block_bytes: int
    fingerprint: Fingerprint
    cpu_bytes: int
    eviction_policy: str = "lru"
    tiers_json: str | None = None
    device: str = "host"  # "host" | "cuda"
    disk_io: str = "auto"
    event_capacity: int = 0  # residency events kept for take_events(); 0 = no feed
    segments: int = 1  # pointers per block: store/load take len(keys) * segments pointers


def _keys_array(keys):
    # One array.array of the flat (hi, lo) words, viewed as Key[]: a load submits a few
    # hundred keys on vLLM's step, and filling the structs field by field cost more Python
    # time than the engine takes to start the load (bench/ttft/load_profile.py).
    words = array.array("Q", [w for key in keys for w in key])
    return (Key * len(keys)).from_buffer(words)


class Engine:
    """One libkvoffload engine. Keys are (hi, lo) pairs of 64-bit ints; pointers are ints
    (tensor.data_ptr()) of block_bytes each, on the engine's device."""

    def __init__(self, options: EngineOptions):
        lib = _load()
        fp = options.fingerprint
        self._strings = [s.encode() if s is not None else None for s in (
            fp.model, fp.revision, fp.dtype, fp.layout, options.device, options.disk_io,
            options.eviction_policy, options.tiers_json)]
        model, revision, dtype, layout, device, disk_io, policy, tiers = self._strings
        opts = _Options(ctypes.sizeof(_Options), options.block_bytes, model, revision, dtype,
                        layout, fp.rank, device, disk_io, 0, options.cpu_bytes, policy, tiers,
                        options.event_capacity, options.segments)
        handle = ctypes.c_void_p()
        _check("kvo_engine_create", lib.kvo_engine_create(ctypes.byref(opts),
                                                          ctypes.byref(handle)))
        self._lib = lib
        self._handle = handle
        self.options = options

    def close(self) -> None:
        """Waits for running jobs, cancels queued ones. Idempotent."""
        if self._handle:
            self._lib.kvo_engine_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    @property
    def closed(self) -> bool:
        return not self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        if not self._handle:
            raise RuntimeError("kvoffload engine used after close()")
        return self._handle

    def _submit(self, fn, call, keys, ptrs) -> int:
        if len(keys) * self.options.segments != len(ptrs):
            raise ValueError(f"{call}: {len(keys)} keys of {self.options.segments} segments "
                             f"but {len(ptrs)} pointers")
        job = ctypes.c_uint64()
        if isinstance(ptrs, ctypes.Array):
            arr = ptrs  # made by the caller (TransferCore: over a tensor of addresses)
        else:
            # As _keys_array: array.array converts the pointers in C, not one ctypes object each.
            arr = (ctypes.c_void_p * len(ptrs)).from_buffer(array.array("Q", ptrs))
        _check(call, fn(self._live(), _keys_array(keys), arr, len(keys), ctypes.byref(job)))
        return job.value

    def store(self, keys, ptrs) -> int:
        """Starts copying blocks at ptrs into the tiers; returns the job id. The memory must
        stay valid until the job finished (poll/wait)."""
        return self._submit(self._lib.kvo_store, "kvo_store", keys, ptrs)

    def load(self, keys, ptrs) -> int:
        return self._submit(self._lib.kvo_load, "kvo_load", keys, ptrs)

    def _prefix(self, fn, call, keys) -> list[int]:
        n = len(keys)
        prefix = ctypes.c_size_t()
        tiers = (ctypes.c_int32 * max(n, 1))()
        _check(call, fn(self._live(), _keys_array(keys), n, ctypes.byref(prefix), tiers))
        return list(tiers[: prefix.value])

    def lookup(self, keys) -> list[int]:
        """The tier of each key of the longest stored prefix (0 = pinned host, 1+i = disk
        tier i); its length is the prefix length."""
        return self._prefix(self._lib.kvo_lookup, "kvo_lookup", keys)

    def where(self, keys) -> list[int]:
        """The tier of each key on its own (-1 when absent); not counted as a lookup."""
        n = len(keys)
        tiers = (ctypes.c_int32 * max(n, 1))()
        _check("kvo_where", self._lib.kvo_where(self._live(), _keys_array(keys), n, tiers))
        return list(tiers[:n])

    def hold(self, keys) -> list[int]:
        """lookup() that also holds the prefix it found: no eviction takes those blocks until
        release(). Each hold needs one release."""
        return self._prefix(self._lib.kvo_hold, "kvo_hold", keys)

    def release(self, keys) -> None:
        """Releases one hold of each key; raises KvoError (FAILED_PRECONDITION) naming a key
        that was not held, after releasing the others."""
        _check("kvo_release", self._lib.kvo_release(self._live(), _keys_array(keys), len(keys)))

    def take_events(self, batch: int = 4096) -> list[TierEvent]:
        """Every residency change since the last call, oldest first (empty unless the engine
        was created with event_capacity > 0)."""
        out: list[TierEvent] = []
        buf = (_Event * batch)()
        n = ctypes.c_size_t()
        while True:
            _check("kvo_take_events",
                   self._lib.kvo_take_events(self._live(), buf, batch, ctypes.byref(n)))
            out.extend(TierEvent((e.key.hi, e.key.lo), e.tier, bool(e.removed))
                       for e in buf[: n.value])
            if n.value < batch:
                return out

    def poll(self, job: int) -> bool:
        """False while running; True when finished OK; raises KvoError when it failed."""
        status = self._lib.kvo_job_poll(self._live(), job)
        if status == KVO_PENDING:
            return False
        _check("kvo_job_poll", status)
        return True

    def wait(self, job: int) -> None:
        _check("kvo_job_wait", self._lib.kvo_job_wait(self._live(), job))

    def stats(self) -> dict:
        s = _Stats()
        s.struct_size = ctypes.sizeof(_Stats)
        _check("kvo_get_stats", self._lib.kvo_get_stats(self._live(), ctypes.byref(s)))
        out = {name: getattr(s, name) for name in _STATS_FIELDS}
        out["tiers"] = [{**{name: getattr(s.tiers[i], name) for name in _TIER_FIELDS},
                         "refused": s.tier_refused[i], "lost": s.tier_lost[i]}
                        for i in range(min(s.num_tiers, MAX_TIERS))]
        return out

    def write_back(self, budget_s: float) -> dict:
        """Writes the blocks only the pinned tier has to the first persistent disk tier,
        starting no write after budget_s; {"written", "failed", "left"} block counts."""
        if not 0 <= budget_s < 2**64 / 1000:  # the C API's milliseconds; NaN fails too
            raise ValueError(f"write_back budget_s={budget_s!r}: want seconds >= 0 that fit "
                             "the engine's 64-bit milliseconds")
        written, failed, left = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        _check("kvo_write_back", self._lib.kvo_write_back(
            self._live(), int(budget_s * 1000), ctypes.byref(written), ctypes.byref(failed),
            ctypes.byref(left)))
        return {"written": written.value, "failed": failed.value, "left": left.value}

    def describe(self) -> str:
        need = self._lib.kvo_describe(self._live(), None, 0)
        buf = ctypes.create_string_buffer(need + 1)
        self._lib.kvo_describe(self._live(), buf, need + 1)
        return buf.value.decode(errors="replace")
