// kvoffload-loadgen: an open-loop HTTPS load generator for /mutate-pods. Each connection sends
// on a fixed schedule and latency is measured from the scheduled send time, so a slow server
// cannot hide its queueing (no coordinated omission). Prints one JSON object.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 8443;
  std::string path = "/mutate-pods";
  std::string body_file;
  std::string ca_file;
  int connections = 8;
  double rate = 1000;       // requests per second, all connections together
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

double Percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())));
  return sorted[i];
}

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
  if (o.body_file.empty() || o.ca_file.empty() || o.rate <= 0 || o.connections <= 0) return Usage();
  std::stringstream ss;
  ss << std::ifstream(o.body_file).rdbuf();
  const std::string body = ss.str();

  const auto interval = std::chrono::duration<double>(o.connections / o.rate);
  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(200);
  const Clock::time_point measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(o.warmup_s));
  const Clock::time_point end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(o.duration_s));
  std::vector<std::vector<double>> latencies(static_cast<size_t>(o.connections));
  std::atomic<long> errors{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < o.connections; ++c) {
    threads.emplace_back([&, c] {
      httplib::SSLClient client(o.host, o.port);
      client.set_ca_cert_path(o.ca_file.c_str());
      client.enable_server_certificate_verification(true);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      client.set_read_timeout(10, 0);
      // Connections start staggered so the aggregate schedule is even.
      Clock::time_point next = start + std::chrono::duration_cast<Clock::duration>(interval * c / o.connections);
      auto& mine = latencies[static_cast<size_t>(c)];
      while (next < end) {
        std::this_thread::sleep_until(next);
        httplib::Result r = client.Post(o.path.c_str(), body, "application/json");
        const Clock::time_point done = Clock::now();
        const bool ok = r && r->status == 200 && r->body.find("\"allowed\":true") != std::string::npos;
        if (next >= measure_from) {
          if (ok) {
            mine.push_back(std::chrono::duration<double, std::micro>(done - next).count());
          } else {
            ++errors;
          }
        }
        next += std::chrono::duration_cast<Clock::duration>(interval);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  nlohmann::json out = {{"target_rate", o.rate},
                        {"connections", o.connections},
                        {"requests", all.size()},
                        {"errors", errors.load()},
                        {"achieved_rate", static_cast<double>(all.size()) / o.duration_s},
                        {"p50_us", Percentile(all, 0.50)},
                        {"p99_us", Percentile(all, 0.99)},
                        {"p999_us", Percentile(all, 0.999)},
                        {"max_us", all.empty() ? 0.0 : all.back()}};
  std::cout << out.dump() << std::endl;
  return errors.load() == 0 ? 0 : 1;
}
