// The patch's base64 against OpenSSL's encoder, which it replaced: every length up to a few
// thousand bytes of random data (each tail and each step of the six-byte loop), every byte
// value, and appending after existing text.
#include "webhook/base64.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <random>
#include <string>

namespace kvoffload::webhook {
namespace {

std::string OpenSsl(const std::string& data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

TEST(Base64Test, MatchesOpenSslOnEveryLength) {
  std::mt19937_64 rng(7);
  std::string data;
  for (size_t len = 0; len <= 3000; ++len) {
    std::string encoded;
    AppendBase64(encoded, data);
    ASSERT_EQ(encoded, OpenSsl(data)) << "length " << len;
    data.push_back(static_cast<char>(rng()));
  }
}

TEST(Base64Test, EveryByteValueAndAppending) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  for (int b = 255; b >= 0; --b) all.push_back(static_cast<char>(b));
  std::string out = "prefix:";
  AppendBase64(out, all);
  EXPECT_EQ(out, "prefix:" + OpenSsl(all));
  std::string small;
  AppendBase64(small, "Man");
  AppendBase64(small, "Ma");
  AppendBase64(small, "M");
  EXPECT_EQ(small, "TWFuTWE=TQ==");
}

}  // namespace
}  // namespace kvoffload::webhook
