// LoadKubeconfig on an arbitrary file (it takes a path: the input is written to a temp file).
// Relative file references resolve inside the temp directory, so nothing outside is read.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "webhook/kube_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char dir[] = "/tmp/fuzz-kubeconfig-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    return std::string(dir) + "/config";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto conn = kvoffload::webhook::LoadKubeconfig(path);
  if (!conn.ok() && conn.status().message().empty()) std::abort();
  return 0;
}
