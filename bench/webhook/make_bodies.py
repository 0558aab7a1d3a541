#!/usr/bin/env python3
"""Writes the two AdmissionReview bodies the webhook benchmark posts: a small pod and a
KServe-rendered pod of about 12 KB (the size LLMInferenceService pods reach with their env,
probes and init containers). Its container "main" is rendered by tests/webhook/kserve_fixtures.py
from KServe's launch script, as KServe's controller writes it (`/bin/bash -c SCRIPT --` with the
user's args), so the benchmark parses and patches the launch real pods have; the 88 env entries
stand in for the size of a real pod's env."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "webhook"))
import kserve_fixtures  # noqa: E402  (the one renderer of KServe's launch)

out = sys.argv[1]
spec = {"cpu": "10Gi", "evictionPolicy": "arc", "secondary": [
    {"fileSystem": {"emptyDir": {"size": "100Gi"}}},
    {"fileSystem": {"pvc": {"spec": {"accessModes": ["ReadWriteOnce"],
                                     "resources": {"requests": {"storage": "200Gi"}}}}}}]}


def review(pod):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "6b1e7c5e-2a3f-4c1d-9f0e-123456789abc",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "team-a", "operation": "CREATE",
                        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                        "object": pod}}


small = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"generateName": "vllm-", "namespace": "team-a",
                      "annotations": {"kvoffload.io/config": json.dumps(spec), "kvoffload.io/vllm": "true"}},
         "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.32.0",
                                  "args": ["--model", "/models/llama"]}]}}

env = [{"name": f"VLLM_SETTING_{i:02d}", "value": f"value-{i:04d}-" + "x" * 40} for i in range(88)]
big = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"generateName": "llama-kserve-6d9f7c-", "namespace": "team-a",
                    "labels": {"app.kubernetes.io/name": "llama", "app.kubernetes.io/part-of": "llminferenceservice",
                               "app.kubernetes.io/component": "llminferenceservice-workload",
                               "kserve.io/component": "workload", "llm-d.ai/role": "both",
                               "pod-template-hash": "6d9f7c"},
                    "annotations": {"kvoffload.io/config": json.dumps(spec)},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-kserve-6d9f7c",
                                         "uid": "0d6a1c7e-1111-4c1e-9a65-1d3f0c1a2b3c", "controller": True,
                                         "blockOwnerDeletion": True}]},
       "spec": {"serviceAccountName": "llama-kserve",
                "initContainers": [{"name": "storage-initializer", "image": "kserve/storage-initializer:v0.15.0",
                                    "args": ["hf://meta-llama/Llama-3.1-8B-Instruct", "/mnt/models"],
                                    "volumeMounts": [{"name": "model-cache", "mountPath": "/mnt/models"}]}],
                "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.32.0",
                                "command": ["vllm", "serve", "/mnt/models"],
                                "args": ["--served-model-name", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000",
                                         "--max-model-len", "16384", "--gpu-memory-utilization", "0.92"],
                                "env": env,
                                "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 30,
                                                  "failureThreshold": 5},
                                "resources": {"limits": {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": "1"},
                                              "requests": {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "1"}},
                                "volumeMounts": [{"name": "model-cache", "mountPath": "/mnt/models", "readOnly": True},
                                                 {"name": "dshm", "mountPath": "/dev/shm"}]}],
                "volumes": [{"name": "model-cache", "emptyDir": {}},
                            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]}}

if not kserve_fixtures.render_main(big["spec"]["containers"][0], "meta-llama/Llama-3.1-8B-Instruct",
                                  "team-a", spec):
    sys.exit("make_bodies.py: the KServe pod's main container is not a launch KServe renders")

for name, pod in (("small", small), ("kserve", big)):
    with open(f"{out}/{name}.json", "w") as f:
        json.dump(review(pod), f, separators=(",", ":"))
