// The disk I/O backend registry (registry.h) and the built-in backends' constructors. Not
// public: callers pick a backend by name (NewDiskIo).
#ifndef KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_
#define KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_

#include <memory>

#include "kvoffload/disk_io.h"
#include "registry.h"

namespace kvoffload {

using DiskIoRegistry = Registry<DiskIo, const DiskIoOptions&>;
// Built on first use with every built-in registered (registry.h says why); never destroyed.
DiskIoRegistry& DiskIoBackends();

std::unique_ptr<DiskIo> NewPsyncIo(const DiskIoOptions& options);
// Unavailable (with the reason) when io_uring cannot be set up here or liburing was not built in.
Result<std::unique_ptr<DiskIo>> NewUringIo(const DiskIoOptions& options);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_
