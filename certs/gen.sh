#!/usr/bin/env bash
# Generates the webhook's serving certificate with OpenSSL, signed by a local CA, and writes
# what the self-signed overlay consumes:
#   OUT/ca.crt OUT/ca.key        the CA (kept across runs; replaced only with --rotate-ca)
#   OUT/tls.crt OUT/tls.key      the serving certificate (new key and cert on every run)
#   OUT/secret.yaml              Secret kv-offload-webhook-tls (type kubernetes.io/tls)
#   OUT/cabundle-patch.yaml      JSON 6902 patch setting caBundle on both mutating entries
#   OUT/validating-cabundle-patch.yaml   the same for the validating configuration's entries
# Re-running rotates the serving certificate under the same CA, so the caBundle the API server
# holds stays valid and a rotation needs no change to the webhook configuration.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${here}/../manifests/overlays/self-signed/generated"
namespace="kv-offload-system"
service="kv-offload-webhook"
secret="kv-offload-webhook-tls"
webhook_entries=2
validating_entries=3
days=365
ca_days=3650
rotate_ca=0
extra_sans=()

usage() {
  cat <<USAGE
usage: certs/gen.sh [options]
  --out DIR           where to write (default manifests/overlays/self-signed/generated)
  --namespace NS      namespace of the Service and Secret (default ${namespace})
  --service NAME      Service name, for the DNS SANs (default ${service})
  --secret NAME       Secret name (default ${secret})
  --san NAME|IP       extra subject alternative name, repeatable (e.g. 127.0.0.1 for local runs)
  --days N            serving certificate validity in days (default ${days})
  --ca-days N         CA validity in days, used only when a CA is created (default ${ca_days})
  --rotate-ca         replace an existing CA; the previous CA stays in the caBundle once, so
                      serving certs of either CA are trusted while the new Secret rolls out
  --webhooks N        number of entries in the webhook configuration to patch (default ${webhook_entries})
  --validating-webhooks N
                      number of entries in the validating configuration (default ${validating_entries})
USAGE
}

die() { echo "gen.sh: error: $*" >&2; exit 1; }

while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --namespace) namespace="$2"; shift 2 ;;
    --service) service="$2"; shift 2 ;;
    --secret) secret="$2"; shift 2 ;;
    --san) extra_sans+=("$2"); shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --ca-days) ca_days="$2"; shift 2 ;;
    --rotate-ca) rotate_ca=1; shift ;;
    --webhooks) webhook_entries="$2"; shift 2 ;;
    --validating-webhooks) validating_entries="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "${days}" =~ ^[1-9][0-9]*$ ]] || die "--days must be a positive integer, got '${days}'"
[[ "${ca_days}" =~ ^[1-9][0-9]*$ ]] || die "--ca-days must be a positive integer, got '${ca_days}'"
[[ "${webhook_entries}" =~ ^[1-9][0-9]*$ ]] || die "--webhooks must be a positive integer"
[[ "${validating_entries}" =~ ^[1-9][0-9]*$ ]] || die "--validating-webhooks must be a positive integer"
command -v openssl >/dev/null || die "openssl not found"

mkdir -p "${out}"
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# --- CA ---------------------------------------------------------------------------------------
if [[ -f "${out}/ca.crt" || -f "${out}/ca.key" ]]; then
  if ((rotate_ca)); then
    cp "${out}/ca.crt" "${tmp}/ca-previous.crt"
    echo "gen.sh: rotating CA (previous CA kept in the caBundle)" >&2
    create_ca=1
  else
    [[ -f "${out}/ca.crt" && -f "${out}/ca.key" ]] \
      || die "${out} holds only one of ca.crt/ca.key; remove it or pass --rotate-ca"
    openssl x509 -in "${out}/ca.crt" -noout -checkend 0 >/dev/null \
      || die "CA ${out}/ca.crt has expired; pass --rotate-ca to replace it"
    # A serving certificate that outlives its CA is refused by the API server from the CA's
    # end on, with failurePolicy Fail, and its own expiry (what the alert watches) is later.
    openssl x509 -in "${out}/ca.crt" -noout -checkend $((days * 86400)) >/dev/null \
      || die "CA ${out}/ca.crt expires within the --days ${days} the serving certificate would" \
             "be valid ($(openssl x509 -in "${out}/ca.crt" -noout -enddate | cut -d= -f2));" \
             "pass --rotate-ca, or a shorter --days"
    echo "gen.sh: reusing CA ${out}/ca.crt (pass --rotate-ca to replace it)" >&2
    create_ca=0
  fi
else
  ((rotate_ca)) && echo "gen.sh: no CA to rotate in ${out}; creating one" >&2
  create_ca=1
fi
if ((create_ca)); then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "${tmp}/ca.key" -out "${tmp}/ca.crt" -days "${ca_days}" -sha256 \
    -subj "/O=kv-offload/CN=kv-offload-webhook-ca" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null \
    || die "openssl could not create the CA"
  mv -f "${tmp}/ca.key" "${out}/ca.key"
  mv -f "${tmp}/ca.crt" "${out}/ca.crt"
fi

# --- serving certificate ----------------------------------------------------------------------
sans="DNS:${service},DNS:${service}.${namespace},DNS:${service}.${namespace}.svc"
sans+=",DNS:${service}.${namespace}.svc.cluster.local"
for s in "${extra_sans[@]}"; do
  if [[ "${s}" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "${s}" == *:* ]]; then
    sans+=",IP:${s}"
  else
    sans+=",DNS:${s}"
  fi
done
cat > "${tmp}/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=${sans}
EXT
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "${tmp}/tls.key" -out "${tmp}/tls.csr" \
  -subj "/O=kv-offload/CN=${service}.${namespace}.svc" 2>/dev/null \
  || die "openssl could not create the serving key"
openssl x509 -req -in "${tmp}/tls.csr" -CA "${out}/ca.crt" -CAkey "${out}/ca.key" \
  -CAcreateserial -CAserial "${tmp}/ca.srl" -out "${tmp}/tls.crt" -days "${days}" -sha256 \
  -extfile "${tmp}/ext.cnf" 2>/dev/null || die "openssl could not sign the serving certificate"
openssl verify -CAfile "${out}/ca.crt" "${tmp}/tls.crt" >/dev/null \
  || die "the new serving certificate does not verify against ${out}/ca.crt"

bundle="${tmp}/bundle.pem"
cat "${out}/ca.crt" > "${bundle}"
[[ -f "${tmp}/ca-previous.crt" ]] && cat "${tmp}/ca-previous.crt" >> "${bundle}"

# --- manifests --------------------------------------------------------------------------------
b64() { base64 -w0 < "$1"; }
cat > "${tmp}/secret.yaml" <<YAML
# Generated by certs/gen.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ); holds a private key: do not commit.
apiVersion: v1
kind: Secret
metadata:
  name: ${secret}
  namespace: ${namespace}
  labels:
    app.kubernetes.io/part-of: kv-offload
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "${tmp}/tls.crt")
  tls.key: $(b64 "${tmp}/tls.key")
  ca.crt: $(b64 "${bundle}")
YAML
cabundle_patch() { # ENTRIES
  echo "# Generated by certs/gen.sh: the CA bundle the API server uses to verify the webhook."
  for ((i = 0; i < $1; i++)); do
    echo "- op: add"
    echo "  path: /webhooks/${i}/clientConfig/caBundle"
    echo "  value: $(b64 "${bundle}")"
  done
}
cabundle_patch "${webhook_entries}" > "${tmp}/cabundle-patch.yaml"
cabundle_patch "${validating_entries}" > "${tmp}/validating-cabundle-patch.yaml"
cp "${bundle}" "${tmp}/ca-bundle.crt"

# Publish each file with a rename so a reader never sees a half-written file.
for f in tls.key tls.crt ca-bundle.crt secret.yaml cabundle-patch.yaml validating-cabundle-patch.yaml; do
  mv -f "${tmp}/${f}" "${out}/${f}"
done
chmod 600 "${out}/ca.key" "${out}/tls.key" "${out}/secret.yaml"
chmod 644 "${out}/ca.crt" "${out}/tls.crt" "${out}/ca-bundle.crt" "${out}/cabundle-patch.yaml" \
  "${out}/validating-cabundle-patch.yaml"

echo "gen.sh: wrote ${out}/{ca.crt,ca.key,tls.crt,tls.key,ca-bundle.crt,secret.yaml,cabundle-patch.yaml,validating-cabundle-patch.yaml}"
echo "gen.sh: serving cert $(openssl x509 -in "${out}/tls.crt" -noout -enddate) (valid ${days} days)"
echo "gen.sh: SANs ${sans}"
echo "gen.sh: CA $(openssl x509 -in "${out}/ca.crt" -noout -enddate)"
