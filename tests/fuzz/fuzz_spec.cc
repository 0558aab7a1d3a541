// ParseSpecText on an arbitrary annotation value; a valid spec's canonical form must parse
// again to the same canonical form (two specs that mean the same hash the same).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "webhook/spec.h"

using namespace kvoffload::webhook;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = ParseSpecText(text, SpecSource::PodAnnotation());
  if (!spec.ok()) {
    if (spec.status().message().empty()) std::abort();  // a denial must say why
    return 0;
  }
  const nlohmann::json canonical = spec.value().Canonical();
  auto again = ParseSpecFrom(canonical, SpecSource::PodAnnotation());
  if (!again.ok() || again.value().Canonical() != canonical) std::abort();
  return 0;
}
