// Constructors of the device backends, used by the NewDeviceBackend factory.
#ifndef KVOFFLOAD_SRC_DEVICE_BACKENDS_H_
#define KVOFFLOAD_SRC_DEVICE_BACKENDS_H_

#include <memory>

#include "kvoffload/device.h"

namespace kvoffload {

std::unique_ptr<DeviceBackend> NewHostDevice();
// Unavailable when built without CUDA or when no device can be used.
Result<std::unique_ptr<DeviceBackend>> NewCudaDevice();

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_DEVICE_BACKENDS_H_
