// The device backend registry with its built-ins. "cuda" is registered in every build, so that
// a library built without CUDA says so instead of calling the name unknown.
#include "device_backends.h"

namespace kvoffload {

#if !KVOFFLOAD_HAVE_CUDA
Result<std::unique_ptr<DeviceBackend>> NewCudaDevice() {
  return Status::Unavailable("device \"cuda\": libkvoffload was built without CUDA");
}
#endif

DeviceBackendRegistry& DeviceBackends() {
  // Leaked on purpose, as EvictionPolicies() is.
  static DeviceBackendRegistry* registry = [] {
    auto* r = new DeviceBackendRegistry("device backend");
    r->Register("host", [] { return NewHostDevice(DefaultHostCopyThreads()); });
    r->Register("cuda", &NewCudaDevice);
    return r;
  }();
  return *registry;
}

std::vector<std::string> DeviceBackendNames() { return DeviceBackends().Names(); }

Result<std::unique_ptr<DeviceBackend>> NewDeviceBackend(std::string_view name) {
  return DeviceBackends().Create(name);
}

}  // namespace kvoffload
