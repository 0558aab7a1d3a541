#!/usr/bin/env python3
"""Composes random container launches of the shapes vLLM pods are written in, injects each pod
with `kv-offload-webhook inject` (agent mode), runs its launch before and after with real
bash/dash and a stand-in `vllm` (hack/vllm_argv.py), and checks, by the status's vllmFlag:
(a) "args" / "VLLM_ADDITIONAL_ARGS": vLLM gets exactly one --kv-transfer-config, the agent's,
    and exactly one --shutdown-timeout; without ours (the flag, --shutdown-timeout 20) its
    argv is the one it got before, in order;
(b) "user": vLLM gets the argv it got before, and that argv really holds a flag of the user's;
(c) "not-injected": vLLM gets the argv it got before, and inject warns;
(d) inject over its own output changes nothing;
(e) inject neither fails nor hangs, and the patched launch still starts vLLM.
Exploratory runs of this kind found the launch forms launch_test.py now pins one by one; those
cases hold the forms someone wrote down, this holds their combinations (a comment with an
apostrophe before an eval, a here-document before a VLLM_ADDITIONAL_ARGS launch, a wrapper in
front of `bash -euo pipefail -c --`), so a change to the launch reader that mends one form and
breaks another is caught. A run fails too when some status was never reached, so the generator
keeps exercising each.
The default seed and count are sized for CI (about 15 s on two cores); use other seeds and
larger counts to explore. A failure prints the pod, its status and both argvs, and
`--seed S --case I` runs that case alone.

  launch_property_test.py WEBHOOK_BINARY [--seed S] [--count N] [--case I] [--jobs J]"""

import argparse
import json
import pathlib
import random
import subprocess
import sys
import unittest
from multiprocessing import Pool

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
import vllm_argv  # noqa: E402

AGENT = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"spec_name": "KVOffloadAgentSpec",
                                       "spec_module_path": "kvoffload.vllm"},
         "kv_load_failure_policy": "recompute"}
# The agent mode's --shutdown-timeout: ours to strip before comparing with the user's argv.
OUR_SHUTDOWN_TIMEOUT = "20"
USER_JSON = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
STATUSES = ("args", "VLLM_ADDITIONAL_ARGS", "user", "not-injected")
# What an envFrom ConfigMap holds; the pod shows only the reference.
CONFIG_MAP = {"VLLM_ADDITIONAL_ARGS": "--max-model-len 2048 --enforce-eager"}
# Seconds for one launch or one inject: generous, as ctest may run other tests beside this.
TIMEOUT = 20

# ------------------------------------------------------------------------------ the generator
# Programs that exec the rest of their command line, all installed on Debian (tini is not, and
# a fake one would test the fake). The webhook must see the shell or vLLM behind them.
WRAPPERS = [["env", "X=1"], ["/usr/bin/env", "FOO=bar", "BAZ=2"], ["env", "-u", "X", "FOO=1"],
            ["timeout", "1h"], ["timeout", "-k", "5", "3600"], ["taskset", "-c", "0"],
            ["stdbuf", "-oL"], ["nice", "-n", "5"], ["nohup"]]
# Shell options before -c, long ones and ones with a value (-O extglob, -o pipefail) included:
# each was once read as -c or as the script.
BASH_OPTS = [["-e"], ["-x"], ["-euo", "pipefail"], ["-eo", "pipefail"], ["-O", "extglob"],
             ["--norc"], ["--noprofile", "--norc"], ["-u"], ["-l"]]
SH_OPTS = [["-e"], ["-x"], ["-eu"], ["-u"]]
C_FORMS = [["-c"], ["-ec"], ["-c", "--"], ["-xc"]]

# Script lines before the launch: (text, needs bash). Each is something a launch script does
# that is not the launch: comments and prints holding an apostrophe or the flag's name (once
# read as an unterminated quote or the user's own flag), "$@" in a print, a function, a
# subshell or a here-document (once taken for the launch's), tests of "$*" that only log.
LINES = [
    ("# start vLLM; it's the main process", False),
    ("# the webhook adds --kv-transfer-config to \"$@\"", False),
    ("# don't pass --kv-transfer-config here, it's injected", False),
    ("set -e", False),
    ("set -x", False),
    ("set -o pipefail", True),
    ('echo "starting: it\'s #1 --port"', False),
    ("echo 'quote \" inside' # it's a comment", False),
    ("printf '%s #%d\\n' \"run\" 1 >&2", False),
    ('echo "don\'t pass --kv-transfer-config yourself" >&2', False),
    ("echo \"args: $*\" >&2", False),
    ("printf '%s\\n' \"$@\" >&2", False),
    ('for a in "$@"; do :; done', False),
    ('ARGS="$*"', False),
    ('[ "$#" -gt 0 ] && echo "$@" >&2', False),
    ("cat <<EOF >&2\nit's starting with $@ and \"quotes\" # not a comment\n"
     "don't --kv-transfer-config\nEOF", False),
    ("cat <<'EOF' >/dev/null\nit's literal: exec vllm serve /x \"$@\" '\n"
     "--kv-transfer-config '{\"a\":1}'\nEOF", False),
    ("cat <<-EOF >&2\n\tindented it's \"$@\"\n\tEOF", False),
    ("python3 - <<'EOF'\nprint(\"it's python, not shell: $@\")\nEOF", False),
    ('if [[ "$*" != *--kv-transfer-config* ]]; then echo "no user flag" >&2; fi', True),
    ('if [ -n "$HF_TOKEN" ]; then echo "token set"; fi', False),
    ('MODEL="/m"', False),
    ("export HF_HOME=/tmp/hf", False),
    ("PORT=${PORT:-8000}", False),
    ("cd /tmp", False),
    ("log() { echo \"[launch] $*\" >&2; }\nlog \"it's starting\"", False),
    ("log() { echo \"[launch] $*\" >&2; }\nlog \"$@\"", False),
    ("true && echo ok # trailing --kv-transfer-config comment", False),
    ("ulimit -n 65536 || true", False),
    ('die() { echo "error: $*" >&2; exit 1; }', False),
    ("warn() { printf '%s\\n' \"$*\" >&2; }", False),
    ('{ echo "args: $*"; } >&2', False),
    ('( echo "$@" ) >&2', False),
    ('case "$*" in *--kv-transfer-config*) echo "user flag" >&2;; esac', False),
    ("trap 'echo \"stopping $*\" >&2' TERM", False),
    ('if true; then echo "$@" >&2; fi', False),
    ('echo "$(date) starting: $*" >&2', False),
    ('while false; do echo "$@"; done', False),
    ('test -n "$*" && echo "got args" >&2', False),
]

# The script's last line, and how the container's args reach vLLM through it: "direct" ("$@"),
# "split" (unquoted $@ / $*), "reparse" (through eval or bash -c, so quotes in args are read
# again), "env" / "envreparse" / "envquoted" ($VLLM_ADDITIONAL_ARGS plain, eval'd, in double
# quotes), "userflag" (the script's own flag: the user's).
LAUNCHES = [
    ('exec vllm serve /m "$@"', "direct"),
    ("vllm serve /m $@", "split"),
    ('eval "exec vllm serve /m $@"', "reparse"),
    ('eval "cd /tmp; exec vllm serve /m $@"', "reparse"),
    ("eval 'exec vllm serve /m \"$@\"'", "direct"),
    ('exec bash -c "vllm serve /m $*"', "reparse"),
    ("exec vllm serve /m $VLLM_ADDITIONAL_ARGS", "env"),
    ('exec vllm serve /m $VLLM_ADDITIONAL_ARGS "$@"', "direct+env"),
    ('eval "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"', "envreparse"),
    ('python3 -m vllm.entrypoints.openai.api_server --model /m "$@"', "direct"),
    ('exec vllm serve /m \\\n  --port 8000 \\\n  "$@"', "direct"),
    ('eval "exec vllm serve /m \\\n  --port 8000 \\\n  $@"', "reparse"),
    ('exec vllm serve "/models/my model" "$@"', "direct"),
    ("eval \"exec vllm serve '/models/my model' $@\"", "reparse"),
    ('exec vllm serve /m "$@"  # vLLM gets --kv-transfer-config here', "direct"),
    ('start() { exec vllm serve /m "$@"; }\nstart "$@"', "direct"),
    ('exec vllm serve /m "$VLLM_ADDITIONAL_ARGS"', "envquoted"),
    ("exec vllm serve /m --kv-transfer-config '" + USER_JSON + "' \"$@\"", "direct+userflag"),
    ("exec vllm serve /m $*", "split"),
    ('vllm serve /m "$@"\necho "vllm exited" >&2', "direct"),
    # The script's own flag in a variable the launch expands, always passed: the user's
    # (after a `case "$*"` from the lines above, it was taken for a default and vLLM got two).
    ("KV='--kv-transfer-config=" + USER_JSON + "'\nexec vllm serve /m $KV \"$@\"",
     "direct+userflag"),
]

# The user's arguments, --shutdown-timeout included (ours must not double it).
PLAIN_ARGS = [["--port", "8000"], ["--max-model-len", "4096"], ["--enforce-eager"],
              ["--served-model-name", "my-model"], ["--gpu-memory-utilization=0.9"],
              ["--shutdown-timeout", "45"], ["--tensor-parallel-size", "2"]]


def user_flag(how: str, rng: random.Random) -> list[str]:
    """A --kv-transfer-config of the user's, quoted so vLLM gets it whole the way the args
    reach it (an eval reads the quotes once more)."""
    if how.startswith("reparse"):
        return ["--kv-transfer-config", "'" + USER_JSON + "'"]
    if rng.random() < 0.5:
        return ["--kv-transfer-config=" + USER_JSON]
    return ["--kv-transfer-config", USER_JSON]


def generate(rng: random.Random) -> dict:
    """One random launch: an exec form (vllm or python3 -m vllm...), a container with args
    only (the image's `vllm serve`), or a shell script; with wrappers, args and env."""
    case = {"form": rng.choice(["exec", "image-entrypoint", "shell", "shell", "shell", "shell"]),
            "wrappers": [], "shell": None, "opts": [], "cform": ["-c"], "lines": [],
            "launch": None, "placeholder": None, "args": [], "env": None, "envFrom": False}
    if rng.random() < 0.3:
        case["wrappers"] = rng.sample(WRAPPERS, rng.choice([1, 1, 2]))
    if case["form"] == "exec":
        case["launch"] = rng.choice([["vllm", "serve", "/m"],
                                     ["vllm", "serve", "/m", "--port", "8000"],
                                     ["python3", "-m", "vllm.entrypoints.openai.api_server",
                                      "--model", "/m"]])
        how = "direct"
    elif case["form"] == "image-entrypoint":
        case["wrappers"] = []  # no command to put them in front of
        how = "direct"
    else:
        case["shell"] = rng.choice(["/bin/bash", "bash", "/bin/bash", "/bin/sh", "sh"])
        bash = "bash" in case["shell"]
        if rng.random() < 0.5:
            case["opts"] = rng.sample(BASH_OPTS if bash else SH_OPTS, rng.choice([1, 1, 2]))
        case["cform"] = rng.choice(C_FORMS)
        pool = [line for line, needs_bash in LINES if bash or not needs_bash]
        case["lines"] = [rng.choice(pool) for _ in range(rng.choice([0, 0, 1, 2, 3, 4, 6]))]
        case["launch"], how = rng.choice(LAUNCHES)
        # The word after the script is $0: "--" by convention, a name, or none (then the
        # first of the container's args becomes $0, so args may start with one).
        case["placeholder"] = rng.choice(["--", "--", None, "vllm-launch", "args0"])
    case["args"] = rng.sample(PLAIN_ARGS, rng.choice([0, 1, 1, 2, 3]))
    if rng.random() < 0.08:
        case["args"].append(["--served-model-name", "my model"])  # a space the shell keeps
    # The user's own flag: not where the script has one, nor into "$VLLM_ADDITIONAL_ARGS",
    # whose launch is left alone anyway.
    if rng.random() < 0.25 and "userflag" not in how and how != "envquoted":
        case["args"].insert(rng.randint(0, len(case["args"])), user_flag(how, rng))
    if "env" in how or rng.random() < 0.1:
        value = rng.choice(["--enforce-eager", "--max-model-len 4096", "", "--port 8000"])
        if rng.random() < 0.25 and how != "envquoted":
            value += " --kv-transfer-config " + ("'" + USER_JSON + "'" if how == "envreparse"
                                                 else USER_JSON)
        case["env"] = value.strip()
        if rng.random() < 0.1:
            case["envFrom"] = True
            if rng.random() < 0.5:
                case["env"] = None  # the variable comes from the ConfigMap alone
    return case


def pod_of(case: dict) -> dict:
    c = {"name": "main", "image": "vllm/vllm-openai"}
    args = [word for group in case["args"] for word in group]
    wrappers = [word for w in case["wrappers"] for word in w]
    if case["form"] == "exec":
        c["command"] = wrappers + case["launch"]
    elif case["form"] == "image-entrypoint":
        args = ["/m"] + args
    else:
        script = "\n".join(case["lines"] + [case["launch"]])
        c["command"] = wrappers + [case["shell"]] + [o for opts in case["opts"] for o in opts] \
            + case["cform"] + [script]
        if case["placeholder"] in ("--", "vllm-launch"):
            c["command"].append(case["placeholder"])
        elif case["placeholder"] == "args0":
            args = ["--"] + args
    if args:
        c["args"] = args
    if case["env"] is not None:
        c["env"] = [{"name": "VLLM_ADDITIONAL_ARGS", "value": case["env"]}]
    if case["envFrom"]:
        c["envFrom"] = [{"configMapRef": {"name": "vllm-args"}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "annotations": {
                "kvoffload.io/config": '{"cpu":"1Gi"}', "kvoffload.io/vllm": "true",
                "kvoffload.io/mode": "agent"}},
            "spec": {"containers": [c]}}


# ------------------------------------------------------------------------------ the checks
def inject(webhook: str, pod: dict) -> tuple[dict | None, str]:
    """The patched pod (None where inject failed) and inject's stderr (its warnings)."""
    try:
        out = subprocess.run([webhook, "inject", "-f", "-", "--default-mode=agent",
                              "--agent-image=kv-offload/offload-agent:test"],
                             input=json.dumps(pod), capture_output=True, text=True,
                             timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"inject ran past {TIMEOUT} s"
    if out.returncode != 0:
        return None, f"inject exited {out.returncode}: {out.stderr}"
    try:
        return json.loads(out.stdout), out.stderr
    except json.JSONDecodeError:
        return None, "inject printed no JSON: " + out.stdout[:200]


def without_ours(argv: list[str]) -> list[str]:
    """`argv` without the agent's --kv-transfer-config and our --shutdown-timeout, each in one
    word or two: what is left must be the user's argv as it was."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--kv-transfer-config=") and parses_to(a.split("=", 1)[1], AGENT) \
                or a == "--shutdown-timeout=" + OUR_SHUTDOWN_TIMEOUT:
            i += 1
        elif i + 1 < len(argv) and (a == "--kv-transfer-config" and parses_to(argv[i + 1], AGENT)
                                    or a == "--shutdown-timeout"
                                    and argv[i + 1] == OUR_SHUTDOWN_TIMEOUT):
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def parses_to(text: str, want: dict) -> bool:
    try:
        return json.loads(text) == want
    except json.JSONDecodeError:
        return False


def shutdown_timeouts(argv: list[str]) -> int:
    return sum(1 for i, a in enumerate(argv)
               if a in ("--shutdown-timeout", "--shutdown_timeout") and i + 1 < len(argv)
               or a.startswith(("--shutdown-timeout=", "--shutdown_timeout=")))


def check(webhook: str, pod: dict, env_from: dict | None) -> dict:
    """Runs one pod through inject and both launches. Returns {"status": vllmFlag, or "skipped"
    where the generated launch does not start vLLM even unpatched, "failed": [broken
    invariants], and what a report needs}."""
    try:
        before = vllm_argv.run(pod, env_from=env_from, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"status": "skipped", "failed": []}
    # Some combinations are no launch at all (set -u with an unset variable, an option the
    # shell lacks, a user flag the shell splits): nothing of ours to check there.
    if before["argv"] is None or any("invalid" in c for c in before["kvTransferConfigs"]) \
            or any(a.startswith("--kv-transfer-config ") for a in before["argv"]) \
            or "not found" in before["output"] or "syntax error" in before["output"]:
        return {"status": "skipped", "failed": []}
    result = {"status": None, "failed": [], "pod": pod, "before": before["argv"]}
    patched, warnings = inject(webhook, pod)
    result["warnings"] = warnings.strip()
    if patched is None:
        result["failed"].append("(e) inject failed")
        return result
    status = json.loads(patched["metadata"].get("annotations", {})
                        .get("kvoffload.io/status", "{}"))
    how = result["status"] = status.get("vllmFlag")
    result["statusAnnotation"] = status
    try:
        after = vllm_argv.run(patched, env_from=env_from, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        result["failed"].append(f"(e) the patched launch ran past {TIMEOUT} s")
        return result
    result["after"] = after["argv"]
    failed = result["failed"]
    if after["argv"] is None:
        failed.append(f"(e) the patched launch started no vLLM (exit {after['exitCode']}: "
                      f"{after['output'][-300:]!r})")
    elif how in ("args", "VLLM_ADDITIONAL_ARGS"):
        configs = after["kvTransferConfigs"]
        if len(configs) != 1:
            failed.append(f"(a) {how}: vLLM got {len(configs)} --kv-transfer-config")
        elif configs[0] != AGENT:
            failed.append(f"(a) {how}: vLLM's --kv-transfer-config is not the agent's: "
                          + json.dumps(configs[0]))
        if without_ours(after["argv"]) != before["argv"]:
            failed.append(f"(a) {how}: the user's argv changed")
        if shutdown_timeouts(after["argv"]) != 1:
            failed.append(f"(a) {how}: {shutdown_timeouts(after['argv'])} --shutdown-timeout")
    elif how == "user":
        if after["argv"] != before["argv"]:
            failed.append("(b) user: vLLM's argv changed")
        if not before["kvTransferConfigs"]:
            failed.append("(b) user: the status says the user's flag, vLLM got none")
    elif how == "not-injected":
        if after["argv"] != before["argv"]:
            failed.append("(c) not-injected: vLLM's argv changed")
        if "Warning" not in warnings:
            failed.append("(c) not-injected: no warning")
    else:
        failed.append(f"vllmFlag {how!r}: a vLLM container must have one of {STATUSES}")
    again, warnings = inject(webhook, patched)
    if again is None:
        failed.append("(e) inject failed over its own output: " + warnings[:300])
    elif again != patched:
        failed.append("(d) inject over its own output changed it")
    return result


def run_case(task: tuple[str, int, int]) -> dict:
    webhook, seed, i = task
    # One generator per case, so --case I rebuilds case I without the ones before it.
    case = generate(random.Random(f"{seed}-{i}"))
    result = check(webhook, pod_of(case), CONFIG_MAP if case["envFrom"] else None)
    result["case"] = i
    return result


def report(result: dict, seed: int) -> str:
    c = result["pod"]["spec"]["containers"][0]
    lines = [f"case {result['case']} (--seed {seed} --case {result['case']}): "
             + "; ".join(result["failed"])]
    for key in ("command", "args", "env", "envFrom"):
        if key in c:
            lines.append(f"  {key}: {json.dumps(c[key])}")
    if "envFrom" in c:
        lines.append(f"  (the ConfigMap holds {json.dumps(CONFIG_MAP)})")
    lines.append(f"  status: {json.dumps(result.get('statusAnnotation'))}")
    lines.append(f"  warnings: {result.get('warnings')!r}")
    lines.append(f"  vLLM's argv before: {json.dumps(result['before'])}")
    lines.append(f"  vLLM's argv after:  {json.dumps(result.get('after'))}")
    return "\n".join(lines)


class LaunchPropertyTest(unittest.TestCase):
    def test_random_launches(self):
        cases = [CASE] if CASE is not None else range(COUNT)
        with Pool(JOBS) as pool:
            results = pool.map(run_case, [(WEBHOOK, SEED, i) for i in cases], chunksize=16)
        counts = {}
        for r in results:
            counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
        failures = [r for r in results if r["failed"]]
        print(f"\nseed {SEED}, {len(results)} cases: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
        for r in failures[:20]:
            print(report(r, SEED), file=sys.stderr)
        self.assertEqual(len(failures), 0, f"{len(failures)} of {len(results)} cases broke an "
                         "invariant (the first 20 are printed above)")
        if CASE is None:
            # A generator that stopped reaching a status would pass without checking it.
            for how in STATUSES:
                self.assertGreater(counts.get(how, 0), 0, f"no generated case has vllmFlag {how}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("webhook")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--case", type=int, help="run only this case of the seed")
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    WEBHOOK, SEED, COUNT, CASE, JOBS = (options.webhook, options.seed, options.count,
                                        options.case, options.jobs)
    unittest.main(argv=sys.argv[:1], verbosity=2)
