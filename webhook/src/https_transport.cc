#include "webhook/https_transport.h"

#include <openssl/err.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <csignal>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvoffload/work_queue.h"
#include "kvoffload/cpu_budget.h"

namespace kvoffload::webhook {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

// Request headers beyond this are refused (431); the API server sends well under 1 KiB.
constexpr uint32_t kHeaderLimit = 16 * 1024;
// One TLS record: what a single SSL_read can return.
constexpr int kReadChunk = 16 * 1024;
// After an answer that closes the connection, how long unread input is drained so that the
// client reads the answer instead of a reset (it may still be sending a refused body).
constexpr std::chrono::milliseconds kLingerTimeout{1000};

class Connection;

}  // namespace

class HttpsTransport::Impl {
 public:
  Impl(HttpsTransportOptions options, SSL_CTX* ctx, Handler handler, Draining draining)
      : options_(std::move(options)),
        ctx_(ctx),
        handler_(std::move(handler)),
        draining_(std::move(draining)),
        workers_(static_cast<size_t>(std::max(1, options_.worker_threads)),
                 WorkQueue::OnStop::kRunQueued, static_cast<size_t>(PerCore())),
        acceptor_(net::make_strand(io_)),
        accept_retry_(acceptor_.get_executor()) {
    if (ctx_ != nullptr) SSL_CTX_up_ref(ctx_);
  }
  ~Impl() {
    Stop();
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }

  Status Start();
  void Stop();
  HttpsTransportStats Stats() const;
  int port() const { return port_; }
  int io_threads() const { return static_cast<int>(io_threads_.size()); }
  int usable_cpus() const { return usable_cpus_; }
  // One per core, at most 4: the I/O threads, and the admissions computing at once (those
  // waiting on the API server do not count). Cores are those the process may use (UsableCpus:
  // its cpuset and its CPU limit), not the node's: threads beyond them only take turns.
  int PerCore() const { return std::clamp(usable_cpus_, 1, 4); }

  // Whether responses must close their connection: draining or stopping.
  bool Closing() const { return stopping_.load() || draining_(); }
  bool Stopped() const { return stopping_.load(); }
  void Unregister(Connection* c);

  const HttpsTransportOptions options_;
  SSL_CTX* const ctx_;  // nullptr: plain HTTP
  const Handler handler_;
  const Draining draining_;
  const int usable_cpus_ = UsableCpus();  // read once: before workers_, which is sized by it
  net::io_context io_;
  std::atomic<uint64_t> timed_out_{0};
  uint64_t accepted_ = 0;  // connections accepted, under mu_
  // Admissions. Up to --threads of them may wait on API server lookups, but only about one per
  // core computes at a time (PerCore): Asio's thread_pool, used before, woke its
  // sleeping threads in turn, so under load all 64 ran at once on 2 cores, each admission on a
  // thread with cold caches, and the server admitted KServe pods at 0.8x the rate it does with
  // the cap.
  WorkQueue workers_;

 private:
  void Accept();

  // Keeps the I/O threads running while no operation is pending (between a request's dispatch to
  // a worker and its answer, once the acceptor is closed).
  net::executor_work_guard<net::io_context::executor_type> work_ = net::make_work_guard(io_);
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_;
  std::vector<std::thread> io_threads_;
  mutable std::mutex mu_;
  std::condition_variable all_closed_;
  // Every live connection, so Stop() can close the idle ones. Weak: a connection owns itself
  // through its pending operations and unregisters in its destructor.
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections_;  // guarded by mu_
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  int port_ = 0;
};

namespace {

// A handshake or request deadline for the seq-th connection accepted, stretched by that
// connection's share of a tenth: slow clients opened together (an attacker's, or a fleet
// restarted at once) are then not all cut in the same instant, and do not all come back with a
// new TLS handshake in the same instant either, which is what slowed legitimate admissions most
// under 1000 trickling clients (docs/decisions.md). The share is the fractional part of seq
// times the golden ratio (2^64 fixed point, so the product's wrapping keeps just the fraction),
// which spreads any run of consecutive connections evenly. The idle deadline is not stretched:
// it is a promise to the API server's connection pool, and stays exact.
std::chrono::microseconds Stretched(std::chrono::milliseconds d, uint64_t seq) {
  const uint64_t fraction = seq * 0x9E3779B97F4A7C15ull;
  const double stretch = 1.0 + 0.1 * static_cast<double>(fraction >> 11) * 0x1p-53;
  return std::chrono::duration_cast<std::chrono::microseconds>(d * stretch);
}

// One client connection. Every member is touched only on the connection's strand (the socket's
// executor); the worker pool hands its answer back through that strand. OpenSSL is driven on the
// non-blocking socket directly (SSL_set_fd, retried on readiness) rather than through a buffered
// stream adaptor, so an idle connection holds no buffers (SSL_MODE_RELEASE_BUFFERS, our own read
// buffer dropped between requests): a few KiB per connection instead of some 70 KiB.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = net::steady_timer::clock_type;

  // seq: the connection's place in the order of accepting (Stretched).
  Connection(HttpsTransport::Impl* server, tcp::socket socket, uint64_t seq)
      : server_(server),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        handshake_timeout_(Stretched(server->options_.handshake_timeout, seq)),
        request_timeout_(Stretched(server->options_.request_timeout, seq)) {}
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    server_->Unregister(this);
  }

  net::any_io_executor executor() { return socket_.get_executor(); }

  void Start() {
    error_code ec;
    socket_.non_blocking(true, ec);
    if (!ec) socket_.set_option(tcp::no_delay(true), ec);  // header and body leave in one go
    if (ec) return Close();
    phase_ = Phase::kAccepted;
    Arm(handshake_timeout_);
    // No TLS state until the client says something: a silent connection costs a socket.
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& e) {
      if (e || self->phase_ == Phase::kClosed) return self->Close();
      self->Handshake();
    });
  }

  // Stop(): a connection between requests (or not yet spoken to) is closed now; one with a
  // request under way finishes it and closes after its answer.
  void CloseIfIdle() {
    if (phase_ == Phase::kAccepted || phase_ == Phase::kIdle) Close();
  }

 private:
  enum class Phase { kAccepted, kHandshake, kIdle, kReading, kHandling, kWriting, kLingering, kClosed };
  enum class Then { kReadBody, kNextRequest, kLinger };

  // Runs one OpenSSL call (plain: one recv or send, which waits for `plain_wait`) until it
  // stops asking for readiness; `done` gets its positive result. Any other outcome (peer
  // closed, protocol error, socket error) closes the connection.
  template <class Op, class Done>
  void Drive(Op op, Done done, tcp::socket::wait_type plain_wait = tcp::socket::wait_read) {
    ERR_clear_error();
    const int r = op();
    const int saved_errno = errno;
    if (r > 0) return done(r);
    tcp::socket::wait_type wait = plain_wait;
    if (ssl_ != nullptr) {
      const int err = SSL_get_error(ssl_, r);
      ERR_clear_error();
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return Close();
      wait = err == SSL_ERROR_WANT_READ ? tcp::socket::wait_read : tcp::socket::wait_write;
    } else if (r == 0 || (saved_errno != EAGAIN && saved_errno != EWOULDBLOCK &&
                          saved_errno != EINTR)) {
      return Close();
    }
    socket_.async_wait(wait, [self = shared_from_this(), op, done, plain_wait](const error_code& ec) {
      if (ec || self->phase_ == Phase::kClosed) return self->Close();
      self->Drive(op, done, plain_wait);
    });
  }
  int Fd() { return socket_.native_handle(); }

  // One deadline at a time; arming replaces it. The timer is kept lazily: Arm and Disarm only
  // move deadline_, and the timer is set again only when the new deadline comes before its
  // pending wait's expiry; a wait that fires before the deadline waits again for the rest.
  // Setting the timer at each of a request's phases (idle, request, handler, write) cancelled
  // its wait every time, and a cancelled wait's completion is queued like any other: per
  // request a wake-up of the other I/O thread, an epoll interrupt and a timerfd update.
  void Arm(std::chrono::microseconds d) {
    deadline_ = Clock::now() + d;
    if (!timer_waiting_ || timer_.expiry() > deadline_) Wait(deadline_);
  }
  void Disarm() { deadline_ = Clock::time_point::max(); }
  void Wait(Clock::time_point at) {
    const uint64_t gen = ++timer_gen_;  // a replaced wait's completion finds a newer one
    timer_waiting_ = true;
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      if (gen != self->timer_gen_) return;
      self->timer_waiting_ = false;
      if (ec || self->phase_ == Phase::kClosed || self->deadline_ == Clock::time_point::max()) {
        return;
      }
      if (Clock::now() < self->deadline_) return self->Wait(self->deadline_);
      if (self->phase_ != Phase::kLingering) ++self->server_->timed_out_;
      self->Close();
    });
  }

  void Handshake() {
    if (server_->ctx_ == nullptr) return ReadRequest();  // plain: the request's first bytes
    ssl_ = SSL_new(server_->ctx_);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, socket_.native_handle()) != 1) return Close();
    SSL_set_accept_state(ssl_);
    phase_ = Phase::kHandshake;
    Drive([this] { return SSL_do_handshake(ssl_); },
          [this](int) {
            AckFinishedNow();
            WaitRequest();
          });
  }

  // A client that leaves Nagle on (Python's ssl, OpenSSL's s_client; Go, and so the API
  // server, turns it off) writes its Finished, then its request, which its kernel holds until
  // the Finished is acknowledged; having just sent our handshake flight, Linux delays that
  // ACK by 40 ms. TLS 1.3 servers usually hide this by writing session tickets at once; ours
  // sends none (server.cc), so it acknowledges now: one setsockopt instead of a ticket.
  void AckFinishedNow() {
    const int one = 1;
    ::setsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
  }

  // Between requests: nothing is buffered; the idle deadline runs until the next first byte.
  void WaitRequest() {
    phase_ = Phase::kIdle;
    // SSL_has_pending, not SSL_pending: it also counts bytes read ahead and not yet decrypted.
    if (!in_.empty() || (ssl_ != nullptr && SSL_has_pending(ssl_) == 1)) return ReadRequest();
    // Draining, a connection that has served is closed (its client reconnects elsewhere) and
    // a new one gets its first request; once stopped, none waits: one whose handshake ended
    // after the stop would hold the shutdown for the idle timeout.
    if ((server_->Closing() && served_ > 0) || server_->Stopped()) return Close();
    in_ = std::string();
    read_buf_.reset();
    Arm(server_->options_.idle_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      if (ec || self->phase_ == Phase::kClosed) return self->Close();
      self->ReadRequest();
    });
  }

  // From the request's first byte one deadline covers headers and body: trickling bytes does
  // not extend it.
  void ReadRequest() {
    phase_ = Phase::kReading;
    Arm(request_timeout_);
    reading_since_ = std::chrono::steady_clock::now();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(server_->options_.max_body_bytes);
    sent_continue_ = false;
    body_reserved_ = false;
    Parse();
  }

  void ReadMore() {
    if (!read_buf_) read_buf_ = std::make_unique<char[]>(kReadChunk);
    Drive([this] {
            return ssl_ != nullptr
                       ? SSL_read(ssl_, read_buf_.get(), kReadChunk)
                       : static_cast<int>(::recv(Fd(), read_buf_.get(), kReadChunk, 0));
          },
          [this](int n) {
            in_.append(read_buf_.get(), static_cast<size_t>(n));
            Parse();
          });
  }

  void Parse() {
    while (!in_.empty() && !parser_->is_done()) {
      error_code ec;
      const size_t used = parser_->put(net::buffer(in_.data(), in_.size()), ec);
      in_.erase(0, used);
      // need_more, or nothing taken: only more input can move the parser on.
      if (ec == http::error::need_more || (!ec && used == 0)) break;
      if (ec) return Refuse(ec);
      // put() stops at the end of the header (the parser is not eager), so the body's buffer
      // is sized before its first byte arrives: its length plus the spare bytes, one
      // allocation and no copy. Beast's own reserve of the length is then a no-op.
      if (parser_->is_header_done() && !body_reserved_) {
        // A Transfer-Encoding not ending in chunked leaves the body's length unknown (RFC 9112
        // 6.3): Beast reads such a request as bodiless, and its body as the next request.
        if (parser_->get().count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
          return Refuse(http::error::bad_transfer_encoding);
        }
        body_reserved_ = true;
        const boost::optional<uint64_t> length = parser_->content_length();
        if (length && *length <= server_->options_.max_body_bytes) {
          parser_->get().body().reserve(static_cast<size_t>(*length) + kBodySpareBytes);
        }
      }
    }
    if (parser_->is_done()) return Dispatch();
    // curl and others wait (about a second) for this before sending a body. Never to HTTP/1.0,
    // which has no interim answers (RFC 9110 10.1.1).
    if (parser_->is_header_done() && !sent_continue_ && parser_->get().version() >= 11 &&
        boost::beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      sent_continue_ = true;
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      return Write(Then::kReadBody);
    }
    ReadMore();
  }

  void Refuse(const error_code& ec) {
    HttpsResponse r;
    if (ec == http::error::body_limit) {
      r.status = 413;
      r.body = "request body over " + std::to_string(server_->options_.max_body_bytes) + " bytes\n";
    } else if (ec == http::error::header_limit) {
      r.status = 431;
      r.body = "request headers over " + std::to_string(kHeaderLimit) + " bytes\n";
    } else {
      r.status = 400;
      r.body = "malformed HTTP request: " + ec.message() + "\n";
    }
    if (server_->options_.on_refused) {
      // Set once the request line is parsed, whatever failed after it (a body over the limit
      // is refused as its header ends, before the parser counts the header as done).
      const auto& msg = parser_->get();
      const auto method = msg.method_string();
      const auto target = msg.target();
      std::string_view why = r.body;
      if (!why.empty() && why.back() == '\n') why.remove_suffix(1);
      server_->options_.on_refused(
          {std::string_view(method.data(), method.size()),
           std::string_view(target.data(), target.size()), r.status, why,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - reading_since_)
               .count()});
    }
    parser_.reset();
    Respond(std::move(r), /*close=*/true);
  }

  void Dispatch() {
    Disarm();  // the handler's own time is bounded by its lookups, not by the client
    auto& msg = parser_->get();
    auto req = std::make_shared<HttpsRequest>();
    req->method = std::string(msg.method_string());
    req->target = std::string(msg.target());
    req->content_type = std::string(msg[http::field::content_type]);
    req->body = std::move(msg.body());
    req->received = std::chrono::steady_clock::now();
    head_ = msg.method() == http::verb::head;
    const bool keep_alive = msg.keep_alive();
    parser_.reset();
    read_buf_.reset();
    ++served_;
    phase_ = Phase::kHandling;
    if (req->method == "GET" && req->body.empty()) return Respond(Call(*req), !keep_alive);
    // Refused only once Stop has begun, which waits for this connection to close first.
    [[maybe_unused]] const bool queued =
        server_->workers_.Push([self = shared_from_this(), req, keep_alive] {
          HttpsResponse res = self->Call(*req);
          net::post(self->executor(), [self, res = std::move(res), keep_alive]() mutable {
            self->Respond(std::move(res), !keep_alive);
          });
        });
  }

  HttpsResponse Call(const HttpsRequest& req) const {
    try {
      return server_->handler_(req);
    } catch (const std::exception&) {
      // Unreachable by design (every layer returns Status); kept so nothing can crash the server.
      return HttpsResponse{500, "text/plain", "internal error\n", ""};
    }
  }

  void Respond(HttpsResponse res, bool close) {
    if (phase_ == Phase::kClosed) return;
    close = close || server_->Closing();
    const boost::beast::string_view reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(res.status)));
    out_.clear();
    out_.reserve(res.body.size() + 160);
    out_.append("HTTP/1.1 ").append(std::to_string(res.status)).append(" ").append(reason.data(), reason.size());
    out_.append("\r\nContent-Type: ").append(res.content_type);
    out_.append("\r\nContent-Length: ").append(std::to_string(res.body.size()));
    if (!res.allow.empty()) out_.append("\r\nAllow: ").append(res.allow);
    // While draining, the API server reconnects and reaches a replica that is still ready.
    if (close) out_.append("\r\nConnection: close");
    out_.append("\r\n\r\n");
    // An answer to HEAD is the answer to GET without its body (RFC 9110 9.3.2).
    if (!head_) out_.append(res.body);
    head_ = false;
    phase_ = Phase::kWriting;
    Arm(server_->options_.write_timeout);
    Write(close ? Then::kLinger : Then::kNextRequest);
  }

  void Write(Then then) {
    if (out_off_ == out_.size()) {
      out_ = std::string();
      out_off_ = 0;
      switch (then) {
        case Then::kReadBody:
          return ReadMore();
        case Then::kNextRequest:
          return WaitRequest();
        case Then::kLinger:
          return Linger();
      }
    }
    Drive(
        [this] {
          const size_t left = std::min<size_t>(out_.size() - out_off_, INT_MAX);
          return ssl_ != nullptr
                     ? SSL_write(ssl_, out_.data() + out_off_, static_cast<int>(left))
                     : static_cast<int>(::send(Fd(), out_.data() + out_off_, left, MSG_NOSIGNAL));
        },
        [this, then](int n) {
          out_off_ += static_cast<size_t>(n);
          Write(then);
        },
        tcp::socket::wait_write);
  }

  void Linger() {
    phase_ = Phase::kLingering;
    if (ssl_ != nullptr) SSL_shutdown(ssl_);  // our close_notify; the client's is not awaited
    ERR_clear_error();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    Arm(kLingerTimeout);
    Discard();
  }

  void Discard() {
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      if (ec || self->phase_ == Phase::kClosed) return self->Close();
      char sink[4096];
      const ssize_t n = ::recv(self->socket_.native_handle(), sink, sizeof(sink), 0);
      if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) return self->Discard();
      self->Close();
    });
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    Disarm();
    timer_.cancel();  // its pending wait holds the connection
    error_code ec;
    socket_.close(ec);
  }

  HttpsTransport::Impl* const server_;
  tcp::socket socket_;
  net::steady_timer timer_;
  Clock::time_point deadline_ = Clock::time_point::max();  // max(): none (Disarm)
  bool timer_waiting_ = false;
  uint64_t timer_gen_ = 0;
  const std::chrono::microseconds handshake_timeout_;  // the options', Stretched for this one
  const std::chrono::microseconds request_timeout_;
  Phase phase_ = Phase::kAccepted;
  SSL* ssl_ = nullptr;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string in_;  // received and not yet parsed (a pipelined next request, a partial header)
  // When this request's reading began: a refusal's log says how long the client took to it.
  std::chrono::steady_clock::time_point reading_since_;
  std::unique_ptr<char[]> read_buf_;  // only while a request is being read
  std::string out_;
  size_t out_off_ = 0;
  bool sent_continue_ = false;
  bool body_reserved_ = false;
  bool head_ = false;  // the request being answered is a HEAD
  uint64_t served_ = 0;
};

}  // namespace

Status HttpsTransport::Impl::Start() {
  // OpenSSL writes with plain send(): a client that has gone away would raise SIGPIPE and kill
  // the process. The error (EPIPE) closes that connection instead.
  ::signal(SIGPIPE, SIG_IGN);
  error_code ec;
  const net::ip::address address = net::ip::make_address(options_.bind_address, ec);
  if (ec) {
    return Status::InvalidArgument("--bind-address=" + options_.bind_address +
                                   " is not an IP address");
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  const std::string where = options_.bind_address + ":" + std::to_string(options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable(options_.port_flag + "=" + std::to_string(options_.port) +
                               ": cannot listen on " + where + " (" + ec.message() + ")");
  }
  port_ = acceptor_.local_endpoint(ec).port();
  started_ = true;
  Accept();
  int n = options_.io_threads;
  if (n <= 0) n = PerCore();
  for (int i = 0; i < n; ++i) io_threads_.emplace_back([this] { io_.run(); });
  return Status::Ok();
}

void HttpsTransport::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](const error_code& ec, tcp::socket socket) {
    if (!acceptor_.is_open()) return;
    if (ec) {
      // Out of file descriptors (or a connection reset before accept): retry shortly rather
      // than spin on an error that persists.
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](const error_code& e) {
        if (!e && acceptor_.is_open()) Accept();
      });
      return;
    }
    std::shared_ptr<Connection> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (connections_.size() < static_cast<size_t>(options_.max_connections)) {
        c = std::make_shared<Connection>(this, std::move(socket), accepted_++);
        connections_.emplace(c.get(), c);
      }
    }
    if (c) {
      c->Start();
    } else {
      ++refused_;
      error_code ignored;
      socket.close(ignored);
    }
    Accept();
  });
}

void HttpsTransport::Impl::Unregister(Connection* c) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(c);
  if (connections_.empty()) all_closed_.notify_all();
}

void HttpsTransport::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  if (!started_) return;
  net::post(acceptor_.get_executor(), [this] {
    error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
  });
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, weak] : connections_) {
      if (std::shared_ptr<Connection> c = weak.lock()) live.push_back(std::move(c));
    }
  }
  // Released outside mu_: the last reference runs the destructor, which takes mu_.
  for (std::shared_ptr<Connection>& c : live) {
    net::any_io_executor strand = c->executor();
    net::post(strand, [c = std::move(c)] { c->CloseIfIdle(); });
  }
  live.clear();
  {
    std::unique_lock<std::mutex> lock(mu_);
    all_closed_.wait(lock, [this] { return connections_.empty(); });
  }
  workers_.Stop();
  work_.reset();
  io_.stop();
  for (std::thread& t : io_threads_) t.join();
}

HttpsTransportStats HttpsTransport::Impl::Stats() const {
  HttpsTransportStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.open_connections = static_cast<int64_t>(connections_.size());
  }
  s.refused_connections = refused_.load();
  s.timed_out = timed_out_.load();
  return s;
}

HttpsTransport::HttpsTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpsTransport::~HttpsTransport() = default;

std::unique_ptr<HttpsTransport> HttpsTransport::Create(HttpsTransportOptions options, SSL_CTX* ctx,
                                                       Handler handler, Draining draining) {
  return std::unique_ptr<HttpsTransport>(new HttpsTransport(
      std::make_unique<Impl>(std::move(options), ctx, std::move(handler), std::move(draining))));
}

int HttpsTransport::port() const { return impl_->port(); }
int HttpsTransport::io_threads() const { return impl_->io_threads(); }
int HttpsTransport::usable_cpus() const { return impl_->usable_cpus(); }
Status HttpsTransport::Start() { return impl_->Start(); }
void HttpsTransport::Stop() { impl_->Stop(); }
HttpsTransportStats HttpsTransport::stats() const { return impl_->Stats(); }

}  // namespace kvoffload::webhook
