# End to end.
#   make controlplane  build kube-apiserver, kube-controller-manager, kubectl and etcd into the cache
#   make e2e           the cases against the local control plane (E2E_CLUSTER=kind: against kind)
#   make demo          (Makefile) hack/demo.sh: local control plane + webhook + examples/
.PHONY: controlplane e2e
controlplane:
	./e2e/controlplane/build.sh

e2e: build controlplane
	E2E_WEBHOOK_BIN=$(abspath $(BUILD))/webhook/kv-offload-webhook ./e2e/run.sh
