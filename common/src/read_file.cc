#include "kvoffload/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvoffload {

// With read(2): a stream's `<<` dropped read errors, so a directory (EISDIR on the first read)
// or a file failing with EIO read as an empty one.
Result<std::string> ReadAll(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(what + ": is a directory, not a file");
  }
  std::string text;
  for (char buf[65536];;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return text;
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (errno != EINTR) {
      return Status::InvalidArgument(what + ": cannot read: " + std::strerror(errno));
    }
  }
}

Result<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::InvalidArgument(path + ": cannot read: " + std::strerror(errno));
  Result<std::string> text = ReadAll(fd, path);
  ::close(fd);
  return text;
}

}  // namespace kvoffload
