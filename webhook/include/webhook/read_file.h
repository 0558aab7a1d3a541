// A whole file's bytes, for the small files the server reads (service account token and CA,
// kubeconfig, cgroup limits).
#ifndef KVOFFLOAD_WEBHOOK_READ_FILE_H_
#define KVOFFLOAD_WEBHOOK_READ_FILE_H_

#include <string>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// NotFound naming the path and errno when it cannot be opened.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_READ_FILE_H_
