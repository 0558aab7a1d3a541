// Device backends: where KV blocks live before the host tiers, and the copies to and from the
// pinned host pool. "cuda" (streams + events, batched copies) and "host" (device memory emulated
// by host memory, copies on a small pool of worker threads with the same asynchronous semantics).
// Thread-safe: CopyAsync may be called from several threads, and each ticket waited or polled
// from any one thread at a time. Batches have no order among themselves: the copies of a later
// batch may run before or alongside an earlier one's (host: several workers; cuda: several
// streams), so a caller that needs one batch's bytes in place before another's copies start
// waits for the first ticket.
#ifndef KVOFFLOAD_DEVICE_H_
#define KVOFFLOAD_DEVICE_H_

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/export.h"
#include "kvoffload/status.h"

namespace kvoffload {

// Host memory the device can DMA to/from, owned by the backend that allocated it.
class KVOFFLOAD_EXPORT PinnedRegion {
 public:
  virtual ~PinnedRegion() = default;
  virtual std::byte* data() const = 0;
  virtual size_t size() const = 0;
};

struct CopyOp {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t len = 0;
};

enum class CopyDirection { kDeviceToHost, kHostToDevice };

// A batch of copies in flight. Destroying it waits for the copies. Ready() turns true once, when
// every copy of the batch finished, and stays true.
class KVOFFLOAD_EXPORT CopyTicket {
 public:
  virtual ~CopyTicket() = default;
  virtual bool Ready() = 0;
  // Blocks until every copy of the batch finished; the first error otherwise.
  virtual Status Wait() = 0;
};

class KVOFFLOAD_EXPORT DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::string_view name() const = 0;
  virtual std::string Describe() const = 0;
  // One pool for the whole pinned host tier, allocated up front, 4096-aligned.
  virtual Result<std::unique_ptr<PinnedRegion>> AllocatePinned(size_t bytes) = 0;
  // Starts the batch; the memory of every op must stay valid until the ticket is waited.
  virtual Result<std::unique_ptr<CopyTicket>> CopyAsync(CopyDirection direction,
                                                         std::span<const CopyOp> ops) = 0;
};

// "host", "cuda" (Unavailable when the library was built without CUDA or no GPU is usable).
// Unknown names are InvalidArgument listing DeviceBackendNames().
KVOFFLOAD_EXPORT Result<std::unique_ptr<DeviceBackend>> NewDeviceBackend(std::string_view name);
// The registered backends, sorted ("cuda", "host").
KVOFFLOAD_EXPORT std::vector<std::string> DeviceBackendNames();

}  // namespace kvoffload

#endif  // KVOFFLOAD_DEVICE_H_
