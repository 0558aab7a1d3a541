// The device backend factory. Without CUDA compiled in, "cuda" says so instead of failing later.
#include "device_backends.h"

namespace kvoffload {

#if !KVOFFLOAD_HAVE_CUDA
Result<std::unique_ptr<DeviceBackend>> NewCudaDevice() {
  return Status::Unavailable("device \"cuda\": libkvoffload was built without CUDA");
}
#endif

Result<std::unique_ptr<DeviceBackend>> NewDeviceBackend(std::string_view name) {
  if (name == "host") return NewHostDevice(DefaultHostCopyThreads());
  if (name == "cuda") return NewCudaDevice();
  return Status::InvalidArgument("device backend \"" + std::string(name) +
                                 "\" is not known; use host or cuda");
}

}  // namespace kvoffload
