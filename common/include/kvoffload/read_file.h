// A whole file's bytes, for small files read whole (the webhook's service account token and CA
// and kubeconfig, the cgroup files cpu_budget reads).
#ifndef KVOFFLOAD_READ_FILE_H_
#define KVOFFLOAD_READ_FILE_H_

#include <string>

#include "kvoffload/status.h"

namespace kvoffload {

// NotFound naming the path and errno when it cannot be opened.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace kvoffload

#endif  // KVOFFLOAD_READ_FILE_H_
