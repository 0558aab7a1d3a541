// A small fake API server for tests: HTTPS with a test CA, canned objects by path, a bearer
// token check, an optional delay per request, bodies sent slowly or never finished, and request
// counts. Thread-safe.
#ifndef KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_
#define KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_pki.h"

namespace kvoffload::webhook::testing {

class FakeApiServer {
 public:
  // Writes its serving pair (`pki`'s leaf) into `dir` and listens on 127.0.0.1, any port.
  explicit FakeApiServer(const std::filesystem::path& dir, const Pki& pki = MakePki("apiserver"));
  ~FakeApiServer();

  void Put(const std::string& path, const nlohmann::json& obj, int status = 200);
  // `body` as it is, JSON or not.
  void PutRaw(const std::string& path, const std::string& body, int status = 200);
  // A 200 whose chunked body is `piece` every `interval`, never finished (for 10 s at most, so
  // a client that keeps reading fails its test instead of hanging it).
  void PutEndless(const std::string& path, const std::string& piece,
                  std::chrono::milliseconds interval);
  // Every answer's headers at once, then its body one byte every `interval` (0: all at once).
  void SetTrickle(std::chrono::milliseconds interval);
  void SetToken(const std::string& token);
  void SetDelay(std::chrono::milliseconds delay);
  int Requests(const std::string& path);
  int port() const { return port_; }
  const std::string& ca_pem() const { return ca_pem_; }
  // A kubeconfig for this server authenticating with the token in `token_file`.
  std::string Kubeconfig(const std::string& token_file) const;

 private:
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::string ca_pem_;
  std::mutex mu_;
  std::map<std::string, std::pair<int, std::string>> objects_;  // GUARDED_BY(mu_)
  std::map<std::string, int> requests_;                         // GUARDED_BY(mu_)
  std::string token_ = "secret-1";                              // GUARDED_BY(mu_)
  std::chrono::milliseconds delay_{0};                          // GUARDED_BY(mu_)
  std::chrono::milliseconds trickle_{0};                        // GUARDED_BY(mu_)
  std::map<std::string, std::pair<std::string, std::chrono::milliseconds>>
      endless_;                                                 // GUARDED_BY(mu_)
  std::atomic<bool> stopping_{false};  // ends slow bodies so the destructor can stop the server
};

}  // namespace kvoffload::webhook::testing

#endif  // KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_
