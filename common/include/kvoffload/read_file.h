// A whole file's bytes, for small files read whole (the webhook's service account token and CA,
// kubeconfig, certificates and manifests, the cgroup files cpu_budget reads).
#ifndef KVOFFLOAD_READ_FILE_H_
#define KVOFFLOAD_READ_FILE_H_

#include <string>

#include "kvoffload/status.h"

namespace kvoffload {

// The rest of `fd` up to its end. InvalidArgument "<what>: is a directory, not a file" or
// "<what>: cannot read: <errno>" where it cannot be read to its end: a read error is never
// an empty or a short file.
Result<std::string> ReadAll(int fd, const std::string& what);

// The whole of `path`, errors as ReadAll's naming `path`.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace kvoffload

#endif  // KVOFFLOAD_READ_FILE_H_
