// AdmissionReview decode + resolve (pod annotation) + mutate, and the apply-time checks, as the
// server calls them. Every input must get an answer: 200 with an AdmissionReview, or a 4xx,
// never a crash or a 5xx.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "webhook/admission.h"
#include "webhook/json_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kvoffload::webhook::AdmissionHandler handler(
      {kvoffload::webhook::Mode::kAgent, "registry.example/kvoffload-agent:0.1.0"}, nullptr);
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // As a body without spare capacity (parsed from a padded copy) and as the server's bodies
  // come, with spare capacity (parsed in place) that holds JSON-looking bytes past the end.
  std::string padded;
  padded.reserve(size + kvoffload::webhook::kJsonPadding);
  padded.append(input).append(kvoffload::webhook::kJsonPadding, '"');
  padded.resize(size);
  for (const std::string& body : {std::string(input), padded}) {
    const kvoffload::webhook::HttpAnswer answer = handler.Handle("application/json", body);
    if (answer.status >= 500) std::abort();  // a hostile body is the client's error, not ours
    if (handler.Validate("application/json", body, /*pods_need_label=*/false).status >= 500) {
      std::abort();
    }
  }
  return 0;
}
