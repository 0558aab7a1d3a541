// LoadKubeconfig on an arbitrary file (it takes a path: the input is written to a temp file).
// Relative file references resolve inside the temp directory, so nothing outside is read.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "webhook/kube_client.h"

namespace {
// The directory the inputs are written in, removed when libFuzzer exits (it ends a timed run
// with exit(), which runs static destructors), so that CI's runs leave nothing in /tmp.
class InputFile {
 public:
  InputFile() {
    char dir[] = "/tmp/fuzz-kubeconfig-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    dir_ = dir;
    path_ = dir_ + "/config";
  }
  ~InputFile() {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const InputFile input;
  const std::string& path = input.path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto conn = kvoffload::webhook::LoadKubeconfig(path);
  if (!conn.ok() && conn.status().message().empty()) std::abort();
  return 0;
}
