#!/usr/bin/env python3
"""Checks the objects that `kubectl kustomize` rendered for one overlay against the deployment
contract (docs/design.md). Usage: check_rendered.py OVERLAY < rendered.yaml
Prints one line per failed expectation and exits 1 when there is any."""
import sys

import yaml

overlay = sys.argv[1]
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


def one(kind, name=None):
    found = [d for d in docs if d.get("kind") == kind
             and (name is None or d["metadata"]["name"] == name)]
    expect(len(found) == 1, f"exactly one {kind} {name or ''} (found {len(found)})")
    return found[0] if found else {}


ns = "kv-offload-system"
namespace = one("Namespace", ns)
expect(namespace.get("metadata", {}).get("labels", {})
       .get("pod-security.kubernetes.io/enforce") == "restricted",
       "namespace enforces the restricted Pod Security level")
one("ServiceAccount", "kv-offload-webhook")

role = one("ClusterRole", "kv-offload-webhook")
granted = set()
for rule in role.get("rules", []):
    expect(rule.get("verbs", []) == ["get"],
           f"ClusterRole rule {rule} grants only get (the webhook never lists or watches)")
    for group in rule.get("apiGroups", []):
        for res in rule.get("resources", []):
            granted.add((group, res))
expect(granted == {("serving.kserve.io", "llminferenceservices"),
                   ("serving.kserve.io", "llminferenceserviceconfigs"),
                   ("", "persistentvolumeclaims"), ("", "namespaces")},
       "ClusterRole covers exactly llminferenceservices, llminferenceserviceconfigs, "
       f"persistentvolumeclaims, namespaces: {granted}")
binding = one("ClusterRoleBinding", "kv-offload-webhook")
expect(binding.get("subjects") == [{"kind": "ServiceAccount", "name": "kv-offload-webhook",
                                    "namespace": ns}], "binding names the webhook's ServiceAccount")

dep = one("Deployment", "kv-offload-webhook")
spec = dep.get("spec", {})
expect(spec.get("replicas") == 2, "Deployment has 2 replicas")
pod = spec.get("template", {}).get("spec", {})
expect(bool(pod.get("topologySpreadConstraints")) or
       bool(pod.get("affinity", {}).get("podAntiAffinity")), "replicas are spread")
psc = pod.get("securityContext", {})
expect(psc.get("runAsNonRoot") is True, "pod runAsNonRoot")
expect(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccomp RuntimeDefault")
containers = pod.get("containers", [])
expect(len(containers) == 1, "one webhook container")
c = containers[0] if containers else {}
sc = c.get("securityContext", {})
expect(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation false")
expect(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
expect(sc.get("capabilities", {}).get("drop") == ["ALL"], "all capabilities dropped")
expect(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "container seccomp")
res = c.get("resources", {})
expect({"cpu", "memory"} <= set(res.get("requests", {})) and
       {"cpu", "memory"} <= set(res.get("limits", {})), "cpu/memory requests and limits")
expect(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "readiness /readyz")
expect(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "liveness /healthz")
args = c.get("args", [])
expect(args[:1] == ["serve"], "container runs `serve`")
for flag in ("--port=8443", "--metrics-port=9090"):
    expect(flag in args, f"arg {flag}")
expect(any(a.startswith("--agent-image=") and len(a) > len("--agent-image=") for a in args),
       "--agent-image is set")
# The lookups of one admission share --lookup-timeout; with a slow API server our answer (naming
# the lookup) must reach the API server before its own timeoutSeconds does.
lookup = [a.split("=", 1)[1] for a in args if a.startswith("--lookup-timeout=")]
expect(len(lookup) == 1 and lookup[0].endswith("s") and lookup[0][:-1].isdigit(),
       f"--lookup-timeout=<seconds>s set once: {lookup}")
lookup_s = int(lookup[0][:-1]) if lookup and lookup[0][:-1].isdigit() else 0
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
expect(ports == {"https": 8443, "metrics": 9090}, f"container ports https 8443, metrics 9090: {ports}")
tls_secret = [v.get("secret", {}).get("secretName") for v in pod.get("volumes", []) if "secret" in v]
expect(tls_secret == ["kv-offload-webhook-tls"], "serving cert mounted from kv-offload-webhook-tls")
expect(pod.get("automountServiceAccountToken") is not False, "SA token mounted (lookups)")
labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
expect(labels.get("kvoffload.io/inject") == "false", "webhook pods opt out of injection")

svc = one("Service", "kv-offload-webhook")
sports = {p.get("port"): p.get("targetPort") for p in svc.get("spec", {}).get("ports", [])}
expect(sports.get(443) == "https", f"Service 443 -> https (8443): {sports}")
expect(9090 in sports, "Service exposes metrics")
pdb = one("PodDisruptionBudget", "kv-offload-webhook")
expect(pdb.get("spec", {}).get("minAvailable") == 1, "PDB minAvailable 1")
np = one("NetworkPolicy", "kv-offload-webhook")
nps = np.get("spec", {})
expect(nps.get("policyTypes") == ["Ingress"], "NetworkPolicy restricts ingress")
allowed = sorted(p["port"] for rule in nps.get("ingress", []) for p in rule.get("ports", []))
expect(allowed == [8443, 9090], f"NetworkPolicy admits only 8443 and 9090: {allowed}")

mwc = one("MutatingWebhookConfiguration", "kv-offload-webhook")
hooks = mwc.get("webhooks", [])
expect(len(hooks) == 2, "two webhook entries")
for h in hooks:
    n = h.get("name")
    expect(h.get("sideEffects") == "None", f"{n}: sideEffects None")
    expect(h.get("admissionReviewVersions") == ["v1"], f"{n}: admissionReviewVersions [v1]")
    expect(h.get("timeoutSeconds") == 5, f"{n}: timeoutSeconds 5")
    expect(lookup_s + 2 <= h.get("timeoutSeconds", 0),
           f"{n}: --lookup-timeout {lookup_s}s at least 2 s below timeoutSeconds")
    expect(h.get("reinvocationPolicy") == "IfNeeded", f"{n}: reinvocationPolicy IfNeeded")
    expect(h.get("failurePolicy") == "Fail", f"{n}: failurePolicy Fail")
    rules = h.get("rules", [])
    expect(len(rules) == 1 and rules[0].get("operations") == ["CREATE"] and
           rules[0].get("resources") == ["pods"] and rules[0].get("apiGroups") == [""],
           f"{n}: pods/CREATE only")
    svcref = h.get("clientConfig", {}).get("service", {})
    expect(svcref == {"name": "kv-offload-webhook", "namespace": ns, "path": "/mutate-pods",
                      "port": 443}, f"{n}: calls the Service on /mutate-pods")
    nsx = h.get("namespaceSelector", {}).get("matchExpressions", [])
    expect({"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", ns]} in nsx, f"{n}: skips kube-system and {ns}")
    objx = h.get("objectSelector", {}).get("matchExpressions", [])
    skips_false = any(e["key"] == "kvoffload.io/inject" and
                      ((e["operator"] == "NotIn" and "false" in e["values"]) or
                       (e["operator"] == "In" and e["values"] == ["true"])) for e in objx)
    expect(skips_false, f"{n}: skips pods labelled kvoffload.io/inject=false")
if len(hooks) == 2:
    expect({"key": "kvoffload.io/injection", "operator": "In", "values": ["enabled"]}
           in hooks[0]["namespaceSelector"]["matchExpressions"],
           "entry 1 selects kvoffload.io/injection=enabled namespaces")
    expect({"key": "kvoffload.io/injection", "operator": "DoesNotExist"}
           in hooks[1]["namespaceSelector"]["matchExpressions"],
           "entry 2 skips namespaces with the injection label (no pod matches both entries)")
    expect({"key": "kvoffload.io/inject", "operator": "In", "values": ["true"]}
           in hooks[1]["objectSelector"]["matchExpressions"],
           "entry 2 selects pods labelled kvoffload.io/inject=true")

if overlay == "self-signed":
    secret = one("Secret", "kv-offload-webhook-tls")
    expect(secret.get("type") == "kubernetes.io/tls" and
           {"tls.crt", "tls.key"} <= set(secret.get("data", {})), "TLS Secret with tls.crt/tls.key")
    for h in hooks:
        expect(len(h.get("clientConfig", {}).get("caBundle", "")) > 100, f"{h.get('name')}: caBundle set")
elif overlay == "cert-manager":
    ann = mwc.get("metadata", {}).get("annotations", {})
    expect(ann.get("cert-manager.io/inject-ca-from") == f"{ns}/kv-offload-webhook-serving",
           "cert-manager.io/inject-ca-from names the serving Certificate")
    cert = one("Certificate", "kv-offload-webhook-serving")
    expect(cert.get("spec", {}).get("secretName") == "kv-offload-webhook-tls",
           "Certificate writes the Secret the Deployment mounts")
    expect(f"kv-offload-webhook.{ns}.svc" in cert.get("spec", {}).get("dnsNames", []),
           "Certificate has the Service DNS name")
    ca = one("Certificate", "kv-offload-ca")
    expect(ca.get("spec", {}).get("isCA") is True, "CA Certificate isCA")
    one("Issuer", "kv-offload-selfsigned")
    one("Issuer", "kv-offload-ca")

# The apply-time checks: same Service and certificate, never blocking an apply (Ignore).
vwc = one("ValidatingWebhookConfiguration", "kv-offload-webhook")
vhooks = {h.get("name"): h for h in vwc.get("webhooks", [])}
expect(set(vhooks) == {"specs.validate.kvoffload.io", "workloads.namespace.validate.kvoffload.io",
                       "workloads.object.validate.kvoffload.io"},
       f"three validating entries: {sorted(vhooks)}")
def resources_of(h):
    return {(g, v, r) for rule in h.get("rules", []) for g in rule.get("apiGroups", [])
            for v in rule.get("apiVersions", []) for r in rule.get("resources", [])}
for n, h in vhooks.items():
    expect(h.get("failurePolicy") == "Ignore", f"{n}: failurePolicy Ignore")
    expect(h.get("sideEffects") == "None", f"{n}: sideEffects None (dry-run applies are checked)")
    expect(h.get("admissionReviewVersions") == ["v1"], f"{n}: admissionReviewVersions [v1]")
    expect(h.get("timeoutSeconds") == 5, f"{n}: timeoutSeconds 5")
    expect(lookup_s + 2 <= h.get("timeoutSeconds", 0),
           f"{n}: --lookup-timeout {lookup_s}s at least 2 s below timeoutSeconds")
    expect(all(sorted(rule.get("operations", [])) == ["CREATE", "UPDATE"] for rule in h.get("rules", [])),
           f"{n}: CREATE and UPDATE")
    svcref = h.get("clientConfig", {}).get("service", {})
    path = "/validate-labelled" if n.startswith("workloads.object.") else "/validate"
    expect(svcref == {"name": "kv-offload-webhook", "namespace": ns, "path": path, "port": 443},
           f"{n}: calls the Service on {path}")
    nsx = h.get("namespaceSelector", {}).get("matchExpressions", [])
    expect({"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", ns]} in nsx, f"{n}: skips kube-system and {ns}")
    if overlay == "self-signed":
        expect(len(h.get("clientConfig", {}).get("caBundle", "")) > 100, f"{n}: caBundle set")
if len(vhooks) == 3:
    expect(resources_of(vhooks["specs.validate.kvoffload.io"]) ==
           {("serving.kserve.io", v, r) for v in ("v1alpha1", "v1alpha2")
            for r in ("llminferenceservices", "llminferenceserviceconfigs")}
           | {("", "v1", "namespaces")},
           "specs entry: LLMInferenceService(Config) v1alpha1/v1alpha2 and Namespaces")
    workloads = {("apps", "v1", "deployments"), ("apps", "v1", "statefulsets"),
                 ("apps", "v1", "replicasets"), ("apps", "v1", "daemonsets"),
                 ("batch", "v1", "jobs"), ("batch", "v1", "cronjobs"),
                 ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")}
    for n in ("workloads.namespace.validate.kvoffload.io", "workloads.object.validate.kvoffload.io"):
        expect(resources_of(vhooks[n]) == workloads, f"{n}: every workload with a pod template")
    # The same split as the pod entries, so a workload's check matches how its pods are selected.
    expect({"key": "kvoffload.io/injection", "operator": "In", "values": ["enabled"]}
           in vhooks["workloads.namespace.validate.kvoffload.io"]["namespaceSelector"]["matchExpressions"],
           "namespace workloads entry selects kvoffload.io/injection=enabled")
    expect({"key": "kvoffload.io/injection", "operator": "DoesNotExist"}
           in vhooks["workloads.object.validate.kvoffload.io"]["namespaceSelector"]["matchExpressions"],
           "object workloads entry covers namespaces without the injection label")
if overlay == "cert-manager":
    expect(vwc.get("metadata", {}).get("annotations", {}).get("cert-manager.io/inject-ca-from") ==
           f"{ns}/kv-offload-webhook-serving", "validating configuration: cert-manager injects the CA")

for f in failures:
    print(f"{overlay}: FAIL {f}")
print(f"{overlay}: {len(docs)} objects, {len(failures)} failed expectations")
sys.exit(1 if failures else 0)
