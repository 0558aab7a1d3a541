#include "kvoffload/read_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvoffload {

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + path + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvoffload
