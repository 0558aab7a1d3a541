// Both disk I/O backends: batched aligned transfers with O_DIRECT on ext4, buffered on tmpfs
// (which refuses O_DIRECT), and a read past the end reported, never OK.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvoffload/disk_io.h"
#include "test_util.h"

namespace kvoffload {
namespace {

struct Aligned {
  explicit Aligned(size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(4096, n))), len(n) {}
  ~Aligned() { std::free(p); }
  std::byte* p;
  size_t len;
};

class DiskIoTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KVO_REQUIRE_CAPABILITY("the " + GetParam() + " disk I/O backend",
                           testing::MissingDiskIo(GetParam()));
  }
  std::unique_ptr<DiskIo> Make(std::byte* reg = nullptr, size_t reg_len = 0) {
    DiskIoOptions o;
    o.registered_base = reg;
    o.registered_len = reg_len;
    o.parallelism = 2;
    o.queue_depth = 8;  // smaller than the batch: exercises refilling the ring
    Result<std::unique_ptr<DiskIo>> io = NewDiskIo(GetParam(), o);
    EXPECT_TRUE(io.ok()) << io.status().ToString();
    return std::move(io).value();
  }

  // Writes 32 pages through one batch, reads them back through another, compares.
  void RoundTrip(const std::string& dir, bool direct) {
    constexpr size_t kPages = 32;
    Aligned src(kPages * 4096), dst(kPages * 4096);
    for (size_t i = 0; i < src.len; ++i) src.p[i] = static_cast<std::byte>(i * 31 + 7);
    std::memset(dst.p, 0, dst.len);
    std::unique_ptr<DiskIo> io = Make(src.p, src.len);  // src registered, dst not: both paths
    const std::string path = dir + "/data";
    int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::vector<IoOp> writes, reads;
    for (size_t i = 0; i < kPages; ++i) {
      writes.push_back(IoOp{IoOp::Kind::kWrite, fd, src.p + i * 4096, 4096, i * 4096, 0, {}});
      reads.push_back(IoOp{IoOp::Kind::kRead, fd, dst.p + i * 4096, 4096, i * 4096, 0, {}});
    }
    io->Execute(writes);
    for (const IoOp& op : writes) {
      ASSERT_TRUE(op.status.ok()) << op.status.ToString();
      EXPECT_EQ(op.done, 4096u);
    }
    io->Execute(reads);
    for (const IoOp& op : reads) ASSERT_TRUE(op.status.ok()) << op.status.ToString();
    EXPECT_EQ(std::memcmp(src.p, dst.p, src.len), 0);

    // Reading past the end of the file cannot move all bytes: an error, never OK.
    IoOp past{IoOp::Kind::kRead, fd, dst.p, 4096, kPages * 4096, 0, {}};
    io->Execute(std::span(&past, 1));
    EXPECT_FALSE(past.status.ok());
    EXPECT_NE(past.status.message().find("short"), std::string::npos) << past.status.ToString();
    ::close(fd);
  }
};

TEST_P(DiskIoTest, BatchedRoundTripWithODirectOnExt4) {
  testing::TempDir dir;
  KVO_REQUIRE_CAPABILITY("O_DIRECT", testing::MissingODirect(dir.path()));
  RoundTrip(dir.path(), /*direct=*/true);
}

TEST_P(DiskIoTest, BufferedRoundTripOnAFileSystemWithoutODirect) {
  testing::NoDirectDir dir;
  KVO_REQUIRE_CAPABILITY("a file system without O_DIRECT", dir.reason());
  EXPECT_FALSE(SupportsODirect(dir.path()));
  RoundTrip(dir.path(), /*direct=*/false);
}

TEST_P(DiskIoTest, BadDescriptorIsAnError) {
  Aligned buf(4096);
  std::unique_ptr<DiskIo> io = Make();
  IoOp op{IoOp::Kind::kWrite, 12345, buf.p, 4096, 0, 0, {}};
  io->Execute(std::span(&op, 1));
  EXPECT_EQ(op.status.code(), StatusCode::kIOError);
  EXPECT_NE(io->Describe().find(GetParam()), std::string::npos);
}

// The disk tier verifies each block in ExecuteEach's callback while the rest are read: every op
// must be reported exactly once, and only when its status and byte count are final.
TEST_P(DiskIoTest, ExecuteEachReportsEveryOpOnceWithItsFinalStatus) {
  testing::TempDir dir;
  KVO_REQUIRE_CAPABILITY("O_DIRECT", testing::MissingODirect(dir.path()));
  constexpr size_t kPages = 20;  // more than the queue depth: reported while others run
  Aligned buf(kPages * 4096);
  for (size_t i = 0; i < buf.len; ++i) buf.p[i] = static_cast<std::byte>(i * 13 + 1);
  std::unique_ptr<DiskIo> io = Make(buf.p, buf.len);
  const std::string path = dir.path() + "/data";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_DIRECT, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::vector<IoOp> ops;
  for (size_t i = 0; i < kPages; ++i) {
    ops.push_back(IoOp{IoOp::Kind::kWrite, fd, buf.p + i * 4096, 4096, i * 4096, 0, {}});
  }
  std::vector<int> calls(ops.size());
  auto count = [&](size_t i) {
    ASSERT_LT(i, ops.size());
    ++calls[i];
  };
  io->ExecuteEach(ops, count);
  EXPECT_EQ(calls, std::vector<int>(ops.size(), 1));

  // Reads back, plus one past the end of the file (a short transfer, an error).
  ops.clear();
  Aligned back(kPages * 4096);
  for (size_t i = 0; i < kPages; ++i) {
    ops.push_back(IoOp{IoOp::Kind::kRead, fd, back.p + i * 4096, 4096, i * 4096, 0, {}});
  }
  ops.push_back(IoOp{IoOp::Kind::kRead, fd, back.p, 4096, kPages * 4096, 0, {}});
  calls.assign(ops.size(), 0);
  io->ExecuteEach(ops, [&](size_t i) {
    count(i);
    if (i < kPages) {
      EXPECT_TRUE(ops[i].status.ok()) << ops[i].status.ToString();
      EXPECT_EQ(ops[i].done, 4096u) << "reported before it finished";
      EXPECT_EQ(std::memcmp(back.p + i * 4096, buf.p + i * 4096, 4096), 0) << "page " << i;
    } else {
      EXPECT_FALSE(ops[i].status.ok()) << "a failed op is reported with its error";
    }
  });
  EXPECT_EQ(calls, std::vector<int>(ops.size(), 1));
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskIoTest, ::testing::Values("psync", "uring"));

TEST(DiskIoFactoryTest, AutoPicksUringWhereTheKernelHasIt) {
  const bool uring_works = NewDiskIo("uring", DiskIoOptions{}).ok();
  Result<std::unique_ptr<DiskIo>> io = NewDiskIo("auto", DiskIoOptions{});
  ASSERT_TRUE(io.ok());
  EXPECT_EQ((*io)->name(), uring_works ? "uring" : "psync");
  EXPECT_FALSE(NewDiskIo("aio", DiskIoOptions{}).ok());
}

}  // namespace
}  // namespace kvoffload
