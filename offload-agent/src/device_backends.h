// The device backend registry (registry.h) and the built-in backends' constructors. Not public:
// callers pick a backend by name (NewDeviceBackend).
#ifndef KVOFFLOAD_SRC_DEVICE_BACKENDS_H_
#define KVOFFLOAD_SRC_DEVICE_BACKENDS_H_

#include <cstddef>
#include <memory>

#include "kvoffload/device.h"
#include "registry.h"

namespace kvoffload {

using DeviceBackendRegistry = Registry<DeviceBackend>;
// Built on first use with every built-in registered (registry.h says why); never destroyed.
DeviceBackendRegistry& DeviceBackends();

// copy_threads: workers of the host device's copy pool (at least 1; a waiter copies too).
std::unique_ptr<DeviceBackend> NewHostDevice(size_t copy_threads);
// min(4, the CPUs the process may use: UsableCpus, its affinity mask capped by its cgroup's CPU
// limit): the copies are memory-bound, and a few threads reach the host's copy bandwidth where
// one thread reached a fraction of it; more than the container's CPUs only take turns on them.
size_t DefaultHostCopyThreads();
// Unavailable when built without CUDA or when no device can be used.
Result<std::unique_ptr<DeviceBackend>> NewCudaDevice();

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DEVICE_BACKENDS_H_
