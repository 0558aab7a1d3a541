#!/usr/bin/env python3
"""Renders container "main" of every KServe-shaped fixture the way KServe's LLMInferenceService
controller does: `command: [/bin/bash, -c, SCRIPT, --]` with the user's args in `args`, SCRIPT
from testdata/kserve-launch.sh.in (kserve-launch-dp.sh.in for the leader and workers of a
multi-node LeaderWorkerSet, with the LLMInferenceService's parallelism), and KServe's own
`--kv-transfer-config` inside the script when the case's LLMInferenceService has a
kvCacheOffloading spec for the pod's role (KServe's `kvTransferConfig` template function: keys
sorted, each `"` written as `\\"`, single-quoted).

  tests/webhook/kserve_fixtures.py            rewrite the fixtures and the example in place
  tests/webhook/kserve_fixtures.py --check    exit 1 when one differs from its rendering
  tests/webhook/kserve_fixtures.py container MODEL NAMESPACE [SPEC_JSON]
                                              print container "main" as JSON (e2e pods)

A fixture is KServe-shaped when it carries `app.kubernetes.io/part-of: llminferenceservice` and
its main container runs `vllm serve` (converted: the model and port move into the script) or
already runs this script. Other launch forms (a user's own `sh -c`) are left as written.
examples/kserve-rendered-pod.yaml (what `make demo` creates) comes from the same script."""

import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
TESTDATA = HERE / "testdata"
TEMPLATE = (TESTDATA / "kserve-launch.sh.in").read_text()
MARKER = TEMPLATE.splitlines()[0]
# The multi-node templates' script: the single-node one's version checks inside.
DP_TEMPLATE = (TESTDATA / "kserve-launch-dp.sh.in").read_text().replace(
    "@COMMON@", TEMPLATE[TEMPLATE.index("\nVLLM_VERSION=") + 1:TEMPLATE.index("\neval ")])
DP_MARKER = DP_TEMPLATE.splitlines()[0]
REPO = HERE.parent.parent

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "": 1}


def quantity_bytes(text: str) -> int:
    """resource.Quantity.Value() for the whole-number quantities the fixtures use."""
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", text)
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"fixture quantity {text!r}: only integer quantities are rendered")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def kserve_flag(spec) -> str:
    """What KServe puts in KV_TRANSFER_ARGS for `spec` (empty without one)."""
    if not spec:
        return ""
    try:
        cpu = quantity_bytes(spec["cpu"])
    except (KeyError, ValueError):
        # KServe's own validation refuses such an object; it would render nothing.
        return ""
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu}
    if spec.get("evictionPolicy"):
        extra["eviction_policy"] = spec["evictionPolicy"]
    tiers = [{"type": "fs", "root_dir": f"/mnt/kv-cache-{i}"}
             for i, t in enumerate(spec.get("secondary", [])) if t.get("fileSystem")]
    if tiers:
        extra["secondary_tiers"] = tiers
    body = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": extra}, sort_keys=True, separators=(",", ":"))
    return "--kv-transfer-config '" + body.replace('"', '\\"') + "'"


def script(model: str, namespace: str, spec, node: str = "", parallelism=None) -> str:
    """`node`: "leader" or "worker" of a multi-node (LeaderWorkerSet) group, "" for one pod."""
    text = TEMPLATE
    if node:
        p = parallelism or {}
        local = p.get("dataLocal") or 1
        # KServe's templates: a worker's engines start at its index times its local count, the
        # leader serves the API (8 servers by default), the workers run engines only.
        text = (DP_TEMPLATE.replace("@START_RANK@", "0" if node == "leader" else
                                    f"$(( ${{LWS_WORKER_INDEX:-0}} * {local} ))")
                .replace("@ROLE_ARGS@", "  --api-server-count ${VLLM_API_SERVER_COUNT:-8} \\"
                         if node == "leader" else "  --headless \\"))
        flags = (["--enable-expert-parallel"] if p.get("expert") else []) + \
            ([f"--tensor-parallel-size {p['tensor']}"] if p.get("tensor") else []) + \
            [f"--data-parallel-size {p.get('data') or 1}", f"--data-parallel-size-local {local}"]
        text = text.replace("@PARALLEL_ARGS@", "\n".join(f"  {f} \\" for f in flags))
    return (text.rstrip("\n").replace("@MODEL@", model).replace("@NAMESPACE@", namespace)
            .replace("@KV_TRANSFER_ARGS@", kserve_flag(spec)))


def llmisvc(cluster: dict, name: str, role: str):
    """(served model name, kvCacheOffloading spec for `role`, its parallelism) of the case's
    LLMInferenceService."""
    for o in cluster.get("objects", []):
        if o.get("kind") == "LLMInferenceService" and o["metadata"]["name"] == name:
            spec = o.get("spec", {})
            model = spec.get("model", {}).get("name", name)
            if role == "prefill":
                spec = spec.get("prefill") or {}
            return model, (spec.get("kvCacheOffloading") or
                           spec.get("workload", {}).get("kvCacheOffloading")), \
                spec.get("parallelism")
    return name, None, None


def render_main(container: dict, model: str, namespace: str, spec, node: str = "",
                parallelism=None) -> bool:
    """Rewrites `container` in place; False when it is not a KServe-shaped launch."""
    command, args = container.get("command") or [], list(container.get("args") or [])
    if command[:2] == ["vllm", "serve"]:
        # The exec form this project's fixtures once used: model, name and port are the script's.
        while args and args[0] in ("--served-model-name", "--port"):
            args = args[2:]
    elif not (command[:2] == ["/bin/bash", "-c"] and len(command) > 2 and
              command[2].startswith((MARKER, DP_MARKER))):
        return False
    container["command"] = ["/bin/bash", "-c",
                            script(model, namespace, spec, node, parallelism), "--"]
    if args:
        container["args"] = args
    else:
        container.pop("args", None)
    return True


EXAMPLE_HEAD = """\
# The pod KServe's LLMInferenceService controller renders for examples/llminferenceservice.yaml:
# its labels and container "main" with KServe's launch script (rendered by
# tests/webhook/kserve_fixtures.py from tests/webhook/testdata/kserve-launch.sh.in). KServe would
# also render the tier volumes; they are left out so that the demo shows the webhook adding them.
"""


def example_yaml() -> str:
    import yaml  # python3-yaml; only the example needs it

    class Literal(str):
        pass

    yaml.SafeDumper.add_representer(
        Literal, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|"))
    llmisvc = yaml.safe_load((REPO / "examples" / "llminferenceservice.yaml").read_text())
    name = llmisvc["metadata"]["name"]
    main_c = {"name": "main", "image": "vllm/vllm-openai:v0.33.0", "command": ["vllm", "serve"]}
    render_main(main_c, llmisvc["spec"]["model"]["name"], "kv-offload-demo",
                llmisvc["spec"]["kvCacheOffloading"])
    main_c["command"][2] = Literal(main_c["command"][2] + "\n")
    main_c["resources"] = llmisvc["spec"]["template"]["containers"][0]["resources"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{name}-kserve-demo",
                        "labels": {"app.kubernetes.io/name": name,
                                   "app.kubernetes.io/part-of": "llminferenceservice",
                                   "app.kubernetes.io/component": "llminferenceservice-workload",
                                   "kserve.io/component": "workload",
                                   "llm-d.ai/role": "both"}},
           "spec": {"containers": [main_c]}}
    return EXAMPLE_HEAD + yaml.safe_dump(pod, sort_keys=False, width=1000)


def main() -> int:
    if sys.argv[1:2] == ["container"]:
        model, namespace = sys.argv[2], sys.argv[3]
        spec = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
        c = {"name": "main", "command": ["vllm", "serve"]}
        render_main(c, model, namespace, spec)
        print(json.dumps(c))
        return 0
    check = "--check" in sys.argv[1:]
    stale = []
    for pod_file in sorted(TESTDATA.glob("*.pod.json")):
        pod = json.loads(pod_file.read_text())
        labels = pod["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/part-of") != "llminferenceservice":
            continue
        cluster_file = pod_file.with_name(pod_file.name.replace(".pod.json", ".cluster.json"))
        cluster = json.loads(cluster_file.read_text()) if cluster_file.exists() else {}
        name = labels["app.kubernetes.io/name"]
        namespace = pod["metadata"].get("namespace", cluster.get("namespace", "default"))
        # As the webhook reads it (KServeRole): the prefill LeaderWorkerSet's pods carry no
        # role label where the prefill has a leader template, only their component.
        component = labels.get("app.kubernetes.io/component", "")
        role = labels.get("llm-d.ai/role") or (
            "prefill" if component.endswith("-prefill") else "both")
        node = next((n for n in ("leader", "worker")
                     if component.removesuffix("-prefill").endswith("-" + n)), "")
        model, spec, parallelism = llmisvc(cluster, name, role)
        main_c = next((c for c in pod["spec"]["containers"] if c["name"] == "main"), None)
        if main_c is None or not render_main(main_c, model, namespace, spec, node, parallelism):
            continue
        text = json.dumps(pod, indent=2) + "\n"
        if pod_file.read_text() != text:
            stale.append(pod_file.name)
            if not check:
                pod_file.write_text(text)
    example = REPO / "examples" / "kserve-rendered-pod.yaml"
    if example.read_text() != example_yaml():
        stale.append(str(example.relative_to(REPO)))
        if not check:
            example.write_text(example_yaml())
    if check and stale:
        print("kserve_fixtures: not rendered from kserve-launch.sh.in: " + ", ".join(stale) +
              "; run tests/webhook/kserve_fixtures.py", file=sys.stderr)
        return 1
    print(("stale: " if check else "rendered: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
