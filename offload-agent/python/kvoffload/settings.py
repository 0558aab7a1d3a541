"""The agent's environment contract (docs/design.md, set by the webhook in agent mode):
KVOFFLOAD_CPU_BYTES (required, integer bytes), KVOFFLOAD_EVICTION_POLICY (default lru),
KVOFFLOAD_TIERS (JSON array of {path, kind, capacityBytes, persistent, shared}; default none).
An empty variable is an unset one, as libkvoffload reads it (config.cc).
Parsed here, not with the C API's from_env, so that a bad value fails at vLLM start with the
variable named, and so tests can check a golden pod's env without building an engine. The
policies accepted are those the loaded libkvoffload registers (engine.policy_names), the list
the engine itself checks against, so a policy added to the agent needs no change here."""

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from kvoffload import engine

_TIER_KINDS = ("emptyDir", "pvcSpec", "pvcRef")
# The keys of one tier; any other is refused, as libkvoffload refuses it: a misspelt
# "persistent" read as absent would start the tier empty on every restart.
_TIER_KEYS = ("path", "kind", "capacityBytes", "persistent", "shared")
# The C API's stats report the CPU tier and at most this many disk tiers (KVO_MAX_TIERS - 1);
# libkvoffload refuses more, which would run unseen by stats and metrics.
_MAX_DISK_TIERS = 15
# The variables read here. Another KVOFFLOAD_* that is nearly one of them is refused: a
# misspelt KVOFFLOAD_TIERS ran the pod with no disk tier, and nothing said so.
_VARIABLES = ("KVOFFLOAD_CPU_BYTES", "KVOFFLOAD_EVICTION_POLICY", "KVOFFLOAD_TIERS")


@dataclass(frozen=True)
class Tier:
    path: str
    kind: str
    capacity_bytes: int
    persistent: bool
    shared: bool


@dataclass(frozen=True)
class Settings:
    cpu_bytes: int
    eviction_policy: str
    tiers: tuple[Tier, ...]
    # (variable, where its value came from) for each value not from the variable itself
    # (kv_connector_extra_config.<key>): the library's errors name the variable.
    sources: tuple[tuple[str, str], ...] = ()

    def as_configured(self, message: str) -> str:
        """`message` (the library's) with each variable named as the value was given."""
        for var, source in self.sources:
            message = message.replace(var, source)
            if var == "KVOFFLOAD_CPU_BYTES":
                # The webhook's fix does not apply to a value it did not set.
                message = message.replace("raise kvCacheOffloading.cpu", "raise it")
        return message

    def tiers_json(self) -> str | None:
        """KVOFFLOAD_TIERS as the C API takes it; None when there is no disk tier."""
        if not self.tiers:
            return None
        return json.dumps([{"path": t.path, "kind": t.kind, "capacityBytes": t.capacity_bytes,
                            "persistent": t.persistent, "shared": t.shared}
                           for t in self.tiers])


# The engine's sizes are 64-bit: a larger value would reach it wrapped around (ctypes does not
# check), a tier of a few bytes where terabytes were meant.
_MAX_BYTES = 2**64 - 1


def _int(name: str, value, minimum: int) -> int:
    # bool is an int in Python; a JSON true is not a size. Text is plain ASCII digits, as
    # libkvoffload's own parser reads it: int() would also take "+1", " 1 ", "1_000" and other
    # scripts' digits, which the same variable given to the C API refuses.
    n = value
    if isinstance(value, str):
        text = value[1:] if value.startswith("-") else value
        if text.isascii() and text.isdigit() and len(text) > 20:
            # Past any 64-bit size; and past 4300 digits int() raises its own error, naming
            # nothing.
            raise ValueError(f"{name}={value[:20] + '...'!r} ({len(value)} digits): more than "
                             "2^64-1 bytes")
        n = int(value) if text.isascii() and text.isdigit() else None
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"{name}={value!r}: want an integer number of bytes")
    if n < minimum:
        raise ValueError(f"{name}={value!r}: must be at least {minimum}")
    if n > _MAX_BYTES:
        raise ValueError(f"{name}={value!r}: more than 2^64-1 bytes")
    return n


def _file_system_capacity(where: str, path: str) -> int:
    """capacityBytes 0 is the webhook's "size unknown" (a pvc.ref it could not read, as in
    offline inject): the tier's file system's size, less the headroom the webhook keeps from a
    size it knows, as libkvoffload reads it (config.cc says why the total, not the free space).
    Resolved here, before rank_share splits it among the pod's ranks."""
    try:
        fs = os.statvfs(path)
    except OSError as e:
        raise ValueError(f"{where}.capacityBytes=0 sizes the tier from its file system, but "
                         f"{path} cannot be read: {e.strerror}; mount the tier's volume there "
                         "or give its size") from None
    size = fs.f_blocks * fs.f_frsize
    return size - min(size // 2, 8 * 2**20 + size // 64)


class _Object(dict):
    """A JSON object that remembers the first key it was given twice: json keeps the last, and
    "persistent": false after true made a pvcRef tier start empty, removing its blocks."""
    twice = None


def _object(pairs) -> _Object:
    obj = _Object()
    for key, value in pairs:
        if key in obj and obj.twice is None:
            obj.twice = key
        obj[key] = value
    return obj


def parse_tiers(text: str, name: str = "KVOFFLOAD_TIERS") -> tuple[Tier, ...]:
    try:
        raw = json.loads(text, object_pairs_hook=_object)
    except ValueError as e:  # JSONDecodeError, and an integer past Python's 4300 digits
        raise ValueError(f"{name}={text!r}: not JSON ({e})") from None
    if not isinstance(raw, list):
        raise ValueError(f"{name}={text!r}: want a JSON array of tiers")
    if len(raw) > _MAX_DISK_TIERS:
        raise ValueError(f"{name} has {len(raw)} disk tiers; at most {_MAX_DISK_TIERS} are "
                         f"taken (the stats report the CPU tier and {_MAX_DISK_TIERS} more)")
    tiers = []
    dirs = {}
    for i, t in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(t, dict):
            raise ValueError(f"{where}={t!r}: want an object")
        if t.twice is not None:
            raise ValueError(f"{where} has the key {t.twice!r} twice; give each key once")
        unknown = sorted(set(t) - set(_TIER_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; the keys are "
                             f"{', '.join(_TIER_KEYS)}")
        path, kind = t.get("path"), t.get("kind")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{where}.path={path!r}: want an absolute path")
        # As libkvoffload refuses them; a byte that is no UTF-8 (os.environ's surrogate escape)
        # reached it as JSON it could not read, an error about text the user never wrote.
        if any(c < " " or c == "\x7f" for c in path):
            raise ValueError(f"{where}.path={path!r}: has a control character; a tier's mount "
                             "path has none")
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where}.path={path!r}: not UTF-8; give the tier a UTF-8 mount "
                             "path") from None
        # Two tiers in one directory would spend one disk's room twice (libkvoffload refuses
        # it too); "/mnt/a/" and "/mnt/b/../a" are "/mnt/a".
        same = dirs.setdefault(os.path.normpath(path), i)
        if same != i:
            raise ValueError(f"{where}.path={path!r}: tier {same}'s directory too "
                             f"({raw[same]['path']!r}); give each tier its own")
        if kind not in _TIER_KINDS:
            raise ValueError(f"{where}.kind={kind!r}: want one of {', '.join(_TIER_KINDS)}")
        for flag in ("persistent", "shared"):
            if not isinstance(t.get(flag, False), bool):
                raise ValueError(f"{where}.{flag}={t.get(flag)!r}: want true or false")
        # A JSON number, as libkvoffload takes it: "65536" (text) is refused by both.
        capacity = t.get("capacityBytes")
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise ValueError(f"{where}.capacityBytes={capacity!r}: want a JSON integer number "
                             "of bytes")
        capacity = _int(f"{where}.capacityBytes", capacity, 0)
        tiers.append(Tier(path=path, kind=kind,
                          capacity_bytes=capacity or _file_system_capacity(where, path),
                          persistent=t.get("persistent", kind == "pvcRef"),
                          shared=t.get("shared", False)))
    return tuple(tiers)


def from_env(env: Mapping[str, str], names: Mapping[str, str] | None = None) -> Settings:
    """Reads the contract from `env` (os.environ in vLLM). Errors name the variable and value,
    or the name in `names` where a variable's value came from elsewhere (the extra config)."""
    def name(var: str) -> str:
        return (names or {}).get(var, var)

    for var in env:
        near = (difflib.get_close_matches(var.upper(), _VARIABLES, n=1, cutoff=0.85)
                if var not in _VARIABLES else None)
        if near:
            raise ValueError(f"{var} is set, but no such variable is read; did you mean "
                             f"{near[0]}?")
    cpu = env.get("KVOFFLOAD_CPU_BYTES")
    if cpu is None or cpu == "":
        raise ValueError("KVOFFLOAD_CPU_BYTES is not set (or empty); the webhook sets it in "
                         "agent mode (kvCacheOffloading.cpu), set it by hand to run without the "
                         "webhook")
    policy = env.get("KVOFFLOAD_EVICTION_POLICY") or "lru"
    policies = engine.policy_names()
    if policy not in policies:
        raise ValueError(f"{name('KVOFFLOAD_EVICTION_POLICY')}={policy!r}: want one of "
                         f"{', '.join(policies)} (the policies of {engine.library_path()})")
    tiers_text = env.get("KVOFFLOAD_TIERS")
    return Settings(cpu_bytes=_int(name("KVOFFLOAD_CPU_BYTES"), cpu, 1), eviction_policy=policy,
                    tiers=parse_tiers(tiers_text, name("KVOFFLOAD_TIERS")) if tiers_text else (),
                    sources=tuple(sorted((names or {}).items())))
