// The transport on its own, through raw TLS writes: a request's body reaches the handler whole
// however its bytes are split across reads (and pipelined requests each get theirs), and a body
// with a declared length arrives with the spare capacity the JSON parser reads past its end.
#include "webhook/https_transport.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_pki.h"

namespace kvoffload::webhook {
namespace {

// What the handler saw of one request.
struct Seen {
  std::string body;
  size_t spare = 0;  // capacity left after the body
};

class HttpsTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::Pki pki = testing::MakePki("transport");
    ctx_ = SSL_CTX_new(TLS_server_method());
    BIO* cert = BIO_new_mem_buf(pki.cert_pem.data(), static_cast<int>(pki.cert_pem.size()));
    BIO* key = BIO_new_mem_buf(pki.key_pem.data(), static_cast<int>(pki.key_pem.size()));
    X509* x509 = PEM_read_bio_X509(cert, nullptr, nullptr, nullptr);
    EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key, nullptr, nullptr, nullptr);
    ASSERT_EQ(SSL_CTX_use_certificate(ctx_, x509), 1);
    ASSERT_EQ(SSL_CTX_use_PrivateKey(ctx_, pkey), 1);
    SSL_CTX_set_read_ahead(ctx_, 1);  // as the server sets it: records wait inside OpenSSL
    X509_free(x509);
    EVP_PKEY_free(pkey);
    BIO_free(cert);
    BIO_free(key);

    HttpsTransportOptions o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    o.io_threads = 1;
    o.worker_threads = 2;
    o.idle_timeout = std::chrono::seconds(2);  // a request left waiting fails in 2 s, not 120
    transport_ = HttpsTransport::Create(
        o, ctx_,
        [this](const HttpsRequest& req) {
          std::lock_guard<std::mutex> lock(mu_);
          seen_.push_back({req.body, req.body.capacity() - req.body.size()});
          return HttpsResponse{200, "text/plain", std::to_string(req.body.size()), ""};
        },
        [] { return false; });
    ASSERT_TRUE(transport_->Start().ok());
  }
  void TearDown() override {
    transport_->Stop();
    SSL_CTX_free(ctx_);
  }

  // Sends `parts` on one connection, pausing between them so each arrives as its own read
  // (unless `pause` is false), and returns everything the server wrote until it closed the
  // connection.
  std::string Exchange(const std::vector<std::string>& parts, bool pause = true) {
    SSL_CTX* client = SSL_CTX_new(TLS_client_method());
    BIO* bio = BIO_new_ssl_connect(client);
    BIO_set_conn_hostname(bio, ("127.0.0.1:" + std::to_string(transport_->port())).c_str());
    std::string got;
    if (BIO_do_handshake(bio) == 1) {
      for (const std::string& part : parts) {
        EXPECT_EQ(BIO_write(bio, part.data(), static_cast<int>(part.size())),
                  static_cast<int>(part.size()));
        if (pause) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      char buf[4096];
      for (int n; (n = BIO_read(bio, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
    }
    BIO_free_all(bio);
    SSL_CTX_free(client);
    return got;
  }

  std::vector<Seen> TakeSeen() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(seen_);
  }

  SSL_CTX* ctx_ = nullptr;
  std::unique_ptr<HttpsTransport> transport_;
  std::mutex mu_;
  std::vector<Seen> seen_;
};

std::string Post(const std::string& body, bool close) {
  return "POST /p HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + body;
}

// Two requests written back to back arrive as two TLS records in one read: OpenSSL hands over
// the first record's request and keeps the second record, undecrypted, which the socket will
// never signal again. The server must find it there, not wait on the socket (the client waits
// for the first answer's successor until the idle deadline).
TEST_F(HttpsTransportTest, ARequestReadAheadIntoTlsIsAnsweredWithoutMoreInput) {
  const auto start = std::chrono::steady_clock::now();
  const std::string answer = Exchange({Post("first", false), Post("second", true)}, false);
  const std::vector<Seen> seen = TakeSeen();
  ASSERT_EQ(seen.size(), 2u) << answer;
  EXPECT_EQ(seen[0].body, "first");
  EXPECT_EQ(seen[1].body, "second");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST_F(HttpsTransportTest, BodiesArriveWholeWithSpareCapacityHoweverTheyAreSplit) {
  const std::string small(10, 's');
  const std::string large(100000, 'l');
  const std::string whole = Post(large, true);
  const size_t header_end = whole.find("\r\n\r\n") + 4;
  struct Case {
    const char* name;
    std::vector<std::string> parts;
    std::vector<std::string> bodies;
  };
  const std::vector<Case> cases = {
      {"one write", {Post(small, true)}, {small}},
      {"header, then the body in two writes",
       {whole.substr(0, header_end), whole.substr(header_end, 5000), whole.substr(header_end + 5000)},
       {large}},
      {"header split inside a line", {whole.substr(0, 20), whole.substr(20)}, {large}},
      {"two pipelined in one write", {Post(large, false) + Post(small, true)}, {large, small}},
  };
  for (const Case& c : cases) {
    const std::string answer = Exchange(c.parts);
    const std::vector<Seen> seen = TakeSeen();
    ASSERT_EQ(seen.size(), c.bodies.size()) << c.name << ": " << answer;
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].body, c.bodies[i]) << c.name << " #" << i;
      EXPECT_GE(seen[i].spare, kBodySpareBytes) << c.name << " #" << i;
      EXPECT_NE(answer.find("\r\n\r\n" + std::to_string(c.bodies[i].size())), std::string::npos)
          << c.name << ": " << answer;
    }
  }
}

TEST_F(HttpsTransportTest, ChunkedBodiesArriveWhole) {
  // No declared length, so no spare capacity is promised; the body must still be whole.
  const std::string answer = Exchange(
      {"POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
       "5\r\nhello\r\n",
       "6\r\n world\r\n0\r\n\r\n"});
  const std::vector<Seen> seen = TakeSeen();
  ASSERT_EQ(seen.size(), 1u) << answer;
  EXPECT_EQ(seen[0].body, "hello world");
  EXPECT_NE(answer.find("\r\n\r\n11"), std::string::npos) << answer;
}

// A Transfer-Encoding whose last coding is not chunked leaves the body's length unknown (RFC
// 9112 6.3): the request is refused and the connection closed. Read as a request without a
// body, its bytes were answered as a second request (a request smuggled inside another).
TEST_F(HttpsTransportTest, ATransferEncodingThatIsNotChunkedIsRefused) {
  for (const std::string coding : {"gzip", "identity", "chunked, gzip", "xchunked"}) {
    const std::string answer = Exchange(
        {"POST /p HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: " + coding + "\r\n\r\n"
         "GET /hidden HTTP/1.1\r\nHost: t\r\n\r\n"});
    EXPECT_TRUE(TakeSeen().empty()) << coding << ": " << answer;
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 ", 0), 0u) << coding << ": " << answer;
    EXPECT_EQ(answer.find("HTTP/1.1", 1), std::string::npos) << coding << ": one answer: " << answer;
  }
}

// 100 Continue answers an HTTP/1.1 client that asks for it before its body; an HTTP/1.0 client
// has no interim answers and reads it as the answer to its request.
TEST_F(HttpsTransportTest, ContinueGoesOnlyToHttp11) {
  for (const std::string version : {"1.1", "1.0"}) {
    const std::string answer = Exchange(
        {"POST /p HTTP/" + version + "\r\nHost: t\r\nContent-Length: 5\r\n"
         "Expect: 100-continue\r\nConnection: close\r\n\r\n",
         "hello"});
    EXPECT_EQ(answer.find("100 Continue") != std::string::npos, version == "1.1")
        << version << ": " << answer;
    EXPECT_NE(answer.find("\r\n\r\n5"), std::string::npos) << version << ": " << answer;
    EXPECT_EQ(TakeSeen().size(), 1u) << version;
  }
}

// An answer to HEAD has the headers of the answer to GET and no body: bytes after them were
// read by the client as the start of its next answer on the connection.
TEST_F(HttpsTransportTest, AnAnswerToHeadHasNoBody) {
  const std::string answer = Exchange(
      {"HEAD /p HTTP/1.1\r\nHost: t\r\n\r\n", Post("next", true)});
  const std::string first_end = "\r\n\r\n";
  const size_t head_end = answer.find(first_end);
  ASSERT_NE(head_end, std::string::npos) << answer;
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 ", 0), 0u) << answer;
  EXPECT_EQ(answer.substr(head_end + first_end.size(), 9), "HTTP/1.1 ") << answer;
  EXPECT_EQ(TakeSeen().size(), 2u);
}

}  // namespace
}  // namespace kvoffload::webhook
