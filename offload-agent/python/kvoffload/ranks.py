"""The link between vLLM's scheduler-side manager and the engines of its workers (ranks).

Each worker owns one libkvoffload engine for its shard of the KV cache and serves the index
calls of that engine (hold, release, stored, take_events, stats, take_metrics) on a local
socket; the manager answers vLLM's lookups by asking every rank, so that a block is a hit only
when every rank has its shard, and it holds the block on every rank from the lookup until the
load is done; it also reads every rank's counters for vLLM's metrics.
The bytes never travel here: loads and stores run in each worker, ordered by the specs vLLM
sends in its connector metadata.

Sockets are Linux abstract Unix sockets named after the vLLM engine id and the rank: nothing
on a file system to create or clean up, reachable by the processes of the pod's network
namespace (vLLM's 'uni' and 'mp' executors keep the scheduler and its workers there). A worker
in the scheduler's own process is called directly. Never imports vLLM or torch.

What travels is JSON, never pickles: the link's key comes from the engine id, which is in the
pod's command line, so it keeps engines apart but is no secret, and anything of the pod that
reaches the socket could have its pickle run in a worker (or, answering first, in the
scheduler). Calls are data checked against what each method takes."""

import errno
import hashlib
import json
import os
import socket
import threading
import time
from multiprocessing.connection import Client, Connection, Listener

from kvoffload.engine import TierEvent

# How long the manager waits for a rank's socket: vLLM registers the workers' KV caches (which
# starts the servers) before it builds the scheduler, so this only covers a slow start.
CONNECT_TIMEOUT_S = 60.0

# How long the manager waits for a rank's answer. A call is an index operation (microseconds)
# and the worker's serving thread runs beside its transfers, so no answer in this long is a
# worker that is stuck; vLLM's scheduler then fails with a message instead of hanging for ever.
CALL_TIMEOUT_S = 60.0

# Calls a rank serves: the index side of its engine, never a transfer. Those taking blocks
# take their keys and the key generation.
_KEYED_METHODS = ("hold", "release", "stored")
_METHODS = _KEYED_METHODS + ("take_events", "stats", "take_metrics")

# Largest message read, so that a peer cannot make the other end allocate without bound: a
# call names a step's blocks at most (tens of thousands of keys, ~70 bytes each in JSON);
# an answer can carry an engine's whole event feed (2^20 events, ~60 bytes each).
MAX_CALL_BYTES = 64 << 20
MAX_ANSWER_BYTES = 256 << 20


def _encode_call(method: str, args: tuple) -> bytes:
    call: dict = {"method": method}
    if method in _KEYED_METHODS:
        keys, generation = args
        call["keys"] = [k.hex() for k in keys]
        call["generation"] = generation
    return json.dumps(call).encode()


def _decode_call(data: bytes) -> tuple[str, tuple]:
    """(method, args) of a call, or ValueError saying what is wrong with it."""
    try:
        call = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not a call (want a JSON object)") from None
    if not isinstance(call, dict) or call.get("method") not in _METHODS:
        raise ValueError(f"not a call: method must be one of {', '.join(_METHODS)}")
    method = call["method"]
    if method not in _KEYED_METHODS:
        return method, ()
    keys, generation = call.get("keys"), call.get("generation")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{method}: keys must be a list of hex strings")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"{method}: generation must be an integer >= 0")
    try:
        return method, ([bytes.fromhex(k) for k in keys], generation)
    except ValueError:
        raise ValueError(f"{method}: keys must be a list of hex strings") from None


def _encode_answer(method: str, value) -> bytes:
    if method == "take_events":
        value = [[e.key[0], e.key[1], e.tier, e.removed] for e in value]
    return json.dumps(["ok", value]).encode()


def _encode_error(message: str) -> bytes:
    return json.dumps(["error", message]).encode()


def _decode_answer(method: str, data: bytes):
    """The value of an answer to `method`; RuntimeError for an error answer, ValueError for
    one that is none."""
    try:
        status, value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError):
        raise ValueError("no answer (want a JSON [status, value] pair)") from None
    if status == "error":
        raise RuntimeError(f"kvoffload: {value}")
    if status != "ok":
        raise ValueError(f"no answer (status {status!r})")
    try:
        if method == "take_events":
            return [TierEvent((int(e[0]), int(e[1])), int(e[2]), bool(e[3])) for e in value]
        if method == "take_metrics":
            stats, loads, stores = value
            return stats, loads, stores
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"no answer (a {method} value of another shape)") from None
    return value


def address(engine_id: str, rank: int) -> str:
    """The abstract socket of a rank (a leading NUL: no file). Hashed, because an address is
    at most 107 bytes and engine ids are the user's to choose."""
    digest = hashlib.blake2b(engine_id.encode(), digest_size=12).hexdigest()
    return f"\0kvoffload-{digest}-rank{rank}"


def _authkey(engine_id: str) -> bytes:
    # Keeps another vLLM engine of the pod (another engine id) off this engine's ranks.
    return hashlib.blake2b(b"kvoffload-rank-link" + engine_id.encode()).digest()


class RankServer:
    """Serves one rank's engine index to the manager, on threads of the worker's process.
    `core` is the rank's TransferCore; its engine is thread-safe, so calls from here run next
    to the worker's own transfers. close() must come before the core is closed."""

    def __init__(self, core, engine_id: str, rank: int):
        self._core = core
        self._rank = rank
        # Held while a call runs, and by close(): no call reaches an engine being closed.
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list[Connection] = []
        self._address = address(engine_id, rank)
        try:
            self._listener = Listener(self._address, family="AF_UNIX",
                                      authkey=_authkey(engine_id))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ValueError(
                f"KVOffloadAgentSpec: another worker engine of vLLM engine {engine_id!r} "
                f"rank {rank} runs on this node; each vLLM engine needs its own "
                "kv_transfer_config.engine_id") from None
        self._thread = threading.Thread(target=self._accept, name=f"kvoffload-rank{rank}",
                                        daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except Exception:  # a client with a wrong key, or close()'s wake-up call
                conn = None
            with self._lock:
                if self._closed:
                    if conn is not None:
                        conn.close()
                    self._listener.close()
                    return
                if conn is None:
                    continue
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name=f"kvoffload-rank{self._rank}-conn").start()

    def _serve(self, conn: Connection) -> None:
        while True:
            try:
                # OSError also for a message over the bound: the link is then out of step.
                data = conn.recv_bytes(MAX_CALL_BYTES)
            except (EOFError, OSError):
                return
            with self._lock:
                reply = self._answer(data)
            try:
                conn.send_bytes(reply)
            except OSError:
                return

    def _answer(self, data: bytes) -> bytes:
        """The answer to one call; an error travels back and is raised by the caller."""
        try:
            method, args = _decode_call(data)
        except ValueError as e:
            return _encode_error(f"rank {self._rank}: {e}")
        if self._closed:
            return _encode_error(f"rank {self._rank}: the worker's engine is closed")
        try:
            return _encode_answer(method, getattr(self._core, method)(*args))
        except Exception as e:
            return _encode_error(f"rank {self._rank}: {method}: {e}")

    def close(self) -> None:
        """Stops serving; the address is free again when this returns (unless a stuck client
        holds the accept thread, see below)."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        # accept() does not return when its socket is closed by another thread: connect to
        # wake it up; it then sees _closed and closes the listener itself.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
            try:
                wake.connect(self._address)
            except OSError:
                pass
        # Bounded: a client of the pod that connected and never answered the key challenge
        # holds accept() up; the thread then closes the listener when that one gives up.
        self._thread.join(timeout=5)
        for conn in conns:
            # Likewise a recv() blocked on another thread: shut the socket down (EOF on both
            # ends: the manager learns that this rank is gone) before closing it.
            with socket.socket(fileno=os.dup(conn.fileno())) as s:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:  # the manager hung up first
                    pass
            conn.close()


class RemoteRank:
    """The manager's end of one rank's socket; its calls mirror TransferCore's."""

    def __init__(self, engine_id: str, rank: int):
        self.rank = rank
        self._broken = ""  # why the link may not be used any more
        self._sent = ""  # the call whose answer is due
        timeout_s = CONNECT_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._conn = Client(address(engine_id, rank), family="AF_UNIX",
                                    authkey=_authkey(engine_id))
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"no worker engine of rank {rank} answers on this node after "
                        f"{timeout_s:.0f} s") from None
                time.sleep(0.05)

    def _fail(self, why: str):
        """Takes the link out of use (an answer still to come would be read as the next
        call's) and raises."""
        self._broken = why
        self._conn.close()
        raise RuntimeError(f"kvoffload: the worker of rank {self.rank} {why}")

    def _check_usable(self) -> None:
        if self._broken:
            raise RuntimeError(f"kvoffload: the worker of rank {self.rank} {self._broken}")

    def send(self, method: str, *args) -> None:
        self._check_usable()
        self._sent = method
        try:
            self._conn.send_bytes(_encode_call(method, args))
        except OSError as e:
            self._fail(f"is gone: {e}")

    def result(self):
        method = self._sent
        self._check_usable()
        try:
            if not self._conn.poll(CALL_TIMEOUT_S):
                self._fail(f"did not answer {method} within {CALL_TIMEOUT_S:g} s: its "
                           "engine is stuck")
            data = self._conn.recv_bytes(MAX_ANSWER_BYTES)
        except (EOFError, OSError) as e:
            self._fail(f"is gone: {e or 'connection closed'}")
        try:
            return _decode_answer(method, data)
        except ValueError as e:
            self._fail(f"answered {method} with {e}")

    def call(self, method: str, *args):
        self.send(method, *args)
        return self.result()

    def close(self) -> None:
        self._conn.close()


class RankGroup:
    """Every rank of one vLLM engine, as the manager sees them: either the one worker engine
    of this process (a TransferCore, called directly) or a RemoteRank per rank. Calls go to
    all ranks at once and then wait for all answers."""

    def __init__(self, ranks: list):
        self._ranks = ranks

    def _all(self, method: str, *args) -> list:
        remote = [r for r in self._ranks if isinstance(r, RemoteRank)]
        for r in remote:
            r.send(method, *args)
        # Local ranks run while the remote ones work; then the answers, in rank order.
        local = {id(r): getattr(r, method)(*args) for r in self._ranks
                 if not isinstance(r, RemoteRank)}
        return [r.result() if isinstance(r, RemoteRank) else local[id(r)]
                for r in self._ranks]

    def hold(self, key: bytes, generation: int) -> list[int] | None:
        """Holds one block on every rank; returns the tier each rank has it in, in rank order
        (0 = pinned host, 1+i = disk tier i; the farthest is what the load will wait for), or
        None when some rank lacks it (its store failed, it evicted it, its shard file is gone
        after a restart): the holds taken are then given back and the block is a miss
        everywhere."""
        held = self._all("hold", [key], generation)
        if all(len(tiers) == 1 for tiers in held):
            return [tiers[0] for tiers in held]
        partial = [r for r, tiers in zip(self._ranks, held) if len(tiers) == 1]
        if partial:
            RankGroup(partial).release([key], generation)
        return None

    def release(self, keys: list[bytes], generation: int) -> None:
        self._all("release", keys, generation)

    def stored(self, keys: list[bytes], generation: int) -> list[bool]:
        """Per key: does every rank have it."""
        per_rank = self._all("stored", keys, generation)
        return [all(column) for column in zip(*per_rank)] if per_rank else []

    def take_events(self) -> list:
        """Rank 0's residency events: every rank is ordered the same stores, so rank 0
        stands for the others (a block lost on one rank only is still reported here)."""
        first = self._ranks[0]
        return first.call("take_events") if isinstance(first, RemoteRank) \
            else first.take_events()

    def take_metrics(self) -> tuple[list[dict], list[float], list[float]]:
        """Every rank's engine stats, in rank order, and rank 0's transfer latencies since
        the last call (each rank moves its shard of the same jobs; the others' are dropped)."""
        per_rank = self._all("take_metrics")
        return [m[0] for m in per_rank], per_rank[0][1], per_rank[0][2]

    def close(self) -> None:
        for r in self._ranks:
            if isinstance(r, RemoteRank):
                r.close()
