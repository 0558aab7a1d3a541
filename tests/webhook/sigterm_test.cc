// The real binary under SIGTERM: readiness turns false first, requests in flight (held up by a
// slow API server) all get their answer, and the process exits 0. SIGHUP before it changes
// nothing.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "fake_api_server.h"
#include "test_pki.h"

extern char** environ;

namespace kvoffload::webhook {
namespace {

using nlohmann::json;
using testing::FakeApiServer;
using testing::MakePki;
using testing::TempDir;
using testing::WriteFileAtomic;

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string Review() {
  json pod = {{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                        {"app.kubernetes.io/name", "llama"}}}}},
              {"spec", {{"containers", {{{"name", "main"}}}}}}};
  return json{{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"},
              {"request", {{"uid", "u"}, {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                           {"namespace", "team-a"}, {"operation", "CREATE"}, {"object", pod}}}}
      .dump();
}

TEST(SigtermTest, DrainsThenExitsCleanly) {
  const auto dir = TempDir("sigterm");
  FakeApiServer api(dir);
  api.Put("/apis/serving.kserve.io/v1alpha2/namespaces/team-a/llminferenceservices/llama",
          {{"metadata", {{"name", "llama"}, {"namespace", "team-a"}}},
           {"spec", {{"kvCacheOffloading", {{"cpu", "1Gi"}}}}}});
  WriteFileAtomic(dir / "token", "secret-1");
  WriteFileAtomic(dir / "kubeconfig", api.Kubeconfig("token"));
  const testing::Pki pki = MakePki("webhook");
  WriteFileAtomic(dir / "tls.crt", pki.cert_pem);
  WriteFileAtomic(dir / "tls.key", pki.key_pem);
  WriteFileAtomic(dir / "ca.crt", pki.ca_pem);

  const int port = FreePort();
  std::vector<std::string> args = {KVOFFLOAD_WEBHOOK_BINARY, "serve", "--bind-address=127.0.0.1",
                                   "--port=" + std::to_string(port), "--metrics-port=-1",
                                   "--tls-cert-file=" + (dir / "tls.crt").string(),
                                   "--tls-key-file=" + (dir / "tls.key").string(),
                                   "--kubeconfig=" + (dir / "kubeconfig").string(),
                                   "--shutdown-delay=400ms", "--cache-ttl=0s", "--log-level=warn"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);

  auto client = [&] {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
    c->set_ca_cert_path((dir / "ca.crt").c_str());
    c->enable_server_certificate_verification(true);
    c->set_read_timeout(5, 0);
    return c;
  };
  // Ready within 5 s (bounded poll, no fixed sleep).
  bool ready = false;
  for (int i = 0; i < 500 && !ready; ++i) {
    httplib::Result r = client()->Get("/readyz");
    ready = r && r->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(ready);
  // SIGHUP, which operators send to ask for a reload, killed the process mid-admission: it
  // is ignored (the certificate reloads by itself), and the webhook keeps serving.
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), 0) << "SIGHUP ended the process";
  httplib::Result after_hup = client()->Get("/readyz");
  ASSERT_TRUE(after_hup);
  EXPECT_EQ(after_hup->status, 200);

  api.SetDelay(std::chrono::milliseconds(600));
  std::vector<std::future<bool>> inflight;
  for (int i = 0; i < 6; ++i) {
    inflight.push_back(std::async(std::launch::async, [&] {
      httplib::Result r = client()->Post("/mutate-pods", Review(), "application/json");
      return r && r->status == 200 && json::parse(r->body)["response"]["allowed"] == true &&
             json::parse(r->body)["response"].contains("patch");
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  httplib::Result r = client()->Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  for (auto& f : inflight) EXPECT_TRUE(f.get());

  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 500 && waited == 0; ++i) {
    waited = ::waitpid(pid, &status, WNOHANG);
    if (waited == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (waited == 0) ::kill(pid, SIGKILL);
  ASSERT_EQ(waited, pid) << "did not exit within 5 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvoffload::webhook
