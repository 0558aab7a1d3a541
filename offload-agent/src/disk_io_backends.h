// Constructors of the disk I/O backends, used by the NewDiskIo factory. Not public: callers
// pick a backend by name.
#ifndef KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_
#define KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_

#include <memory>

#include "kvoffload/disk_io.h"

namespace kvoffload {

std::unique_ptr<DiskIo> NewPsyncIo(const DiskIoOptions& options);
// Unavailable (with the reason) when io_uring cannot be set up here or liburing was not built in.
Result<std::unique_ptr<DiskIo>> NewUringIo(const DiskIoOptions& options);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DISK_IO_BACKENDS_H_
