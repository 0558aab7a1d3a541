"""KVOffloadAgentSpec under vLLM 0.32.0: vLLM's own OffloadingSpecFactory loads it from the
golden agent-mode pod's --kv-transfer-config, and its manager and worker are driven the way
vLLM's OffloadingConnector scheduler and worker call them (lookup -> prepare_store ->
submit_store -> get_finished -> complete_store; prepare_load -> submit_load -> wait ->
complete_load), over CPU tensors with the engine's host backend."""

import dataclasses
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import pytest
import torch
import vllm
from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    Medium,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from conftest import AGENT_CASE as CASE
from conftest import (GOLDEN, golden_env, golden_kv_transfer_config,
                      golden_kv_transfer_configs, scaled_env, slot_bytes, tier_block_bytes)
from kvoffload import engine, settings
from kvoffload.transfer import TransferCore, engine_key
from kvoffload.vllm import (KVOffloadAgentSpec, check_vllm_release, model_digest, pod_engines,
                            rank_share, resolve_settings, write_back_budget)

PAGE = 4096
TENSORS = 2
BLOCKS = 32
# One engine block is one row of every KV tensor.
SLOT = slot_bytes(PAGE * TENSORS)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def offloading_config(extra, dtype="float16", world_size=1, engine_id="engine-0", model=MODEL):
    parallel = OffloadingParallelConfig(
        rank=0, world_size=world_size, tp_size=world_size, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=False)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0",),
                                      group_id=0),),
        worker_kv_bytes_per_block=PAGE * TENSORS, enable_kv_cache_events=True,
        extra_config=extra, engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=parallel, kv_cache_layout="NHD")


def kv_caches():
    tensors = [torch.zeros(BLOCKS, PAGE, dtype=torch.int8) for _ in range(TENSORS)]
    return CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in tensors],
        # One group whose layers are the tensors, as vLLM builds it for a model of one
        # attention type: vLLM 0.34 resolves a transfer's page addresses from these refs.
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=PAGE)
                          for i in range(TENSORS)]])


def offload_keys(n, salt=b""):
    # vLLM block hashes are bytes digests chained over the prefix; any bytes do here.
    return [make_offload_key(hashlib.sha256(salt + i.to_bytes(4, "big")).digest(), 0)
            for i in range(n)]


def agent_extra():
    return golden_kv_transfer_config(CASE)["kv_connector_extra_config"]


END_OF_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
# Engine tier -> (medium, ownership) of the adapter's OffloadingEvents.
MEDIUM_OF_TIER = {0: (Medium.CPU, None), 1: (Medium.STORAGE, "disk0"),
                  2: (Medium.STORAGE, "disk1"), 3: (Medium.STORAGE, "disk2")}


def residency(events):
    """Replays OffloadingEvents: key -> the (medium, ownership) places it is in at the end."""
    where = {}
    for e in events:
        for k in e.keys:
            places = where.setdefault(k, set())
            if e.removed:
                assert (e.medium, e.ownership) in places, f"{k.hex()} removed from where it was not"
                places.discard((e.medium, e.ownership))
            else:
                places.add((e.medium, e.ownership))
    return {k: v for k, v in where.items() if v}


def finish(worker, job_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in worker.get_finished():
            if r.job_id == job_id:
                return r
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def store(manager, worker, keys, rows, job_id, kept=True):
    ctx = ReqContext(req_id=f"store-{job_id}")
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    assert out.keys_to_store == list(keys)
    ok = worker.submit_store(job_id, GPULoadStoreSpec(list(rows), group_sizes=[len(rows)],
                                                      block_indices=[0]), out.store_spec)
    assert ok
    assert manager.lookup(keys[0], ctx) is LookupResult.HIT_PENDING
    result = finish(worker, job_id)
    # A store the engine could not keep is still reported done: vLLM asserts on failures.
    assert result.success
    assert result.transfer_size == (len(keys) * TENSORS * PAGE if kept else 0)
    manager.complete_store(keys, ctx)


def load(manager, worker, keys, rows, job_id):
    ctx = ReqContext(req_id=f"load-{job_id}")
    spec = manager.prepare_load(keys, ctx)
    assert worker.submit_load(job_id, spec, GPULoadStoreSpec(list(rows), group_sizes=[len(rows)],
                                                            block_indices=[0]))
    worker.wait({job_id})
    results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(job_id, True)]
    manager.complete_load(keys, ctx)


def new_spec(extra, **kw):
    spec = OffloadingSpecFactory.create_spec(offloading_config(extra, **kw))
    caches = kv_caches()
    worker = spec.get_worker(caches)
    return spec, spec.get_manager(), worker, [t.tensor for t in caches.tensors]


def fillable(size: int) -> int:
    """What the webhook lets the agent fill of a tier of `size` bytes: the size less the
    headroom it keeps for what du counts besides block files, min(size/2, 8 MiB + size/64)."""
    return size - min(size // 2, 8 * 2**20 + size // 64)


def test_golden_env_parses_into_engine_settings():
    s = settings.from_env(golden_env(CASE))
    assert s.cpu_bytes == 10 * 2**30
    assert s.eviction_policy == "arc"
    assert s.tiers == (
        settings.Tier("/mnt/kv-cache-0", "emptyDir", fillable(100 * 2**30), False, False),
        settings.Tier("/mnt/kv-cache-1", "pvcSpec", fillable(200 * 2**30), False, False),
        settings.Tier("/mnt/kv-cache-2", "pvcRef", fillable(2**40), True, True),
    )


def test_env_errors_name_the_variable():
    with pytest.raises(ValueError, match="KVOFFLOAD_CPU_BYTES is not set"):
        settings.from_env({})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES='10Gi': want an integer"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "10Gi"})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_EVICTION_POLICY='fifo'"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_EVICTION_POLICY": "fifo"})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].kind='nfs'"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS":
                           '[{"path":"/x","kind":"nfs","capacityBytes":1}]'})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\]: unknown key 'persistant'; "
                                         r"the keys are path, kind, capacityBytes, persistent"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS":
                           '[{"path":"/x","kind":"pvcRef","capacityBytes":1,"persistant":true}]'})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[1\].path='/mnt/b/../a/': tier 0's "
                                         r"directory too \('/mnt/a'\)"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS":
                           '[{"path":"/mnt/a","kind":"emptyDir","capacityBytes":1},'
                           '{"path":"/mnt/b/../a/","kind":"emptyDir","capacityBytes":1}]'})


def test_tier_json_is_read_as_libkvoffload_reads_it():
    """A size as text and a missing kind: refused here and by the C parser (config_test.cc),
    so a tier the adapter accepts is one the engine accepts."""
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].capacityBytes='65536': want a "
                                         r"JSON integer"):
        settings.parse_tiers('[{"path":"/x","kind":"emptyDir","capacityBytes":"65536"}]')
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].kind=None: want one of"):
        settings.parse_tiers('[{"path":"/x","capacityBytes":65536}]')


def test_sizes_are_plain_digits_within_64_bits():
    """A size is read as libkvoffload's own parser reads it, and one past 64 bits is refused,
    not handed to the C API to wrap around (2^64 + 65536 was a 64 KiB tier)."""
    for text in ("+65536", " 65536 ", "65_536", "\u0666\u0665\u0665\u0663\u0666", "-"):
        with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES=.*: want an integer"):
            settings.from_env({"KVOFFLOAD_CPU_BYTES": text})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES='-5': must be at least 1"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "-5"})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES='18446744073709617152': more "
                                         r"than 2\^64-1 bytes"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": str(2**64 + 65536)})
    assert settings.from_env({"KVOFFLOAD_CPU_BYTES": str(2**64 - 1)}).cpu_bytes == 2**64 - 1
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].capacityBytes=18446744073709551616"
                                         r": more than 2\^64-1 bytes"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS": json.dumps(
            [{"path": "/x", "kind": "emptyDir", "capacityBytes": 2**64}])})


def test_what_json_lets_through_is_refused_as_libkvoffload_refuses_it():
    """Found by running the adapter with hand-written settings (config_test.cc has the C side):
    a key given twice (json keeps the last: "persistent": false after true made a pvcRef tier
    start empty and remove its blocks), more tiers than the stats report, a control character
    or a byte that is no UTF-8 in a path, a size of thousands of digits (Python's own
    int-conversion error, naming nothing)."""
    tier = '"kind":"pvcRef","capacityBytes":4096'
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[1\] has the key 'persistent' twice; "
                                         r"give each key once"):
        settings.parse_tiers(f'[{{"path":"/x",{tier}}},'
                             f'{{"path":"/y",{tier},"persistent":true,"persistent":false}}]')
    twenty = ",".join(f'{{"path":"/mnt/t{i}",{tier}}}' for i in range(20))
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS has 20 disk tiers; at most 15"):
        settings.parse_tiers(f"[{twenty}]")
    for path in (r"/x/\u0000y", r"/x/\u0001y", r"/x/\u007fy"):
        with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].path=.*: has a control "
                                             r"character"):
            settings.parse_tiers(f'[{{"path":"{path}",{tier}}}]')
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].path=.*: not UTF-8"):
        settings.parse_tiers(b'[{"path":"/x/\xff",'.decode("utf-8", "surrogateescape") +
                             tier + "}]")
    with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES='9{20}\.\.\.' \(5000 digits\): "
                                         r"more than 2\^64-1 bytes"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "9" * 5000})
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS=.*: not JSON"):
        settings.parse_tiers('[{"path":"/x","kind":"pvcRef","capacityBytes":' + "9" * 5000 + "}]")


def test_near_misses_of_our_names_are_refused_not_read_as_absent():
    """A misspelt setting ran the pod with no disk tier or with lru, and nothing said so: an
    extra-config key near one of the spec's own (case, '-' for '_', a letter off, our prefix
    left out), a KVOFFLOAD_* variable near one of the three. vLLM's own extra-config keys and
    the other variables of ours are not near misses."""
    tiers = [{"path": "/x", "kind": "emptyDir", "capacityBytes": 8192}]
    for key, meant in (("kvoffload-tiers", "kvoffload_tiers"), ("tiers", "kvoffload_tiers"),
                       ("evicton_policy", "eviction_policy"),
                       ("EVICTION_POLICY", "eviction_policy"), ("disk-io", "disk_io"),
                       ("write_back_second", "write_back_seconds")):
        with pytest.raises(ValueError, match=rf"kv_connector_extra_config.{key}: unknown key; "
                                             rf"did you mean {meant}\?"):
            resolve_settings({"cpu_bytes_to_use": 65536, key: tiers}, env={})
    ok = {"cpu_bytes_to_use": 65536, "spec_name": "KVOffloadAgentSpec",
          "spec_module_path": "kvoffload.vllm", "block_size": 16, "offload_prompt_only": True,
          "store_threshold": 2, "backpressure": True}
    assert resolve_settings(ok, env={}).cpu_bytes == 65536
    for var, meant in (("KVOFFLOAD_TIER", "KVOFFLOAD_TIERS"),
                       ("KVOFFLOAD_EVICTION_POLICIES", "KVOFFLOAD_EVICTION_POLICY"),
                       ("KVOFFLOAD_CPU_BYTE", "KVOFFLOAD_CPU_BYTES"),
                       ("kvoffload_tiers", "KVOFFLOAD_TIERS")):
        with pytest.raises(ValueError, match=rf"{var} is set, but no such variable is read; did "
                                             rf"you mean {meant}\?"):
            settings.from_env({"KVOFFLOAD_CPU_BYTES": "65536", var: json.dumps(tiers)})
    others = {"KVOFFLOAD_CPU_BYTES": "65536", "KVOFFLOAD_LIBRARY": "/x.so",
              "KVOFFLOAD_VLLM_PYTHON": "0.34.0", "KVOFFLOAD_CONFIG_HASH": "abc", "PATH": "/bin"}
    assert settings.from_env(others).cpu_bytes == 65536


def test_durations_are_numbers_not_what_float_makes_of_text(tmp_path, monkeypatch):
    """float() took True (1 s), "1_0" (10 s) and "  2 " (2 s): refused as the sizes are."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    for value in (True, "1_0", "  2 ", "0x10", "1e2"):
        with pytest.raises(ValueError, match=re.escape(f"write_back_seconds={value!r}") +
                           " is not a number of seconds from 0 to 3600"):
            OffloadingSpecFactory.create_spec(
                offloading_config({**agent_extra(), "write_back_seconds": value}))
    for value in (2, 2.5, "2", "2.5"):
        OffloadingSpecFactory.create_spec(
            offloading_config({**agent_extra(), "write_back_seconds": value}))


def test_extra_config_settings_take_json_values_and_name_their_keys():
    """Without KVOFFLOAD_* (no webhook), the extra config sets the engine: kvoffload_tiers as
    --kv-transfer-config's JSON carries it (a list) or as a string of JSON; errors name the key
    the value came by; a misspelt key of ours, or vLLM's own tier key, is refused rather than
    read as no disk tier."""
    tiers = [{"path": "/x", "kind": "emptyDir", "capacityBytes": 8192}]
    for value in (tiers, json.dumps(tiers)):
        s = resolve_settings({"cpu_bytes_to_use": 65536, "kvoffload_tiers": value}, env={})
        assert s.cpu_bytes == 65536
        assert s.tiers == (settings.Tier("/x", "emptyDir", 8192, False, False),)
    # vLLM's --kv-offloading-size writes GiB * 2^30 as a float (1.5 -> 1610612736.0); its
    # own CPU spec reads int() of it. Refused as "not an integer" before.
    assert resolve_settings({"cpu_bytes_to_use": 1.5 * (1 << 30)}, env={}).cpu_bytes == 1610612736
    assert resolve_settings({"cpu_bytes_to_use": 1e9}, env={}).cpu_bytes == 10**9
    with pytest.raises(ValueError, match=r"kv_connector_extra_config.cpu_bytes_to_use="
                                         r"'Infinity': want an integer"):
        resolve_settings({"cpu_bytes_to_use": float("inf")}, env={})
    # No size anywhere: the message names both ways to give it, and a near miss of the key.
    with pytest.raises(ValueError, match=r"KVOFFLOAD_CPU_BYTES .* or kv_connector_extra_config"
                                         r".cpu_bytes_to_use \(vLLM's --kv-offloading-size "
                                         r"sets it, in GiB\); the extra config has "
                                         r"'cpu_byte_to_use': did you mean cpu_bytes_to_use\?"):
        resolve_settings({"cpu_byte_to_use": 65536}, env={})
    with pytest.raises(ValueError, match=r"kv_connector_extra_config.eviction_policy='fifo'"):
        resolve_settings({"cpu_bytes_to_use": 65536, "eviction_policy": "fifo"}, env={})
    with pytest.raises(ValueError, match=r"kv_connector_extra_config.kvoffload_tiers\[0\].kind"):
        resolve_settings({"cpu_bytes_to_use": 65536,
                          "kvoffload_tiers": [{**tiers[0], "kind": "nfs"}]}, env={})
    with pytest.raises(ValueError, match=r"kv_connector_extra_config.kvoffload_tier: unknown "
                                         r"key; the keys of KVOffloadAgentSpec's own are "
                                         r"kvoffload_tiers"):
        resolve_settings({"cpu_bytes_to_use": 65536, "kvoffload_tier": tiers}, env={})
    vllm_tiers = [{"type": "fs", "root_dir": "/x"}]
    with pytest.raises(ValueError, match=r"kv_connector_extra_config.secondary_tiers is the key "
                                         r"of vLLM's TieringOffloadingSpec"):
        resolve_settings({"cpu_bytes_to_use": 65536, "secondary_tiers": vllm_tiers}, env={})
    # An empty variable is an unset one, as libkvoffload reads it: the extra config's tiers
    # and policy stay (an empty KVOFFLOAD_TIERS dropped them), and an empty size is no size.
    s = resolve_settings({"cpu_bytes_to_use": 65536, "kvoffload_tiers": tiers,
                          "eviction_policy": "arc"},
                         env={"KVOFFLOAD_TIERS": "", "KVOFFLOAD_EVICTION_POLICY": "",
                              "KVOFFLOAD_CPU_BYTES": ""})
    assert (s.cpu_bytes, s.eviction_policy, len(s.tiers)) == (65536, "arc", 1)
    with pytest.raises(ValueError, match="KVOFFLOAD_CPU_BYTES is not set \\(or empty\\)"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": ""})
    # The webhook's env wins over the extra config, whatever the latter holds.
    s = resolve_settings({"cpu_bytes_to_use": 1e9, "secondary_tiers": vllm_tiers},
                         env={"KVOFFLOAD_CPU_BYTES": "4096", "KVOFFLOAD_TIERS": json.dumps(tiers)})
    assert (s.cpu_bytes, len(s.tiers)) == (4096, 1)


def test_unknown_tier_size_is_the_file_systems(tmp_path):
    """capacityBytes 0 (a pvc.ref the webhook could not read) is the tier's file system's size
    less the webhook's headroom, min(size/2, 8 MiB + size/64): 55 MiB of a 64 MiB tmpfs. Taken
    before the ranks split it, so two ranks get 27.5 MiB each, not the whole disk each."""
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(tmp_path)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        # As the C++ tests' KVO_REQUIRE_CAPABILITY: CI (CI=true, root) must run it.
        why = f"needs a 64 MiB tmpfs mounted (root): {mount.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have this: {why}")
        pytest.skip(f"not run: {why}")
    try:
        s = settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS": json.dumps(
            [{"path": str(tmp_path), "kind": "pvcRef", "capacityBytes": 0}])})
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=True)
    assert s.tiers[0].capacity_bytes == 55 * 2**20
    assert rank_share(s, 0, 2).tiers[0].capacity_bytes == 55 * 2**19
    with pytest.raises(ValueError, match=r"KVOFFLOAD_TIERS\[0\].capacityBytes=0 sizes the tier "
                                         r"from its file system, but /nonexistent cannot be read"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS":
                           '[{"path":"/nonexistent","kind":"pvcRef","capacityBytes":0}]'})


def test_tier_flags_default_as_the_agent_defaults_them():
    """A tier without "persistent" is persistent when it is a pvc.ref, as libkvoffload reads it,
    so the C API is handed what it would have chosen itself."""
    s = settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_TIERS":
                           '[{"path":"/a","kind":"pvcRef","capacityBytes":1},'
                           '{"path":"/b","kind":"emptyDir","capacityBytes":1}]'})
    assert [(t.persistent, t.shared) for t in s.tiers] == [(True, False), (False, False)]


def test_policies_are_the_loaded_agents():
    """settings takes its list from the loaded libkvoffload (kvo_policy_names), the registry the
    engine checks against, so every agent policy passes and the error lists them."""
    assert engine.policy_names() == ("arc", "chain-lru", "lirs", "lru", "lru-tinylfu", "s3fifo")
    for policy in engine.policy_names():
        s = settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_EVICTION_POLICY": policy})
        assert s.eviction_policy == policy
    with pytest.raises(ValueError, match=r"KVOFFLOAD_EVICTION_POLICY='LRU': want one of arc, "
                                         r"chain-lru, lirs, lru, lru-tinylfu, s3fifo \(the policies of .*libkvoffload"):
        settings.from_env({"KVOFFLOAD_CPU_BYTES": "1", "KVOFFLOAD_EVICTION_POLICY": "LRU"})


def golden_flags() -> dict[str, dict]:
    """Golden pod -> the --kv-transfer-config its vLLM receives, for the pods that receive one
    of the two flags kv-offload hands vLLM (agent mode's, or vllm-native mode's: KServe's own
    or the webhook's), found by running each launch with the stand-in vllm."""
    flags = {}
    for path in sorted(GOLDEN.glob("*.patched.json")):
        got = golden_kv_transfer_configs(path.name.removesuffix(".patched.json"))
        if len(got) == 1 and got[0].get("kv_connector_extra_config", {}).get("spec_name") in (
                "KVOffloadAgentSpec", "TieringOffloadingSpec"):
            flags[path.name.removesuffix(".patched.json")] = got[0]
    return flags


GOLDEN_FLAGS = golden_flags()
NATIVE_CASES = [case for case, flag in GOLDEN_FLAGS.items()
                if flag["kv_connector_extra_config"]["spec_name"] == "TieringOffloadingSpec"]


def test_golden_pods_get_both_modes_flags():
    assert "kserve-rendered" in NATIVE_CASES and "kserve-annotation-native" in NATIVE_CASES
    assert len(NATIVE_CASES) >= 10, NATIVE_CASES
    assert {"agent-mode-default", "kserve-namespace-default"} <= set(GOLDEN_FLAGS), GOLDEN_FLAGS


@pytest.mark.parametrize("case", sorted(GOLDEN_FLAGS))
def test_vllm_takes_the_whole_flag(case):
    """vLLM parses --kv-transfer-config into its KVTransferConfig, which refuses a key it
    does not have and a value outside its choices (agent mode's kv_load_failure_policy)."""
    from vllm.config import KVTransferConfig
    config = KVTransferConfig(**GOLDEN_FLAGS[case])
    assert config.kv_connector == "OffloadingConnector"
    agent = config.kv_connector_extra_config["spec_name"] == "KVOffloadAgentSpec"
    assert config.kv_load_failure_policy == ("recompute" if agent else "fail")


BESIDE_CASES = sorted(p.name.removesuffix(".patched.json") for p in GOLDEN.glob("*.patched.json")
                      if "vllmFlagBeside" in p.read_text())


def test_golden_pods_run_ours_beside_a_pd_connector():
    assert {"kserve-pd-decode-nixl", "kserve-pd-prefill-nixl-agent"} <= set(BESIDE_CASES)


@pytest.mark.parametrize("case", BESIDE_CASES)
def test_vllm_takes_the_multi_connector_beside_the_users(case):
    """Where the pod passes its own P/D connector (KServe's P/D pods: NixlConnector), vLLM
    gets it and then ours as one MultiConnector with it first: vLLM keeps the later flag,
    parses it and each connector in it as it builds MultiConnector's children."""
    from vllm.config import KVTransferConfig
    theirs, multi = golden_kv_transfer_configs(case)
    config = KVTransferConfig(**multi)
    assert config.kv_connector == "MultiConnector"
    children = [KVTransferConfig(**c) for c in config.kv_connector_extra_config["connectors"]]
    assert [c.kv_connector for c in children] == [theirs["kv_connector"], "OffloadingConnector"]
    assert children[0].kv_role == theirs["kv_role"]
    agent = children[1].kv_connector_extra_config["spec_name"] == "KVOffloadAgentSpec"
    assert config.kv_load_failure_policy == ("recompute" if agent else "fail")


@pytest.mark.parametrize("case", NATIVE_CASES)
def test_vllm_builds_its_tiering_spec_from_the_vllm_native_flag(case, tmp_path):
    """vllm-native mode hands vLLM its own TieringOffloadingSpec. vLLM's factory builds the
    spec and its scheduler-side manager from the flag the pod's launch gives vLLM, reading
    every key the webhook writes: the CPU tier's bytes, the policy, and one fs tier per
    mounted disk, each created at its mount path (moved under tmp_path). The worker side
    needs a GPU (vLLM's CPU tier copies with CUDA) and is not built here."""
    extra = json.loads(json.dumps(GOLDEN_FLAGS[case]["kv_connector_extra_config"]))
    cpu_bytes = extra["cpu_bytes_to_use"]
    assert isinstance(cpu_bytes, int) and cpu_bytes >= PAGE * TENSORS, extra
    # vLLM maps the whole CPU tier at start: a few blocks' worth here.
    extra["cpu_bytes_to_use"] = 64 * PAGE * TENSORS
    roots = []
    for tier in extra.get("secondary_tiers", []):
        assert tier["type"] == "fs" and tier["root_dir"].startswith("/mnt/kv-cache-"), tier
        tier["root_dir"] = str(tmp_path / tier["root_dir"].lstrip("/"))
        roots.append(tier["root_dir"])
    spec = OffloadingSpecFactory.create_spec(offloading_config(extra))
    assert type(spec).__name__ == "TieringOffloadingSpec"
    manager = spec.get_manager()
    try:
        assert len(manager.secondary_tiers) == len(roots)
        missing = [r for r in roots if not os.path.isdir(r)]
        assert not missing, f"vLLM made no fs tier at {missing}"
        # The spec read the policy and the bytes (knowing the policy's name was all the test
        # checked before, and the bytes were replaced unread).
        assert spec.eviction_policy == extra.get("eviction_policy", "lru")
        if "eviction_policy" in extra:
            from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
            assert CachePolicyFactory.get_cache_policy_cls(extra["eviction_policy"])
        assert 0 < spec.num_chunks <= extra["cpu_bytes_to_use"] // (PAGE * TENSORS), spec.num_chunks
    finally:
        manager.shutdown()


def test_vllm_registers_the_policies_vllm_native_mode_accepts():
    """The webhook accepts exactly these in vllm-native mode (webhook/src/eviction_policies.cc);
    a vLLM that registers others changes that list."""
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
    assert sorted(CachePolicyFactory._registry) == ["arc", "lru"]


@pytest.mark.parametrize("release", ["0.35.0", "0.31.1"])
def test_other_vllm_releases_are_refused_on_import(release):
    """Each vLLM release changes the offloading interfaces (0.34 handed the worker device
    pointers instead of block ids): on a release it was not written for, the adapter would
    fail on the first transfer. A pod on another release fails at start instead, saying why
    and what to do (the import is what vLLM's spec factory does with spec_module_path)."""
    code = f"import vllm; vllm.__version__ = {release!r}; import kvoffload.vllm"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: kvoffload.vllm: this image runs vLLM {release}, "), last
    assert "supports vLLM 0.32, 0.33 and 0.34 only" in last
    assert "kvoffload.io/mode: vllm-native" in last


def test_supported_vllm_releases_pass_the_check():
    for release in ["0.32.0", "0.32.1", "0.33.0", "0.33.2rc1", "0.32.0+cpu", "0.34.0"]:
        check_vllm_release(release)
    with pytest.raises(ImportError, match="runs vLLM 0.3.0,"):
        check_vllm_release("0.3.0")


def test_vllm_factory_loads_the_spec_from_the_golden_flag(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    cfg = golden_kv_transfer_config(CASE)
    assert cfg["kv_connector"] == "OffloadingConnector"
    spec, manager, worker, _ = new_spec(cfg["kv_connector_extra_config"])
    try:
        assert type(spec) is KVOffloadAgentSpec
        described = worker._core.engine.describe()
        assert "policy arc" in described
        for i in range(3):
            assert str(tmp_path / f"kv-cache-{i}") in described, described
    finally:
        worker.shutdown()


def test_store_evict_to_disk_load_back_identical(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec, manager, worker, tensors = new_spec(agent_extra())
    try:
        keys = offload_keys(8)
        assert manager.lookup(keys[0], ReqContext("r")) is LookupResult.MISS
        g = torch.Generator().manual_seed(7)
        for t in tensors:
            t[:8] = torch.randint(-128, 128, (8, PAGE), dtype=torch.int8, generator=g)
        expected = [t[:8].clone() for t in tensors]
        store(manager, worker, keys, range(8), job_id=1)
        assert all(manager.lookup(k, ReqContext("r")) is LookupResult.HIT for k in keys)
        manager.on_schedule_end(END_OF_STEP)
        # Replayed, the events put every block where the engine says it is.
        where = residency(manager.take_events())
        tiers = worker._core.engine.lookup([engine_key(k) for k in keys])
        assert [where.get(k) for k in keys] == [{MEDIUM_OF_TIER[t]} for t in tiers]
        stats = worker._core.engine.stats()
        assert stats["tiers"][1]["blocks"] > 0, f"no block reached disk tier 0: {stats}"
        # Already offloaded: a second store of the same blocks asks for nothing.
        assert manager.prepare_store(keys, ReqContext("r")).keys_to_store == []
        for t in tensors:
            t.zero_()
        load(manager, worker, keys, range(16, 24), job_id=2)
        for want, t in zip(expected, tensors):
            assert torch.equal(want, t[16:24])
    finally:
        worker.shutdown()


def test_polling_a_running_load_on_the_host_device_yields_the_core(tmp_path, monkeypatch):
    """vLLM's in-process step loop polls a load it waits for again at once; on the host device
    the load's copies need the same cores, so a poll that finds a load running yields the CPU
    once. A running store (nobody waits for it) and a finished load do not."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec, manager, worker, tensors = new_spec(agent_extra())
    try:
        keys, more = offload_keys(4)[:2], offload_keys(4)[2:]
        store(manager, worker, keys, range(2), job_id=1)
        yields = []
        monkeypatch.setattr(os, "sched_yield", lambda: yields.append(True))
        # While `held` is set, every engine job polls as still running.
        held = [True]
        real_poll = worker._core.poll
        monkeypatch.setattr(worker._core, "poll", lambda job: not held and real_poll(job))

        ctx = ReqContext(req_id="load-2")
        assert worker.submit_load(2, manager.prepare_load(keys, ctx),
                                  GPULoadStoreSpec([4, 5], group_sizes=[2], block_indices=[0]))
        assert worker.get_finished() == [] and len(yields) == 1
        assert worker.get_finished() == [] and len(yields) == 2
        held.clear()
        assert finish(worker, 2).success
        manager.complete_load(keys, ctx)
        after_load = len(yields)
        assert worker.get_finished() == [] and len(yields) == after_load

        held.append(True)
        ctx = ReqContext(req_id="store-3")
        out = manager.prepare_store(more, ctx)
        assert worker.submit_store(3, GPULoadStoreSpec([6, 7], group_sizes=[2],
                                                       block_indices=[0]), out.store_spec)
        assert worker.get_finished() == [] and len(yields) == after_load
        held.clear()
        assert finish(worker, 3).success
        manager.complete_store(more, ctx)
    finally:
        worker.shutdown()


def test_restart_hits_persistent_tier_and_fingerprint_change_misses(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS, persistent_only=True)
    keys = offload_keys(8, salt=b"restart")
    _, manager, worker, tensors = new_spec(agent_extra())
    g = torch.Generator().manual_seed(8)
    for t in tensors:
        t[:8] = torch.randint(-128, 128, (8, PAGE), dtype=torch.int8, generator=g)
    expected = [t[:8].clone() for t in tensors]
    store(manager, worker, keys, range(8), job_id=1)
    worker.shutdown()

    # A new process would build a new spec and engine over the same pvc.ref directory.
    _, manager, worker, tensors = new_spec(agent_extra())
    try:
        ctx = ReqContext("after-restart")
        hits = [i for i, k in enumerate(keys) if manager.lookup(k, ctx) is LookupResult.HIT]
        # The 2 blocks left in pinned RAM die with the engine; the cascaded 6 survive.
        assert len(hits) >= 6, f"only blocks {hits} hit after restart"
        load(manager, worker, [keys[i] for i in hits], hits, job_id=3)
        for want, t in zip(expected, tensors):
            assert torch.equal(want[hits], t[hits])
    finally:
        worker.shutdown()

    # (extra config change, OffloadingConfig change): another revision, another dtype.
    for extra_change, config_change in (({"revision": "other"}, {}), ({}, {"dtype": "bfloat16"})):
        _, manager, worker, _ = new_spec({**agent_extra(), **extra_change}, **config_change)
        try:
            assert all(manager.lookup(k, ReqContext("r")) is LookupResult.MISS for k in keys), \
                f"blocks served under a changed fingerprint {extra_change or config_change}"
        finally:
            worker.shutdown()


def test_a_cache_reset_salts_keys_as_no_other_process_does(tmp_path, monkeypatch):
    """A reset (vLLM's weight sync: pause_scheduler(clear_cache=True)) moved every process to
    generation 1, 2, ... alike: after a restart, or in another replica on a shared tier, the
    first reset found the blocks another process stored after its own first reset, made by
    other weights, and served them. Generation 0 (no reset yet) still hits after a restart."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS, persistent_only=True)
    keys = offload_keys(6, salt=b"reset")
    _, manager, worker, _ = new_spec(agent_extra())
    manager.reset_cache()  # new weights, then their KV stored
    store(manager, worker, keys, range(6), job_id=1)
    worker.shutdown()  # the write-back puts the pinned ones on the persistent tier too

    # A restart (or another replica): its own reset, with its own new weights.
    _, manager, worker, _ = new_spec(agent_extra())
    try:
        ctx = ReqContext("after-restart")
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.MISS] * 6
        manager.on_schedule_end(END_OF_STEP)
        manager.reset_cache()
        got = [manager.lookup(k, ctx) for k in keys]
        manager.on_schedule_end(END_OF_STEP)
        assert got == [LookupResult.MISS] * 6, "blocks of another process's weights served"
    finally:
        worker.shutdown()


def test_new_weights_in_the_model_directory_scope_anew(tmp_path, monkeypatch):
    """KServe starts every model as `vllm serve /mnt/models`, so the name scopes nothing: a
    persistent tier kept across a change of model (a fine-tune of the same architecture: same
    sizes, same safetensors header) must not serve the old weights' KV. The same weights
    downloaded again (new download metadata, new times) keep the tier's blocks."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS, persistent_only=True)
    models = tmp_path / "mnt-models"
    (models / ".cache" / "huggingface").mkdir(parents=True)
    (models / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    weights = models / "model.safetensors"
    rng = random.Random(1)
    weights.write_bytes(rng.randbytes(1 << 20))
    keys = offload_keys(8, salt=b"weights")

    def restart() -> list[bool]:
        _, manager, worker, _ = new_spec(agent_extra(), model=str(models))
        try:
            hits = [manager.lookup(k, ReqContext("r")) is LookupResult.HIT for k in keys]
            manager.on_schedule_end(END_OF_STEP)
            return hits
        finally:
            worker.shutdown()

    _, manager, worker, _ = new_spec(agent_extra(), model=str(models))
    store(manager, worker, keys, range(8), job_id=1)
    worker.shutdown()
    weights.write_bytes(weights.read_bytes())
    (models / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 2\n")
    assert restart() == [True] * 8, "the same weights, downloaded again, lost the tier"
    fine_tune = bytearray(weights.read_bytes())
    fine_tune[4096:] = rng.randbytes(len(fine_tune) - 4096)  # same header, other values
    weights.write_bytes(bytes(fine_tune))
    assert restart() == [False] * 8, "blocks of the old weights served to the new ones"


def test_model_digest_reads_the_weights_only(tmp_path):
    assert model_digest(MODEL) is None  # a hub name
    assert model_digest(str(tmp_path)) is None  # no weight file
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"a" * 300_000)
    first = model_digest(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "README.md").write_text("# another card")
    assert model_digest(str(tmp_path)) == first
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"b")
    assert model_digest(str(tmp_path)) != first


def dp_engine_config(extra, index, size, local_rank):
    c = offloading_config(extra, engine_id=f"engine-dp{index}")
    return dataclasses.replace(c, parallel=dataclasses.replace(
        c.parallel, data_parallel_index=index, data_parallel_size=size,
        data_parallel_rank_local=local_rank))


def test_data_parallel_engines_of_one_pod_share_its_tiers(tmp_path, monkeypatch):
    """vLLM runs one engine per data-parallel rank, --data-parallel-size-local of them in one
    server, each building a spec from the pod's env. Each takes its share of the pod's pinned
    RAM and disk tiers, in a directory of its own: opening the second engine, which empties
    its non-persistent tiers, must not remove the first one's blocks."""
    pod = scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    pod_tiers = json.loads(pod["KVOFFLOAD_TIERS"])
    local = VllmConfig(parallel_config=ParallelConfig(data_parallel_size=2,
                                                      data_parallel_size_local=2),
                       device_config=DeviceConfig("cpu"))
    workers, managers = [], []
    try:
        for dp in range(2):
            spec = OffloadingSpecFactory.create_spec(dp_engine_config(agent_extra(), dp, 2, dp))
            with set_current_vllm_config(local):  # as vLLM's worker has it in get_worker
                workers.append(spec.get_worker(kv_caches()))
            managers.append(spec.get_manager())
            if dp == 0:
                keys = offload_keys(8, salt=b"dp0")
                store(managers[0], workers[0], keys, range(8), job_id=1)
                files = sorted(p for p in tmp_path.glob("kv-cache-*/**/*") if p.is_file())
        engines = [w._core.engine for w in workers]
        assert files and all(p.exists() for p in files), "dp1's start removed dp0's files"
        assert all("/dp0/" in str(p) for p in files), files
        assert [managers[0].lookup(k, ReqContext("r")) for k in keys] == [LookupResult.HIT] * 8
        managers[0].on_schedule_end(END_OF_STEP)
        for dp, e in enumerate(engines):
            tiers = e.stats()["tiers"]
            assert tiers[0]["capacity_bytes"] == int(pod["KVOFFLOAD_CPU_BYTES"]) // 2
            for t, pod_tier in zip(tiers[1:], pod_tiers):
                assert t["capacity_bytes"] == pod_tier["capacityBytes"] // 2
        # One engine per pod (external load balancing: each rank a server of its own): the
        # pod's whole budget, in the tiers' own directories.
        one = VllmConfig(parallel_config=ParallelConfig(data_parallel_size=2,
                                                        data_parallel_size_local=1),
                     device_config=DeviceConfig("cpu"))
        assert pod_engines(dp_engine_config(agent_extra(), 1, 2, 0).parallel, one) == (0, 1)
        assert pod_engines(dp_engine_config(agent_extra(), 1, 2, 1).parallel, local) == (1, 2)
        assert pod_engines(offloading_config(agent_extra()).parallel, None) == (0, 1)
    finally:
        for w in workers:
            w.shutdown()


def test_write_back_seconds_must_be_a_duration(tmp_path, monkeypatch):
    """Refused at start, naming the key: inf (or 1e20) s was accepted and overflowed at
    shutdown, before the engine closed, so nothing was written back and nothing closed."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    for key, value in [("write_back_seconds", "soon"), ("write_back_seconds", float("inf")),
                       ("write_back_seconds", 1e20), ("write_back_seconds", float("nan")),
                       ("metrics_interval_seconds", float("inf"))]:
        with pytest.raises(ValueError, match=re.escape(f"{key}={value!r}") +
                           " is not a number of seconds from 0 to 3600"):
            OffloadingSpecFactory.create_spec(offloading_config({**agent_extra(), key: value}))


def test_write_back_fits_the_multiproc_executors_wait_for_its_workers(monkeypatch):
    """vLLM's multiproc executor (a process per rank, named VllmWorker-<rank>) waits
    VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s) for its workers to exit, then signals and kills
    them: the 10 s write-back was killed part way, before the engine closed. There the budget
    ends a second before that wait, saying which variable gives it all; elsewhere it is whole."""
    import multiprocessing
    monkeypatch.delenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", raising=False)
    assert write_back_budget(10.0) == (10.0, None)
    monkeypatch.setattr(multiprocessing.current_process(), "name", "VllmWorker-1")
    budget, why = write_back_budget(10.0)
    assert budget == 4.0
    assert "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=5" in why and "to 11 or more" in why, why
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "30")
    assert write_back_budget(10.0) == (10.0, None)
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "0")
    assert write_back_budget(10.0)[0] == 0.0


def test_blocks_moved_down_never_decrease_when_their_writes_fail_later():
    """The pinned tier counts an eviction when its write to disk0 starts and a drop when that
    write fails, so between two reads evictions less drops can shrink: the increase of the
    'moved to disk0' counter came out negative, which prometheus_client refuses with an error
    raised in vLLM's output handler. It stays at 0 until the count is back above what was
    reported, and the total is right in the end."""
    from kvoffload import metrics as metrics_mod

    def snapshot(evictions, dropped):
        tier = {name: 0 for name in engine._TIER_FIELDS}
        tier.update(refused=0, lost=0)
        cpu = dict(tier, evictions=evictions, dropped=dropped)
        out = {name: 0 for name in engine._STATS_FIELDS}
        out["tiers"] = [cpu, dict(tier)]
        return out

    reporter = metrics_mod.MetricsReporter(0.0)
    moved = []
    for evictions, dropped in [(16, 0), (16, 16), (24, 16), (40, 16)]:
        stats = reporter.take(lambda: ([snapshot(evictions, dropped)], [], []))
        got = stats.data["data"][metrics_mod.EVICTED].get(("cpu", "disk0"), 0)
        assert got >= 0, (evictions, dropped, got)
        moved.append(got)
    assert moved == [16, 0, 0, 8]
    assert sum(moved) == 40 - 16


def test_a_failed_write_back_still_closes_the_engine(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    core = TransferCore([torch.zeros(4, PAGE, dtype=torch.uint8)],
                        engine.Fingerprint("m", "", "u8", "L", 0), cpu_bytes=SLOT)
    with pytest.raises(ValueError, match="write_back budget_s=inf"):
        core.close(float("inf"))
    with pytest.raises(RuntimeError, match="used after close"):
        core.engine.stats()


def test_a_second_shutdown_is_harmless(tmp_path, monkeypatch):
    """A worker shut down twice (a test's teardown after vLLM's, an executor that calls it
    again) raised "kvoffload engine used after close()" from the write-back."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS, persistent_only=True)
    _, manager, worker, _ = new_spec(agent_extra())
    store(manager, worker, offload_keys(2, salt=b"twice"), range(2), job_id=1)
    worker.shutdown()
    worker.shutdown()


def test_a_tier_whose_volume_is_not_mounted_is_refused(tmp_path, monkeypatch):
    """A tier directory that does not exist is a volume not mounted there: refused at start,
    naming it, rather than created in the container's own file system, where a persistent
    tier would lose its blocks at every restart."""
    env = scaled_env(tmp_path, monkeypatch, PAGE * TENSORS, persistent_only=True)
    missing = json.loads(env["KVOFFLOAD_TIERS"])[0]["path"]
    os.rmdir(missing)
    spec = OffloadingSpecFactory.create_spec(offloading_config(agent_extra()))
    with pytest.raises(ValueError, match=f"disk tier 0's directory {missing} does not exist: "
                                         "mount the tier's volume there"):
        spec.get_worker(kv_caches())
    assert not os.path.exists(missing)


def test_engine_errors_name_the_extra_config_key_the_value_came_by(tmp_path, monkeypatch):
    """Without the webhook's env the extra config sizes the engine; the library's refusal named
    KVOFFLOAD_CPU_BYTES, which the user never set, and an unknown disk_io named no key."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    for var in ("KVOFFLOAD_CPU_BYTES", "KVOFFLOAD_TIERS", "KVOFFLOAD_EVICTION_POLICY"):
        monkeypatch.delenv(var)
    spec = OffloadingSpecFactory.create_spec(offloading_config({**agent_extra(),
                                                                "cpu_bytes_to_use": 1.5}))
    with pytest.raises(engine.KvoError,
                       match=r"kv_connector_extra_config.cpu_bytes_to_use=1 holds "
                             r"no block of \d+ bytes; raise it$") as refused:
        spec.get_worker(kv_caches())
    assert "KVOFFLOAD_CPU_BYTES" not in str(refused.value)
    spec = OffloadingSpecFactory.create_spec(offloading_config(
        {**agent_extra(), "cpu_bytes_to_use": 2 * SLOT, "disk_io": "aio"}))
    with pytest.raises(engine.KvoError, match=r"kv_connector_extra_config.disk_io=\"aio\""):
        spec.get_worker(kv_caches())


def test_cache_groups_over_different_tensors_are_refused(tmp_path, monkeypatch):
    """A block id is a row of every KV tensor to the engine: right where the groups share
    their tensors (test_real_engine's sliding-window model), wrong where each group owns its
    own, whose loads would then write over the other group's rows."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec = OffloadingSpecFactory.create_spec(offloading_config(agent_extra()))
    shared = kv_caches()
    shared.group_data_refs = [[CanonicalKVCacheRef(i, PAGE) for i in range(TENSORS)]] * 2
    spec.get_worker(shared).shutdown()
    own = kv_caches()
    own.group_data_refs = [[CanonicalKVCacheRef(i, PAGE)] for i in range(TENSORS)]
    spec = OffloadingSpecFactory.create_spec(offloading_config(agent_extra()))
    with pytest.raises(ValueError, match=r"groups use different tensors \(\[\[0\], \[1\]\]\).*"
                                         "vllm-native"):
        spec.get_worker(own)


class PageAddresses(NamedTuple):
    """The fields of vLLM 0.34's DevicePointers that the worker reads (the class itself is not
    in 0.32; test_vllm_scheduler and test_through_vllm_connector_worker get the real one from
    vLLM's resolve_device_pointers when the tests run under 0.34)."""
    ptrs: np.ndarray
    group_block_counts: tuple[int, ...]
    group_data_ref_counts: tuple[int, ...]


def addresses(tensors, rows, shift=0):
    return PageAddresses(
        np.array([t.data_ptr() + r * t.stride(0) + shift for t in tensors for r in rows],
                 dtype=np.uint64), (len(rows),), (len(tensors),))


def test_vllm_034_resolved_addresses_of_two_groups_are_their_block_ids():
    """vLLM 0.34's own resolve_device_pointers, for a model with two KV cache groups over the
    same tensors (full and sliding-window attention, as vLLM lays out Gemma 3), each group
    listing the tensors in its own order: rows_at gives back the block ids, group by group."""
    # Gated on the version, not on the import: under 0.34 a broken import must fail the test,
    # not skip it (a skip passes the ctest entry).
    if tuple(int(x) for x in vllm.__version__.split(".")[:2]) < (0, 34):
        pytest.skip(f"vLLM {vllm.__version__} hands the worker block ids, not page "
                    "addresses: runs under 0.34 (ctest vllm.0.34.0.test_vllm_spec)")
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
    caches = kv_caches()
    caches.group_data_refs = [[CanonicalKVCacheRef(i, PAGE) for i in range(TENSORS)],
                              [CanonicalKVCacheRef(i, PAGE) for i in reversed(range(TENSORS))]]
    core = TransferCore([t.tensor for t in caches.tensors], engine.Fingerprint(
        "m", "", "float16", "test", 0), cpu_bytes=4 * PAGE * TENSORS)
    try:
        ids = [7, 2, 30, 5, 11]
        spec = GPULoadStoreSpec(ids, group_sizes=[2, 3], block_indices=[0, 4])
        pointers = resolve_device_pointers(spec, caches)
        rows = core.rows_at(pointers.ptrs, pointers.group_block_counts,
                            [[r.tensor_idx for r in refs] for refs in caches.group_data_refs])
        assert rows.tolist() == ids
    finally:
        core.close()


def test_page_addresses_that_name_no_row_are_neither_read_nor_written(tmp_path, monkeypatch):
    """vLLM 0.34's page addresses reach the engine as the rows they start. Addresses that start
    no row of the registered tensors: the store is reported done with nothing stored (as any
    store the engine cannot take), the load failed with its holds released (vLLM 0.34 then
    recomputes), and not a byte of the tensors changes."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec, manager, worker, tensors = new_spec(agent_extra())
    try:
        g = torch.Generator().manual_seed(4)
        for t in tensors:
            t.copy_(torch.randint(-128, 128, t.shape, dtype=torch.int8, generator=g))
        keys = offload_keys(3, salt=b"addresses")
        ctx = ReqContext("addresses-store")
        out = manager.prepare_store(keys, ctx)
        assert worker.submit_store(1, addresses(tensors, [4, 5, 6]), out.store_spec)
        assert finish(worker, 1).transfer_size == 3 * TENSORS * PAGE
        manager.complete_store(keys, ctx)
        assert worker._core.stored(keys) == [True] * 3

        before = [t.clone() for t in tensors]
        more = offload_keys(2, salt=b"inside a page")
        out = manager.prepare_store(more, ReqContext("misaligned"))
        assert worker.submit_store(2, addresses(tensors, [1, 2], shift=64), out.store_spec)
        result = finish(worker, 2)
        assert (result.success, result.transfer_size) == (True, 0)
        assert worker._core.stored(more) == [False] * 2

        ctx = ReqContext("addresses-load")
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 3
        src = manager.prepare_load(keys, ctx)
        past_the_end = addresses(tensors, [BLOCKS - 1, BLOCKS, BLOCKS + 1])
        assert worker.submit_load(3, src, past_the_end)
        assert not finish(worker, 3).success
        manager.complete_load(keys, ctx)
        assert all(torch.equal(b, t) for b, t in zip(before, tensors))
        assert worker._core.stats()["held_blocks"] == 0

        # The same blocks at addresses that are rows: loaded where they say.
        src = manager.prepare_load(keys, ReqContext("addresses-reload"))
        assert worker.submit_load(4, src, addresses(tensors, [9, 10, 11]))
        worker.wait({4})
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(4, True)]
        for b, t in zip(before, tensors):
            assert torch.equal(t[9:12], b[4:7])
    finally:
        worker.shutdown()


def test_through_vllm_connector_worker(tmp_path, monkeypatch):
    """vLLM's own worker-side OffloadingConnectorWorker drives our worker: deferred store
    submission, async load with finished_recving, and its assertion that transfers succeed.
    register_kv_caches() needs a full VllmConfig; it ends in _init_worker(), called here."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        TransferJob,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )

    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec = OffloadingSpecFactory.create_spec(offloading_config(agent_extra()))
    caches = kv_caches()
    connector = OffloadingConnectorWorker(spec, vllm_config=None, kv_cache_config=None)
    connector._init_worker(caches)
    manager = spec.get_manager()
    tensors = [t.tensor for t in caches.tensors]
    try:
        keys = offload_keys(6, salt=b"connector")
        g = torch.Generator().manual_seed(9)
        for t in tensors:
            t[2:8] = torch.randint(-128, 128, (6, PAGE), dtype=torch.int8, generator=g)
        expected = [t[2:8].clone() for t in tensors]

        def completed(job_id, req_id=None):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                _, recving = connector.get_finished(set())
                meta = connector.build_connector_worker_meta()
                if meta is not None and job_id in meta.completed_jobs:
                    return recving
                time.sleep(0.01)
            raise AssertionError(f"vLLM's connector worker never completed job {job_id}")

        ctx = ReqContext("req-store")
        out = manager.prepare_store(keys, ctx)
        gpu = GPULoadStoreSpec(list(range(2, 8)), group_sizes=[6], block_indices=[0])
        connector.prepare_store_kv(OffloadingConnectorMetadata(
            load_jobs={}, store_jobs={10: TransferJob("req-store", gpu, out.store_spec)}))
        # vLLM defers stores to the start of the next step.
        connector.start_kv_transfers(OffloadingConnectorMetadata(load_jobs={}, store_jobs={}))
        completed(10)
        manager.complete_store(keys, ctx)
        assert all(manager.lookup(k, ctx) is LookupResult.HIT for k in keys)

        for t in tensors:
            t.zero_()
        ctx = ReqContext("req-load")
        src = manager.prepare_load(keys, ctx)
        dst = GPULoadStoreSpec(list(range(20, 26)), group_sizes=[6], block_indices=[0])
        connector.start_kv_transfers(OffloadingConnectorMetadata(
            load_jobs={11: TransferJob("req-load", src, dst)}, store_jobs={}))
        assert "req-load" in completed(11)
        manager.complete_load(keys, ctx)
        for want, t in zip(expected, tensors):
            assert torch.equal(want, t[20:26])
    finally:
        connector.shutdown()


def test_lookup_hit_stays_loadable_until_its_load_is_done(tmp_path, monkeypatch):
    """vLLM loads a block a step after its lookup; the engine's stores evict meanwhile. A HIT
    must still load: the lookup holds it, the load's end on the worker lets it go."""
    env = scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    monkeypatch.setenv("KVOFFLOAD_TIERS", "[]")  # pinned host only: eviction drops blocks
    del env
    spec, manager, worker, tensors = new_spec(agent_extra())
    engine = worker._core.engine
    try:
        old, new = offload_keys(2, salt=b"old"), offload_keys(2, salt=b"new")
        g = torch.Generator().manual_seed(11)
        for t in tensors:
            t[:4] = torch.randint(-128, 128, (4, PAGE), dtype=torch.int8, generator=g)
        expected = [t[:2].clone() for t in tensors]
        store(manager, worker, old, range(2), job_id=1)
        ctx = ReqContext("req-load")
        assert [manager.lookup(k, ctx) for k in old] == [LookupResult.HIT] * 2
        assert engine.stats()["held_blocks"] == 2
        # Two new blocks want the only two slots: held, the old ones stay and the store
        # keeps nothing (reported done: vLLM asserts on failed stores).
        store(manager, worker, new, range(2, 4), job_id=2, kept=False)
        assert [manager.lookup(k, ctx) for k in new] == [LookupResult.MISS] * 2
        spec_ = manager.prepare_load(old, ctx)
        manager.on_schedule_end(END_OF_STEP)
        assert engine.stats()["held_blocks"] == 2, "the load's holds outlive the step"
        for t in tensors:
            t.zero_()
        assert worker.submit_load(3, spec_, GPULoadStoreSpec([10, 11], group_sizes=[2],
                                                             block_indices=[0]))
        worker.wait({3})
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(3, True)]
        for want, t in zip(expected, tensors):
            assert torch.equal(want, t[10:12])
        assert engine.stats()["held_blocks"] == 0
        manager.complete_load(old, ctx)
        # Released, the old blocks give way to new ones.
        store(manager, worker, new, range(2, 4), job_id=4)
        assert [manager.lookup(k, ctx) for k in new] == [LookupResult.HIT] * 2
        assert [manager.lookup(k, ctx) for k in old] == [LookupResult.MISS] * 2
        manager.on_schedule_end(END_OF_STEP)
        assert engine.stats()["held_blocks"] == 0
    finally:
        worker.shutdown()


def test_a_load_whose_holds_cannot_be_released_still_finishes(tmp_path, monkeypatch):
    """Releasing a finished load's holds failed (the engine said a key was not held): the
    error reached the job's except clause, which finished the job a second time, and the
    KeyError of the job already gone ended vLLM's worker. The load is reported once."""
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec, manager, worker, tensors = new_spec(agent_extra())
    try:
        keys = offload_keys(2, salt=b"release")
        store(manager, worker, keys, range(2), job_id=1)
        ctx = ReqContext("req-release")
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 2
        spec_ = manager.prepare_load(keys, ctx)
        manager.on_schedule_end(END_OF_STEP)

        def refuse(*_args, **_kwargs):
            raise engine.KvoError("kvo_release", 8, "key ... is not held")
        monkeypatch.setattr(worker._core, "release", refuse)
        for wait in (True, False):
            job = 2 if wait else 3
            assert worker.submit_load(job, spec_, GPULoadStoreSpec([10, 11], group_sizes=[2],
                                                                   block_indices=[0]))
            if wait:
                worker.wait({job})
            finished = []
            while not finished:
                finished = worker.get_finished()
            assert [(r.job_id, r.success) for r in finished] == [(job, True)]
        # A block id past the tensors' rows: refused and reported, not raised into vLLM.
        rows = tensors[0].shape[0]
        assert worker.submit_load(4, spec_, GPULoadStoreSpec([rows, rows + 1], group_sizes=[2],
                                                             block_indices=[0]))
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(4, False)]
    finally:
        worker.shutdown()


def test_lookup_holds_without_a_load_end_with_the_step(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    spec, manager, worker, _ = new_spec(agent_extra())
    engine = worker._core.engine
    try:
        keys = offload_keys(3, salt=b"step")
        store(manager, worker, keys, range(3), job_id=1)
        ctx = ReqContext("req")
        # The same prefix looked up by two requests: two holds per block.
        for _ in range(2):
            assert all(manager.lookup(k, ctx) is LookupResult.HIT for k in keys)
        assert engine.stats()["held_blocks"] == 3
        load = manager.prepare_load(keys[:1], ctx)  # one of them is loaded
        manager.on_schedule_end(END_OF_STEP)
        assert engine.stats()["held_blocks"] == 1, "only the loading block is still held"
        assert worker.submit_load(2, load, GPULoadStoreSpec([5], group_sizes=[1],
                                                            block_indices=[0]))
        worker.wait({2})
        assert engine.stats()["held_blocks"] == 0
        # A load the worker cannot start (here: one key paired with two GPU blocks) fails,
        # and ends its holds as well: nothing else would.
        assert manager.lookup(keys[1], ctx) is LookupResult.HIT
        load = manager.prepare_load(keys[1:2], ctx)
        manager.on_schedule_end(END_OF_STEP)
        assert engine.stats()["held_blocks"] == 1
        assert worker.submit_load(3, load, GPULoadStoreSpec([5, 6], group_sizes=[2],
                                                            block_indices=[0]))
        assert not finish(worker, 3).success
        assert engine.stats()["held_blocks"] == 0
    finally:
        worker.shutdown()


def test_evictions_are_reported_as_removed_events(tmp_path, monkeypatch):
    scaled_env(tmp_path, monkeypatch, PAGE * TENSORS)
    monkeypatch.setenv("KVOFFLOAD_TIERS", json.dumps([{
        "path": str(tmp_path / "kv-cache-0"), "kind": "emptyDir",
        "capacityBytes": 2 * tier_block_bytes(PAGE * TENSORS, "emptyDir"),
        "persistent": False, "shared": False}]))
    spec, manager, worker, _ = new_spec(agent_extra())
    try:
        keys = offload_keys(6, salt=b"evict")
        for i in range(6):  # one by one: a strict order through 2 pinned + 2 disk slots
            store(manager, worker, keys[i:i + 1], [i], job_id=10 + i)
        events = list(manager.take_events())
        where = residency(events)
        # The two oldest fell off the last tier: stored, moved to disk, removed from there.
        assert keys[0] not in where and keys[1] not in where
        removed = [k for e in events if e.removed and e.ownership == "disk0" for k in e.keys]
        assert removed == keys[:2]
        assert where == {k: {MEDIUM_OF_TIER[t]} for k, t in zip(
            keys[2:], worker._core.engine.lookup([engine_key(k) for k in keys[2:]]))}
        assert manager._names.keys() == {engine_key(k) for k in keys[2:]}, \
            "names of blocks gone from every tier are forgotten"
    finally:
        worker.shutdown()
