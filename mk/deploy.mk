# Deployment artefacts: manifests, certificates, images.
#   make manifests     render base and both overlays into $(BUILD)/manifests (self-signed needs certs)
#   make certs         certs/gen.sh into manifests/overlays/self-signed/generated (rotates the serving cert)
#   make webhook-dist  stage the webhook binary and its shared libraries (the webhook image's payload)
#   make agent-dist    stage /opt/kvoffload (library, Python package, install entrypoint)
#   make images        build both images with $(CONTAINER_TOOL); the Dockerfiles run the *-dist targets
CONTAINER_TOOL ?= docker
IMAGE_REPO     ?= kv-offload
IMAGE_TAG      ?= 0.1.0
DIST           ?= dist

.PHONY: manifests certs webhook-dist agent-dist images
manifests:
	./tests/manifests/check_manifests.sh
	@mkdir -p $(BUILD)/manifests
	KUBECTL="$$(./e2e/controlplane/build.sh kubectl | tail -n1)/kubectl"; \
	for d in manifests/base manifests/overlays/*/; do \
	  n=$$(basename $$d); \
	  if [ "$$n" = self-signed ] && [ ! -f $$d/generated/secret.yaml ]; then \
	    echo "skipping $$n: run 'make certs' first"; continue; fi; \
	  $$KUBECTL kustomize $$d > $(BUILD)/manifests/$$n.yaml && echo "$(BUILD)/manifests/$$n.yaml"; \
	done

certs:
	./certs/gen.sh

webhook-dist: build
	./hack/stage-webhook.sh $(BUILD) $(DIST)/webhook

agent-dist: build
	./hack/stage-agent.sh $(BUILD) $(DIST)/offload-agent

images:
	@command -v $(CONTAINER_TOOL) >/dev/null || { \
	  echo "make images: $(CONTAINER_TOOL) not found (set CONTAINER_TOOL=podman or install Docker)" >&2; exit 1; }
	$(CONTAINER_TOOL) build -f webhook/Dockerfile -t $(IMAGE_REPO)/webhook:$(IMAGE_TAG) .
	$(CONTAINER_TOOL) build -f offload-agent/Dockerfile -t $(IMAGE_REPO)/offload-agent:$(IMAGE_TAG) .
