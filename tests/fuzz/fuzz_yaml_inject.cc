// The offline injector: YAML/JSON documents in, mutated documents out. ParseYamlDocuments is
// the parser every input meets first; InjectManifests runs the whole mutation on what parses.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "webhook/inject.h"

using namespace kvoffload::webhook;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto docs = ParseYamlDocuments(text);
  if (docs.ok()) {
    for (const auto& doc : docs.value()) (void)EmitYaml(doc);
  }
  InjectOptions options;
  options.default_mode = Mode::kAgent;
  options.agent_image = "registry.example/kvoffload-agent:0.1.0";
  auto out = InjectManifests(text, options);
  if (!out.ok() && out.status().message().empty()) std::abort();
  return 0;
}
