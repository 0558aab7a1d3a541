// API server access for the resolver: connection settings from a kubeconfig or the pod's
// service account, and a ClusterReader that GETs objects over HTTPS. The service-account token
// is re-read when its file changes (projected tokens rotate hourly). Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_KUBE_CLIENT_H_
#define KVOFFLOAD_WEBHOOK_KUBE_CLIENT_H_

#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kvoffload/status.h"
#include "webhook/cluster_reader.h"

namespace kvoffload::webhook {

struct KubeConnection {
  std::string host;  // without brackets for IPv6
  int port = 443;
  // The server URL's path ("/k8s/clusters/c-1" behind a Rancher-style proxy), put before every
  // request's path as kubectl does; empty, or "/..." without a trailing slash.
  std::string path_prefix;
  // The kubeconfig's tls-server-name: the name sent as SNI and verified against the API
  // server's certificate instead of `host`; empty: `host`.
  std::string tls_server_name;
  std::string ca_pem;           // the only CAs trusted; empty: the system trust store
  // Where ca_pem came from ("certificate-authority of cluster x in kubeconfig /p"), for
  // TLS verification errors: they must say which setting to fix.
  std::string ca_source;
  bool insecure_skip_verify = false;
  std::string client_cert_pem;  // client certificate auth, optional
  std::string client_key_pem;
  std::string token;            // bearer token, optional
  std::string token_file;       // re-read when it changes; wins over `token`
  // The most one GET may take (connect, TLS, request and answer); a caller's earlier
  // deadline shortens it.
  std::chrono::milliseconds timeout{2000};
};

// Reads the current context of a kubeconfig file (clusters/users/contexts, *-data fields or
// file paths relative to the kubeconfig, token or tokenFile, a server URL with a path,
// tls-server-name).
Result<KubeConnection> LoadKubeconfig(const std::string& path);

// In-cluster settings: KUBERNETES_SERVICE_HOST/PORT and the service account's files under
// `sa_dir` (/var/run/secrets/kubernetes.io/serviceaccount). NotFound when not in a pod;
// FailedPrecondition, naming the file, when in a pod whose service account cannot be used.
Result<KubeConnection> InClusterConnection(const std::string& sa_dir);

// Errors keep their meaning for the cache: a 404 is "no object" (not an error), a 403 is
// FailedPrecondition (an answer, never hidden behind an older copy), and every other failure
// (unreachable, timeout, other HTTP statuses with their code in the message, an answer that is
// too large, not JSON, or not the object asked for) is Unavailable.
class KubeClusterReader final : public ClusterReader {
 public:
  explicit KubeClusterReader(KubeConnection connection);
  ~KubeClusterReader() override;
  KubeClusterReader(const KubeClusterReader&) = delete;
  KubeClusterReader& operator=(const KubeClusterReader&) = delete;
  Result<std::optional<nlohmann::json>> GetBefore(const ObjectRef& ref,
                                                  Deadline deadline) override;
  bool Authoritative() const override { return true; }

 private:
  // GETs `path` (below the server URL's own path) and checks the answer is `ref`.
  Result<std::optional<nlohmann::json>> GetPath(const ObjectRef& ref, const std::string& path,
                                                Deadline deadline);
  std::string CurrentToken();

  const KubeConnection conn_;
  // conn_.ca_pem as a file (a memfd, /proc/self/fd/N): cpp-httplib trusts only the CAs of a
  // file it is given, where with a certificate store it added the system's (Debian's public
  // CAs in the image) to ours. Empty without ca_pem.
  int ca_fd_ = -1;
  std::string ca_path_;
  std::mutex token_mu_;
  std::string token_;          // GUARDED_BY(token_mu_)
  std::timespec token_mtime_{};  // GUARDED_BY(token_mu_)
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_KUBE_CLIENT_H_
