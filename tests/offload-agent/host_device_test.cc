// The host device's copy pool: every byte of a batch arrives, whatever the pool size and however
// the batch's ops are sized (many small pieces, one op larger than a chunk, empty ops, an empty
// batch); each ticket completes once, with several threads submitting and waiting at once; and
// tickets dropped without a wait, or a device destroyed with batches queued, still finish their
// copies.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/on_one_cpu.h"
#include "device_backends.h"
#include "kvoffload/cpu_budget.h"
#include "kvoffload/device.h"

namespace kvoffload {
namespace {

// Bytes that differ for every offset and seed, so a piece copied to the wrong place or twice
// from the wrong source shows.
std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<std::byte>(x >> 24);
  }
  return v;
}

// Copies `src` into `dst` as ops of the given lengths, laid out with a gap between them in dst
// (like vLLM's one row per layer) so that a piece landing at the wrong offset corrupts a gap.
struct Scatter {
  std::vector<std::byte> src, dst;
  std::vector<CopyOp> ops;
  std::vector<size_t> dst_off;

  Scatter(const std::vector<size_t>& lens, uint32_t seed) {
    size_t total = 0;
    for (size_t l : lens) total += l;
    src = Pattern(total, seed);
    dst.assign(total + 64 * lens.size(), std::byte{0xA5});
    size_t s = 0, d = 0;
    for (size_t l : lens) {
      ops.push_back({dst.data() + d, src.data() + s, l});
      dst_off.push_back(d);
      s += l;
      d += l + 64;
    }
  }

  void ExpectCopied() const {
    size_t s = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      ASSERT_EQ(std::memcmp(dst.data() + dst_off[i], src.data() + s, ops[i].len), 0)
          << "op " << i << " of " << ops.size();
      for (size_t g = 0; g < 64; ++g) {
        ASSERT_EQ(dst[dst_off[i] + ops[i].len + g], std::byte{0xA5}) << "gap after op " << i;
      }
      s += ops[i].len;
    }
  }
};

std::vector<size_t> Lens(size_t n, size_t len) { return std::vector<size_t>(n, len); }

class HostDeviceTest : public ::testing::TestWithParam<size_t> {
 protected:
  std::unique_ptr<DeviceBackend> dev_ = NewHostDevice(GetParam());
};

TEST_P(HostDeviceTest, EveryByteOfManySmallPieces) {
  Scatter s(Lens(6 * 40, 32 << 10), 1);  // 40 blocks of six 32 KiB layer pieces
  auto t = dev_->CopyAsync(CopyDirection::kHostToDevice, s.ops);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Wait().ok());
  EXPECT_TRUE((*t)->Ready());
  s.ExpectCopied();
}

TEST_P(HostDeviceTest, OpsLargerThanAChunkAndUnevenSizes) {
  Scatter s({3 << 20, 1, 0, 4097, (256 << 10) - 1, 256 << 10, (256 << 10) + 1, 7}, 2);
  auto t = dev_->CopyAsync(CopyDirection::kDeviceToHost, s.ops);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Wait().ok());
  s.ExpectCopied();
}

TEST_P(HostDeviceTest, EmptyBatchIsReadyAtOnce) {
  auto t = dev_->CopyAsync(CopyDirection::kHostToDevice, {});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE((*t)->Ready());
  EXPECT_TRUE((*t)->Wait().ok());
  Scatter s({0, 0}, 3);
  auto z = dev_->CopyAsync(CopyDirection::kHostToDevice, s.ops);
  ASSERT_TRUE(z.ok());
  EXPECT_TRUE((*z)->Ready());
}

// Polling alone (no Wait) completes a batch: the workers copy it without the waiter's help.
TEST_P(HostDeviceTest, PollingWithoutWaitCompletes) {
  Scatter s(Lens(64, 32 << 10), 4);
  auto t = dev_->CopyAsync(CopyDirection::kHostToDevice, s.ops);
  ASSERT_TRUE(t.ok());
  while (!(*t)->Ready()) std::this_thread::yield();
  s.ExpectCopied();
  EXPECT_TRUE((*t)->Ready());  // stays ready
}

// Several submitters, each with several batches in flight before it waits for any; every ticket
// completes and every byte of every batch arrives.
TEST_P(HostDeviceTest, ConcurrentSubmittersAndWaiters) {
  constexpr size_t kThreads = 4, kBatches = 6, kRounds = 5;
  std::vector<std::thread> threads;
  std::vector<size_t> completed(kThreads, 0);
  for (size_t th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (size_t r = 0; r < kRounds; ++r) {
        std::vector<Scatter> batches;
        for (size_t b = 0; b < kBatches; ++b) {
          batches.emplace_back(Lens(1 + (th * 7 + b * 3 + r) % 24, (8 << 10) + b * 4096),
                               static_cast<uint32_t>(th * 1000 + r * 10 + b));
        }
        std::vector<std::unique_ptr<CopyTicket>> tickets;
        for (Scatter& s : batches) {
          auto t = dev_->CopyAsync(CopyDirection::kHostToDevice, s.ops);
          ASSERT_TRUE(t.ok());
          tickets.push_back(std::move(t).value());
        }
        // Wait in reverse order of submission: the waiter of the last batch helps copy it
        // while the workers are on earlier ones.
        for (size_t b = kBatches; b-- > 0;) {
          ASSERT_TRUE(tickets[b]->Wait().ok());
          ASSERT_TRUE(tickets[b]->Ready());
          batches[b].ExpectCopied();
          ++completed[th];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t th = 0; th < kThreads; ++th) EXPECT_EQ(completed[th], kBatches * kRounds);
}

// A ticket destroyed without a wait, and a device destroyed with batches still queued, finish
// the copies first: the caller's memory is not written after either is gone.
TEST_P(HostDeviceTest, DroppedTicketsAndDeviceFinishCopies) {
  Scatter a(Lens(100, 32 << 10), 5);
  {
    auto t = dev_->CopyAsync(CopyDirection::kHostToDevice, a.ops);
    ASSERT_TRUE(t.ok());
  }
  a.ExpectCopied();
  std::vector<Scatter> rest;
  for (uint32_t i = 0; i < 8; ++i) rest.emplace_back(Lens(20, 64 << 10), 10 + i);
  std::vector<std::unique_ptr<CopyTicket>> tickets;
  for (Scatter& s : rest) {
    tickets.push_back(std::move(dev_->CopyAsync(CopyDirection::kHostToDevice, s.ops)).value());
  }
  dev_.reset();  // its workers finish the queue before they exit
  for (const Scatter& s : rest) s.ExpectCopied();
  for (std::unique_ptr<CopyTicket>& t : tickets) {
    EXPECT_TRUE(t->Ready());
    EXPECT_TRUE(t->Wait().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, HostDeviceTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::to_string(i.param) + "Workers";
                         });

// The default pool is one worker per CPU the process may use, at most 4: in a container given a
// cpuset or a CPU limit, more would take turns on the same CPUs.
TEST(HostDeviceDefaultsTest, DefaultPoolFollowsTheUsableCpus) {
  const size_t n = DefaultHostCopyThreads();
  EXPECT_EQ(n, std::min<size_t>(static_cast<size_t>(UsableCpus()), 4));
  std::unique_ptr<DeviceBackend> dev = std::move(NewDeviceBackend("host")).value();
  EXPECT_NE(dev->Describe().find(std::to_string(n) + " worker threads"), std::string::npos)
      << dev->Describe();

  // From a thread allowed one CPU (the affinity mask is per thread and read by the caller), one
  // worker, whatever the machine has.
  testing::OnOneCpu([] {
    EXPECT_EQ(DefaultHostCopyThreads(), 1u);
    std::unique_ptr<DeviceBackend> pinned = std::move(NewDeviceBackend("host")).value();
    EXPECT_NE(pinned->Describe().find("1 worker threads"), std::string::npos)
        << pinned->Describe();
  });
}

}  // namespace
}  // namespace kvoffload
