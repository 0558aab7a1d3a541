#include "webhook/kube_client.h"

#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "webhook/api_status.h"
#include "webhook/json_util.h"
#include "kvoffload/read_file.h"

namespace kvoffload::webhook {
namespace {

Result<std::string> Base64Decode(const std::string& text, const std::string& what) {
  std::string clean;
  for (char c : text) {
    if (c != '\n' && c != '\r' && c != ' ') clean += c;
  }
  if (clean.size() % 4 != 0) return Status::InvalidArgument(what + " is not valid base64");
  std::string out(clean.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()),
                                static_cast<int>(clean.size()));
  if (n < 0) return Status::InvalidArgument(what + " is not valid base64");
  // EVP_DecodeBlock counts padding bytes as output; drop them.
  size_t len = static_cast<size_t>(n);
  for (size_t i = clean.size(); i > 0 && clean[i - 1] == '='; --i) --len;
  out.resize(len);
  return out;
}

// "https://host[:port][/path]" -> host, port, path prefix. The path is kept (kubectl puts it
// before every request's path): proxies serve API servers below one (Rancher's
// /k8s/clusters/<id>), and cutting it sent every lookup to the proxy's own /apis/..., whose 404s
// admitted pods without offloading.
Status ParseServer(const std::string& server, KubeConnection* conn) {
  const std::string scheme = "https://";
  if (server.rfind(scheme, 0) != 0) {
    return Status::InvalidArgument("server \"" + server + "\" must be an https:// URL");
  }
  std::string rest = server.substr(scheme.size());
  if (rest.find_first_of("?#") != std::string::npos) {
    return Status::InvalidArgument("server \"" + server + "\" must not have a query or fragment");
  }
  const size_t slash = rest.find('/');
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  conn->path_prefix = prefix;
  rest = rest.substr(0, slash);
  std::string host = rest;
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return Status::InvalidArgument("bad server " + server);
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return Status::InvalidArgument("server \"" + server + "\" has no host");
  conn->host = host;
  conn->port = 443;
  if (!port.empty()) {
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || p <= 0 || p > 65535) {
      return Status::InvalidArgument("server \"" + server + "\" has a bad port");
    }
    conn->port = static_cast<int>(p);
  }
  return Status::Ok();
}

const YAML::Node FindNamed(const YAML::Node& list, const std::string& name, const char* field) {
  if (list.IsSequence()) {
    for (const YAML::Node& item : list) {
      if (item["name"] && item["name"].as<std::string>() == name) return item[field];
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// Reads `<key>-data` (base64) or `<key>` (a path relative to the kubeconfig's folder).
Result<std::string> DataOrFile(const YAML::Node& node, const std::string& key,
                               const std::filesystem::path& base) {
  if (node[key + "-data"]) return Base64Decode(node[key + "-data"].as<std::string>(), key + "-data");
  if (node[key]) {
    std::filesystem::path p = node[key].as<std::string>();
    if (p.is_relative()) p = base / p;
    return ReadWholeFile(p.string());
  }
  return std::string();
}

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// Answers larger than this are refused as soon as they are seen to be: the API server never
// sends an object near it (etcd keeps values up to 1.5 MiB, requests are capped at 3 MiB), so a
// bigger one is a proxy or server gone wrong, and read whole it cost its size in memory, kept in
// the cache and copied at every hit (a 100 MB answer was accepted).
constexpr size_t kMaxAnswerBytes = size_t{8} << 20;

// Ends `client`'s request at `end`: cpp-httplib bounds each read, not the answer, so a body sent
// a byte at a time (or never finished) held an admission, and the cache's waiters on the same
// object, far past the lookup budget. At `end` the watchdog shuts the connection's socket down,
// and the request's pending and next reads and writes fail at once. It holds its own duplicate
// of the socket's descriptor (taken as httplib creates the socket): shutdown() acts on the
// connection whoever else holds it, and the duplicate keeps the number from being reused for
// another file if httplib closes its own meanwhile. httplib's own stop() was not used: it takes
// the client's socket lock from this thread, a lock TSan cannot follow in Debian's
// uninstrumented library, and it waits out a connect or handshake that a shutdown cuts short.
class Watchdog {
 public:
  Watchdog(httplib::ClientImpl& client, std::chrono::steady_clock::time_point end)
      : thread_([this, end] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_until(lock, end, [this] { return done_; })) return;
          fired_ = true;
          if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
        }) {
    client.set_socket_options([this](socket_t sock) {
      std::lock_guard<std::mutex> lock(mu_);
      if (fd_ >= 0) ::close(fd_);
      fd_ = ::fcntl(sock, F_DUPFD_CLOEXEC, 0);
      if (fired_ && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // a socket made after the end
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool fired() {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;   // GUARDED_BY(mu_)
  bool fired_ = false;  // GUARDED_BY(mu_)
  int fd_ = -1;         // GUARDED_BY(mu_): our duplicate of the request's socket
  std::thread thread_;  // last: it uses the members above
};

// `host` as a numeric address: itself if it is one, else its first address from the resolver.
Result<std::string> NumericAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int err = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); err != 0) {
    return Status::Unavailable("cannot resolve " + host + ": " + ::gai_strerror(err));
  }
  char text[INET6_ADDRSTRLEN] = {};
  const int err = ::getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof(text), nullptr, 0,
                                NI_NUMERICHOST);
  ::freeaddrinfo(found);
  if (err != 0) return Status::Unavailable("cannot resolve " + host + ": " + ::gai_strerror(err));
  return std::string(text);
}

// The API server answers a GET of one object with that object. Anything else was used as it
// came: `null`, a list or `{}` as "exists, without a spec" (skipping the namespace default,
// and cached), another namespace's object from a misrouting proxy as the one asked for.
Status CheckAnswer(const nlohmann::json& obj, const ObjectRef& ref, const std::string& url) {
  const auto wrong = [&](const std::string& what) {
    return Status::Unavailable("GET " + url + ": the answer is not " + ref.ToString() + ": " + what);
  };
  if (!obj.is_object()) return wrong(std::string("a JSON ") + obj.type_name() + ", not an object");
  const auto metadata = obj.find("metadata");
  if (metadata == obj.end() || !metadata->is_object()) return wrong("it has no metadata");
  const auto field = [&](const char* key) {
    const auto it = metadata->find(key);
    return it != metadata->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (const std::string name = field("name"); name != ref.name) {
    return wrong("its metadata.name is \"" + name + "\"");
  }
  if (ref.kind != ObjectKind::kNamespace) {
    if (const std::string ns = field("namespace"); ns != ref.namespace_name) {
      return wrong("its metadata.namespace is \"" + ns + "\"");
    }
  }
  if (const auto spec = obj.find("spec"); spec != obj.end() && !spec->is_object()) {
    return wrong(std::string("its spec is a JSON ") + spec->type_name() + ", not an object");
  }
  return Status::Ok();
}

// Why TLS verification failed, and which setting decides it: "SSLServerVerification" alone
// sent operators guessing between the CA, the name and the clock.
std::string VerifyFailure(long verify_result, const KubeConnection& conn,
                          const std::string& name) {
  if (verify_result != X509_V_OK) {
    return "the API server's certificate failed verification: " +
           std::string(X509_verify_cert_error_string(verify_result)) + " (trusted CAs: " +
           conn.ca_source + ")";
  }
  // httplib checks the name after OpenSSL's chain checks passed: the chain is good.
  return "the API server's certificate is not valid for \"" + name + "\" (" +
         (conn.tls_server_name.empty()
              ? "the server's host; a kubeconfig's tls-server-name sets another name to verify"
              : "the kubeconfig's tls-server-name") +
         ")";
}

std::string StatusMessage(const std::string& body) {
  Result<nlohmann::json> parsed = ParseJson(body, "response");
  if (parsed.ok()) {
    const std::string msg = StringAt(*parsed, "message");
    if (!msg.empty()) return msg;
  }
  return body.substr(0, 200);
}

}  // namespace

Result<KubeConnection> LoadKubeconfig(const std::string& path) {
  try {
    Result<std::string> text = ReadWholeFile(path);
    if (!text.ok()) return Status::InvalidArgument("--kubeconfig: " + text.status().message());
    const YAML::Node root = YAML::Load(*text);
    const std::filesystem::path base = std::filesystem::path(path).parent_path();
    if (!root["current-context"]) {
      return Status::InvalidArgument("kubeconfig " + path + " has no current-context");
    }
    const std::string ctx_name = root["current-context"].as<std::string>();
    const YAML::Node ctx = FindNamed(root["contexts"], ctx_name, "context");
    if (!ctx) return Status::InvalidArgument("kubeconfig " + path + ": context " + ctx_name + " not found");
    const std::string cluster_name = ctx["cluster"] ? ctx["cluster"].as<std::string>() : "";
    const YAML::Node cluster = FindNamed(root["clusters"], cluster_name, "cluster");
    if (!cluster || !cluster["server"]) {
      return Status::InvalidArgument("kubeconfig " + path + ": cluster " + cluster_name +
                                     " not found or has no server");
    }
    KubeConnection conn;
    if (Status s = ParseServer(cluster["server"].as<std::string>(), &conn); !s.ok()) return s;
    Result<std::string> ca = DataOrFile(cluster, "certificate-authority", base);
    if (!ca.ok()) return ca.status();
    conn.ca_pem = *ca;
    const std::string where = " of cluster " + cluster_name + " in kubeconfig " + path;
    conn.ca_source = cluster["certificate-authority-data"] ? "certificate-authority-data" + where
                     : cluster["certificate-authority"]
                         ? "certificate-authority " +
                               cluster["certificate-authority"].as<std::string>() + where
                         : "the system's, no certificate-authority" + where;
    if (cluster["tls-server-name"]) {
      conn.tls_server_name = cluster["tls-server-name"].as<std::string>();
    }
    conn.insecure_skip_verify =
        cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>();
    const std::string user_name = ctx["user"] ? ctx["user"].as<std::string>() : "";
    const YAML::Node user = FindNamed(root["users"], user_name, "user");
    if (user) {
      Result<std::string> cert = DataOrFile(user, "client-certificate", base);
      Result<std::string> key = DataOrFile(user, "client-key", base);
      if (!cert.ok()) return cert.status();
      if (!key.ok()) return key.status();
      conn.client_cert_pem = *cert;
      conn.client_key_pem = *key;
      if (user["token"]) conn.token = user["token"].as<std::string>();
      if (user["tokenFile"]) {
        std::filesystem::path p = user["tokenFile"].as<std::string>();
        conn.token_file = (p.is_relative() ? base / p : p).string();
      }
    }
    return conn;
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument("kubeconfig " + path + " is not valid YAML: " + e.what());
  }
}

Result<KubeConnection> InClusterConnection(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr) {
    return Status::NotFound("KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod)");
  }
  std::string h = host;
  const std::string server = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) +
                             ":" + port;
  // In a pod from here on: what fails is its setup, not the absence of one.
  auto broken = [](const Status& s) {
    return Status::FailedPrecondition(
        "running in a pod (KUBERNETES_SERVICE_HOST is set), but its service account cannot be "
        "used for API lookups: " + s.message() +
        "; mount its token (automountServiceAccountToken: true) or pass --kubeconfig");
  };
  KubeConnection conn;
  if (Status s = ParseServer(server, &conn); !s.ok()) return broken(s);
  Result<std::string> ca = ReadWholeFile(sa_dir + "/ca.crt");
  if (!ca.ok()) return broken(ca.status());
  conn.ca_pem = *ca;
  conn.ca_source = "the in-cluster CA file " + sa_dir + "/ca.crt";
  conn.token_file = sa_dir + "/token";
  if (Result<std::string> t = ReadWholeFile(conn.token_file); !t.ok()) return broken(t.status());
  return conn;
}

KubeClusterReader::KubeClusterReader(KubeConnection connection) : conn_(std::move(connection)) {
  token_ = conn_.token;
  if (conn_.ca_pem.empty()) return;
  ca_fd_ = ::memfd_create("kvoffload-api-ca", MFD_CLOEXEC);
  if (ca_fd_ >= 0 &&
      ::write(ca_fd_, conn_.ca_pem.data(), conn_.ca_pem.size()) ==
          static_cast<ssize_t>(conn_.ca_pem.size())) {
    ca_path_ = "/proc/self/fd/" + std::to_string(ca_fd_);
  } else {
    // No CA file: every lookup is then refused with the CA's source named (GetPath), never
    // verified against the system's CAs instead.
    ca_path_ = "/nonexistent/kvoffload-api-ca";
  }
}

KubeClusterReader::~KubeClusterReader() {
  if (ca_fd_ >= 0) ::close(ca_fd_);
}

std::string KubeClusterReader::CurrentToken() {
  std::lock_guard<std::mutex> lock(token_mu_);
  if (conn_.token_file.empty()) return token_;
  struct stat st {};
  if (::stat(conn_.token_file.c_str(), &st) == 0 &&
      (st.st_mtim.tv_sec != token_mtime_.tv_sec || st.st_mtim.tv_nsec != token_mtime_.tv_nsec)) {
    if (Result<std::string> t = ReadWholeFile(conn_.token_file); t.ok()) {
      std::string token = *t;
      while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
      token_ = token;
      token_mtime_ = st.st_mtim;
    }
  }
  return token_;
}

Result<std::optional<nlohmann::json>> KubeClusterReader::GetPath(const ObjectRef& ref,
                                                                 const std::string& path,
                                                                 Deadline deadline) {
  const std::string bracketed = conn_.host.find(':') != std::string::npos
                                    ? "[" + conn_.host + "]" : conn_.host;
  const std::string authority = bracketed + ":" + std::to_string(conn_.port);
  const std::string target = conn_.path_prefix + path;
  const std::string url = "https://" + authority + target;
  // Whatever is left of the caller's budget, at most the configured timeout. cpp-httplib bounds
  // connecting and the TLS handshake with one timeout each (half the budget, so that a slow
  // connect leaves time for the answer) and each read and write; the watchdog ends whatever is
  // still going (request, headers, body) when the budget is spent.
  auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(conn_.timeout);
  bool cut = false;  // the admission's budget, not the configured timeout, bounds this GET
  if (deadline != Deadline::max()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    cut = left < budget;
    budget = std::min(budget, left);
  }
  if (budget.count() <= 0) {
    return Status::Unavailable("GET " + path + ": not sent, the lookup budget (--lookup-timeout) " +
                               "of this admission is spent");
  }
  const std::chrono::milliseconds phase = std::max(budget / 2, std::chrono::milliseconds(1));
  std::unique_ptr<X509, X509Free> cert;
  std::unique_ptr<EVP_PKEY, PkeyFree> key;
  if (!conn_.client_cert_pem.empty()) {
    BIO* cb = BIO_new_mem_buf(conn_.client_cert_pem.data(), static_cast<int>(conn_.client_cert_pem.size()));
    cert.reset(PEM_read_bio_X509(cb, nullptr, nullptr, nullptr));
    BIO_free(cb);
    BIO* kb = BIO_new_mem_buf(conn_.client_key_pem.data(), static_cast<int>(conn_.client_key_pem.size()));
    key.reset(PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr));
    BIO_free(kb);
    if (!cert || !key) return Status::InvalidArgument("client certificate or key is not valid PEM");
  }
  // With tls-server-name the client is made for that name (httplib sends its host as SNI and
  // verifies the certificate against it) and told to connect to the server's address instead.
  // That map takes numeric addresses only, so a host name is resolved here.
  const std::string& name = conn_.tls_server_name.empty() ? conn_.host : conn_.tls_server_name;
  std::map<std::string, std::string> addresses;
  if (!conn_.tls_server_name.empty()) {
    Result<std::string> address = NumericAddress(conn_.host);
    if (!address.ok()) return Status::Unavailable("GET " + url + ": " + address.status().message());
    addresses[name] = *address;
  }
  // One client per call: lookups are rare (cached) and this keeps calls independent, so one
  // slow API server answer never blocks another admission's lookup.
  httplib::SSLClient client(name, conn_.port, cert.get(), key.get());
  client.set_hostname_addr_map(std::move(addresses));
  if (!ca_path_.empty()) client.set_ca_cert_path(ca_path_);
  client.enable_server_certificate_verification(!conn_.insecure_skip_verify);
  const auto timeout = [](std::chrono::milliseconds t) {
    return std::pair{static_cast<time_t>(t.count() / 1000), static_cast<time_t>(t.count() % 1000 * 1000)};
  };
  client.set_connection_timeout(timeout(phase).first, timeout(phase).second);
  client.set_read_timeout(timeout(budget).first, timeout(budget).second);
  client.set_write_timeout(timeout(budget).first, timeout(budget).second);
  if (const std::string token = CurrentToken(); !token.empty()) client.set_bearer_token_auth(token);
  // The server's own authority, as kubectl sends it, not the tls-server-name httplib would.
  const httplib::Headers headers = {{"Accept", "application/json"}, {"Host", authority}};
  std::string body;
  std::string too_large;  // why the answer was refused for its size
  const auto started = std::chrono::steady_clock::now();
  bool out_of_time = false;  // the watchdog ended the request
  httplib::Result res = [&] {
    Watchdog watchdog(client, started + budget);
    httplib::Result r = client.Get(
        target, headers,
        [&](const httplib::Response& head) {
          const std::string length = head.get_header_value("Content-Length");
          if (!length.empty() && std::strtoull(length.c_str(), nullptr, 10) > kMaxAnswerBytes) {
            too_large = "Content-Length " + length;
            return false;
          }
          return true;
        },
        [&](const char* data, size_t size) {
          if (body.size() + size > kMaxAnswerBytes) {
            too_large = "more than " + std::to_string(kMaxAnswerBytes) + " bytes";
            return false;
          }
          body.append(data, size);
          return true;
        });
    out_of_time = watchdog.fired();
    return r;
  }();
  if (!too_large.empty()) {
    return Status::Unavailable("GET " + url + ": the answer for " + ref.ToString() +
                               " is too large (" + too_large + "; at most " +
                               std::to_string(kMaxAnswerBytes >> 20) +
                               " MiB is read, the API server keeps objects under 1.5 MiB)");
  }
  if (!res) {
    if (res.error() == httplib::Error::SSLServerVerification) {
      return Status::Unavailable("GET " + url + ": " +
                                 VerifyFailure(client.get_openssl_verify_result(), conn_, name));
    }
    // A connection refused or reset fails at once: saying it timed out would send the operator
    // to --lookup-timeout instead of to the API server's address.
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - started);
    std::string why = "GET " + url + ": " + httplib::to_string(res.error());
    if (!out_of_time && took < phase) {
      why += " (failed after " + std::to_string(took.count()) + " ms, not a timeout)";
    } else if (cut) {
      why += " (no answer within what was left of this admission's lookup budget, "
             "--lookup-timeout)";
    } else {
      why += " (no answer within --lookup-timeout)";
    }
    return Status::Unavailable(why);
  }
  // Not found whatever the body: the API server answers a path that no group version serves
  // (v1alpha2 where only v1alpha1 is installed) with net/http's plain "404 page not found",
  // not a Status (k8s.io/apiserver's notfoundhandler, 1.35), so a Status cannot be required.
  if (res->status == 404) return std::optional<nlohmann::json>();
  if (res->status == 403) {
    // A definite answer, not an outage: the cache must not hide it behind an older object.
    return Status::FailedPrecondition(
        "GET " + url + ": HTTP 403: " + StatusMessage(body) +
        " (the webhook's ServiceAccount may not read it: check the ClusterRole "
        "kv-offload-webhook and its binding, manifests/base/rbac.yaml)");
  }
  if (res->status != 200) {
    return ApiServerStatusError(res->status, "GET " + url, StatusMessage(body));
  }
  Result<nlohmann::json> obj = ParseJson(body, "the answer to GET " + url);
  if (!obj.ok()) return Status::Unavailable(obj.status().message());
  if (Status s = CheckAnswer(*obj, ref, url); !s.ok()) return s;
  return std::optional<nlohmann::json>(std::move(*obj));
}

Result<std::optional<nlohmann::json>> KubeClusterReader::GetBefore(const ObjectRef& ref,
                                                                   Deadline deadline) {
  switch (ref.kind) {
    case ObjectKind::kNamespace:
      return GetPath(ref, "/api/v1/namespaces/" + ref.name, deadline);
    case ObjectKind::kPersistentVolumeClaim:
      return GetPath(ref, "/api/v1/namespaces/" + ref.namespace_name + "/persistentvolumeclaims/" +
                     ref.name, deadline);
    case ObjectKind::kLLMInferenceService:
    case ObjectKind::kLLMInferenceServiceConfig: {
      const char* resource = ref.kind == ObjectKind::kLLMInferenceService
                                 ? "/llminferenceservices/"
                                 : "/llminferenceserviceconfigs/";
      // v1alpha2 first; clusters with only the older CRD version answer 404 there.
      for (const char* version : {"v1alpha2", "v1alpha1"}) {
        Result<std::optional<nlohmann::json>> r =
            GetPath(ref, std::string("/apis/serving.kserve.io/") + version + "/namespaces/" +
                    ref.namespace_name + resource + ref.name, deadline);
        if (!r.ok() || r->has_value()) return r;
      }
      return std::optional<nlohmann::json>();
    }
  }
  return Status::Internal("unknown object kind");
}

}  // namespace kvoffload::webhook
