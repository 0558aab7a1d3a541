#include "fake_api_server.h"

#include <openssl/evp.h>


namespace kvoffload::webhook::testing {
namespace {

std::string Base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                  reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  return out;
}

}  // namespace

FakeApiServer::FakeApiServer(const std::filesystem::path& dir, const Pki& pki) {
  WriteFileAtomic(dir / "api.crt", pki.cert_pem);
  WriteFileAtomic(dir / "api.key", pki.key_pem);
  ca_pem_ = pki.ca_pem;
  server_ = std::make_unique<httplib::SSLServer>((dir / "api.crt").c_str(), (dir / "api.key").c_str());
  server_->Get(".*", [this](const httplib::Request& req, httplib::Response& res) {
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++requests_[req.path];
      delay = delay_;
      if (req.get_header_value("Authorization") != "Bearer " + token_) {
        res.status = 401;
        res.set_content(R"({"kind":"Status","message":"Unauthorized"})", "application/json");
        return;
      }
    }
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto endless = endless_.find(req.path); endless != endless_.end()) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      res.set_chunked_content_provider(
          "application/json", [this, until, piece = endless->second.first,
                               interval = endless->second.second](size_t, httplib::DataSink& sink) {
            std::this_thread::sleep_for(interval);
            if (stopping_ || std::chrono::steady_clock::now() > until) return false;
            return sink.write(piece.data(), piece.size());
          });
      return;
    }
    auto it = objects_.find(req.path);
    if (it == objects_.end()) {
      res.status = 404;
      res.set_content(R"({"kind":"Status","reason":"NotFound"})", "application/json");
      return;
    }
    res.status = it->second.first;
    if (trickle_.count() == 0) {
      res.set_content(it->second.second, "application/json");
      return;
    }
    res.set_content_provider(
        it->second.second.size(), "application/json",
        [this, body = it->second.second, interval = trickle_](size_t offset, size_t,
                                                              httplib::DataSink& sink) {
          std::this_thread::sleep_for(interval);
          return !stopping_ && sink.write(body.data() + offset, 1);
        });
  });
  port_ = server_->bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() does nothing before listen_after_bind() has begun; wait so the destructor can stop it.
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

FakeApiServer::~FakeApiServer() {
  stopping_ = true;
  server_->stop();
  thread_.join();
}

void FakeApiServer::Put(const std::string& path, const nlohmann::json& obj, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_[path] = {status, obj.dump()};
}

void FakeApiServer::PutRaw(const std::string& path, const std::string& body, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_[path] = {status, body};
}

void FakeApiServer::PutEndless(const std::string& path, const std::string& piece,
                               std::chrono::milliseconds interval) {
  std::lock_guard<std::mutex> lock(mu_);
  endless_[path] = {piece, interval};
}

void FakeApiServer::SetTrickle(std::chrono::milliseconds interval) {
  std::lock_guard<std::mutex> lock(mu_);
  trickle_ = interval;
}

void FakeApiServer::SetToken(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  token_ = token;
}

void FakeApiServer::SetDelay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay;
}

int FakeApiServer::Requests(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_[path];
}

std::string FakeApiServer::Kubeconfig(const std::string& token_file) const {
  return "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
         "clusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:" +
         std::to_string(port_) + "\n    certificate-authority-data: " + Base64(ca_pem_) +
         "\ncontexts:\n- name: test\n  context: {cluster: local, user: webhook}\n"
         "users:\n- name: webhook\n  user:\n    tokenFile: " + token_file + "\n";
}

}  // namespace kvoffload::webhook::testing
