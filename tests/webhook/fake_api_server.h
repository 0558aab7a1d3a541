// A small fake API server for tests: HTTPS with a test CA, canned objects by path, a bearer
// token check, an optional delay per request, and request counts. Thread-safe.
#ifndef KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_
#define KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace kvoffload::webhook::testing {

class FakeApiServer {
 public:
  // Writes its serving pair into `dir` and listens on 127.0.0.1, any port.
  explicit FakeApiServer(const std::filesystem::path& dir);
  ~FakeApiServer();

  void Put(const std::string& path, const nlohmann::json& obj, int status = 200);
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
};

}  // namespace kvoffload::webhook::testing

#endif  // KVOFFLOAD_TESTS_WEBHOOK_FAKE_API_SERVER_H_
