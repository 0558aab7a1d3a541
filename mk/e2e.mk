# End to end.
#   make controlplane  build kube-apiserver, kube-controller-manager, kubectl and etcd into the cache
#   make e2e           the cases against the local control plane and its node (E2E_NODE=0: no
#                      node; E2E_CLUSTER=kind: against kind)
#   make demo          (Makefile) hack/demo.sh: local control plane + webhook + examples/
.PHONY: controlplane e2e
controlplane:
	./e2e/controlplane/build.sh

# The staged trees are the node's image payloads (e2e/node/images.sh builds OCI archives of them).
e2e: build controlplane webhook-dist agent-dist
	E2E_WEBHOOK_BIN=$(abspath $(BUILD))/webhook/kv-offload-webhook DIST=$(abspath $(DIST)) ./e2e/run.sh
