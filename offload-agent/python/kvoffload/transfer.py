"""The transfer core: moves blocks between KV-cache tensors and a libkvoffload engine.
Plain torch tensors in, engine calls out; it never imports vLLM, so it is tested on machines
without vLLM (the GPU machine) as well as under the vLLM adapter.

A KV cache is a list of tensors whose first dimension is the block number (vLLM's canonical
layout). One logical block (one vLLM block hash) spans the same row of every tensor; it is one
engine block of one segment per tensor (the engine gathers the rows on store and scatters them
on load), so it lives, is evicted, held and reported as a unit, in one slot and one file.
All tensors must have the same page size. Not thread-safe."""

import ctypes
import hashlib
import logging
import os
import struct
import threading
from collections.abc import Sequence

import torch

from kvoffload.engine import Engine, EngineOptions, Fingerprint, TierEvent, library_path


# The digest as two big-endian 64-bit words in one C call: a load hashes every key of its
# blocks on vLLM's step, and two int.from_bytes a key doubled that time.
_two_words = struct.Struct(">QQ").unpack


def engine_key(block_key: bytes, generation: int = 0) -> tuple[int, int]:
    """The 128-bit engine key of a block: stable across processes and restarts (no Python
    hash()), so persistent tiers hit again after a restart. A cache reset moves the caller to
    the next generation, under which no earlier block is found."""
    salt = b"" if generation == 0 else b"\0kvoffload-generation" + generation.to_bytes(8, "big")
    return _two_words(hashlib.blake2b(block_key + salt, digest_size=16).digest())


def page_stride(tensor: torch.Tensor) -> int:
    """Bytes between consecutive blocks of a (num_blocks, ...) tensor."""
    return tensor.stride(0) * tensor.element_size()


def device_backend(tensors: Sequence[torch.Tensor]) -> str:
    """The engine device backend for these tensors: "cuda" for GPU tensors, "host" for CPU."""
    kinds = {t.device.type for t in tensors}
    if len(kinds) != 1:
        raise ValueError(f"KV tensors live on several device types {sorted(kinds)}; "
                         "one engine serves one device")
    kind = kinds.pop()
    if kind == "cuda":
        return "cuda"
    if kind == "cpu":
        return "host"
    raise ValueError(f"KV tensors on device type {kind!r}: libkvoffload supports cuda and cpu")


def _c_array(addresses: torch.Tensor):
    """A C array of void* over an int64 CPU tensor's memory, without a copy; the tensor must
    outlive its use."""
    return (ctypes.c_void_p * addresses.numel()).from_address(addresses.data_ptr())


# Transfer latencies kept between two take_metrics() of the manager: a manager that stops asking
# costs at most this many floats per kind; later ones are not kept.
MAX_LATENCIES = 1 << 16


class TransferCore:
    """Owns one engine for one worker's KV tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor], fingerprint: Fingerprint,
                 cpu_bytes: int, eviction_policy: str = "lru", tiers_json: str | None = None,
                 disk_io: str = "auto", page_bytes: int | None = None,
                 event_capacity: int = 0):
        if not tensors:
            raise ValueError("no KV tensors to offload")
        sizes = sorted({page_stride(t) for t in tensors})
        if len(sizes) != 1:
            raise ValueError(f"KV tensors have different page sizes {sizes} bytes; "
                             "libkvoffload needs one block size per engine")
        self.stride = sizes[0]
        # vLLM may pad pages; the engine copies exactly page_bytes from each page start.
        self.page_bytes = page_bytes or self.stride
        if self.page_bytes > self.stride:
            raise ValueError(f"page_bytes={self.page_bytes} exceeds the page stride "
                             f"{self.stride} of the KV tensors")
        self.tensors = list(tensors)
        self.device = device_backend(tensors)
        # A job's pointers are made in one vectorized step from these: a load of 4096 tokens
        # of Llama-3-8B is 16384 of them, and a Python loop over rows and tensors, then the
        # conversion for C, took about 1 ms of vLLM's step (0.03 ms this way).
        self._bases = torch.tensor([t.data_ptr() for t in self.tensors], dtype=torch.int64)
        self._rows = min(t.shape[0] for t in self.tensors)
        # The worker records job latencies; the manager takes them from another thread (the
        # rank link) or process.
        self._latency_lock = threading.Lock()
        self._latencies: dict[str, list[float]] = {"load": [], "store": []}
        self.engine = Engine(EngineOptions(
            block_bytes=self.page_bytes * len(self.tensors), segments=len(self.tensors),
            fingerprint=fingerprint, cpu_bytes=cpu_bytes,
            eviction_policy=eviction_policy, tiers_json=tiers_json, device=self.device,
            disk_io=disk_io, event_capacity=event_capacity))
        # Where the adapter and the library came from: in agent mode, the agent volume's (a
        # pod's image may carry an older kvoffload on its own path).
        logging.getLogger("vllm.kvoffload").info(
            "kvoffload: adapter from %s, library %s", os.path.dirname(os.path.abspath(__file__)),
            library_path())

    def close(self, write_back_s: float = 0.0) -> dict | None:
        """Closes the engine. With write_back_s > 0 it first writes the blocks only the
        pinned tier has to the first persistent disk tier, for at most that long, and returns
        the engine's report ({"written", "failed", "left"})."""
        # The engine closes whatever the write-back does: unclosed, its pinned pool and its
        # tiers' locks would outlive the worker's shutdown. Closed already (a second shutdown:
        # the write-back raised "used after close"), there is nothing left to do.
        if self.engine.closed:
            return None
        try:
            return self.engine.write_back(write_back_s) if write_back_s > 0 else None
        finally:
            self.engine.close()

    @staticmethod
    def _keys(block_keys: Sequence[bytes], generation: int) -> list[tuple[int, int]]:
        return [engine_key(k, generation) for k in block_keys]

    def _pointers(self, block_ids) -> torch.Tensor:
        """Row block_ids[i] of every tensor, i major, as int64 addresses. block_ids: any
        sequence of ints (vLLM gives a numpy array)."""
        rows = torch.as_tensor(block_ids, dtype=torch.int64)
        if rows.numel():
            low, high = int(rows.min()), int(rows.max())
            if low < 0 or high >= self._rows:
                raise IndexError(f"block ids {low}..{high} outside a KV tensor of "
                                 f"{self._rows} blocks")
        return (rows[:, None] * self.stride + self._bases[None, :]).reshape(-1)

    def rows_at(self, ptrs, group_rows: Sequence[int],
                group_tensors: Sequence[Sequence[int]]) -> torch.Tensor:
        """The rows that a transfer's page addresses name, in the form vLLM 0.34 gives them
        (DevicePointers): for each KV cache group in turn, group_rows[g] blocks, and for each of
        the group's data refs (the tensors group_tensors[g], in that order) one address per
        block, ref major. Every address must start a row of its ref's tensor, and all refs of
        a block must name the same row: the engine copies a block's row of every tensor (see
        the module's doc), and an address it cannot place is refused (ValueError), never
        copied to or from."""
        # ptrs: vLLM's numpy uint64 array (numpy is not imported here: vLLM brings it, a bare
        # torch need not). Addresses fit in int64, the type torch computes with.
        flat = torch.from_numpy(ptrs.astype("uint64", copy=False).view("int64"))
        rows, at = [], 0
        for n, tensors in zip(group_rows, group_tensors, strict=True):
            if n == 0:
                continue
            refs = len(tensors)
            if refs == 0:
                raise ValueError(f"a group of {n} blocks has no data refs: no page address "
                                 "names its rows")
            if at + n * refs > flat.numel():
                raise ValueError(f"{flat.numel()} page addresses, fewer than the groups' "
                                 f"{list(group_rows)} blocks of "
                                 f"{[len(t) for t in group_tensors]} refs")
            offsets = (flat[at:at + n * refs].view(refs, n)
                       - self._bases[list(tensors)][:, None])
            at += n * refs
            row = torch.div(offsets, self.stride, rounding_mode="floor")
            if bool((offsets % self.stride).any()) or bool((row != row[0]).any()):
                raise ValueError(f"page addresses of a group of {n} blocks over tensors "
                                 f"{list(tensors)} are not one row of each")
            if int(row[0].min()) < 0 or int(row[0].max()) >= self._rows:
                raise ValueError(f"page addresses of rows {int(row[0].min())}.."
                                 f"{int(row[0].max())}, outside KV tensors of {self._rows} "
                                 "blocks")
            rows.append(row[0])
        if at != flat.numel():
            raise ValueError(f"{flat.numel()} page addresses for {at} pages of the groups' "
                             f"{list(group_rows)} blocks")
        return torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64)

    def _check_lengths(self, block_keys, block_ids):
        if len(block_keys) != len(block_ids):
            raise ValueError(f"{len(block_keys)} block keys but {len(block_ids)} block ids")

    def store(self, block_keys: Sequence[bytes], block_ids: Sequence[int],
              generation: int = 0) -> int:
        """Starts copying rows block_ids of every tensor into the engine under block_keys.
        On CUDA the current stream is synchronized first: the engine copies on its own
        stream, and the rows must hold what the forward pass wrote. Returns the engine job."""
        self._check_lengths(block_keys, block_ids)
        if self.device == "cuda":
            torch.cuda.current_stream(self.tensors[0].device).synchronize()
        ptrs = self._pointers(block_ids)  # held until the engine has taken its copy
        return self.engine.store(self._keys(block_keys, generation), _c_array(ptrs))

    def load(self, block_keys: Sequence[bytes], block_ids: Sequence[int],
             generation: int = 0) -> int:
        """Starts copying blocks back into rows block_ids. On CUDA the current stream is
        synchronized first: work queued there may still write these rows (vLLM zeroes a block
        it reallocates on the compute stream and, with async scheduling, nothing else orders
        that before a load into it), and the engine copies on its own stream. Returns the
        engine job."""
        self._check_lengths(block_keys, block_ids)
        if self.device == "cuda":
            torch.cuda.current_stream(self.tensors[0].device).synchronize()
        ptrs = self._pointers(block_ids)  # held until the engine has taken its copy
        return self.engine.load(self._keys(block_keys, generation), _c_array(ptrs))

    def stored_prefix(self, block_keys: Sequence[bytes], generation: int = 0) -> int:
        """How many leading blocks are stored."""
        return len(self.engine.lookup(self._keys(block_keys, generation)))

    def stored(self, block_keys: Sequence[bytes], generation: int = 0) -> list[bool]:
        """Per block: is it stored (each on its own, not as a prefix). Not a lookup: the
        engine's hit and query counts stay those of serving."""
        return [t >= 0 for t in self.engine.where(self._keys(block_keys, generation))]

    def hold(self, block_keys: Sequence[bytes], generation: int = 0) -> list[int]:
        """Holds the longest stored prefix of blocks so that no eviction takes them until
        release(); returns the tier of each held block (0 = pinned host, 1+i = disk tier i)."""
        return self.engine.hold(self._keys(block_keys, generation))

    def release(self, block_keys: Sequence[bytes], generation: int = 0) -> None:
        self.engine.release(self._keys(block_keys, generation))

    def take_events(self) -> list[TierEvent]:
        """The engine's residency changes since the last call, keyed by engine_key()."""
        return self.engine.take_events()

    def stats(self) -> dict:
        return self.engine.stats()

    def record_latency(self, is_store: bool, seconds: float) -> None:
        """A finished job's time from submission to the worker seeing it done."""
        with self._latency_lock:
            kept = self._latencies["store" if is_store else "load"]
            if len(kept) < MAX_LATENCIES:
                kept.append(seconds)

    def take_metrics(self) -> tuple[dict, list[float], list[float]]:
        """The engine's stats, and the load and store latencies recorded since the last
        call."""
        with self._latency_lock:
            load, store = self._latencies["load"], self._latencies["store"]
            self._latencies = {"load": [], "store": []}
        return self.engine.stats(), load, store

    def poll(self, job: int) -> bool:
        return self.engine.poll(job)

    def wait(self, job: int) -> None:
        self.engine.wait(job)

    def transfer_bytes(self, num_blocks: int) -> int:
        return num_blocks * len(self.tensors) * self.page_bytes
