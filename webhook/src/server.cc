#include "webhook/server.h"

#include <httplib.h>
#include <openssl/ssl.h>

#include "webhook/log.h"

namespace kvoffload::webhook {
namespace {

// TLS 1.2 suites: forward secret AEAD only (TLS 1.3 suites are all of that kind already).
constexpr char kTls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

void WaitUntilRunning(const httplib::Server* srv) {
  while (!srv->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

Server::Server(ServerOptions options, AdmissionHandler* handler, Metrics* metrics)
    : options_(std::move(options)), handler_(handler), metrics_(metrics) {}

Server::~Server() { Shutdown(); }

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, AdmissionHandler* handler,
                                               Metrics* metrics) {
  std::unique_ptr<Server> s(new Server(std::move(options), handler, metrics));
  Result<std::unique_ptr<CertReloader>> certs = CertReloader::Create(
      s->options_.cert_file, s->options_.key_file, [metrics](bool ok, const std::string& detail) {
        metrics->RecordCertReload(ok);
        LogEvent(ok ? spdlog::level::info : spdlog::level::warn,
                 ok ? "serving certificate loaded" : "serving certificate not reloaded",
                 {{"detail", detail}});
      });
  if (!certs.ok()) return certs.status();
  s->certs_ = std::move(*certs);

  std::string ctx_error;
  CertReloader* reloader = s->certs_.get();
  const std::string client_ca = s->options_.client_ca_file;
  s->https_ = std::make_unique<httplib::SSLServer>([&ctx_error, reloader, client_ca](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(&ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                  SSL_OP_NO_COMPRESSION);
    if (SSL_CTX_set_cipher_list(&ctx, kTls12Ciphers) != 1) {
      ctx_error = "cipher list rejected";
      return false;
    }
    if (!client_ca.empty()) {
      if (SSL_CTX_load_verify_locations(&ctx, client_ca.c_str(), nullptr) != 1) {
        ctx_error = "cannot load --client-ca-file " + client_ca;
        return false;
      }
      SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    reloader->Install(&ctx);
    return true;
  });
  if (!s->https_->is_valid()) {
    return Status::InvalidArgument("TLS setup failed: " + ctx_error);
  }
  s->Routes();
  return s;
}

void Server::Routes() {
  const int threads = options_.threads;
  https_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  https_->set_payload_max_length(kMaxAdmissionBodyBytes);
  // Headers and body go out in separate writes; with Nagle on, the second waits for the
  // client's delayed ACK (40 ms).
  https_->set_tcp_nodelay(true);
  https_->set_keep_alive_max_count(1000);
  // Idle keep-alive connections hold a worker until this runs out, also at shutdown: it bounds
  // how long SIGTERM takes after --shutdown-delay. The API server simply reconnects.
  https_->set_keep_alive_timeout(5);
  https_->set_read_timeout(10, 0);
  https_->set_write_timeout(10, 0);
  https_->set_exception_handler([this](const httplib::Request&, httplib::Response& res,
                                       std::exception_ptr) {
    // Unreachable by design (every layer returns Status); kept so nothing can crash the server.
    metrics_->RecordAdmission(Outcome::kError, 0);
    res.status = 500;
    res.set_content("internal error\n", "text/plain");
  });

  // One route per kind of request; the answer is written and logged the same way for each.
  auto serve = [this](const char* what, auto handle) {
    return [this, what, handle](const httplib::Request& req, httplib::Response& res) {
      const auto start = std::chrono::steady_clock::now();
      HttpAnswer answer = handle(req);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const bool validation = std::string_view(what) == "validation";
      if (validation) {
        metrics_->RecordValidation(answer.verdict);
      } else {
        metrics_->RecordAdmission(answer.outcome, seconds);
      }
      res.status = answer.status;
      res.set_content(std::move(answer.body),
                      answer.status == 200 ? "application/json" : "text/plain");
      // While draining, make the API server reconnect: the next connection reaches a replica
      // that is still ready.
      if (draining_.load()) res.set_header("Connection", "close");
      const bool quiet = validation ? answer.verdict == Verdict::kSkipped
                                    : answer.outcome == Outcome::kSkipped ||
                                          answer.outcome == Outcome::kUnchanged;
      LogEvent(quiet ? spdlog::level::debug : spdlog::level::info, what,
               {{"outcome", validation ? VerdictName(answer.verdict) : OutcomeName(answer.outcome)},
                {"status", answer.status},
                {"detail", answer.log_message},
                {"seconds", seconds}});
    };
  };
  https_->Post("/mutate-pods", serve("admission", [this](const httplib::Request& req) {
                 return handler_->Handle(req.get_header_value("Content-Type"), req.body);
               }));
  https_->Post("/validate", serve("validation", [this](const httplib::Request& req) {
                 return handler_->Validate(req.get_header_value("Content-Type"), req.body,
                                           /*pods_need_label=*/false);
               }));
  https_->Post("/validate-labelled", serve("validation", [this](const httplib::Request& req) {
                 return handler_->Validate(req.get_header_value("Content-Type"), req.body,
                                           /*pods_need_label=*/true);
               }));
  auto health = [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  };
  https_->Get("/healthz", health);
  https_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    if (ready()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content(draining_.load() ? "draining\n" : "starting\n", "text/plain");
    }
  });

  if (options_.metrics_port >= 0) {
    metrics_http_ = std::make_unique<httplib::Server>();
    metrics_http_->new_task_queue = [] { return new httplib::ThreadPool(2); };
    metrics_http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_->Render(), "text/plain; version=0.0.4");
    });
    metrics_http_->Get("/healthz", health);
  }
}

Status Server::Start() {
  auto bind = [this](httplib::Server* srv, int wanted, int* bound) -> Status {
    if (wanted == 0) {
      *bound = srv->bind_to_any_port(options_.bind_address);
    } else {
      *bound = srv->bind_to_port(options_.bind_address, wanted) ? wanted : -1;
    }
    if (*bound <= 0) {
      return Status::Unavailable("cannot listen on " + options_.bind_address + ":" +
                                 std::to_string(wanted) + " (in use, or not permitted)");
    }
    return Status::Ok();
  };
  if (Status s = bind(https_.get(), options_.port, &port_); !s.ok()) return s;
  if (metrics_http_) {
    if (Status s = bind(metrics_http_.get(), options_.metrics_port, &metrics_port_); !s.ok()) {
      return s;
    }
    metrics_thread_ = std::thread([this] { metrics_http_->listen_after_bind(); });
  }
  https_thread_ = std::thread([this] { https_->listen_after_bind(); });
  // stop() is a no-op until listen_after_bind() has begun, so a Shutdown() right after Start()
  // would leave the listener running and the join waiting forever.
  WaitUntilRunning(https_.get());
  if (metrics_http_) WaitUntilRunning(metrics_http_.get());
  certs_->StartPolling(options_.cert_poll_interval);
  ready_ = true;
  LogEvent(spdlog::level::info, "serving",
           {{"port", port_}, {"metricsPort", metrics_port_}, {"threads", options_.threads}});
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
  // stop() closes the listener; the thread pool then finishes every queued and running request
  // before listen_after_bind() returns.
  https_->stop();
  if (https_thread_.joinable()) https_thread_.join();
  if (metrics_http_) {
    metrics_http_->stop();
    if (metrics_thread_.joinable()) metrics_thread_.join();
  }
  LogEvent(spdlog::level::info, "stopped");
}

}  // namespace kvoffload::webhook
