// The admission port's transport: an event-driven HTTPS/1.1 server (Boost.Asio reactor, OpenSSL
// driven directly on the non-blocking socket, Boost.Beast's HTTP parser) that bounds what each
// connection may cost: a connection cap, a handshake deadline, an idle keep-alive deadline and one
// total deadline per request (headers, then body) that slow clients cannot extend byte by byte.
// Handlers that may block (they have a body: admissions, checks) run on a worker pool; bodiless
// requests (health, readiness) are answered on the I/O threads. Without a TLS context it serves
// plain HTTP with the same bounds (the metrics port). Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_HTTPS_TRANSPORT_H_
#define KVOFFLOAD_WEBHOOK_HTTPS_TRANSPORT_H_

#include <openssl/ssl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// Spare capacity every request body with a declared length carries past its end: a JSON
// parser that reads a little past the text (simdjson) can then parse it where it lies.
inline constexpr size_t kBodySpareBytes = 64;

struct HttpsRequest {
  std::string method;
  std::string target;
  std::string content_type;
  std::string body;  // with kBodySpareBytes of spare capacity when Content-Length was sent
  // When it was read whole: the API server's timeout runs from about then, not from when a
  // worker takes it.
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
};

struct HttpsResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::string allow;  // a 405's Allow header: the methods the path takes
};

struct HttpsTransportOptions {
  std::string bind_address = "0.0.0.0";
  int port = 8443;  // 0: any free port
  std::string port_flag = "--port";  // names the port in a listen error
  uint64_t max_body_bytes = 1024 * 1024;  // larger declared or sent bodies get 413
  // Connections past this are closed as soon as they are accepted (before any TLS work).
  int max_connections = 10000;
  // The handshake and request deadlines are each connection's own, up to a tenth longer, so
  // that clients that began together are not all cut together; the idle deadline is exact.
  std::chrono::milliseconds handshake_timeout{5000};  // accept to TLS established (plain: to
                                                      // the first byte)
  std::chrono::milliseconds idle_timeout{120000};     // no request in progress, to a first byte
  std::chrono::milliseconds request_timeout{10000};   // first byte to the body's last, in total
  std::chrono::milliseconds write_timeout{10000};     // the whole response
  int io_threads = 0;       // 0: one per core it may run on (at most 4)
  int worker_threads = 64;  // handlers in flight (waiting on lookups); one per core computes
  // Told of each request the transport answers itself, never reaching the handler (413 for a
  // body over max_body_bytes, 431, 400 for malformed HTTP): its method and target when its
  // request line was read ("" otherwise), the status and why (the answer's text). May run on
  // any I/O thread.
  struct Refusal {
    std::string_view method;
    std::string_view target;
    int status = 0;
    std::string_view why;
    double seconds = 0;  // from the request's first byte read to its refusal
  };
  std::function<void(const Refusal&)> on_refused;
};

// Counts the transport keeps (for tests and metrics).
struct HttpsTransportStats {
  int64_t open_connections = 0;
  uint64_t refused_connections = 0;  // over max_connections
  uint64_t timed_out = 0;            // closed by a deadline (handshake, idle, request, write)
};

class HttpsTransport {
 public:
  // Called with a complete request; returns the answer. May run on any thread.
  using Handler = std::function<HttpsResponse(const HttpsRequest&)>;
  // Whether the next response must close its connection (graceful drain).
  using Draining = std::function<bool()>;

  // `ctx` is referenced (SSL_CTX_up_ref), configured by the caller.
  static std::unique_ptr<HttpsTransport> Create(HttpsTransportOptions options, SSL_CTX* ctx,
                                                Handler handler, Draining draining);
  ~HttpsTransport();

  // Binds (an error names the address) and serves on background threads.
  Status Start();
  int port() const;
  // The threads serving connections, started by Start(): HttpsTransportOptions::io_threads, or
  // one per CPU the process can use (UsableCpus), at most 4.
  int io_threads() const;
  // What UsableCpus() gave when the transport was made, which the thread counts follow.
  int usable_cpus() const;
  // Stops accepting, closes idle keep-alive connections, lets every request already begun finish
  // (bounded by the deadlines), then stops the threads. Idempotent.
  void Stop();
  HttpsTransportStats stats() const;

  class Impl;

 private:
  explicit HttpsTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_HTTPS_TRANSPORT_H_
