#include "process_tag.h"

#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace kvoffload {
namespace {

uint64_t DrawRandom() {
  uint64_t bits = 0;
  if (::getrandom(&bits, sizeof(bits), 0) == static_cast<ssize_t>(sizeof(bits))) return bits;
  // No getrandom (a seccomp profile that refuses it): the clock's nanoseconds, which two pods
  // starting their engines do not share.
  return static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
         (static_cast<uint64_t>(::getpid()) << 48);
}

}  // namespace

std::string ProcessTag() {
  static const uint64_t random = DrawRandom();
  char tag[48];
  std::snprintf(tag, sizeof(tag), "%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(random));
  return tag;
}

}  // namespace kvoffload
