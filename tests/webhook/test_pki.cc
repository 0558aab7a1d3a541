#include "test_pki.h"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <stdexcept>

namespace kvoffload::webhook::testing {
namespace {

EVP_PKEY* NewKey() { return EVP_EC_gen("P-256"); }

std::string ToPem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

std::string ToPem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) throw std::runtime_error("bad extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

X509* NewCert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
              long not_before_s, long not_after_s, const std::string& sans) {
  static std::atomic<long> serial{1};
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), not_before_s);
  X509_gmtime_adj(X509_getm_notAfter(cert), not_after_s);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : cert;
  if (issuer == nullptr) {
    AddExt(cert, signer, NID_basic_constraints, "critical,CA:TRUE");
    AddExt(cert, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    AddExt(cert, signer, NID_basic_constraints, "critical,CA:FALSE");
    AddExt(cert, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    AddExt(cert, signer, NID_subject_alt_name, sans.c_str());
  }
  X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  return cert;
}

}  // namespace

Pki MakePki(const std::string& name, long not_before_s, long not_after_s,
            const std::string& sans) {
  EVP_PKEY* ca_key = NewKey();
  X509* ca = NewCert(name + " CA", ca_key, nullptr, nullptr, -3600, 86400, "");
  EVP_PKEY* key = NewKey();
  X509* leaf = NewCert(name + " server", key, ca, ca_key, not_before_s, not_after_s, sans);
  Pki pki{ToPem(ca), ToPem(leaf), ToPem(key)};
  X509_free(leaf);
  X509_free(ca);
  EVP_PKEY_free(key);
  EVP_PKEY_free(ca_key);
  return pki;
}

void WriteFileAtomic(const std::filesystem::path& path, const std::string& content) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
  }
  std::filesystem::rename(tmp, path);
}

std::filesystem::path TempDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kvoffload-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace kvoffload::webhook::testing
