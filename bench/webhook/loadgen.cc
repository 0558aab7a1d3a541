// kvoffload-loadgen: an open-loop HTTPS load generator for /mutate-pods. Requests are due on one
// fixed schedule (rate per second, all connections together) and latency is measured from the
// time a request was due, so a slow server cannot hide its queueing (no coordinated omission):
// a request due while every connection is busy waits in a queue, and that wait counts.
//
// One thread runs every connection on Boost.Asio (the reactor the webhook itself uses). The
// first version blocked a thread per connection and slept until each send; at 20,000 req/s it
// used a whole core of the two this machine has, so at half the server's saturation rate the
// client, not the server, set the tail. Prints one JSON object, with the client's own CPU time.
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8443;
  std::string path = "/mutate-pods";
  std::string body_file;
  std::string ca_file;
  int connections = 8;
  double rate = 1000;  // requests per second, all connections together
  double duration_s = 10;
  double warmup_s = 1;
};

int Usage() {
  std::fputs(
      "usage: kvoffload-loadgen --port P --body FILE --ca FILE [--host 127.0.0.1] "
      "[--path /mutate-pods] [--connections 8] [--rate 1000] [--duration 10] [--warmup 1]\n",
      stderr);
  return 2;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i =
      std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())));
  return sorted[i];
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

class LoadGen {
 public:
  LoadGen(const Options& o, std::string request)
      : o_(o),
        request_(std::move(request)),
        tls_(ssl::context::tls_client),
        timer_(io_),
        deadline_(io_),
        interval_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(1.0 / o.rate))) {
    tls_.load_verify_file(o.ca_file);
    tls_.set_verify_mode(ssl::verify_peer);
    endpoint_ = tcp::endpoint(asio::ip::make_address(o.host), static_cast<uint16_t>(o.port));
  }

  // Connects every connection first (handshakes are not part of the schedule), then runs the
  // schedule to its end and waits for the answers still due.
  void Run() {
    for (int i = 0; i < o_.connections; ++i) {
      conns_.push_back(std::make_unique<Conn>(io_, tls_));
      Connect(*conns_.back());
    }
    io_.run();
    if (idle_.size() != conns_.size()) {
      throw std::runtime_error("could not open " + std::to_string(o_.connections) +
                               " connections to " + o_.host + ":" + std::to_string(o_.port));
    }
    io_.restart();
    start_ = Clock::now() + std::chrono::milliseconds(100);
    measure_from_ = start_ + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(o_.warmup_s));
    end_ = measure_from_ + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(o_.duration_s));
    scheduling_ = true;
    // A server that stops answering ends the run 10 s after the schedule; what is still
    // unanswered then counts as errors.
    deadline_.expires_at(end_ + std::chrono::seconds(10));
    deadline_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      errors_ += static_cast<long>(conns_.size() - idle_.size() + queued_.size());
      io_.stop();
    });
    Tick();
    io_.run();
  }

  std::vector<double>& latencies() { return latencies_; }
  long errors() const { return errors_; }

 private:
  struct Conn {
    Conn(asio::io_context& io, ssl::context& tls) : stream(io, tls) {}
    ssl::stream<tcp::socket> stream;
    boost::beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> parser;
    Clock::time_point due;
  };

  void Connect(Conn& c) {
    c.stream.set_verify_callback(ssl::host_name_verification(o_.host));
    c.stream.next_layer().async_connect(endpoint_, [this, &c](boost::system::error_code ec) {
      if (ec) return Failed(c);
      c.stream.next_layer().set_option(tcp::no_delay(true));
      c.stream.async_handshake(ssl::stream_base::client, [this, &c](boost::system::error_code e) {
        if (e) return Failed(c);
        Idle(c);
      });
    });
  }

  // A connection that failed is replaced by a fresh one, as the blocking client did: the
  // request it carried counts as an error, and the schedule goes on.
  void Failed(Conn& c) {
    if (!scheduling_) return;  // while connecting: Run() reports it
    ++errors_;
    for (auto& owned : conns_) {
      if (owned.get() != &c) continue;
      boost::system::error_code ignored;
      owned->stream.next_layer().close(ignored);
      // The failed stream's handlers have all run (this is one of them); it can go once this
      // handler returns.
      asio::post(io_, [old = std::shared_ptr<Conn>(std::move(owned))] {});
      owned = std::make_unique<Conn>(io_, tls_);
      Connect(*owned);
      return;
    }
  }

  // Queues every request due by now.
  void Enqueue() {
    const Clock::time_point now = Clock::now();
    for (Clock::time_point due = start_ + interval_ * sent_; due <= now && due < end_;
         due = start_ + interval_ * sent_) {
      queued_.push_back(due);
      ++sent_;
    }
  }

  // Hands what is due to idle connections, then checks again at the next due time, or kTick
  // from now if that is sooner. Re-arming the timer is a syscall (timerfd_settime), which at
  // 28,000 req/s was the client's largest cost: the tick bounds it, a request sent late by up to
  // a tick still counts from when it was due, and answers arriving between ticks pick up what
  // became due meanwhile (Idle).
  void Tick() {
    Enqueue();
    while (!queued_.empty() && !idle_.empty()) {
      Conn* c = idle_.back();
      idle_.pop_back();
      Send(*c, queued_.front());
      queued_.pop_front();
    }
    const Clock::time_point next = start_ + interval_ * sent_;
    if (next >= end_) {
      scheduling_done_ = true;
      MaybeFinish();
      return;
    }
    timer_.expires_at(std::max(next, Clock::now() + kTick));
    timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) Tick();
    });
  }

  void Send(Conn& c, Clock::time_point due) {
    c.due = due;
    asio::async_write(c.stream, asio::buffer(request_),
                      [this, &c](boost::system::error_code ec, size_t) {
                        if (ec) return Failed(c);
                        c.parser.emplace();
                        c.parser->body_limit(1 << 20);
                        http::async_read(c.stream, c.buffer, *c.parser,
                                         [this, &c](boost::system::error_code e, size_t) {
                                           if (e) return Failed(c);
                                           Answered(c);
                                         });
                      });
  }

  void Answered(Conn& c) {
    const Clock::time_point done = Clock::now();
    const auto& res = c.parser->get();
    const bool ok = res.result_int() == 200 &&
                    res.body().find("\"allowed\":true") != std::string::npos;
    if (c.due >= measure_from_) {
      if (ok) {
        latencies_.push_back(std::chrono::duration<double, std::micro>(done - c.due).count());
      } else {
        ++errors_;
      }
    }
    Idle(c);
  }

  void Idle(Conn& c) {
    if (scheduling_ && !scheduling_done_) Enqueue();
    if (!queued_.empty()) {
      const Clock::time_point due = queued_.front();
      queued_.pop_front();
      Send(c, due);
      return;
    }
    idle_.push_back(&c);
    MaybeFinish();
  }

  void MaybeFinish() {
    if (!scheduling_done_ || !queued_.empty() || idle_.size() != conns_.size()) return;
    deadline_.cancel();
    for (auto& c : conns_) {
      boost::system::error_code ignored;
      c->stream.next_layer().close(ignored);
    }
  }

  static constexpr std::chrono::microseconds kTick{100};

  const Options o_;
  const std::string request_;
  asio::io_context io_;
  ssl::context tls_;
  asio::steady_timer timer_;
  asio::steady_timer deadline_;
  tcp::endpoint endpoint_;
  const Clock::duration interval_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> idle_;
  std::deque<Clock::time_point> queued_;
  Clock::time_point start_, measure_from_, end_;
  long sent_ = 0;
  bool scheduling_ = false;
  bool scheduling_done_ = false;
  std::vector<double> latencies_;
  long errors_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--host") o.host = v;
    else if (k == "--port") o.port = std::stoi(v);
    else if (k == "--path") o.path = v;
    else if (k == "--body") o.body_file = v;
    else if (k == "--ca") o.ca_file = v;
    else if (k == "--connections") o.connections = std::stoi(v);
    else if (k == "--rate") o.rate = std::stod(v);
    else if (k == "--duration") o.duration_s = std::stod(v);
    else if (k == "--warmup") o.warmup_s = std::stod(v);
    else return Usage();
  }
  if (argc % 2 == 0 || o.body_file.empty() || o.ca_file.empty() || o.rate <= 0 ||
      o.connections <= 0) {
    return Usage();
  }
  std::stringstream ss;
  ss << std::ifstream(o.body_file).rdbuf();
  const std::string body = ss.str();
  const std::string request = "POST " + o.path + " HTTP/1.1\r\nHost: " + o.host +
                              "\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;

  LoadGen gen(o, request);
  try {
    gen.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvoffload-loadgen: %s\n", e.what());
    return 1;
  }
  std::vector<double>& all = gen.latencies();
  std::sort(all.begin(), all.end());
  nlohmann::json out = {{"target_rate", o.rate},
                        {"connections", o.connections},
                        {"requests", all.size()},
                        {"errors", gen.errors()},
                        {"achieved_rate", static_cast<double>(all.size()) / o.duration_s},
                        {"p50_us", Percentile(all, 0.50)},
                        {"p99_us", Percentile(all, 0.99)},
                        {"p999_us", Percentile(all, 0.999)},
                        {"max_us", all.empty() ? 0.0 : all.back()},
                        {"client_cpu_s", CpuSeconds()}};
  std::cout << out.dump() << std::endl;
  return gen.errors() == 0 ? 0 : 1;
}
