// Start-up errors of the real binary: a bad certificate or key, a bad flag value, an unknown
// flag or a stray argument is one line on stderr naming the flag or file, and exit status 1,
// before anything listens; never a crash or a silent default.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_pki.h"

extern char** environ;

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  bool exited = false;  // false: killed by a signal, or still running after 5 s
  int code = -1;
  std::string err;
};

Outcome RunWebhook(std::vector<std::string> args, const fs::path& dir) {
  args.insert(args.begin(), KVOFFLOAD_WEBHOOK_BINARY);
  const fs::path err_file = dir / "stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  Outcome run;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) return run;
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  for (int i = 0; i < 500 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (::waitpid(pid, &status, WNOHANG) == 0 && ::kill(pid, 0) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return run;  // it started serving: the error was not caught
  }
  run.exited = WIFEXITED(status);
  run.code = run.exited ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  run.err = ss.str();
  return run;
}

class StartupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("startup");
    const testing::Pki pki = testing::MakePki("startup");
    const testing::Pki other = testing::MakePki("other");
    testing::WriteFileAtomic(dir_ / "tls.crt", pki.cert_pem);
    testing::WriteFileAtomic(dir_ / "tls.key", pki.key_pem);
    testing::WriteFileAtomic(dir_ / "other.key", other.key_pem);
    testing::WriteFileAtomic(dir_ / "garbage.pem", "not a pem file\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string File(const char* name) const { return (dir_ / name).string(); }
  std::vector<std::string> Serve(const char* cert, const char* key) const {
    return {"serve", "--bind-address=127.0.0.1", "--port=0", "--metrics-port=-1",
            "--tls-cert-file=" + File(cert), "--tls-key-file=" + File(key)};
  }
  // `flag` ("--name=value") in place of the same flag in `args`, or added: a flag given twice
  // is an error of its own.
  static void Set(std::vector<std::string>& args, const std::string& flag) {
    const std::string name = flag.substr(0, flag.find('=') + 1);
    for (std::string& arg : args) {
      if (arg.rfind(name, 0) == 0) {
        arg = flag;
        return;
      }
    }
    args.push_back(flag);
  }
  // One line naming `what`, exit 1.
  void ExpectOneLineError(const std::vector<std::string>& args, const std::string& what) {
    const Outcome run = RunWebhook(args, dir_);
    ASSERT_TRUE(run.exited) << "crashed or kept running; stderr: " << run.err;
    EXPECT_EQ(run.code, 1) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_NE(run.err.find(what), std::string::npos) << run.err;
  }
  fs::path dir_;
};

TEST_F(StartupTest, MissingCertificateFile) {
  ExpectOneLineError(Serve("absent.crt", "tls.key"), "--tls-cert-file=" + File("absent.crt"));
}

TEST_F(StartupTest, CertificateFileIsNotPem) {
  ExpectOneLineError(Serve("garbage.pem", "tls.key"), "--tls-cert-file=" + File("garbage.pem"));
}

TEST_F(StartupTest, KeyFileIsNotAKey) {
  ExpectOneLineError(Serve("tls.crt", "tls.crt"), "--tls-key-file=" + File("tls.crt"));
}

TEST_F(StartupTest, KeyDoesNotMatchCertificate) {
  ExpectOneLineError(Serve("tls.crt", "other.key"), "does not match");
}

// The key encrypted with a passphrase, as `openssl genpkey -aes256` writes it.
std::string EncryptedKey(const std::string& key_pem) {
  BIO* in = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  BIO* out = BIO_new(BIO_s_mem());
  char pass[] = "secret";
  PEM_write_bio_PKCS8PrivateKey(out, key, EVP_aes_256_cbc(), pass, 6, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(out);
  EVP_PKEY_free(key);
  return pem;
}

// Found from outside the tests: an encrypted key made OpenSSL prompt for a passphrase (into
// the log, or blocking for good where stdin is a terminal); a chain file cut in its second
// certificate (read while being written) served the leaf alone; a directory, or a file the
// process may not read, was said to hold no PEM.
TEST_F(StartupTest, EncryptedKeyCutChainAndDirectoryAreOneLine) {
  const testing::Pki pki = testing::MakePki("startup");
  testing::WriteFileAtomic(dir_ / "encrypted.key", EncryptedKey(pki.key_pem));
  testing::WriteFileAtomic(dir_ / "cut-chain.crt",
                           pki.cert_pem + pki.ca_pem.substr(0, pki.ca_pem.size() / 2));
  testing::WriteFileAtomic(dir_ / "whole-chain.crt", pki.cert_pem + pki.ca_pem);
  testing::WriteFileAtomic(dir_ / "chain.key", pki.key_pem);
  fs::create_directory(dir_ / "a-directory");
  ExpectOneLineError(Serve("tls.crt", "encrypted.key"),
                     "--tls-key-file=" + File("encrypted.key") + ": the key is encrypted");
  ExpectOneLineError(Serve("cut-chain.crt", "chain.key"),
                     "--tls-cert-file=" + File("cut-chain.crt") +
                         ": certificate 2 of the chain is cut short or not a certificate");
  // Cut inside the second certificate's BEGIN line (or its dashes), which OpenSSL reads as
  // the end of the chain: the leaf was served alone.
  for (size_t cut : {size_t{1}, size_t{5}, size_t{12}}) {
    testing::WriteFileAtomic(dir_ / "cut-begin.crt", pki.cert_pem + pki.ca_pem.substr(0, cut));
    ExpectOneLineError(Serve("cut-begin.crt", "chain.key"),
                       "--tls-cert-file=" + File("cut-begin.crt") +
                           ": certificate 2 of the chain is cut short or not a certificate");
  }
  ExpectOneLineError(Serve("a-directory", "tls.key"),
                     "--tls-cert-file=" + File("a-directory") + ": is a directory");
  // A whole chain still starts.
  const Outcome whole = RunWebhook(Serve("whole-chain.crt", "chain.key"), dir_);
  EXPECT_FALSE(whole.exited) << whole.code << " " << whole.err;
}

// Found from outside the tests: an expired certificate was served without a word, and the
// API server refused every handshake (its log, not ours, said why).
TEST_F(StartupTest, ExpiredCertificate) {
  const testing::Pki expired = testing::MakePki("expired", -7200, -3600);
  testing::WriteFileAtomic(dir_ / "expired.crt", expired.cert_pem);
  testing::WriteFileAtomic(dir_ / "expired.key", expired.key_pem);
  ExpectOneLineError(Serve("expired.crt", "expired.key"),
                     "--tls-cert-file=" + File("expired.crt") + ": the certificate expired at ");
}

TEST_F(StartupTest, UnknownLogLevel) {
  std::vector<std::string> args = Serve("tls.crt", "tls.key");
  args.push_back("--log-level=verbose");
  ExpectOneLineError(args, "--log-level=verbose");
}

// Durations out of their flag's range too: with a deadline of 0 the server started, reported
// ready and cut every connection; a reload interval of 0 polled the certificates in a busy
// loop; a count too large for milliseconds overflowed.
TEST_F(StartupTest, BadFlagValue) {
  for (const char* flag :
       {"--shutdown-delay=soon", "--handshake-timeout=forever", "--handshake-timeout=0s",
        "--idle-timeout=0ms", "--request-timeout=0s", "--cert-reload-interval=0s",
        "--idle-timeout=99999999999999999s", "--cache-ttl=2h", "--request-timeout=5d",
        "--agent-image=registry.example/agent :0.1.0"}) {
    std::vector<std::string> args = Serve("tls.crt", "tls.key");
    args.push_back(flag);
    ExpectOneLineError(args, flag);
  }
}

TEST_F(StartupTest, LookupBudgetOutsideWhatTheApiServerWaits) {
  for (const char* value : {"0s", "30s"}) {
    std::vector<std::string> args = Serve("tls.crt", "tls.key");
    args.push_back(std::string("--lookup-timeout=") + value);
    ExpectOneLineError(args, std::string("--lookup-timeout=") + value);
  }
}

TEST_F(StartupTest, PodWhoseServiceAccountCannotBeUsed) {
  // In a pod (the kubelet sets KUBERNETES_SERVICE_HOST/PORT) without a readable service
  // account, the webhook served with lookups off: pods whose spec comes from an
  // LLMInferenceService or a namespace default were admitted without offloading, under
  // failurePolicy Fail. This machine has no /var/run/secrets/kubernetes.io/serviceaccount.
  ASSERT_FALSE(fs::exists("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"));
  ::setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  ExpectOneLineError(Serve("tls.crt", "tls.key"),
                     "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
}

TEST_F(StartupTest, MetricsOnTheAdmissionPort) {
  std::vector<std::string> args = Serve("tls.crt", "tls.key");
  Set(args, "--port=18443");
  Set(args, "--metrics-port=18443");
  ExpectOneLineError(args, "--metrics-port=18443 is --port's too");
}

// Each was found from outside the tests: a client CA that cannot be read was reported as a
// file without certificates, after the serving certificate's "loaded" line; a bind address
// that is no IP address came after the start-up lines; a duration without a unit was said to
// be out of a range that holds it.
TEST_F(StartupTest, MoreBadFilesAndValuesAreOneLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--client-ca-file=" + File("absent.crt"),
       "--client-ca-file=" + File("absent.crt") + ": cannot read: No such file or directory"},
      {"--client-ca-file=" + File("garbage.pem"),
       "--client-ca-file=" + File("garbage.pem") + ": no PEM CA certificate in it"},
      {"--lookup-timeout=0", "--lookup-timeout=0 has no unit: write it like 500ms, 5s or 1m"},
      {"--kserve-namespace=KServe", "--kserve-namespace=KServe is not a namespace name"},
  };
  for (const auto& [flag, message] : cases) {
    std::vector<std::string> args = Serve("tls.crt", "tls.key");
    args.push_back(flag);
    ExpectOneLineError(args, message);
  }
  for (const char* address : {"999.1.1.1", "localhost", ""}) {
    std::vector<std::string> args = Serve("tls.crt", "tls.key");
    Set(args, std::string("--bind-address=") + address);
    ExpectOneLineError(args, std::string("--bind-address=") + address + " is not an IP address");
  }
}

// A flag given twice was read as its last value (--port=18443 --port=18444 served on 18444).
TEST_F(StartupTest, FlagGivenTwiceIsRefused) {
  std::vector<std::string> args = Serve("tls.crt", "tls.key");
  args.push_back("--port=18444");
  ExpectOneLineError(args, "flag --port given twice (0 and 18444); give it once");
}

// A port another process holds: one line with the flag, the address and the reason, exit 1
// (the start-up log lines, "stopped" after them, once came with it).
TEST_F(StartupTest, PortInUseNamesTheFlag) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string held = std::to_string(ntohs(addr.sin_port));
  for (const std::string& flag : {std::string("--port="), std::string("--metrics-port=")}) {
    std::vector<std::string> args = Serve("tls.crt", "tls.key");
    Set(args, flag + held);
    ExpectOneLineError(args, flag + held + ": cannot listen on 127.0.0.1:" + held);
  }
  ::close(fd);
}

TEST_F(StartupTest, UnknownFlag) {
  std::vector<std::string> args = Serve("tls.crt", "tls.key");
  args.push_back("--tls-cert=x");
  ExpectOneLineError(args, "--tls-cert");
}

TEST_F(StartupTest, StrayArgument) {
  std::vector<std::string> args = Serve("tls.crt", "tls.key");
  args.push_back("8443");
  ExpectOneLineError(args, "\"8443\"");
}

TEST_F(StartupTest, InjectStrayArgument) {
  ExpectOneLineError({"inject", "-f", "-", "pod.yaml"}, "\"pod.yaml\"");
}

// The control: the same files, all good, and the webhook keeps running (RunWebhook kills it).
TEST_F(StartupTest, GoodFlagsServe) {
  const Outcome run = RunWebhook(Serve("tls.crt", "tls.key"), dir_);
  EXPECT_FALSE(run.exited) << "exited " << run.code << ": " << run.err;
}

}  // namespace
}  // namespace kvoffload::webhook
