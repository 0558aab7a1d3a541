// The HTTPS server with real sockets and TLS handshakes on port 0.
#include "webhook/server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/on_one_cpu.h"
#include "exposition.h"
#include "kvoffload/cpu_budget.h"
#include "server_fixture.h"
#include "test_pki.h"
#include "webhook/admission.h"
#include "webhook/caching_reader.h"
#include "webhook/cluster_reader.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::AnnotatedPodReview;
using testing::LoopbackServerOptions;
using testing::MakePki;
using testing::PodReview;
using testing::Pki;
using testing::TempDir;
using testing::WriteFileAtomic;

// A pod of an LLMInferenceService (KServe's labels), which the handler resolves through the
// ClusterReader.
std::string LlmisvcPodReview() {
  return PodReview({{"metadata", {{"labels", {{"app.kubernetes.io/part-of", "llminferenceservice"},
                                              {"app.kubernetes.io/name", "llama"}}}}},
                    {"spec", {{"containers", {{{"name", "main"}}}}}}});
}

// Answers after a delay, so requests are still in flight when the server drains.
class SlowReader : public ClusterReader {
 public:
  explicit SlowReader(std::chrono::milliseconds delay) : delay_(delay) {}
  Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline) override {
    std::this_thread::sleep_for(delay_);
    if (ref.kind != ObjectKind::kLLMInferenceService) return std::optional<json>();
    return std::optional<json>(json{{"spec", {{"kvCacheOffloading", {{"cpu", "2Gi"}}}}}});
  }
  bool Authoritative() const override { return true; }

 private:
  std::chrono::milliseconds delay_;
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    pki_ = testing::WriteServingPki(dir_, "first");
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    fs::remove_all(dir_);
  }

  void StartServer(ClusterReader* reader = nullptr, std::string client_ca = "",
                   AdmissionOptions admission = {}) {
    handler_ = std::make_unique<AdmissionHandler>(std::move(admission), reader);
    ServerOptions o = LoopbackServerOptions(dir_);
    o.client_ca_file = std::move(client_ca);
    o.cert_poll_interval = std::chrono::milliseconds(20);
    o.shutdown_delay = std::chrono::milliseconds(300);
    o.threads = 16;
    Result<std::unique_ptr<Server>> s = Server::Create(o, handler_.get(), &metrics_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start().ok());
  }

  std::unique_ptr<httplib::SSLClient> Client(const std::string& ca_file) {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", server_->port());
    c->set_ca_cert_path(ca_file.c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(2, 0);
    c->set_read_timeout(5, 0);
    return c;
  }

  fs::path dir_;
  Pki pki_;
  Metrics metrics_;
  std::unique_ptr<AdmissionHandler> handler_;
  std::unique_ptr<Server> server_;
};

TEST_F(ServerTest, ServesAdmissionHealthAndMetrics) {
  StartServer();
  auto client = Client((dir_ / "ca.crt").string());
  client->set_keep_alive(true);
  httplib::Result health = client->Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(client->Get("/readyz")->status, 200);
  httplib::Result r = client->Post("/mutate-pods", AnnotatedPodReview(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  json response = json::parse(r->body)["response"];
  EXPECT_EQ(response["uid"], "u1");
  EXPECT_EQ(response["allowed"], true);
  EXPECT_TRUE(response.contains("patch"));

  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  httplib::Result m = metrics.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kvoffload_admission_requests_total{outcome=\"injected\"} 1"),
            std::string::npos)
      << m->body;
  const testing::Exposition e = testing::ParseExposition(m->body);
  EXPECT_EQ(e.Sum("kvoffload_admission_duration_seconds_count", {{"outcome", "injected"}}), 1);
  EXPECT_EQ(e.Sum("kvoffload_admission_duration_seconds_count"), 1);
  EXPECT_EQ(e.Sum("kvoffload_injection_success_total"), 1);
  // The keep-alive client above is still connected; nothing was refused.
  EXPECT_NE(m->body.find("kvoffload_webhook_open_connections 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("kvoffload_webhook_refused_connections_total 0\n"), std::string::npos);
}

// The metrics port is anyone's to reach (the NetworkPolicy admits Prometheus from any
// namespace). Clients that trickle a request's header must not keep a scrape from its answer:
// on cpp-httplib's server (two threads, a timeout per read) two of them held /metrics for as
// long as they went on. Each is cut at its request deadline (2 s) instead.
TEST_F(ServerTest, SlowClientsDoNotHoldTheMetricsPort) {
  StartServer();
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::send(fd, "GET /metrics HTTP/1.1\r\nX", 25, MSG_NOSIGNAL), 25);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> cut{0};
  std::thread trickle([&] {
    for (int round = 0; round < 30 && !stop; ++round) {  // a byte each 100 ms, for 3 s
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int gone = 0;
      for (int fd : slow) gone += ::send(fd, "x", 1, MSG_NOSIGNAL) == 1 ? 0 : 1;
      cut = gone;
    }
  });
  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  metrics.set_read_timeout(std::chrono::seconds(1));
  for (int i = 0; i < 3; ++i) {
    httplib::Result m = metrics.Get("/metrics");
    ASSERT_TRUE(m) << "scrape " << i << ": " << httplib::to_string(m.error());
    EXPECT_EQ(m->status, 200);
  }
  trickle.join();
  EXPECT_EQ(cut.load(), 4) << "each slow client is cut at its request deadline";
  for (int fd : slow) ::close(fd);
}

TEST_F(ServerTest, QueryStringsUnknownRoutesAndExpectContinue) {
  StartServer();
  auto client = Client((dir_ / "ca.crt").string());
  // The API server calls the configured path with ?timeout=...
  httplib::Result r =
      client->Post("/mutate-pods?timeout=5s", AnnotatedPodReview(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(client->Post("/nope", AnnotatedPodReview(), "application/json")->status, 404);
  // A known route with another method: 405 and the method it takes (was 404, or 400 on the
  // metrics port), on both ports.
  httplib::Result get_mutate = client->Get("/mutate-pods");
  ASSERT_TRUE(get_mutate);
  EXPECT_EQ(get_mutate->status, 405);
  EXPECT_EQ(get_mutate->get_header_value("Allow"), "POST");
  httplib::Result post_health = client->Post("/healthz", "", "text/plain");
  ASSERT_TRUE(post_health);
  EXPECT_EQ(post_health->status, 405);
  EXPECT_EQ(post_health->get_header_value("Allow"), "GET");
  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  for (const char* path : {"/metrics", "/healthz"}) {
    httplib::Result post_metrics = metrics.Post(path, "", "text/plain");
    ASSERT_TRUE(post_metrics);
    EXPECT_EQ(post_metrics->status, 405) << path;
    EXPECT_EQ(post_metrics->get_header_value("Allow"), "GET") << path;
  }
  // curl sends Expect: 100-continue for bodies over 1 KiB and waits for the interim answer.
  const std::string body = AnnotatedPodReview();
  const std::string cmd = "curl -s -o /dev/null -w '%{http_code} %{time_total}' --cacert " +
                          (dir_ / "ca.crt").string() +
                          " -H 'Content-Type: application/json' -H 'Expect: 100-continue'"
                          " --expect100-timeout 5 --data-binary @" + (dir_ / "body.json").string() +
                          " https://127.0.0.1:" + std::to_string(server_->port()) + "/mutate-pods";
  WriteFileAtomic(dir_ / "body.json", body);
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char out[64] = {};
  const size_t n = std::fread(out, 1, sizeof(out) - 1, p);
  ::pclose(p);
  int code = 0;
  double seconds = 0;
  ASSERT_EQ(std::sscanf(std::string(out, n).c_str(), "%d %lf", &code, &seconds), 2) << out;
  EXPECT_EQ(code, 200);
  EXPECT_LT(seconds, 4.0) << "curl waited out its 100-continue timeout";
}

TEST_F(ServerTest, ServesApplyTimeChecksOnBothPaths) {
  StartServer();
  auto client = Client((dir_ / "ca.crt").string());
  const json review = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"request",
       {{"uid", "v1"},
        {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Namespace"}}},
        {"operation", "CREATE"},
        {"object",
         {{"kind", "Namespace"},
          {"metadata",
           {{"name", "team-a"}, {"annotations", {{"kvoffload.io/default-config", "{\"cpu\":\"0\"}"}}}}}}}}}};
  for (const char* path : {"/validate", "/validate-labelled"}) {
    httplib::Result r = client->Post(path, review.dump(), "application/json");
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    json response = json::parse(r->body)["response"];
    EXPECT_EQ(response["uid"], "v1");
    EXPECT_EQ(response["allowed"], false) << path;
    EXPECT_EQ(response["status"]["code"], 403);
  }
  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  httplib::Result m = metrics.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kvoffload_validation_requests_total{verdict=\"denied\"} 2"),
            std::string::npos)
      << m->body;
  // Pod admissions are counted apart: the e2e cases read that counter for pods only.
  const testing::Exposition e = testing::ParseExposition(m->body);
  EXPECT_EQ(e.Count("kvoffload_admission_duration_seconds_count"), 5u);  // one per outcome
  EXPECT_EQ(e.Sum("kvoffload_admission_duration_seconds_count"), 0);
  EXPECT_EQ(e.Sum("kvoffload_injection_requests_total"), 0);
  EXPECT_EQ(metrics_.admissions(Outcome::kDenied), 0u);
}

TEST_F(ServerTest, RejectsOversizedAndMistypedBodies) {
  StartServer();
  auto client = Client((dir_ / "ca.crt").string());
  httplib::Result big =
      client->Post("/mutate-pods", std::string(8 * 1024 * 1024, 'x'), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  httplib::Result text = client->Post("/mutate-pods", AnnotatedPodReview(), "text/plain");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 415);
  httplib::Result garbage = client->Post("/mutate-pods", "\x01\x02{{{", "application/json");
  ASSERT_TRUE(garbage);
  EXPECT_EQ(garbage->status, 200);
  EXPECT_EQ(json::parse(garbage->body)["response"]["allowed"], false);
  // Each counted as a bad request, the 413 too: the transport refuses it before the handler,
  // and it moved no counter before.
  EXPECT_EQ(metrics_.failures(FailureType::kBadRequest), 3u);
  httplib::Result big_review =
      client->Post("/validate", std::string(8 * 1024 * 1024, 'x'), "application/json");
  ASSERT_TRUE(big_review);
  EXPECT_EQ(big_review->status, 413);
  EXPECT_EQ(metrics_.validations(Verdict::kError), 1u);
  // Still serving after all of that.
  EXPECT_EQ(client->Get("/healthz")->status, 200);
}

// Handshake with a client limited to `version` and `ciphers`; true when it completes.
bool Handshake(int port, int version, const char* ciphers) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_security_level(ctx, 0);  // let the client offer what old clients offered
  SSL_CTX_set_min_proto_version(ctx, version);
  SSL_CTX_set_max_proto_version(ctx, version);
  if (ciphers != nullptr) SSL_CTX_set_cipher_list(ctx, ciphers);
  BIO* bio = BIO_new_ssl_connect(ctx);
  BIO_set_conn_hostname(bio, ("127.0.0.1:" + std::to_string(port)).c_str());
  const bool ok = BIO_do_handshake(bio) == 1;
  BIO_free_all(bio);
  SSL_CTX_free(ctx);
  return ok;
}

TEST_F(ServerTest, OnlyModernTls) {
  StartServer();
  EXPECT_TRUE(Handshake(server_->port(), TLS1_2_VERSION, nullptr));
  EXPECT_TRUE(Handshake(server_->port(), TLS1_3_VERSION, nullptr));
  EXPECT_FALSE(Handshake(server_->port(), TLS1_1_VERSION, "ALL:@SECLEVEL=0"));
  EXPECT_FALSE(Handshake(server_->port(), TLS1_VERSION, "ALL:@SECLEVEL=0"));
  // TLS 1.2 with only a CBC, non-forward-secret suite: refused.
  EXPECT_FALSE(Handshake(server_->port(), TLS1_2_VERSION, "AES128-SHA:@SECLEVEL=0"));
}

// Every connection is a full handshake, so the server spends nothing on resumption: no
// session ticket reaches a TLS 1.3 client, and it chooses AES-128-GCM-SHA256 although
// OpenSSL's client lists AES-256 first. And a client that leaves Nagle on, which writes its
// request after its Finished in a second segment, is answered without waiting out the 40 ms
// delayed ACK of the Finished (which a ticket written at once used to cut short): the best of
// five fresh connections stays far under it, where each would take over 40 ms.
TEST_F(ServerTest, FullHandshakesWithoutTicketsAnsweredAtOnce) {
  StartServer();
  static std::atomic<int> tickets{0};
  tickets = 0;
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT);
  SSL_CTX_sess_set_new_cb(ctx, [](SSL*, SSL_SESSION*) {
    ++tickets;
    return 0;  // not kept
  });
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  double best_ms = 1e9;
  for (int i = 0; i < 5; ++i) {
    BIO* bio = BIO_new_ssl_connect(ctx);  // a plain socket: Nagle on
    BIO_set_conn_hostname(bio, ("127.0.0.1:" + std::to_string(server_->port())).c_str());
    ASSERT_EQ(BIO_do_handshake(bio), 1);
    SSL* ssl = nullptr;
    BIO_get_ssl(bio, &ssl);
    EXPECT_STREQ(SSL_CIPHER_get_name(SSL_get_current_cipher(ssl)), "TLS_AES_128_GCM_SHA256");
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(BIO_write(bio, request.data(), static_cast<int>(request.size())),
              static_cast<int>(request.size()));
    std::string answer;
    char buf[4096];
    for (int n; (n = BIO_read(bio, buf, sizeof(buf))) > 0;) {
      answer.append(buf, static_cast<size_t>(n));
    }
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(
                                    std::chrono::steady_clock::now() - t0).count());
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
    BIO_free_all(bio);
  }
  SSL_CTX_free(ctx);
  EXPECT_EQ(tickets.load(), 0);
  EXPECT_LT(best_ms, 25.0);
}

// The same policy as an operator would check it: the openssl command line. Exit 0
// means the handshake completed.
int SClient(int port, const std::string& ca, const std::string& flags) {
  const std::string cmd = "openssl s_client -connect 127.0.0.1:" + std::to_string(port) +
                          " -CAfile " + ca + " -verify_return_error " + flags +
                          " </dev/null >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(ServerTest, OpensslSClientSeesOnlyModernTls) {
  StartServer();
  const std::string ca = (dir_ / "ca.crt").string();
  ASSERT_EQ(SClient(server_->port(), ca, "-tls1_3"), 0) << "openssl must be installed";
  EXPECT_EQ(SClient(server_->port(), ca, "-tls1_2"), 0);
  EXPECT_NE(SClient(server_->port(), ca, "-tls1_1 -cipher ALL:@SECLEVEL=0"), 0);
  EXPECT_NE(SClient(server_->port(), ca, "-tls1 -cipher ALL:@SECLEVEL=0"), 0);
  EXPECT_NE(SClient(server_->port(), ca, "-tls1_2 -cipher AES128-SHA:@SECLEVEL=0"), 0);
  EXPECT_NE(SClient(server_->port(), ca, "-tls1_2 -cipher RC4-SHA:DES-CBC3-SHA:@SECLEVEL=0"), 0);
}

TEST_F(ServerTest, CertificateRotationFailsNoRequest) {
  StartServer();
  const Pki second = MakePki("second");
  WriteFileAtomic(dir_ / "both.crt", pki_.ca_pem + second.ca_pem);
  WriteFileAtomic(dir_ / "second-ca.crt", second.ca_pem);

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&] {
      while (!stop.load()) {
        // A new connection per request: every request is a fresh handshake.
        auto c = Client((dir_ / "both.crt").string());
        c->set_keep_alive(false);
        httplib::Result r = c->Post("/mutate-pods", AnnotatedPodReview(), "application/json");
        (r && r->status == 200 ? ok : failed)++;
      }
    });
  }
  const Pki* pkis[] = {&second, &pki_};
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    const Pki& next = *pkis[i % 2];
    // Cert then key: in between the pair mismatches and must be ignored, not served.
    WriteFileAtomic(dir_ / "tls.crt", next.cert_pem);
    WriteFileAtomic(dir_ / "tls.key", next.key_pem);
  }
  // Last write was the first pki; rotate once more to the second and wait for the reload.
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  WriteFileAtomic(dir_ / "tls.crt", second.cert_pem);
  WriteFileAtomic(dir_ / "tls.key", second.key_pem);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(ok.load(), 20);
  // Rotations closer together than a poll merge into one reload; most are seen.
  EXPECT_GE(metrics_.cert_reloads(true), 5u);

  // The new pair is really served: only its CA verifies now.
  EXPECT_TRUE(Client((dir_ / "second-ca.crt").string())->Get("/healthz"));
  EXPECT_FALSE(Client((dir_ / "ca.crt").string())->Get("/healthz"));
}

// A certificate file that disappears while serving was passed over without a word (no log, no
// failed reload counted, so the alert on failed reloads never fired): it is counted once, and
// the pair loaded before is served on.
TEST_F(ServerTest, ACertificateFileThatGoesIsAFailedReload) {
  StartServer();
  fs::remove(dir_ / "tls.key");
  for (int i = 0; i < 100 && metrics_.cert_reloads(false) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metrics_.cert_reloads(false), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // several polls
  EXPECT_EQ(metrics_.cert_reloads(false), 1u) << "counted once, not at every poll";
  EXPECT_TRUE(Client((dir_ / "ca.crt").string())->Get("/healthz"));
}

// An expired pair in the files (a renewal that failed, an old Secret restored) is not served
// over the working one; one not valid yet is (clock skew), and the metric tells its expiry.
TEST_F(ServerTest, ExpiredRotationKeepsThePairServedAndTheExpiryIsExported) {
  StartServer();
  const int64_t first_expiry = metrics_.cert_not_after();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  EXPECT_GT(first_expiry, now + 3000);
  EXPECT_LE(first_expiry, now + 3600);

  const Pki expired = MakePki("expired", -7200, -60);
  WriteFileAtomic(dir_ / "expired-ca.crt", expired.ca_pem);
  WriteFileAtomic(dir_ / "tls.crt", expired.cert_pem);
  WriteFileAtomic(dir_ / "tls.key", expired.key_pem);
  for (int i = 0; i < 100 && metrics_.cert_reloads(false) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(metrics_.cert_reloads(false), 1u);
  EXPECT_TRUE(Client((dir_ / "ca.crt").string())->Get("/healthz")) << "the first pair is gone";
  EXPECT_EQ(metrics_.cert_not_after(), first_expiry);

  const Pki early = MakePki("early", 30, 7200);
  WriteFileAtomic(dir_ / "tls.crt", early.cert_pem);
  WriteFileAtomic(dir_ / "tls.key", early.key_pem);
  for (int i = 0; i < 100 && metrics_.cert_reloads(true) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metrics_.cert_reloads(true), 2u);
  EXPECT_GT(metrics_.cert_not_after(), now + 7000);

  httplib::Client metrics("127.0.0.1", server_->metrics_port());
  httplib::Result m = metrics.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kvoffload_cert_expiry_timestamp_seconds " +
                         std::to_string(metrics_.cert_not_after()) + "\n"),
            std::string::npos)
      << m->body;
}

// A client in the middle of its handshake when the server stops (the listener is closed, the
// drain delay over), which then finishes the handshake and sends nothing, as Go's client does
// with a connection it dialed for its pool: it held the shutdown for the whole idle timeout
// (120 s by default, past Kubernetes' 30 s grace period). Closed once its handshake is done.
TEST_F(ServerTest, ShutdownClosesAConnectionThatFinishesItsHandshakeAfterTheStop) {
  StartServer();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  auto flush = [&] {
    char buf[16384];
    for (int n; (n = BIO_read(out, buf, sizeof(buf))) > 0;) {
      ASSERT_EQ(::send(fd, buf, static_cast<size_t>(n), 0), n);
    }
  };
  ASSERT_EQ(SSL_do_handshake(ssl), -1);  // ClientHello written, the server's flight awaited
  flush();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  char buf[16384];
  const ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  ASSERT_GT(got, 0) << "the server's handshake flight";
  BIO_write(in, buf, static_cast<int>(got));
  const auto start = std::chrono::steady_clock::now();
  std::future<void> stopped = std::async(std::launch::async, [this] { server_->Shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past the 300 ms drain delay
  ASSERT_EQ(SSL_do_handshake(ssl), 1);  // our Finished: the handshake is complete
  flush();
  const bool done = stopped.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  ::close(fd);  // lets a server that waits for this connection finish
  stopped.wait();
  EXPECT_TRUE(done) << "shutdown waited on a connection that never sent a request";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
}

TEST_F(ServerTest, ShutdownDrainsInFlightRequests) {
  SlowReader slow(std::chrono::milliseconds(400));
  StartServer(&slow);
  std::vector<std::future<int>> inflight;
  for (int i = 0; i < 6; ++i) {
    inflight.push_back(std::async(std::launch::async, [this] {
      auto c = Client((dir_ / "ca.crt").string());
      httplib::Result r = c->Post("/mutate-pods", LlmisvcPodReview(), "application/json");
      if (!r || r->status != 200) return -1;
      return json::parse(r->body)["response"]["allowed"].get<bool>() ? 1 : 0;
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread stopper([this] { server_->Shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Draining: not ready, but still answering.
  EXPECT_FALSE(server_->ready());
  httplib::Result ready = Client((dir_ / "ca.crt").string())->Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  for (auto& f : inflight) EXPECT_EQ(f.get(), 1);
  stopper.join();
  EXPECT_FALSE(Client((dir_ / "ca.crt").string())->Get("/healthz"));
}

// Holds every lookup until the test opens it (or 10 s pass, so a broken server fails the test
// rather than hanging it).
class GatedReader : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10), [this] { return open_; });
    }
    if (ref.kind != ObjectKind::kLLMInferenceService) return std::optional<json>();
    return std::optional<json>(json{{"spec", {{"kvCacheOffloading", {{"cpu", "2Gi"}}}}}});
  }
  bool Authoritative() const override { return true; }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Only one admission per core computes at a time, but one waiting on the API server (its own
// lookup, or another admission's lookup of the same object) does not count: with more
// admissions waiting than there are cores, an admission that needs no lookup is still answered.
TEST_F(ServerTest, AdmissionsWaitingOnTheApiServerDoNotHoldUpOthers) {
  GatedReader gated;
  CachingClusterReader cached(&gated, std::chrono::seconds(30), std::chrono::minutes(5), nullptr);
  // A lookup budget past the gate's bound: the waiting admissions only end when it opens.
  AdmissionOptions options;
  options.lookup_budget = std::chrono::seconds(20);
  StartServer(&cached, "", options);
  std::vector<std::future<int>> waiting;
  for (int i = 0; i < 6; ++i) {  // more than the at most 4 that compute at once
    waiting.push_back(std::async(std::launch::async, [this] {
      auto c = Client((dir_ / "ca.crt").string());
      c->set_read_timeout(20, 0);
      httplib::Result r = c->Post("/mutate-pods", LlmisvcPodReview(), "application/json");
      return r ? r->status : -1;
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let them reach the lookup
  // Answered before the gate opens, or not at all: the gate opens only after this returns.
  httplib::Result r = Client((dir_ / "ca.crt").string())->Post("/mutate-pods", AnnotatedPodReview(),
                                                               "application/json");
  gated.Open();
  ASSERT_TRUE(r) << "waited for the lookups of other admissions";
  EXPECT_EQ(r->status, 200);
  for (auto& f : waiting) EXPECT_EQ(f.get(), 200);
  // Stopped (its workers joined) while the readers it calls still exist: they live on this
  // stack, which TearDown's calls reuse after they are gone.
  server_->Shutdown();
}

// One I/O thread per core the server may run on, not per core of the machine: in a pod given
// a cpuset, threads beyond it would only take turns on its cores. Started from a thread
// allowed one CPU (threads inherit their creator's affinity, and the server reads its own), it
// starts one. (Counted through the server, not in /proc/self/task: threads made once per
// process on first use, such as ThreadSanitizer's, made that count differ by one.)
TEST_F(ServerTest, IoThreadsFollowTheCpusItMayUse) {
  const int cores = UsableCpus();  // the affinity mask, or less under a cgroup CPU limit
  if (cores < 2) {
    // As the agent's capability checks: skipped on a 1-CPU machine, a failure on CI (CI=true).
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true") FAIL() << "CI must give this test 2 usable CPUs";
    GTEST_SKIP() << "not run: needs 2 usable CPUs to tell a cpuset from the machine (runs on "
                    "any machine with 2 or more, as CI has)";
  }
  StartServer();
  EXPECT_EQ(server_->io_threads(), std::min(cores, 4)) << "on " << cores << " usable CPUs";
  server_->Shutdown();
  server_.reset();

  kvoffload::testing::OnOneCpu([&] {
    StartServer();
    EXPECT_EQ(server_->io_threads(), 1) << "allowed one CPU";
  });
}

TEST_F(ServerTest, ClientCertificatesWhenConfigured) {
  const Pki client_pki = MakePki("client");
  WriteFileAtomic(dir_ / "client-ca.crt", client_pki.ca_pem);
  WriteFileAtomic(dir_ / "client.crt", client_pki.cert_pem);
  WriteFileAtomic(dir_ / "client.key", client_pki.key_pem);
  StartServer(nullptr, (dir_ / "client-ca.crt").string());
  EXPECT_FALSE(Client((dir_ / "ca.crt").string())->Get("/healthz"));
  httplib::SSLClient with_cert("127.0.0.1", server_->port(), (dir_ / "client.crt").string(),
                               (dir_ / "client.key").string());
  with_cert.set_ca_cert_path((dir_ / "ca.crt").c_str());
  with_cert.enable_server_certificate_verification(true);
  httplib::Result r = with_cert.Get("/healthz");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
}

}  // namespace
}  // namespace kvoffload::webhook
