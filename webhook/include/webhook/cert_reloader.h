// The serving certificate and key, re-read from their files when they change (cert-manager and
// Secret volume updates swap them in place) without a restart. Each TLS handshake takes the
// pair current at its start, so a rotation never fails a handshake in flight. A half-written
// or mismatched pair is ignored until the files are whole again, and so is an expired
// certificate: the API server refuses it, so serving it would fail every admission where the
// previous pair still works. Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_CERT_RELOADER_H_
#define KVOFFLOAD_WEBHOOK_CERT_RELOADER_H_

#include <openssl/ssl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

class CertReloader {
 public:
  // One load attempt's outcome: on success the certificate's validity (Unix seconds), so the
  // caller can export its expiry and warn about a certificate not valid yet; on failure why.
  struct Load {
    bool ok = false;
    std::string detail;  // the file loaded, or the error naming flag, file and fault
    int64_t not_before = 0;
    int64_t not_after = 0;
  };
  // Called after each load attempt that saw changed files, and after the first load.
  using ReloadObserver = std::function<void(const Load&)>;

  // Loads the pair once; fails when it cannot (a server must not start without a cert).
  static Result<std::unique_ptr<CertReloader>> Create(std::string cert_file, std::string key_file,
                                                      ReloadObserver observer);
  ~CertReloader();
  CertReloader(const CertReloader&) = delete;
  CertReloader& operator=(const CertReloader&) = delete;

  // Unix seconds in RFC 3339, UTC, as kubectl and cert-manager print a certificate's times.
  static std::string Rfc3339(int64_t unix_seconds);

  // Makes `ctx` serve the current pair on every handshake. `ctx` must not outlive this object.
  void Install(SSL_CTX* ctx);
  // Re-reads the files if they changed since the last load. Returns true when a new pair was
  // loaded. The poll thread calls it; tests may call it directly.
  bool ReloadIfChanged();
  // Polls every `interval` on a background thread until destruction.
  void StartPolling(std::chrono::milliseconds interval);

 private:
  struct Pair;
  CertReloader(std::string cert_file, std::string key_file, ReloadObserver observer);
  // Reads and checks the pair into `pair`; the error names the flag, the file and the fault.
  Status Read(Pair* pair) const;
  static int OnHandshake(SSL* ssl, void* arg);
  std::shared_ptr<const Pair> Current();
  // Tells the observer `loaded` is served now.
  void Notify(const Pair& loaded) const;
  std::string FileSignature(std::string* missing = nullptr) const;

  const std::string cert_file_;
  const std::string key_file_;
  const ReloadObserver observer_;
  std::mutex mu_;
  std::shared_ptr<const Pair> current_;  // GUARDED_BY(mu_)
  std::string loaded_signature_;         // GUARDED_BY(mu_); files' stat at the last load
  std::string failed_signature_;         // GUARDED_BY(mu_); files' stat at the last failure
  std::condition_variable stop_cv_;
  bool stopping_ = false;                // GUARDED_BY(mu_)
  std::thread poller_;
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_CERT_RELOADER_H_
