#include "webhook/cert_reloader.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "kvoffload/read_file.h"

namespace kvoffload::webhook {

struct CertReloader::Pair {
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  STACK_OF(X509)* chain = nullptr;  // intermediates after the leaf, may be empty
  int64_t not_before = 0;           // the leaf's validity, Unix seconds
  int64_t not_after = 0;
  ~Pair() {
    X509_free(cert);
    EVP_PKEY_free(key);
    sk_X509_pop_free(chain, X509_free);
  }
};

namespace {

// OpenSSL's reason for the last failure as " (reason)", or "" when it gave none.
std::string OpenSslDetail() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return std::string(" (") + buf + ")";
}

// The whole of `path`, or why it cannot be read, naming the flag: a directory or a file the
// process may not read (a Secret's defaultMode against the pod's uid) was reported as holding
// no PEM.
Result<std::string> ReadPem(const std::string& flag, const std::string& path) {
  Result<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return Status::InvalidArgument(flag + "=" + text.status().message());
  return text;
}

// `t` in Unix seconds; false where OpenSSL cannot read it.
bool UnixSeconds(const ASN1_TIME* t, int64_t* out) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return false;
  *out = static_cast<int64_t>(timegm(&tm));
  return true;
}


// Refuses to ask for a passphrase: OpenSSL's default callback prompts on the terminal, which
// printed into the log, or blocked the reloader for good where stdin is a terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

}  // namespace

std::string CertReloader::Rfc3339(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

CertReloader::CertReloader(std::string cert_file, std::string key_file, ReloadObserver observer)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), observer_(std::move(observer)) {}

Result<std::unique_ptr<CertReloader>> CertReloader::Create(std::string cert_file,
                                                           std::string key_file,
                                                           ReloadObserver observer) {
  std::unique_ptr<CertReloader> r(
      new CertReloader(std::move(cert_file), std::move(key_file), std::move(observer)));
  // A server must not start without its pair: the first load's own error is the start-up
  // error (one line naming the flag and file), not an observer warning before it.
  for (const auto& [flag, file] : {std::pair{"--tls-cert-file", r->cert_file_},
                                   std::pair{"--tls-key-file", r->key_file_}}) {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) {
      return Status::InvalidArgument(std::string(flag) + "=" + file + ": " +
                                     std::strerror(errno));
    }
  }
  const std::string sig = r->FileSignature();
  auto pair = std::make_shared<Pair>();
  if (Status s = r->Read(pair.get()); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(r->mu_);
    r->current_ = std::move(pair);
    r->loaded_signature_ = sig;
  }
  r->Notify(*r->Current());
  return r;
}

CertReloader::~CertReloader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

std::string CertReloader::FileSignature(std::string* missing) const {
  std::string sig;
  for (const auto& [flag, f] : {std::pair{"--tls-cert-file=", &cert_file_},
                                 std::pair{"--tls-key-file=", &key_file_}}) {
    struct stat st {};
    if (::stat(f->c_str(), &st) != 0) {  // missing: nothing to load
      if (missing != nullptr) *missing = flag + *f + ": cannot read: " + std::strerror(errno);
      return "";
    }
    sig += std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
           std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + ";";
  }
  return sig;
}

namespace {

// True when a line after the last PEM block starts with a dash: a block whose BEGIN line
// was cut short (a file read while being written), which OpenSSL reads as no block at all.
bool EndsInACutBoundary(std::string_view pem) {
  const size_t last_end = pem.rfind("-----END ");
  if (last_end == std::string_view::npos) return false;
  for (size_t line = pem.find('\n', last_end); line != std::string_view::npos;
       line = pem.find('\n', line + 1)) {
    if (line + 1 < pem.size() && pem[line + 1] == '-') return true;
  }
  return false;
}

}  // namespace

Status CertReloader::Read(Pair* pair) const {
  Result<std::string> cert_text = ReadPem("--tls-cert-file", cert_file_);
  if (!cert_text.ok()) return cert_text.status();
  {
    std::unique_ptr<BIO, decltype(&BIO_free)> in(
        BIO_new_mem_buf(cert_text->data(), static_cast<int>(cert_text->size())), BIO_free);
    pair->cert = PEM_read_bio_X509(in.get(), nullptr, NoPassphrase, nullptr);
    pair->chain = sk_X509_new_null();
    while (X509* extra = PEM_read_bio_X509(in.get(), nullptr, NoPassphrase, nullptr)) {
      sk_X509_push(pair->chain, extra);
    }
    // The chain ends where no PEM block starts; any other failure is a block cut short (a
    // file read while being written) or not a certificate: the leaf alone would be served
    // without its intermediates.
    const unsigned long end = ERR_peek_last_error();
    if (pair->cert != nullptr &&
        (!(ERR_GET_LIB(end) == ERR_LIB_PEM && ERR_GET_REASON(end) == PEM_R_NO_START_LINE) ||
         EndsInACutBoundary(*cert_text))) {
      return Status::InvalidArgument("--tls-cert-file=" + cert_file_ + ": certificate " +
                                     std::to_string(sk_X509_num(pair->chain) + 2) +
                                     " of the chain is cut short or not a certificate" +
                                     OpenSslDetail());
    }
    ERR_clear_error();
  }
  if (pair->cert == nullptr) {
    return Status::InvalidArgument("--tls-cert-file=" + cert_file_ +
                                   ": no PEM certificate in it" + OpenSslDetail());
  }
  if (!UnixSeconds(X509_get0_notBefore(pair->cert), &pair->not_before) ||
      !UnixSeconds(X509_get0_notAfter(pair->cert), &pair->not_after)) {
    return Status::InvalidArgument("--tls-cert-file=" + cert_file_ +
                                   ": the certificate's validity times cannot be read" +
                                   OpenSslDetail());
  }
  // The API server refuses an expired certificate, so every admission would fail with it.
  // One not valid yet is served (the warning is the caller's): the node's clock may trail
  // the issuer's by seconds, and it becomes valid by itself.
  if (pair->not_after <= static_cast<int64_t>(std::time(nullptr))) {
    return Status::InvalidArgument("--tls-cert-file=" + cert_file_ +
                                   ": the certificate expired at " + Rfc3339(pair->not_after) +
                                   "; renew it (cert-manager: see the Certificate's status and "
                                   "events) or put a current pair in the Secret");
  }
  Result<std::string> key_text = ReadPem("--tls-key-file", key_file_);
  if (!key_text.ok()) return key_text.status();
  if (key_text->find("ENCRYPTED") != std::string::npos) {
    return Status::InvalidArgument("--tls-key-file=" + key_file_ +
                                   ": the key is encrypted, and the webhook asks for no "
                                   "passphrase: give it the key unencrypted (as a Secret of "
                                   "type kubernetes.io/tls holds it)");
  }
  {
    std::unique_ptr<BIO, decltype(&BIO_free)> in(
        BIO_new_mem_buf(key_text->data(), static_cast<int>(key_text->size())), BIO_free);
    pair->key = PEM_read_bio_PrivateKey(in.get(), nullptr, NoPassphrase, nullptr);
  }
  if (pair->key == nullptr) {
    return Status::InvalidArgument("--tls-key-file=" + key_file_ +
                                   ": no PEM private key in it" + OpenSslDetail());
  }
  if (X509_check_private_key(pair->cert, pair->key) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("--tls-key-file=" + key_file_ +
                                   ": does not match the certificate in --tls-cert-file=" +
                                   cert_file_ + " (rotation in progress?)");
  }
  return Status::Ok();
}

bool CertReloader::ReloadIfChanged() {
  std::string missing;
  const std::string sig = FileSignature(&missing);
  if (sig.empty()) {
    // A file gone (a Secret's volume remounted wrong, a key deleted): the pair loaded before
    // is served on, and the failure is counted once, as a bad pair is, so that the alert on
    // failed reloads fires instead of nothing being said until the certificate expires.
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_signature_ == missing) return false;
      failed_signature_ = missing;
    }
    if (observer_) observer_(Load{false, missing, 0, 0});
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // An unchanged broken pair is not re-read every poll: it fails the same way.
    if (sig == loaded_signature_ || sig == failed_signature_) return false;
  }
  auto pair = std::make_shared<Pair>();
  const Status read = Read(pair.get());
  // Re-check the files did not change while we read them; if they did, try again next poll.
  const bool stable = FileSignature() == sig;
  if (!read.ok() || !stable) {
    if (stable) {
      std::lock_guard<std::mutex> lock(mu_);
      failed_signature_ = sig;
    }
    if (observer_ && !read.ok()) observer_(Load{false, read.message(), 0, 0});
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = pair;
    loaded_signature_ = sig;
  }
  Notify(*pair);
  return true;
}

void CertReloader::Notify(const Pair& loaded) const {
  if (observer_) observer_(Load{true, cert_file_, loaded.not_before, loaded.not_after});
}

std::shared_ptr<const CertReloader::Pair> CertReloader::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

int CertReloader::OnHandshake(SSL* ssl, void* arg) {
  auto* self = static_cast<CertReloader*>(arg);
  std::shared_ptr<const Pair> pair = self->Current();
  if (!pair) return 0;
  // SSL_use_* take their own references, so the pair may be replaced mid-handshake.
  if (SSL_use_certificate(ssl, pair->cert) != 1 || SSL_use_PrivateKey(ssl, pair->key) != 1 ||
      SSL_set1_chain(ssl, pair->chain) != 1) {
    return 0;
  }
  return 1;
}

void CertReloader::Install(SSL_CTX* ctx) { SSL_CTX_set_cert_cb(ctx, &CertReloader::OnHandshake, this); }

void CertReloader::StartPolling(std::chrono::milliseconds interval) {
  poller_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_cv_.wait_for(lock, interval, [this] { return stopping_; })) {
      lock.unlock();
      ReloadIfChanged();
      lock.lock();
    }
  });
}

}  // namespace kvoffload::webhook
