// Base64 encoding of the admission answer's JSON patch.
#ifndef KVOFFLOAD_WEBHOOK_BASE64_H_
#define KVOFFLOAD_WEBHOOK_BASE64_H_

#include <string>
#include <string_view>

namespace kvoffload::webhook {

// Appends the base64 (RFC 4648 alphabet, '=' padded, no line breaks) of `data` to `out`: the
// text OpenSSL's EVP_EncodeBlock writes, which the tests check byte for byte.
void AppendBase64(std::string& out, std::string_view data);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_BASE64_H_
