// Test certificates made in-process with OpenSSL: a CA and a leaf it signs for 127.0.0.1 and
// localhost, so server tests run real TLS handshakes without the openssl CLI.
#ifndef KVOFFLOAD_TESTS_WEBHOOK_TEST_PKI_H_
#define KVOFFLOAD_TESTS_WEBHOOK_TEST_PKI_H_

#include <filesystem>
#include <string>

namespace kvoffload::webhook::testing {

struct Pki {
  std::string ca_pem;
  std::string cert_pem;  // leaf, signed by the CA, SANs IP:127.0.0.1 and DNS:localhost by default
  std::string key_pem;
};

// A fresh CA and leaf; `name` goes into the subjects so two Pkis are told apart. The leaf is
// valid from `not_before_s` to `not_after_s` seconds from now (an hour, a minute back), for the
// names in `sans` (OpenSSL's subjectAltName syntax).
Pki MakePki(const std::string& name, long not_before_s = -60, long not_after_s = 3600,
            const std::string& sans = "IP:127.0.0.1,DNS:localhost");

// Writes via a temp file + rename, as Secret volume updates and cert-manager do.
void WriteFileAtomic(const std::filesystem::path& path, const std::string& content);

// A fresh empty folder under the test temp dir.
std::filesystem::path TempDir(const std::string& name);

}  // namespace kvoffload::webhook::testing

#endif  // KVOFFLOAD_TESTS_WEBHOOK_TEST_PKI_H_
