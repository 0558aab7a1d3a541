// The transport layer: HTTPS (TLS 1.2+, reloading certificate) serving /mutate-pods, the
// apply-time checks /validate and /validate-labelled, /healthz and /readyz (on HttpsTransport),
// plus plain-HTTP Prometheus metrics on a second port. Shutdown() drains: readiness goes false,
// new requests are told to close their connection, in-flight requests finish. Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_SERVER_H_
#define KVOFFLOAD_WEBHOOK_SERVER_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "kvoffload/status.h"
#include "webhook/admission.h"
#include "webhook/cert_reloader.h"
#include "webhook/https_transport.h"
#include "webhook/metrics.h"

namespace kvoffload::webhook {

struct ServerOptions {
  std::string bind_address = "0.0.0.0";
  int port = 8443;          // 0: any free port (tests)
  int metrics_port = 9090;  // 0: any free port; -1: no metrics listener
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;  // when set, clients must present a certificate it signed
  std::chrono::milliseconds cert_poll_interval{1000};
  std::chrono::milliseconds shutdown_delay{5000};  // readiness false before we stop listening
  int threads = 64;  // admissions handled at once (each may wait on API server lookups)
  int max_connections = 4096;  // open HTTPS connections; more are closed on accept
  std::chrono::milliseconds request_timeout{10000};  // one request's headers and body, in total
  std::chrono::milliseconds handshake_timeout{5000};  // accept to TLS established
  // A connection with no request in progress (TLS established, or its last answer written),
  // until the next request's first byte. Above the API server's own idle timeout for webhook
  // connections (90 s: client-go's transports keep Go's default), so that the API server closes
  // an idle connection first: a connection we close just as it sends an admission fails that
  // admission (Go does not resend a POST it wrote), and the pod is refused (failurePolicy Fail)
  // or starts without offloading (Ignore). That includes connections that never carried a
  // request: Go pools a connection it dialed for a request another connection served first.
  std::chrono::milliseconds idle_timeout{120000};
};

class Server {
 public:
  // `handler` and `metrics` are not owned and must outlive the server.
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, AdmissionHandler* handler,
                                                Metrics* metrics);
  ~Server();

  // Binds and starts serving on background threads. After it returns OK the ports are bound.
  Status Start();
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  HttpsTransportStats transport_stats() const { return https_->stats(); }
  // The threads serving connections (one per CPU the process can use, at most 4).
  int io_threads() const { return https_->io_threads(); }
  bool ready() const { return ready_.load() && !draining_.load(); }
  // Drains and stops; returns when every in-flight request has been answered. Idempotent.
  void Shutdown();

 private:
  Server(ServerOptions options, AdmissionHandler* handler, Metrics* metrics);
  void Routes();
  HttpsResponse Route(const HttpsRequest& req);
  HttpsResponse MetricsRoute(const HttpsRequest& req) const;
  // A request the transport refused before routing (its on_refused): counted and logged where
  // it was a POST to an admission path.
  void Refused(const HttpsTransportOptions::Refusal& refusal);

  ServerOptions options_;
  AdmissionHandler* handler_;
  Metrics* metrics_;
  std::unique_ptr<CertReloader> certs_;
  std::unique_ptr<HttpsTransport> https_;
  std::unique_ptr<HttpsTransport> metrics_https_;  // plain HTTP
  int port_ = 0;
  int metrics_port_ = -1;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_SERVER_H_
