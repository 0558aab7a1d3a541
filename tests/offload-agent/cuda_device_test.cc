// The CUDA device backend on a real GPU: batched copies both ways and the whole cascade from
// device memory to disk and back. Built only where CUDA is found, never registered with ctest
// (a CPU machine cannot run it); bench/gpu/run.sh runs it on the GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>

#include "kvoffload/device.h"
#include "test_util.h"

namespace kvoffload {
namespace {

using testing::kBlock;

struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  std::byte* get() const { return static_cast<std::byte*>(p); }
  void* p = nullptr;
};

TEST(CudaDeviceTest, BatchedCopiesRoundTrip) {
  Result<std::unique_ptr<DeviceBackend>> dev = NewDeviceBackend("cuda");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr size_t kBlocks = 64;
  Result<std::unique_ptr<PinnedRegion>> pinned = (*dev)->AllocatePinned(kBlocks * 4096);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  std::byte* host = (*pinned)->data();
  DeviceBuffer gpu(kBlocks * kBlock);
  std::vector<std::byte> expect;
  for (size_t i = 0; i < kBlocks; ++i) {
    std::vector<std::byte> p = testing::Pattern(testing::Key(i), kBlock);
    std::memcpy(host + i * 4096, p.data(), kBlock);
    expect.insert(expect.end(), p.begin(), p.end());
  }
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < kBlocks; ++i) {
    up.push_back(CopyOp{gpu.get() + i * kBlock, host + i * 4096, kBlock});
    down.push_back(CopyOp{host + i * 4096, gpu.get() + i * kBlock, kBlock});
  }
  auto t = (*dev)->CopyAsync(CopyDirection::kHostToDevice, up);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Wait().ok());
  EXPECT_TRUE((*t)->Ready());
  std::memset(host, 0, kBlocks * 4096);
  t = (*dev)->CopyAsync(CopyDirection::kDeviceToHost, down);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Wait().ok());
  for (size_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(std::memcmp(host + i * 4096, expect.data() + i * kBlock, kBlock), 0) << i;
  }
}

// More copies than the backend hands to one cudaMemcpyBatchAsync call (it cuts a batch into
// calls of 256), odd sizes at odd offsets, scattered in reverse: every call's copies land.
TEST(CudaDeviceTest, CopiesBeyondOneCallRoundTrip) {
  Result<std::unique_ptr<DeviceBackend>> dev = NewDeviceBackend("cuda");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr size_t kOps = 600;  // two full calls and a part
  constexpr size_t kLen = 1001;
  Result<std::unique_ptr<PinnedRegion>> pinned = (*dev)->AllocatePinned(2 * kOps * kLen);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  std::byte* out = (*pinned)->data();
  std::byte* back = out + kOps * kLen;
  for (size_t i = 0; i < kOps * kLen; ++i) out[i] = static_cast<std::byte>((i * 131) >> 3);
  DeviceBuffer gpu(kOps * kLen);
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < kOps; ++i) {
    std::byte* row = gpu.get() + (kOps - 1 - i) * kLen;
    up.push_back(CopyOp{row, out + i * kLen, kLen});
    down.push_back(CopyOp{back + i * kLen, row, kLen});
  }
  auto t = (*dev)->CopyAsync(CopyDirection::kHostToDevice, up);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Wait().ok());
  t = (*dev)->CopyAsync(CopyDirection::kDeviceToHost, down);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Wait().ok());
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(back + i * kLen, out + i * kLen, kLen), 0) << "copy " << i;
  }
}

class CudaCascadeTest : public ::testing::TestWithParam<std::string> {};

// With "uring", the io_uring rings register the cudaHostRegister'ed pool as fixed buffers and
// O_DIRECT transfers go straight between the disk and that pinned memory.
TEST_P(CudaCascadeTest, FromGpuToDiskAndBack) {
  KVO_REQUIRE_CAPABILITY("the " + GetParam() + " disk I/O backend",
                         testing::MissingDiskIo(GetParam()));
  testing::TempDir dir;
  EngineConfig c = testing::Config(4, {testing::Tier(dir.path(), 32)});
  c.device = "cuda";
  c.disk_io = GetParam();
  Result<std::unique_ptr<Engine>> e = Engine::Open(c);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::string described = (*e)->Describe();
  EXPECT_NE(described.find("cuda: device"), std::string::npos) << described;
  if (GetParam() == "uring") {
    EXPECT_NE(described.find("fixed buffers registered"), std::string::npos) << described;
  }
  constexpr size_t kBlocks = 24;
  DeviceBuffer src(kBlocks * kBlock), dst(kBlocks * kBlock);
  std::vector<BlockKey> keys;
  std::vector<void*> src_ptrs, dst_ptrs;
  std::vector<std::byte> expect;
  for (size_t i = 0; i < kBlocks; ++i) {
    keys.push_back(testing::Key(i));
    std::vector<std::byte> p = testing::Pattern(keys.back(), kBlock);
    expect.insert(expect.end(), p.begin(), p.end());
    src_ptrs.push_back(src.get() + i * kBlock);
    dst_ptrs.push_back(dst.get() + i * kBlock);
  }
  ASSERT_EQ(cudaMemcpy(src.p, expect.data(), expect.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst.p, 0, expect.size()), cudaSuccess);
  auto job = (*e)->Store(keys, src_ptrs);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*e)->Wait(*job).ok());
  LookupResult r = (*e)->Lookup(keys);
  ASSERT_EQ(r.prefix, kBlocks);
  EXPECT_EQ(r.tiers.front(), kTierCpu + 1) << "the oldest blocks went to disk";
  EXPECT_EQ(r.tiers.back(), kTierCpu);
  job = (*e)->Load(keys, dst_ptrs);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*e)->Wait(*job).ok());
  std::vector<std::byte> back(expect.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dst.p, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, expect);
  EngineStats s = (*e)->Stats();
  EXPECT_EQ(s.d2h_bytes, kBlocks * kBlock);
  EXPECT_EQ(s.h2d_bytes, kBlocks * kBlock);
}

INSTANTIATE_TEST_SUITE_P(DiskBackends, CudaCascadeTest, ::testing::Values("psync", "uring"));

}  // namespace
}  // namespace kvoffload
