// errno -> Status, shared by the disk I/O backends and the tiers. Thread-safe (pure).
#ifndef KVOFFLOAD_SRC_IO_STATUS_H_
#define KVOFFLOAD_SRC_IO_STATUS_H_

#include <cerrno>
#include <cstring>
#include <string>

#include "kvoffload/status.h"

namespace kvoffload {

// ENOSPC/EDQUOT are ResourceExhausted (the tier is full behind our back); the rest IOError.
inline Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return Status::ResourceExhausted(std::move(msg));
  return Status::IOError(std::move(msg));
}

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_IO_STATUS_H_
