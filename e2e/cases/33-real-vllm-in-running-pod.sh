# shellcheck shell=bash
# Case 33 (our node): the real vLLM engine in a running pod, started by the command line the
# webhook injects. An LLMInferenceService's pod, shaped and launched as KServe renders it (its
# launch script, KServe's own --kv-transfer-config in it), runs vLLM's CPU build from the host's
# cached virtualenv, mounted read-only, on a model with random weights made here (no
# download). The webhook injects the agent: the init container installs /opt/kvoffload, and
# vLLM loads the adapter and libkvoffload from there through the injected flag and env. A client
# beside the cluster (e2e/node/vllm_client.py) asks about eight documents twice through the
# OpenAI API; vLLM's own cache is capped below one round, so the second round's prefixes come
# back from the pinned tier and the emptyDir tier: every completion equals the first round's,
# and vLLM's counter of tokens supplied by the connector equals the prefixes asked for.
#
# The mounts are hostPaths, which the case namespaces do not allow (new_ns enforces the
# baseline Pod Security level, which forbids them): this case's namespace alone is labelled
# privileged, and a control checks that a hostPath pod is refused in a baseline namespace.
if [[ "${E2E_CLUSTER}" != node ]]; then
  echo "skipped: needs our node (the host's vLLM virtualenv as a hostPath, pod addresses reachable from the test)"
  exit 77
fi
venv="${E2E_VLLM_VENV:?the node mode sets E2E_VLLM_VENV (hack/vllm-venv.sh)}"
[[ -x "${venv}/bin/vllm" ]] || fail "no vllm in ${venv}"
ns="$(case_ns e2e-vllm)"
new_ns "${ns}" kvoffload.io/injection=enabled
k label namespace "${ns}" --overwrite pod-security.kubernetes.io/enforce=privileged >/dev/null

# The control: the same hostPath in a namespace at the case namespaces' default level.
baseline_ns="$(case_ns e2e-baseline)"
new_ns "${baseline_ns}"
hostpath_pod='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"hostpath"},"spec":{
  "containers":[{"name":"c","image":"'"${E2E_STANDIN_IMAGE}"'","volumeMounts":[{"name":"v","mountPath":"/v"}]}],
  "volumes":[{"name":"v","hostPath":{"path":"'"${venv}"'"}}]}}'
if out="$(k -n "${baseline_ns}" create --dry-run=server -f - 2>&1 <<<"${hostpath_pod}")"; then
  fail "a hostPath pod was admitted in the baseline namespace ${baseline_ns}: ${out}"
fi
assert_contains "${out}" "hostPath" "Pod Security's refusal of the hostPath pod"

# The model, made with the venv's torch and transformers; the pod mounts it at /mnt/models.
model="${E2E_STATE}/vllm-model"
"${venv}/bin/python" - "${E2E_REPO}/tests/vllm" "${model}" <<'PY' || fail "making the model failed"
import sys
sys.path.insert(0, sys.argv[1])
import tiny_model
tiny_model.make(sys.argv[2])
PY
# The venv's interpreter (pyvenv.cfg's home): mounted too unless the image's Debian Python is it.
python_home="$(sed -n 's/^home = //p' "${venv}/pyvenv.cfg")"
python_prefix="$(dirname "${python_home}")"

k -n "${ns}" apply -f - >/dev/null <<'YAML'
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata:
  name: tiny
spec:
  kvCacheOffloading:
    cpu: "2Mi"
    evictionPolicy: lru
    secondary:
      - fileSystem:
          emptyDir:
            size: "64Mi"
YAML
spec="$(k -n "${ns}" get llminferenceservice tiny -o json | jq -c .spec.kvCacheOffloading)"
main="$(python3 "${E2E_REPO}/tests/webhook/kserve_fixtures.py" container tiny "${ns}" "${spec}")"
gpu_blocks=24
block_bytes="$(python3 -c "import sys; sys.path.insert(0, '${E2E_REPO}/tests/vllm'); import tiny_model; print(tiny_model.BLOCK_BYTES)")"
tokens_per_block="$(python3 -c "import sys; sys.path.insert(0, '${E2E_REPO}/tests/vllm'); import tiny_model; print(tiny_model.TOKENS_PER_BLOCK)")"
pod_json="$(jq -n --argjson main "${main}" --arg image "${E2E_STANDIN_IMAGE}" --arg venv "${venv}" \
  --arg model "${model}" --arg py "${python_prefix}" \
  --arg blocks "${gpu_blocks}" --arg bytes "$((gpu_blocks * block_bytes))" --arg bs "${tokens_per_block}" '
  ($py | startswith("/usr")) as $debian_python |
  {apiVersion: "v1", kind: "Pod",
   metadata: {name: "vllm", labels: {
     "app.kubernetes.io/name": "tiny", "app.kubernetes.io/part-of": "llminferenceservice",
     "app.kubernetes.io/component": "llminferenceservice-workload",
     "kserve.io/component": "workload", "llm-d.ai/role": "both"}},
   spec: {restartPolicy: "Never", terminationGracePeriodSeconds: 30,
     containers: [$main + {
       image: $image, imagePullPolicy: "Never",
       # Fit vLLM to a tiny model on a CPU, as tests/vllm does: float32, no graph capture, a
       # KV cache of 24 blocks (one round of the client is 40).
       args: ["--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
              "--block-size", $bs, "--num-gpu-blocks-override", $blocks,
              "--kv-cache-memory-bytes", $bytes, "--enable-prompt-tokens-details"],
       env: [{name: "PATH", value: ($venv + "/bin:/usr/local/bin:/usr/bin:/bin")},
             {name: "HOME", value: "/tmp"}, {name: "HF_HUB_OFFLINE", value: "1"}],
       resources: {requests: {cpu: "100m", memory: "1Gi"}},
       volumeMounts: ([{name: "model", mountPath: "/mnt/models", readOnly: true},
                       {name: "vllm-venv", mountPath: $venv, readOnly: true},
                       {name: "tmp", mountPath: "/tmp"},
                       {name: "dshm", mountPath: "/dev/shm"}] +
                      (if $debian_python then [] else
                       [{name: "python", mountPath: $py, readOnly: true}] end))}],
     volumes: ([{name: "model", hostPath: {path: $model, type: "Directory"}},
                {name: "vllm-venv", hostPath: {path: $venv, type: "Directory"}},
                {name: "tmp", emptyDir: {}},
                {name: "dshm", emptyDir: {medium: "Memory", sizeLimit: "1Gi"}}] +
               (if $debian_python then [] else
                [{name: "python", hostPath: {path: $py, type: "Directory"}}] end))}}')"
create_pod "${ns}" "${pod_json}" >/dev/null
pod="$(get_pod "${ns}" vllm)"
assert_injected_once "${pod}" 1
assert_eq "args" "$(jqv "${pod}" '.metadata.annotations["kvoffload.io/status"] | fromjson | .vllmFlag')" "where the webhook put the flag"

running() { [[ "$(pod_phase "${ns}" vllm)" == Running/* ]] || [[ "$(pod_phase "${ns}" vllm)" == Failed/* ]]; }
wait_until 180 "pod vllm to run" running
[[ "$(pod_phase "${ns}" vllm)" == Running/* ]] \
  || { k -n "${ns}" logs vllm -c main --tail 60 || true; fail "pod vllm: $(pod_phase "${ns}" vllm)"; }
ip="$(k -n "${ns}" get pod vllm -o jsonpath='{.status.podIP}')"
t0=${SECONDS}
result="$(python3 "${E2E_REPO}/e2e/node/vllm_client.py" "http://${ip}:8000" 8 | sed -n 's/^KVOFFLOAD-E2E-VLLM //p')" \
  || { k -n "${ns}" logs vllm -c main --tail 80 || true; fail "the client failed"; }
echo "client: $((SECONDS - t0))s (vLLM start included): ${result}"
log="$(k -n "${ns}" logs vllm -c main)"
[[ -n "${result}" ]] || { tail -n 80 <<<"${log}"; fail "no KVOFFLOAD-E2E-VLLM line from the client"; }
assert_eq "[]" "$(jq -c .failures <<<"${result}")" "the client's checks"
assert_contains "${log}" "vllm version '0.32.0+cpu'" "KServe's launch script ran the real vllm"
assert_contains "${log}" "kvoffload: engine started: device host" "the adapter started libkvoffload"
# vLLM's default process layout on its CPU build: the engine core in a process of its own.
assert_contains "${log}" "(EngineCore" "vLLM's engine core in its own process"
# An emptyDir tier keeps its blocks in one slot file, allocated as blocks arrive: bytes there
# mean blocks written.
bytes="$(k -n "${ns}" exec vllm -c main -- /usr/bin/python3 -c \
  'import os; print(sum(os.path.getsize(os.path.join(d, n)) for d, _, f in os.walk("/mnt/kv-cache-0") for n in f))')"
echo "bytes on the emptyDir tier: ${bytes}"
((bytes > 0)) || fail "nothing on the emptyDir tier /mnt/kv-cache-0"
k -n "${ns}" delete pod vllm --wait=false >/dev/null
