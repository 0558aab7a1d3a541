#include "webhook/server.h"

#include <openssl/ssl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>

#include "webhook/log.h"

namespace kvoffload::webhook {
namespace {

// TLS 1.2 suites: forward secret AEAD only (TLS 1.3 suites are all of that kind already).
constexpr char kTls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
// TLS 1.3 suites, AES-128-GCM first: OpenSSL's default order puts AES-256-GCM-SHA384 first
// and we choose (server preference), so every handshake ran its key schedule on SHA-384,
// which has no SHA extensions in x86 CPUs, where SHA-256 has; Go clients (the API server) list
// AES-128 first themselves.
constexpr char kTls13Ciphers[] =
    "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384";

// The metrics port's bounds: Prometheus opens a connection or two and keeps it; a request is
// sent at once and is small.
constexpr int kMetricsMaxConnections = 256;
constexpr std::chrono::milliseconds kMetricsRequestTimeout{2000};

}  // namespace

Server::Server(ServerOptions options, AdmissionHandler* handler, Metrics* metrics)
    : options_(std::move(options)), handler_(handler), metrics_(metrics) {}

Server::~Server() { Shutdown(); }

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, AdmissionHandler* handler,
                                               Metrics* metrics) {
  std::unique_ptr<Server> s(new Server(std::move(options), handler, metrics));
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_server_method()),
                                                         &SSL_CTX_free);
  if (!ctx) return Status::FailedPrecondition("TLS setup failed: SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                     SSL_OP_NO_COMPRESSION);
  // Idle connections give their record buffers back: thousands of them stay cheap.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                                  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // A record in one read() instead of two (its 5-byte header, then the rest).
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  // No session resumption: the API server never resumes (client-go's TLS configs have no
  // ClientSessionCache), and each TLS 1.3 ticket cost about 180k instructions of the handshake
  // (OpenSSL 3 serialises, copies and encrypts the session for every one, two by default),
  // and the session cache a periodic sweep of itself. Every connection is a full handshake.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  if (SSL_CTX_set_ciphersuites(ctx.get(), kTls13Ciphers) != 1) {
    return Status::FailedPrecondition("TLS setup failed: TLS 1.3 suites rejected");
  }
  if (SSL_CTX_set_cipher_list(ctx.get(), kTls12Ciphers) != 1) {
    return Status::FailedPrecondition("TLS setup failed: cipher list rejected");
  }
  if (const std::string& ca = s->options_.client_ca_file; !ca.empty()) {
    // OpenSSL reports a file it cannot open as one without certificates: say which it is.
    if (std::FILE* f = std::fopen(ca.c_str(), "r"); f != nullptr) {
      std::fclose(f);
    } else {
      return Status::InvalidArgument("--client-ca-file=" + ca + ": cannot read: " +
                                     std::strerror(errno));
    }
    if (SSL_CTX_load_verify_locations(ctx.get(), ca.c_str(), nullptr) != 1) {
      return Status::InvalidArgument("--client-ca-file=" + ca + ": no PEM CA certificate in it");
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  // After the other files' checks: a bad one is then the only line, not one after "loaded".
  Result<std::unique_ptr<CertReloader>> certs = CertReloader::Create(
      s->options_.cert_file, s->options_.key_file,
      [metrics, self = s.get()](const CertReloader::Load& load) {
        metrics->RecordCertReload(load.ok, load.not_after);
        // The first load is named by Start()'s "serving" line: a start that then fails (the
        // port in use) prints its error alone.
        const bool first = !self->ready_.load();
        if (!load.ok) {
          LogEvent(spdlog::level::warn, "serving certificate not reloaded",
                   {{"detail", load.detail}});
        } else if (load.not_before > static_cast<int64_t>(std::time(nullptr))) {
          // Served all the same (see CertReloader): the API server refuses it until then.
          LogEvent(spdlog::level::warn,
                   "serving certificate loaded, not valid yet: is this node's clock behind its "
                   "issuer's?",
                   {{"detail", load.detail},
                    {"not_before", CertReloader::Rfc3339(load.not_before)}});
        } else if (!first) {
          LogEvent(spdlog::level::info, "serving certificate loaded",
                   {{"detail", load.detail}, {"not_after", CertReloader::Rfc3339(load.not_after)}});
        }
      });
  if (!certs.ok()) return certs.status();
  s->certs_ = std::move(*certs);
  s->certs_->Install(ctx.get());

  HttpsTransportOptions t;
  t.bind_address = s->options_.bind_address;
  t.port = s->options_.port;
  t.max_body_bytes = kMaxAdmissionBodyBytes;
  t.max_connections = s->options_.max_connections;
  t.handshake_timeout = s->options_.handshake_timeout;
  t.idle_timeout = s->options_.idle_timeout;
  t.request_timeout = s->options_.request_timeout;
  t.write_timeout = s->options_.request_timeout;
  t.worker_threads = s->options_.threads;
  Server* self = s.get();
  // Counted and logged as the handler's own refusals are: a review over 7 MiB answered by the
  // transport moved no counter and wrote no line before.
  t.on_refused = [self](const HttpsTransportOptions::Refusal& r) { self->Refused(r); };
  s->https_ = HttpsTransport::Create(
      t, ctx.get(), [self](const HttpsRequest& req) { return self->Route(req); },
      [self] { return self->draining_.load(); });
  s->Routes();
  return s;
}

// The transport's spare bytes after a body let the handler parse it without a copy.
static_assert(kBodySpareBytes >= kJsonPadding);

namespace {

// A request target's route: the API server calls /mutate-pods?timeout=5s, and the query is
// not part of it.
std::string_view PathOf(std::string_view target) { return target.substr(0, target.find('?')); }

bool IsValidationPath(std::string_view path) {
  return path == "/validate" || path == "/validate-labelled";
}

// The answers to a path that is none of a port's routes, and to a route asked with another
// method than the one it takes (a 404 there reads as a wrong URL in the configuration).
HttpsResponse NoRoute(const HttpsRequest& req, std::string_view path) {
  return {404, "text/plain", "no route for " + req.method + " " + std::string(path) + "\n", ""};
}
HttpsResponse MethodNotAllowed(const HttpsRequest& req, std::string_view path,
                               const std::string& allowed) {
  return {405, "text/plain",
          req.method + " " + std::string(path) + ": method not allowed, use " + allowed + "\n",
          allowed};
}

}  // namespace

void Server::Refused(const HttpsTransportOptions::Refusal& refusal) {
  const std::string_view path = PathOf(refusal.target);
  const bool validation = IsValidationPath(path);
  // A POST, or a request whose line was cut before its method (a malformed one): a GET or PUT
  // with a body over the limit is no admission, and was counted as a failed pod one.
  if ((path != "/mutate-pods" && !validation) ||
      (!refusal.method.empty() && refusal.method != "POST")) {
    return;
  }
  const int status = refusal.status;
  const AdmissionResult failed = AdmissionResult::Failed(FailureType::kBadRequest);
  if (validation) {
    metrics_->RecordValidation(Verdict::kError);
  } else {
    metrics_->RecordAdmission(failed, 0.0);
  }
  nlohmann::json fields = {
      {"outcome", validation ? VerdictName(Verdict::kError) : OutcomeName(failed.outcome())},
      {"status", status},
      {"detail", refusal.why},
      {"seconds", refusal.seconds}};
  if (!validation) fields["reason"] = failed.DetailName();
  LogEvent(spdlog::level::info, validation ? "validation" : "admission", fields);
}

HttpsResponse Server::Route(const HttpsRequest& req) {
  const std::string_view path = PathOf(req.target);
  const bool post = req.method == "POST";
  if (req.method == "GET" && (path == "/healthz" || path == "/readyz")) {
    if (path == "/healthz" || ready()) return {200, "text/plain", "ok\n", ""};
    return {503, "text/plain", draining_.load() ? "draining\n" : "starting\n", ""};
  }
  const bool validation = IsValidationPath(path);
  // A known path asked with another method is a 405 naming the one it takes, not a 404 that
  // reads as a wrong URL in the webhook configuration.
  const bool probe = path == "/healthz" || path == "/readyz";
  // Logged as well as counted: a webhook configuration with a wrong path sends every pod here,
  // and the log is where its owner looks for the path the API server asked for.
  auto unrouted = [&](HttpsResponse r) {
    metrics_->RecordUnrouted(/*wrong_method=*/r.status == 405);
    LogEvent(spdlog::level::warn, "unrouted",
             {{"method", req.method}, {"path", path}, {"status", r.status}});
    return r;
  };
  if (probe || ((path == "/mutate-pods" || validation) && !post)) {
    return unrouted(MethodNotAllowed(req, path, probe ? "GET" : "POST"));
  }
  if (!post || (path != "/mutate-pods" && !validation)) return unrouted(NoRoute(req, path));
  // From the request's arrival, as its lookup budget counts: time queued for a worker is the
  // API server's wait too, and the histogram left it out (a slow API server queues requests).
  const auto start = req.received;
  auto elapsed = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  HttpAnswer answer;
  try {
    answer = validation ? handler_->Validate(req.content_type, req.body,
                                             /*pods_need_label=*/path == "/validate-labelled",
                                             req.received)
                        : handler_->Handle(req.content_type, req.body, req.received);
  } catch (const std::exception& e) {
    // Unreachable by design (every layer returns Status); kept so nothing can crash the server.
    LogEvent(spdlog::level::err, validation ? "validation" : "admission",
             {{"outcome", "error"}, {"reason", "internal"}, {"status", 500}, {"detail", e.what()}});
    if (validation) {
      metrics_->RecordValidation(Verdict::kError);
    } else {
      metrics_->RecordAdmission(AdmissionResult::Failed(FailureType::kInternal), elapsed());
    }
    return {500, "text/plain", "internal error\n", ""};
  }
  const double seconds = elapsed();
  if (validation) {
    metrics_->RecordValidation(answer.verdict);
  } else {
    metrics_->RecordAdmission(answer.admission, seconds);
  }
  const bool quiet = validation ? answer.verdict == Verdict::kSkipped : answer.admission.skipped();
  nlohmann::json fields = {
      {"outcome",
       validation ? VerdictName(answer.verdict) : OutcomeName(answer.admission.outcome())},
      {"status", answer.status},
      {"detail", answer.log_message},
      {"seconds", seconds}};
  if (!answer.uid.empty()) fields["uid"] = answer.uid;
  if (answer.code != 0) fields["code"] = answer.code;
  // The skip reason or failure type, as the injection counters label it.
  if (!validation && *answer.admission.DetailName() != '\0') {
    fields["reason"] = answer.admission.DetailName();
  }
  LogEvent(quiet ? spdlog::level::debug : spdlog::level::info,
           validation ? "validation" : "admission", fields);
  return {answer.status, answer.status == 200 ? "application/json" : "text/plain",
          std::move(answer.body), ""};
}

// The metrics port: two routes, scraped every few seconds from inside the cluster. Plain HTTP on
// the admission port's transport, with its bounds: on cpp-httplib's server (two threads, a
// timeout per read) two clients trickling a header held /metrics for as long as they went on.
void Server::Routes() {
  if (options_.metrics_port < 0) return;
  HttpsTransportOptions t;
  t.bind_address = options_.bind_address;
  t.port = options_.metrics_port;
  t.port_flag = "--metrics-port";
  t.max_body_bytes = 0;  // GET only
  t.max_connections = kMetricsMaxConnections;
  t.handshake_timeout = kMetricsRequestTimeout;  // to the first byte
  t.request_timeout = kMetricsRequestTimeout;
  t.write_timeout = options_.request_timeout;
  t.io_threads = 1;
  t.worker_threads = 1;  // bodiless GETs are answered on the I/O thread
  metrics_https_ = HttpsTransport::Create(
      t, nullptr, [this](const HttpsRequest& req) { return MetricsRoute(req); },
      [] { return false; });
}

HttpsResponse Server::MetricsRoute(const HttpsRequest& req) const {
  const std::string_view path = PathOf(req.target);
  if (path != "/metrics" && path != "/healthz") return NoRoute(req, path);
  // HEAD is GET without the body (the transport's part).
  if (req.method != "GET" && req.method != "HEAD") return MethodNotAllowed(req, path, "GET");
  if (path == "/healthz") return {200, "text/plain", "ok\n", ""};
  // The transport's own counts: a connection flood shows here before admissions slow down.
  const HttpsTransportStats t = https_->stats();
  std::string text = metrics_->Render();
  text += "# HELP kvoffload_webhook_open_connections HTTPS connections open now.\n"
          "# TYPE kvoffload_webhook_open_connections gauge\n"
          "kvoffload_webhook_open_connections " + std::to_string(t.open_connections) + "\n"
          "# HELP kvoffload_webhook_refused_connections_total Connections closed on accept past --max-connections.\n"
          "# TYPE kvoffload_webhook_refused_connections_total counter\n"
          "kvoffload_webhook_refused_connections_total " + std::to_string(t.refused_connections) + "\n"
          "# HELP kvoffload_webhook_timed_out_connections_total Connections closed by a handshake, idle, request or write deadline.\n"
          "# TYPE kvoffload_webhook_timed_out_connections_total counter\n"
          "kvoffload_webhook_timed_out_connections_total " + std::to_string(t.timed_out) + "\n";
  return {200, "text/plain; version=0.0.4", std::move(text), ""};
}

Status Server::Start() {
  if (Status s = https_->Start(); !s.ok()) return s;
  port_ = https_->port();
  if (metrics_https_) {
    if (Status s = metrics_https_->Start(); !s.ok()) return s;
    metrics_port_ = metrics_https_->port();
  }
  ready_ = true;
  LogEvent(spdlog::level::info, "serving",
           {{"port", port_},
            {"certificate", options_.cert_file},
            {"certificateNotAfter", CertReloader::Rfc3339(metrics_->cert_not_after())},
            {"metricsPort", metrics_port_},
            {"threads", options_.threads},
            {"ioThreads", https_->io_threads()},
            {"usableCpus", https_->usable_cpus()},
            {"maxConnections", options_.max_connections}});
  // After the first log line: the poller logs a failed reload at once, and the logger's
  // first use (spdlog's registry, made on first use where ConfigureLogging has not run, as
  // in tests) then raced with this thread's.
  certs_->StartPolling(options_.cert_poll_interval);
  return Status::Ok();
}

void Server::Shutdown() {
  if (stopped_.exchange(true)) return;
  if (ready_.load()) {
    draining_ = true;
    LogEvent(spdlog::level::info, "draining",
             {{"delayMs", static_cast<int64_t>(options_.shutdown_delay.count())}});
    std::this_thread::sleep_for(options_.shutdown_delay);
  }
  // A server whose Create() failed half way has nothing to stop.
  if (!https_) return;
  // Closes the listener and the idle connections; requests under way finish first.
  https_->Stop();
  if (metrics_https_) metrics_https_->Stop();
  // Only after "serving": a start that failed prints its error alone.
  if (ready_.load()) LogEvent(spdlog::level::info, "stopped");
}

}  // namespace kvoffload::webhook
