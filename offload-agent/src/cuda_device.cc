// The CUDA device: the pinned pool is anonymous memory registered with cudaHostRegister (plain
// pages, so io_uring can register it and O_DIRECT can DMA into it, which cudaHostAlloc memory
// does not guarantee); copies are batched on one non-blocking stream per direction with one event
// per batch.
// Host API only, so g++ compiles this against cuda_runtime.h; no kernels, no nvcc.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <vector>

#include "device_backends.h"
#include "io_status.h"

namespace kvoffload {
namespace {

Status CudaStatus(cudaError_t err, const std::string& what) {
  return Status::IOError(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                         ")");
}

// Makes `device` current for one scope, then gives the thread back the device it had. Copies
// are started on the engine's workers and also on a caller's thread that runs its own job while
// it waits for it (Engine::Wait), whose current device is the caller's business.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    set_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
    changed_ = previous_ != device && set_ == cudaSuccess && previous_ >= 0;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t status() const { return set_; }

 private:
  int previous_ = -1;
  cudaError_t set_ = cudaSuccess;
  bool changed_ = false;
};

class RegisteredRegion final : public PinnedRegion {
 public:
  RegisteredRegion(std::byte* data, size_t size) : data_(data), size_(size) {}
  ~RegisteredRegion() override {
    cudaHostUnregister(data_);
    ::munmap(data_, size_);
  }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::byte* const data_;
  const size_t size_;
};

class CudaTicket final : public CopyTicket {
 public:
  explicit CudaTicket(cudaEvent_t event) : event_(event) {}
  ~CudaTicket() override {
    static_cast<void>(Wait());
    cudaEventDestroy(event_);
  }
  bool Ready() override { return cudaEventQuery(event_) == cudaSuccess; }
  Status Wait() override {
    cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::Ok() : CudaStatus(err, "cudaEventSynchronize");
  }

 private:
  cudaEvent_t event_;
};

class CudaDevice final : public DeviceBackend {
 public:
  // Copies per cudaMemcpyBatchAsync call (Enqueue).
  static constexpr size_t kOpsPerCall = 256;

  ~CudaDevice() override {
    cudaSetDevice(device_);
    for (cudaStream_t s : streams_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  Status Init() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      return Status::Unavailable("device \"cuda\": no usable GPU (" +
                                 std::string(cudaGetErrorString(err)) + ")");
    }
    if ((err = cudaGetDevice(&device_)) != cudaSuccess) return CudaStatus(err, "cudaGetDevice");
    for (cudaStream_t& s : streams_) {
      if ((err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) {
        return CudaStatus(err, "cudaStreamCreateWithFlags");
      }
    }
    return Status::Ok();
  }

  std::string_view name() const override { return "cuda"; }
  std::string Describe() const override {
    return "cuda: device " + std::to_string(device_) + ", one stream per direction, " +
#if CUDART_VERSION >= 12080
           "cudaMemcpyBatchAsync";
#else
           "cudaMemcpyAsync per block";
#endif
  }

  Result<std::unique_ptr<PinnedRegion>> AllocatePinned(size_t bytes) override {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap " + std::to_string(bytes) + " bytes");
    cudaSetDevice(device_);
    cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      ::munmap(p, bytes);
      return CudaStatus(err, "cudaHostRegister " + std::to_string(bytes) + " bytes");
    }
    return std::unique_ptr<PinnedRegion>(
        std::make_unique<RegisteredRegion>(static_cast<std::byte*>(p), bytes));
  }

  Result<std::unique_ptr<CopyTicket>> CopyAsync(CopyDirection direction,
                                                std::span<const CopyOp> ops) override {
    const DeviceScope scope(device_);
    cudaError_t err = scope.status();
    if (err != cudaSuccess) return CudaStatus(err, "cudaSetDevice");
    cudaStream_t stream = streams_[direction == CopyDirection::kDeviceToHost ? 0 : 1];
    // On an error the copies already queued (a batch of kOpsPerCall before the one that
    // failed) still run, and the caller gives their slots and buffers back as soon as this
    // returns: another block's copy into a slot reused meanwhile would be overwritten by them.
    // So an error returns only once the stream has finished them.
    auto failed = [stream](Status s) {
      cudaStreamSynchronize(stream);
      return s;
    };
    if (Status s = Enqueue(ops, stream); !s.ok()) return failed(s);
    cudaEvent_t event = nullptr;
    if ((err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming)) != cudaSuccess) {
      return failed(CudaStatus(err, "cudaEventCreateWithFlags"));
    }
    if ((err = cudaEventRecord(event, stream)) != cudaSuccess) {
      cudaEventDestroy(event);
      return failed(CudaStatus(err, "cudaEventRecord"));
    }
    return std::unique_ptr<CopyTicket>(std::make_unique<CudaTicket>(event));
  }

 private:
  Status Enqueue(std::span<const CopyOp> ops, cudaStream_t stream) {
#if CUDART_VERSION >= 12080
    // Batched calls: small blocks gain 5-10x over one call each (bench section 6). A call of
    // thousands of copies is slower per byte than several of kOpsPerCall: a load of 16384
    // pieces in one call ran at half the bandwidth of the same pieces in calls of 256.
    const size_t per_call = std::min(ops.size(), kOpsPerCall);
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(per_call);
    srcs.reserve(per_call);
    sizes.reserve(per_call);
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;  // every copy takes attr
    while (!ops.empty()) {
      const std::span<const CopyOp> part = ops.first(std::min(ops.size(), kOpsPerCall));
      dsts.clear();
      srcs.clear();
      sizes.clear();
      for (const CopyOp& op : part) {
        dsts.push_back(op.dst);
        srcs.push_back(op.src);
        sizes.push_back(op.len);
      }
#if CUDART_VERSION >= 13000
      cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), part.size(),
                                             &attr, &attr_index, 1, stream);
#else
      size_t fail_index = 0;
      cudaError_t err =
          cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                               part.size(), &attr, &attr_index, 1, &fail_index, stream);
#endif
      if (err == cudaErrorNotSupported) {
        cudaGetLastError();  // clear it; the rest go one call per block
        break;
      }
      if (err != cudaSuccess) return CudaStatus(err, "cudaMemcpyBatchAsync");
      ops = ops.subspan(part.size());
    }
#endif
    for (const CopyOp& op : ops) {
      cudaError_t e = cudaMemcpyAsync(op.dst, op.src, op.len, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) return CudaStatus(e, "cudaMemcpyAsync");
    }
    return Status::Ok();
  }

  int device_ = 0;
  // Device-to-host, host-to-device. One each: on an H200 (driver 580, CUDA 13.0) batches of
  // 16 KiB host-to-device copies spread over 2 or 4 streams ran at 4.1-4.7 GiB/s, on one stream
  // at 16.9-30.1 (the pieces of a KV block are this size); from 32 KiB up, and device-to-host
  // at every size, more streams gained nothing (docs/decisions.md).
  std::array<cudaStream_t, 2> streams_{};
};

}  // namespace

Result<std::unique_ptr<DeviceBackend>> NewCudaDevice() {
  auto device = std::make_unique<CudaDevice>();
  if (Status s = device->Init(); !s.ok()) return s;
  return std::unique_ptr<DeviceBackend>(std::move(device));
}

}  // namespace kvoffload
