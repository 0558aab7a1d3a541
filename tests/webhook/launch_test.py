#!/usr/bin/env python3
"""Runs every golden pod's vLLM launch, before and after our patch, with bash and a stand-in
`vllm` (hack/vllm_argv.py), and checks what vLLM would receive:
- status vllmFlag "args" / "VLLM_ADDITIONAL_ARGS": exactly one --kv-transfer-config, valid JSON,
  the one the mode asks for (with vllmFlagBeside, the user's P/D connector and after it one
  MultiConnector of theirs and that one) (agent: KVOffloadAgentSpec; vllm-native: TieringOffloadingSpec with
  the pod's cpu bytes, eviction policy and tier paths); in agent mode also exactly one
  --shutdown-timeout, long enough for the agent's write-back;
- "user": the argv vLLM got before the patch, unchanged (the user's own flag);
- "not-injected": the launch hands vLLM what it did before the patch (and the pod warns);
- KServe-shaped fixtures, unpatched: KServe's own flag exactly when its LLMInferenceService has a
  kvCacheOffloading spec, so the fixture behaves as KServe's template does;
- reinvocation: `kv-offload-webhook inject` patches the case's pod into the golden (whose
  config hash is the "<config-hash>" placeholder), and over its own output changes nothing, so
  vLLM still gets exactly one flag.

  launch_test.py WEBHOOK_BINARY"""

import copy
import json
import pathlib
import re
import subprocess
import sys
import unittest

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = REPO / "tests" / "webhook" / "testdata"
sys.path.insert(0, str(REPO / "hack"))
import vllm_argv  # noqa: E402

WEBHOOK = None  # set from argv in __main__
AGENT = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"spec_name": "KVOffloadAgentSpec",
                                       "spec_module_path": "kvoffload.vllm"},
         "kv_load_failure_policy": "recompute"}


def load(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else None


def env_of(container: dict, name: str) -> str | None:
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def shutdown_timeouts(argv: list[str]) -> list[int]:
    out = []
    for i, a in enumerate(argv):
        if a in ("--shutdown-timeout", "--shutdown_timeout") and i + 1 < len(argv):
            out.append(int(argv[i + 1]))
        elif a.startswith(("--shutdown-timeout=", "--shutdown_timeout=")):
            out.append(int(a.split("=", 1)[1]))
    return out


def cases():
    for patched in sorted(TESTDATA.glob("*.patched.json")):
        name = patched.name[: -len(".patched.json")]
        yield name, load(TESTDATA / f"{name}.pod.json"), load(patched), \
            load(TESTDATA / f"{name}.cluster.json") or {}


def agent_pod(command, env=None, env_from=None, args=None) -> dict:
    """A pod whose container "main" runs vLLM with `command`, in agent mode, 1Gi of cpu."""
    c = {"name": "main", "image": "vllm", "command": command}
    for key, value in (("env", env), ("envFrom", env_from), ("args", args)):
        if value is not None:
            c[key] = value
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": {
                "kvoffload.io/config": '{"cpu":"1Gi"}', "kvoffload.io/mode": "agent",
                "kvoffload.io/vllm": "true"}},
            "spec": {"containers": [c]}}


class LaunchTest(unittest.TestCase):
    def expected_config(self, pod: dict, status: dict) -> dict:
        if status["mode"] == "agent":
            return AGENT
        c = vllm_argv.target_container(pod, None)
        extra = {"spec_name": "TieringOffloadingSpec",
                 "cpu_bytes_to_use": int(env_of(c, "KVOFFLOAD_CPU_BYTES")),
                 "secondary_tiers": [{"type": "fs", "root_dir": t} for t in status["tiers"]]}
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": extra}

    def check_native(self, got: dict, want: dict, pod: dict):
        # eviction_policy is only in our flag when the spec sets one; the env always says.
        policy = got["kv_connector_extra_config"].pop("eviction_policy", "lru")
        c = vllm_argv.target_container(pod, None)
        self.assertEqual(policy, env_of(c, "KVOFFLOAD_EVICTION_POLICY"))
        self.assertEqual(got, want)

    def test_every_golden_launch(self):
        checked = {"args": 0, "VLLM_ADDITIONAL_ARGS": 0, "user": 0, "not-injected": 0}
        for name, before, after, cluster in cases():
            status = json.loads(after["metadata"].get("annotations", {})
                                .get("kvoffload.io/status", "{}"))
            how = status.get("vllmFlag")
            if how is None:
                continue  # not a vLLM container: no flag is ours to add
            with self.subTest(case=name, vllmFlag=how):
                ran_before = vllm_argv.run(before)
                ran_after = vllm_argv.run(after)
                self.assertIsNotNone(ran_after["argv"], ran_after["output"])
                got = ran_after["kvTransferConfigs"]
                beside = status.get("vllmFlagBeside")
                if beside:
                    # The user's P/D connector stays where it was; ours follows it as one
                    # MultiConnector, theirs first, and vLLM takes the later flag.
                    self.assertEqual(len(got), 2, ran_after["argv"])
                    self.assertEqual(ran_before["kvTransferConfigs"], got[:1])
                    self.assertEqual(got[0]["kv_connector"], beside)
                    multi = got.pop()
                    self.assertEqual(multi["kv_connector"], "MultiConnector")
                    self.assertEqual(multi["kv_role"], "kv_both")
                    children = multi["kv_connector_extra_config"]["connectors"]
                    self.assertEqual(children[:-1], got)
                    got = children[-1:]
                if how in ("args", "VLLM_ADDITIONAL_ARGS"):
                    self.assertEqual(len(got), 1, ran_after["argv"])
                    if status["mode"] == "agent":
                        # vLLM must outlast the agent's write-back (10 s) after SIGTERM.
                        timeouts = shutdown_timeouts(ran_after["argv"])
                        self.assertEqual(len(timeouts), 1, ran_after["argv"])
                        self.assertGreaterEqual(timeouts[0], 15)
                    want = self.expected_config(after, status)
                    if status["mode"] == "agent":
                        self.assertEqual(got[0], want)
                    else:
                        self.check_native(copy.deepcopy(got[0]), want, after)
                elif how == "user":
                    # The user's launch is theirs: vLLM gets exactly what it got before.
                    self.assertEqual(ran_after["argv"], ran_before["argv"])
                else:
                    self.assertEqual(how, "not-injected")
                    self.assertEqual(ran_after["argv"], ran_before["argv"])
                checked[how] += 1
        # Every way a flag can reach (or miss) vLLM is exercised by some golden.
        for how, n in checked.items():
            self.assertGreater(n, 0, f"no golden case has vllmFlag {how}")

    def test_kserve_fixtures_behave_like_kserve(self):
        seen = 0
        for name, before, _, cluster in cases():
            main_c = vllm_argv.target_container(before, None)
            if "KV_TRANSFER_ARGS" not in " ".join(main_c.get("command", [])):
                continue
            with self.subTest(case=name):
                rendered = "--kv-transfer-config '" in main_c["command"][2]
                got = vllm_argv.run(before)["kvTransferConfigs"]
                user_has_one = "--kv" in json.dumps(main_c.get("args", [])) + \
                    (env_of(main_c, "VLLM_ADDITIONAL_ARGS") or "")
                if user_has_one:
                    # KServe's own flag stays out; the user's is there, however it was quoted.
                    self.assertGreaterEqual(len(got), 1)
                    self.assertNotIn("TieringOffloadingSpec", json.dumps(got))
                elif rendered:
                    self.assertEqual(len(got), 1)
                    self.assertEqual(got[0]["kv_connector_extra_config"]["spec_name"],
                                     "TieringOffloadingSpec")
                else:
                    self.assertEqual(got, [])
                seen += 1
        self.assertGreaterEqual(seen, 8)

    def test_multi_node_pods_launch_as_kserve_renders_them(self):
        """The LeaderWorkerSet goldens run KServe's data-parallel launch (the leader's address
        resolved, the worker's ranks from its index, the worker headless) with our flag in it."""
        seen = set()
        for name, _, after, _ in cases():
            labels = after["metadata"].get("labels", {})
            node = labels.get("app.kubernetes.io/component", "").removesuffix("-prefill")
            if not node.endswith(("-leader", "-worker")):
                continue
            with self.subTest(case=name):
                argv = vllm_argv.run(after)["argv"]
                self.assertIsNotNone(argv, name)

                def value(flag):
                    self.assertEqual(argv.count(flag), 1, argv)
                    return argv[argv.index(flag) + 1]
                self.assertEqual(value("--data-parallel-address"), "10.244.0.10")
                index = int(labels["leaderworkerset.sigs.k8s.io/worker-index"])
                local = int(value("--data-parallel-size-local"))
                self.assertEqual(int(value("--data-parallel-start-rank")), index * local)
                self.assertEqual("--headless" in argv, node.endswith("-worker"))
                self.assertEqual("--api-server-count" in argv, node.endswith("-leader"))
                self.assertEqual(len(vllm_argv.kv_transfer_configs(argv)), 1, argv)
                seen.add(node.rsplit("-", 1)[1])
        self.assertEqual(seen, {"leader", "worker"})

    def test_reinvocation_through_inject_is_a_no_op(self):
        for name, before, after, cluster in cases():
            with self.subTest(case=name):
                patched = inject(before, cluster)
                # The goldens hold a placeholder for the config hash (mutator_golden_test.cc
                # checks the hash itself); the pod inject made must be the golden otherwise.
                self.assertEqual(without_config_hash(patched), after)
                self.assertEqual(inject(patched, cluster), patched)

    def test_launch_forms_found_from_outside(self):
        """Launches an exploratory run of bash over patched pods found mishandled: a bash long
        option (--norc, --rcfile FILE) read as -c, so the script was taken for another word and
        the pod left without a flag; the flag's name in a comment or an echo read as the
        user's own flag, with the same result; a shell behind env or timeout; a flag in a
        VLLM_ADDITIONAL_ARGS nothing expands. Each must now give vLLM exactly our flag and
        every argument of the user's."""
        script = 'exec vllm serve /mnt/models "$@"'
        lmcache = "--kv-transfer-config '{\"kv_connector\":\"LMCacheConnectorV1\"}'"
        forms = {
            "bash --norc": ["/bin/bash", "--noprofile", "--norc", "-c", script, "--"],
            "bash --rcfile": ["/bin/bash", "--rcfile", "/dev/null", "-c", script, "--"],
            "comment": ["/bin/sh", "-c", "# vLLM gets --kv-transfer-config from the webhook\n"
                        + script, "--"],
            "echo": ["/bin/sh", "-c", 'echo "no --kv-transfer-config of ours" >&2; ' + script,
                     "--"],
            # A shell behind a wrapper was taken for no shell: our flag became its $0.
            "env wrapper": ["/usr/bin/env", "-u", "X", "FOO=1", "bash", "-c", script, "--"],
            "timeout wrapper": ["timeout", "-k", "5", "1000", "sh", "-c", script, "--"],
            # A flag in VLLM_ADDITIONAL_ARGS that no script expands never reaches vLLM: it
            # was taken for the user's own, and vLLM got none.
            "exec form, flag only in the env": (["vllm", "serve", "/mnt/models"],
                                                 [{"name": "VLLM_ADDITIONAL_ARGS",
                                                   "value": lmcache}]),
            # A command substitution before "$@" on the launch line: its `$(` was taken for
            # the start of the command, `echo` for its program, and the pod left without a flag.
            "command substitution": ["/bin/bash", "-c",
                                     'exec vllm serve $(echo /mnt/models) "$@"', "--"],
            # A flag in another env entry that the script only prints reaches nobody.
            "flag in an env entry only printed": (
                ["/bin/bash", "-c", 'echo "$EXTRA_ARGS" >&2\nexec vllm serve /mnt/models "$@"',
                 "--"], [{"name": "EXTRA_ARGS", "value": lmcache}]),
        }
        for name, command in forms.items():
            command, env = command if isinstance(command, tuple) else (command, [])
            with self.subTest(form=name):
                pod = agent_pod(command, env=env, args=["--port", "8000", "a b"])
                patched = inject(pod, {"agentImage": "kv-offload/offload-agent:test"})
                status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
                self.assertEqual(status["vllmFlag"], "args", status)
                ran = vllm_argv.run(patched)
                self.assertEqual(ran["kvTransferConfigs"], [AGENT], ran["argv"])
                self.assertEqual(ran["argv"][:5], ["serve", "/mnt/models", "--port", "8000",
                                                   "a b"], ran["argv"])
        # Where a plain (not eval'd) expansion of VLLM_ADDITIONAL_ARGS carries the user's flag,
        # bash splits it and removes no quotes: unquoted JSON reaches vLLM whole and is the
        # user's; it was judged as eval would read it ("invalid JSON, quote it").
        plain = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "p", "annotations": {
                     "kvoffload.io/config": '{"cpu":"1Gi"}', "kvoffload.io/vllm": "true"}},
                 "spec": {"containers": [{
                     "name": "main", "image": "vllm",
                     "command": ["/bin/bash", "-c",
                                 "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS"],
                     "env": [{"name": "VLLM_ADDITIONAL_ARGS",
                              "value": '--kv-transfer-config={"kv_connector":"Mine"}'}]}]}}
        patched = inject(plain, {})
        status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
        self.assertEqual((status["vllmFlag"], status.get("vllmFlagReason")), ("user", "user-flag"))
        self.assertEqual(vllm_argv.run(patched)["kvTransferConfigs"], [{"kv_connector": "Mine"}])

    def test_more_launch_forms_found_from_outside(self):
        """A second exploratory run of bash over patched pods: bundled shell options with a
        value (`-euo pipefail`), a wrapper we did not know in front of the shell (taskset,
        stdbuf), an eval string with a command before the launch (`cd /x; exec vllm ...`), a
        nested `bash -c "... $*"`, a trailing comment naming the flag, and `bash -c -- SCRIPT`.
        Before, vLLM got no flag while the status said it did, or five broken ones and did
        not start, or the flag was taken for the user's. Each must give vLLM exactly our flag
        and every argument of the user's."""
        plain = 'exec vllm serve /mnt/models "$@"'
        forms = {
            # Without arguments after the script: our flag must not become its $0.
            "bash -euo pipefail": ["/bin/bash", "-euo", "pipefail", "-c", plain],
            "bash -eo pipefail, eval": ["/bin/bash", "-eo", "pipefail", "-c",
                                        'eval "exec vllm serve /mnt/models $@"', "--"],
            "bash -O extglob": ["/bin/bash", "-O", "extglob", "-c", plain],
            "taskset wrapper": ["taskset", "-c", "0", "bash", "-c", plain],
            "stdbuf wrapper, eval": ["stdbuf", "-oL", "bash", "-c",
                                     'eval "exec vllm serve /mnt/models $@"', "--"],
            "eval after cd": ["/bin/bash", "-c",
                              'eval "cd /tmp; exec vllm serve /mnt/models $@"', "--"],
            "eval after &&": ["/bin/bash", "-c",
                              'eval "true && exec vllm serve /mnt/models $@"', "--"],
            "nested bash -c": ["/bin/bash", "-c",
                               'exec bash -c "exec vllm serve /mnt/models $*"', "--"],
            "trailing comment": ["/bin/sh", "-c",
                                 plain + "  # the webhook adds --kv-transfer-config", "--"],
            "bash -c --": ["/bin/bash", "-c", "--", plain, "--"],
            # eval parses the single-quoted string once: "$@" in it is expanded once.
            "eval single-quoted": ["/bin/bash", "-c", "eval '" + plain + "'", "--"],
            # A third run, of generated launches: a print in a function, a subshell or a
            # brace group taken for the launch (our flag unquoted for the eval after it), and
            # a here-document's body read as script ("don't" quoting the rest; its
            # --kv-transfer-config taken for the user's).
            "print in a subshell, then eval": [
                "/bin/bash", "-c", '( echo "$@" ) >&2\neval "exec vllm serve /mnt/models $@"',
                "--"],
            "print in a function, then eval": [
                "/bin/bash", "-c", 'die() { echo "error: $*" >&2; exit 1; }\n'
                'eval "exec vllm serve /mnt/models $@"', "--"],
            "here-document": ["/bin/bash", "-c", "cat <<EOF >&2\ndon't pass "
                              "--kv-transfer-config here\nEOF\n" + plain, "--"],
            # A shift is no here-document (its "body" swallowed the launch).
            "arithmetic shift": ["/bin/bash", "-c", "PORT=$((1 << 13))\n" + plain, "--"],
            # A launch in a function that the script calls with its own arguments.
            "function called with \"$@\"": [
                "/bin/bash", "-c", 'start() {\n  exec vllm serve /mnt/models "$@"\n}\n'
                'start "$@"', "--"],
            "function keyword, called in an if": [
                "/bin/bash", "-c", 'function start {\n  vllm serve /mnt/models "$@"\n}\n'
                'if ! start "$@"; then exit 1; fi', "--"],
            # The first "$@" is a log call's, not the launch's.
            "log \"$@\", then eval": [
                "/bin/bash", "-c", 'log() { echo "[launch] $*" >&2; }\nlog "$@"\n'
                'eval "exec vllm serve /mnt/models $@"', "--"],
            # A log line that names the launch and expands "$@" was taken for the launch line
            # (any line holding "vllm serve"): our flag went unquoted into the eval after it,
            # and vLLM got it split into pieces and did not start.
            "log naming vllm serve, then eval": [
                "/bin/bash", "-c", 'log() { echo "[launch] $*" >&2; }\n'
                'log "starting vllm serve with $*"\neval "exec vllm serve /mnt/models $@"', "--"],
        }
        # Through VLLM_ADDITIONAL_ARGS: a here-document's "$@" was taken for the launch's (our
        # flag went to args the script drops), and a --shutdown-timeout or a
        # --kv-transfer-config in those dropped args was taken for one that reaches vLLM.
        additional = [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--enforce-eager"}]
        through_env = {
            "here-document's $@, then the variable": (
                ["/bin/sh", "-c", "python3 - <<'EOF'\nprint(\"not the shell's: $@\")\nEOF\n"
                 "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS"], None),
            "a dropped --shutdown-timeout": (
                ["/bin/bash", "-c", "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS", "--"],
                ["--shutdown-timeout", "45"]),
            "log \"$@\", then the variable": (
                ["/bin/bash", "-c", 'log() { echo "[launch] $*" >&2; }\nlog "$@"\n'
                 "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS", "--"], None),
            # Taken for the user's flag, so vLLM got none.
            "a dropped --kv-transfer-config": (
                ["/bin/bash", "-c", "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS", "--"],
                ['--kv-transfer-config={"kv_connector":"LMCacheConnectorV1"}']),
        }
        for name, (command, args) in through_env.items():
            with self.subTest(form=name):
                pod = agent_pod(command, env=additional, args=args)
                patched = inject(pod, {"agentImage": "kv-offload/offload-agent:test"})
                status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
                self.assertEqual(status["vllmFlag"], "VLLM_ADDITIONAL_ARGS", status)
                ran = vllm_argv.run(patched)
                self.assertEqual(ran["kvTransferConfigs"], [AGENT], ran["argv"])
                self.assertEqual(shutdown_timeouts(ran["argv"]), [20], ran["argv"])
        for name, command in forms.items():
            with self.subTest(form=name):
                pod = agent_pod(command, args=["--port", "8000", "a-b"]
                                if command[-1] == "--" else None)
                before = vllm_argv.run(pod)["argv"]
                self.assertEqual(before[:2], ["serve", "/mnt/models"])
                patched = inject(pod, {"agentImage": "kv-offload/offload-agent:test"})
                status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
                self.assertEqual(status["vllmFlag"], "args", status)
                ran = vllm_argv.run(patched)
                self.assertEqual(ran["kvTransferConfigs"], [AGENT], ran["argv"])
                self.assertEqual(ran["argv"][:len(before)], before, ran["argv"])
                self.assertEqual(shutdown_timeouts(ran["argv"]), [20], ran["argv"])

    def test_launches_our_flag_cannot_reach_whole_are_left_alone(self):
        """Where adding our flag would break the launch or lose the user's arguments, the pod
        is left as it was and warned: "$VLLM_ADDITIONAL_ARGS" in double quotes (our flag
        would join the user's arguments into one word), and VLLM_ADDITIONAL_ARGS that may come
        from envFrom (a literal entry of ours would replace the ConfigMap's value). The
        user's own flag in vLLM's dotted form (--kv-transfer-config.kv_connector=X) is theirs:
        ours next to it was merged into it by vLLM."""
        cluster = {"agentImage": "kv-offload/offload-agent:test"}
        quoted = agent_pod(
            ["/bin/sh", "-c", 'exec vllm serve /mnt/models "$VLLM_ADDITIONAL_ARGS"'],
            env=[{"name": "VLLM_ADDITIONAL_ARGS", "value": "--enforce-eager"}])
        env_from = agent_pod(
            ["/bin/sh", "-c", "exec vllm serve /mnt/models $VLLM_ADDITIONAL_ARGS"],
            env_from=[{"configMapRef": {"name": "vllm-args"}}])
        from_config_map = {"VLLM_ADDITIONAL_ARGS": "--max-model-len 4096 --enforce-eager"}
        dotted = agent_pod(["vllm", "serve", "/mnt/models"],
                           args=["--kv-transfer-config.kv_connector=LMCacheConnectorV1",
                                 "--kv-transfer-config.kv_role=kv_both"])
        lmcache = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
        # The user's flag with its value in a variable, and the whole flag in an env var the
        # kubelet expands into args ($(VAR)): theirs, where vLLM got two before or was told
        # to "quote it".
        in_variable = agent_pod(["/bin/bash", "-c", "KV='" + lmcache + "'; exec vllm serve "
                                 '/mnt/models --kv-transfer-config "$KV" "$@"', "--"])
        by_reference = agent_pod(
            ["vllm", "serve", "/mnt/models"], args=["$(KV_FLAG)"],
            env=[{"name": "KV_FLAG", "value": "--kv-transfer-config=" + lmcache}])
        # The script's own flag on its launch line, after a test of "$*" that only logs:
        # taken for one that defers to the user's, and vLLM got two.
        after_a_test = agent_pod(["/bin/sh", "-c", 'case "$*" in *--kv-transfer-config*) '
                                  'echo "user flag" >&2;; esac\nexec vllm serve /mnt/models '
                                  "--kv-transfer-config '" + lmcache + "' \"$@\"", "--"])
        # The same test, then the flag kept in a variable that the launch expands: the test's
        # block had closed, so the flag is passed whatever the arguments hold. Taken for a
        # default that defers to ours: vLLM got two, ours last, while the status said "args".
        # Its value in single quotes was also reported as invalid JSON.
        test_then_variable = agent_pod(
            ["/bin/bash", "-c", 'case "$*" in *--kv-transfer-config*) echo "user flag" >&2;; '
             "esac\nKV='--kv-transfer-config=" + lmcache + "'\n"
             'exec vllm serve /mnt/models $KV "$@"', "--"])
        # The user's flag in an env entry of their own that the script expands: ours was
        # added too, and vLLM got two, ours last and winning.
        env_expanded = agent_pod(["/bin/bash", "-c", 'exec vllm serve /mnt/models '
                                  '${EXTRA_ARGS} "$@"', "--"],
                                 env=[{"name": "EXTRA_ARGS",
                                       "value": "--kv-transfer-config=" + lmcache}])
        # A print of the flag before the launch on the same line: only the first occurrence
        # on a line was read, the print's, so the launch's own was not seen and vLLM got two.
        echo_then_flag = agent_pod(
            ["/bin/bash", "-c", 'echo "passing --kv-transfer-config" >&2; exec vllm serve '
             "/mnt/models --kv-transfer-config '" + lmcache + "' \"$@\"", "--"])
        # The user's env entry, extended by the script from itself (the `set -u` idiom): any
        # NAME= in the script counted as setting it, so the entry was not read, and vLLM got
        # two.
        env_extended = agent_pod(
            ["/bin/bash", "-c", 'EXTRA_ARGS="${EXTRA_ARGS:-} --enforce-eager"\n'
             'exec vllm serve /mnt/models $EXTRA_ARGS "$@"', "--"],
            env=[{"name": "EXTRA_ARGS", "value": "--kv-transfer-config=" + lmcache}])
        # The flag in a quoted assignment with more on its line: what followed the closing
        # quote was read into the value, and a valid flag was reported as invalid JSON.
        variable_then_more = agent_pod(
            ["/bin/bash", "-c", "KV='--kv-transfer-config=" + lmcache + "'; "
             'exec vllm serve /mnt/models $KV "$@"', "--"])
        # The dotted form setting a key and then a key under it: reading it threw, the
        # admission answered 500, and the thread's cached plan was left half made.
        dotted_nested = agent_pod(["vllm", "serve", "/mnt/models"],
                                  args=["--kv-transfer-config.kv_connector=LMCacheConnectorV1",
                                        "--kv-transfer-config.kv_connector.a=1"])
        # A launch in a function called without the script's arguments: "$@" there is the
        # call's (none), so ours in args never reached vLLM while the status said "args".
        function_without_args = agent_pod(
            ["/bin/bash", "-c", 'start() { exec vllm serve /mnt/models "$@"; }\nstart', "--"],
            args=["--port", "8000"])
        for name, before, env_values, how in (("in a variable", in_variable, {}, "user"),
                                              ("function without \"$@\"",
                                               function_without_args, {}, "not-injected"),
                                              ("after a test", after_a_test, {}, "user"),
                                              ("after a test, in a variable",
                                               test_then_variable, {}, "user"),
                                              ("in another env entry", env_expanded, {},
                                               "user"),
                                              ("$(VAR) in args", by_reference, {}, "user"),
                                              ("quoted", quoted, {}, "not-injected"),
                                              ("envFrom", env_from, from_config_map,
                                               "not-injected"),
                                              ("dotted", dotted, {}, "user"),
                                              ("echo, then the flag on one line",
                                               echo_then_flag, {}, "user"),
                                              ("env entry extended from itself",
                                               env_extended, {}, "user"),
                                              ("variable, then more on its line",
                                               variable_then_more, {}, "user"),
                                              ("dotted, a key under a key", dotted_nested, {},
                                               "user")):
            with self.subTest(case=name):
                warnings = []
                patched = inject(before, cluster, warnings)
                status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
                self.assertEqual(status["vllmFlag"], how, status)
                if before is function_without_args:  # the warning names the call to fix
                    self.assertTrue(any('call it as start "$@"' in w for w in warnings),
                                    warnings)
                if how == "user":
                    self.assertEqual(status.get("vllmFlagReason"), "user-flag", status)
                    self.assertFalse([w for w in warnings if "invalid JSON" in w], warnings)
                self.assertEqual(vllm_argv.run(patched, env_from=env_values)["argv"],
                                 vllm_argv.run(before, env_from=env_values)["argv"])

    def test_reinjection_after_a_spec_or_mode_change_replaces_our_flag(self):
        """A pod (or template) injected once, then injected again after its spec or mode
        changed, as a GitOps repository re-runs `inject` over its own output: our earlier flag
        was read as the user's and kept, so vLLM got the old spec, or the agent's spec after a
        switch to vllm-native. The new flag takes its place, in args or in
        VLLM_ADDITIONAL_ARGS, and vLLM gets exactly one, the new one."""
        changes = {
            "spec": lambda a: a.update({"kvoffload.io/config": json.dumps(
                {"cpu": "8Gi", "secondary": [{"fileSystem": {"emptyDir": {"size": "20Gi"}}}]})}),
            "mode": lambda a: a.update({"kvoffload.io/mode": "vllm-native"}),
        }
        for name in ("python-module-exec", "shell-eval-escaped", "shell-additional-args-env",
                     "kserve-rendered"):
            before = load(TESTDATA / f"{name}.pod.json")
            cluster = dict(load(TESTDATA / f"{name}.cluster.json") or {},
                           defaultMode="agent", agentImage="kv-offload/offload-agent:test")
            for change, apply in changes.items():
                with self.subTest(case=name, change=change):
                    first = inject(before, cluster)
                    if name == "kserve-rendered" and change == "spec":
                        continue  # its spec is the LLMInferenceService's, not the pod's
                    again = copy.deepcopy(first)
                    annotations = again["metadata"].setdefault("annotations", {})
                    apply(annotations)
                    patched = inject(again, cluster)
                    status = json.loads(patched["metadata"]["annotations"]["kvoffload.io/status"])
                    self.assertIn(status["vllmFlag"], ("args", "VLLM_ADDITIONAL_ARGS"), status)
                    got = vllm_argv.run(patched)["kvTransferConfigs"]
                    self.assertEqual(len(got), 1, got)
                    if status["mode"] == "agent":
                        self.assertEqual(got[0], AGENT)
                    else:
                        self.check_native(copy.deepcopy(got[0]),
                                          self.expected_config(patched, status), patched)
                    env = {e["name"]: e.get("value") for c in patched["spec"]["containers"]
                           for e in c.get("env", [])}
                    agent = status["mode"] == "agent"
                    if change == "spec":
                        # The new spec, where each mode carries it: the agent's flag has no
                        # bytes (a check of the flag alone held with the old spec kept).
                        if agent:
                            self.assertEqual(env.get("KVOFFLOAD_CPU_BYTES"), str(8 * 2**30), env)
                            tiers = json.loads(env["KVOFFLOAD_TIERS"])
                            self.assertEqual(len(tiers), 1, tiers)
                            self.assertTrue(0 < tiers[0]["capacityBytes"] <= 20 * 2**30, tiers)
                        else:
                            self.assertEqual(
                                got[0]["kv_connector_extra_config"]["cpu_bytes_to_use"], 8 * 2**30)
                    # The agent's env goes with the agent: vLLM's wait for its workers too.
                    self.assertEqual("KVOFFLOAD_LIBRARY" in env, agent, env)
                    self.assertEqual(env.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"),
                                     "11" if agent else None, env)
                    # Once more over its own output: nothing changes.
                    self.assertEqual(inject(patched, cluster), patched)

    def test_a_pd_connector_runs_beside_ours_through_reinjection(self):
        """KServe's P/D pods pass NixlConnector themselves; vLLM takes one flag, so ours
        follows theirs as one MultiConnector (theirs first). Re-injected after a mode change,
        the MultiConnector is replaced, never nested, and theirs stays as it was; in args
        (an exec-form pod) as in VLLM_ADDITIONAL_ARGS."""
        nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
        exec_form = agent_pod(["vllm", "serve", "/models"],
                              args=["--kv-transfer-config", json.dumps(nixl)])
        for name, before, cluster in (
                ("kserve-pd-decode-nixl", load(TESTDATA / "kserve-pd-decode-nixl.pod.json"),
                 load(TESTDATA / "kserve-pd-decode-nixl.cluster.json")),
                ("exec-form", exec_form, {"agentImage": "kv-offload/offload-agent:test"})):
            cluster = dict(cluster, agentImage="kv-offload/offload-agent:test")
            theirs = vllm_argv.run(before)["kvTransferConfigs"]
            self.assertEqual(len(theirs), 1)
            pod = before
            for mode in ("agent", "vllm-native", "agent"):
                with self.subTest(case=name, mode=mode):
                    pod = copy.deepcopy(pod)
                    pod["metadata"].setdefault("annotations", {})["kvoffload.io/mode"] = mode
                    pod = inject(pod, cluster)
                    status = json.loads(pod["metadata"]["annotations"]["kvoffload.io/status"])
                    self.assertEqual(status["vllmFlagBeside"], theirs[0]["kv_connector"])
                    got = vllm_argv.run(pod)["kvTransferConfigs"]
                    self.assertEqual(len(got), 2, got)
                    self.assertEqual(got[0], theirs[0])
                    children = got[1]["kv_connector_extra_config"]["connectors"]
                    self.assertEqual(children[0], theirs[0])
                    self.assertEqual(len(children), 2, children)
                    spec = children[1]["kv_connector_extra_config"]["spec_name"]
                    self.assertEqual(spec, "KVOffloadAgentSpec" if mode == "agent"
                                     else "TieringOffloadingSpec")
                    self.assertEqual(inject(pod, cluster), pod)

    def test_ours_goes_beside_theirs_only_where_vllm_then_takes_ours(self):
        """Found from outside: with their flag in args and in VLLM_ADDITIONAL_ARGS, or twice,
        vLLM takes the last, which need not be the one ours was composed with or come before
        ours: theirs is kept alone there. A quote in their JSON made ours (which carries it)
        unknown to a re-injection, and stale MultiConnectors piled up; a flag of theirs
        added by hand after ours in VLLM_ADDITIONAL_ARGS was taken for ours and removed."""
        # No blanks: plain expansions of VLLM_ADDITIONAL_ARGS split at them.
        nixl = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                          separators=(",", ":"))
        mooncake = json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_both"},
                              separators=(",", ":"))
        cluster = {"agentImage": "kv-offload/offload-agent:test"}

        def status(pod):
            return json.loads(pod["metadata"]["annotations"]["kvoffload.io/status"])

        kept_alone = {
            "args and env": agent_pod(
                ["/bin/bash", "-c", 'exec vllm serve /m "$@" $VLLM_ADDITIONAL_ARGS', "--"],
                args=["--kv-transfer-config=" + nixl],
                env=[{"name": "VLLM_ADDITIONAL_ARGS", "value": "--kv-transfer-config=" + mooncake}]),
            "twice in env": agent_pod(
                ["/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"],
                env=[{"name": "VLLM_ADDITIONAL_ARGS",
                      "value": f"--kv-transfer-config={mooncake} --kv_transfer_config={nixl}"}]),
        }
        for name, pod in kept_alone.items():
            with self.subTest(case=name):
                patched = inject(pod, cluster)
                self.assertEqual(status(patched)["vllmFlag"], "user")
                self.assertEqual(vllm_argv.run(patched)["argv"], vllm_argv.run(pod)["argv"])

        quoted = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                             "kv_connector_extra_config": {"note": "it's"}})
        pod = agent_pod(["/bin/bash", "-c", 'eval "exec vllm serve /m $@"', "--"],
                        args=["--kv-transfer-config=" + vllm_argv_quote(quoted)])
        for mode in ("agent", "vllm-native", "agent"):
            with self.subTest(case="a quote in theirs", mode=mode):
                pod["metadata"]["annotations"]["kvoffload.io/mode"] = mode
                pod = inject(pod, cluster)
                got = vllm_argv.run(pod)["kvTransferConfigs"]
                self.assertEqual(len(got), 2, got)
                self.assertEqual(got[0], json.loads(quoted))
                self.assertEqual(len(pod["spec"]["containers"][0]["args"]),
                                 2 + (mode == "agent"), pod["spec"]["containers"][0]["args"])

        plain = agent_pod(["/bin/bash", "-c", "exec vllm serve /m $VLLM_ADDITIONAL_ARGS"],
                          env=[{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-model-len 64"}])
        plain = inject(plain, cluster)
        env = plain["spec"]["containers"][0]["env"]
        extra = next(e for e in env if e["name"] == "VLLM_ADDITIONAL_ARGS")
        extra["value"] += " --kv-transfer-config=" + nixl  # added by hand after ours
        plain["metadata"]["annotations"]["kvoffload.io/config"] = '{"cpu":"2Gi"}'
        plain = inject(plain, cluster)
        got = vllm_argv.run(plain)["kvTransferConfigs"]
        self.assertEqual([g["kv_connector"] for g in got], ["NixlConnector", "MultiConnector"])
        self.assertEqual(status(plain)["vllmFlagBeside"], "NixlConnector")


def vllm_argv_quote(text: str) -> str:
    """`text` single-quoted for a shell, as a user writes a value an eval reads."""
    return "'" + text.replace("'", "'\\''") + "'"


def inject(pod: dict, cluster: dict, warnings: list | None = None) -> dict:
    """The pod as `kv-offload-webhook inject` prints it, with the case's cluster objects; its
    warnings (stderr lines) appended to `warnings` when given."""
    ns = cluster.get("namespace", "default")
    docs = [o for o in cluster.get("objects", [])] + [pod]
    flags = [f"--namespace={ns}", f"--default-mode={cluster.get('defaultMode', 'vllm-native')}"]
    if cluster.get("agentImage"):
        flags.append(f"--agent-image={cluster['agentImage']}")
    out = subprocess.run([WEBHOOK, "inject", "-f", "-"] + flags,
                         input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    if warnings is not None:
        warnings.extend(out.stderr.splitlines())
    pods = [i for i in json.loads(out.stdout)["items"] if i.get("kind") == "Pod"]
    assert len(pods) == 1, pods
    return pods[0]


def without_config_hash(pod: dict) -> dict:
    """`pod` with its config hash written as the goldens write it."""
    pod = copy.deepcopy(pod)
    annotations = pod["metadata"]["annotations"]
    status = annotations["kvoffload.io/status"]
    found = re.search(r'"configHash":"([0-9a-f]{16})"', status)
    assert found, status
    annotations["kvoffload.io/status"] = status.replace(found.group(0),
                                                        '"configHash":"<config-hash>"')
    for c in pod["spec"]["containers"]:
        for e in c.get("env", []):
            if e["name"] == "KVOFFLOAD_CONFIG_HASH" and e.get("value") == found.group(1):
                e["value"] = "<config-hash>"
    return pod


if __name__ == "__main__":
    WEBHOOK = sys.argv.pop(1)
    unittest.main(verbosity=2)
