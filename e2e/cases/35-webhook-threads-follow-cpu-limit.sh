# shellcheck shell=bash
# Case 35 (a node): the webhook Deployment sizes its threads by the CPU its container may use,
# not by the node's cores: the manifests' limits.cpu "1" is one CPU for the cgroup the runtime
# made, so one I/O thread and one admission computing at a time (docs/decisions.md, Server).
# The server logs what it found when it starts serving.
need_node
sel=app.kubernetes.io/name=kv-offload-webhook
limit="$(k -n kv-offload-system get deployment kv-offload-webhook -o json \
  | jq -r '.spec.template.spec.containers[] | select(.name == "webhook") | .resources.limits.cpu // empty')"
assert_eq "1" "${limit}" "the manifests' CPU limit of the webhook container"
pods="$(k -n kv-offload-system get pods -l "${sel}" -o jsonpath='{.items[*].metadata.name}')"
[[ -n "${pods}" ]] || fail "no webhook pods"
for pod in ${pods}; do
  line="$(k -n kv-offload-system logs "${pod}" -c webhook | jq -c 'select(.msg == "serving")' | tail -n 1)"
  [[ -n "${line}" ]] || fail "${pod}: no \"serving\" line in its log"
  echo "${pod}: ${line}"
  assert_eq "1" "$(jq -r .usableCpus <<<"${line}")" "${pod}: the CPUs it found it may use"
  assert_eq "1" "$(jq -r .ioThreads <<<"${line}")" "${pod}: its I/O threads"
done
