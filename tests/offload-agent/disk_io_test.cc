// Both disk I/O backends: batched aligned transfers with O_DIRECT on ext4, buffered on tmpfs
// (which refuses O_DIRECT), and a read past the end reported, never OK; the uring backend's
// rings sharing one registration of the pool.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
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

// A persistent tier restarting on a full file system: the probe's write failed with ENOSPC,
// which read as a file system refusing O_DIRECT, and the tier ran buffered for good. ext4 in a
// loop image, filled to the last block.
TEST(ODirectProbeTest, AFullFileSystemStillTakesODirect) {
  testing::TempDir dir;
  const std::string image = dir.path() + "/fs.img", mnt = dir.path() + "/mnt";
  const std::string make = "truncate -s 8M '" + image + "' && mkfs.ext4 -q '" + image +
                           "' && mkdir '" + mnt + "' && mount -o loop '" + image + "' '" + mnt +
                           "' 2>/dev/null";
  KVO_REQUIRE_CAPABILITY("root, mkfs.ext4 and a loop device",
                         std::system(make.c_str()) == 0 ? "" : "mounting an ext4 image failed");
  const int fd = ::open((mnt + "/filler").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> chunk(64 << 10, 'x');
  int err = 0;
  for (size_t size : {size_t{64} << 10, size_t{4096}, size_t{1024}}) {  // to the last block
    for (err = 0; err == 0;) {
      if (::write(fd, chunk.data(), size) < 0) err = errno;
    }
  }
  ::fsync(fd);
  ::close(fd);
  EXPECT_EQ(err, ENOSPC);
  EXPECT_TRUE(SupportsODirect(mnt));
  EXPECT_EQ(std::system(("umount '" + mnt + "'").c_str()), 0);
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

// The describe lines of two uring backends of `rings` rings over `pool`, the second sharing the
// first's registration as an engine's second disk tier does, made in a child process without
// CAP_IPC_LOCK and with RLIMIT_MEMLOCK at `memlock` bytes (as in a container: runc drops
// CAP_IPC_LOCK and the runtime's limit applies); round trips through their rings, in a file
// under `dir`, are checked there too. "" with the reason in `error` when the child failed
// ("set-up: ..." when it could not be set up so).
std::string DescribeUnderMemlock(const std::string& dir, std::byte* pool, size_t pool_len,
                                 size_t rings, size_t memlock, std::string* error) {
  int out[2];
  if (::pipe(out) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return "";
  }
  std::fflush(nullptr);  // or the child's exit writes what the parent had buffered a second time
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    auto finish = [&](int code, const std::string& text) {
      if (::write(out[1], text.data(), text.size()) < 0) code = 9;
      ::_exit(code);
    };
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) finish(2, "capget failed");
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    if (::syscall(SYS_capset, &header, caps) != 0) finish(2, "capset failed");
    rlimit limit{};
    if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_max < memlock) {
      finish(2, "RLIMIT_MEMLOCK's hard limit is below " + std::to_string(memlock));
    }
    limit.rlim_cur = limit.rlim_max = memlock;
    if (::setrlimit(RLIMIT_MEMLOCK, &limit) != 0) finish(2, "setrlimit failed");
    std::unique_ptr<DiskIo> io[2];
    for (size_t b = 0; b < 2; ++b) {
      DiskIoOptions o;
      o.registered_base = pool;
      o.registered_len = pool_len;
      o.parallelism = rings;
      o.share_registration_of = b == 0 ? -1 : io[0]->RegistrationFd();
      Result<std::unique_ptr<DiskIo>> made = NewDiskIo("uring", o);
      if (!made.ok()) finish(3, made.status().ToString());
      io[b] = std::move(made).value();
    }
    // Several threads on each backend at once, so that every ring serves some of the round
    // trips (a caller takes the first idle ring); each thread's pages are its own.
    const std::string path = dir + "/data";
    const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_DIRECT, 0644);
    if (fd < 0) finish(3, "open " + path + ": " + std::strerror(errno));
    const size_t threads_count = 2 * rings;
    const size_t per_thread = pool_len / (2 * threads_count);
    std::atomic<bool> wrong{false};
    std::vector<std::thread> threads;
    for (size_t t = 0; t < threads_count; ++t) {
      threads.emplace_back([&, t] {
        DiskIo& backend = *io[t % 2];
        std::byte* src = pool + 2 * t * per_thread;
        std::byte* dst = src + per_thread;
        for (size_t round = 0; round < 100 && !wrong; ++round) {
          for (size_t i = 0; i < per_thread; ++i) {
            src[i] = static_cast<std::byte>(i * 7 + t + round);
          }
          IoOp w{IoOp::Kind::kWrite, fd, src, per_thread, t * per_thread, 0, {}};
          backend.Execute(std::span(&w, 1));
          IoOp r{IoOp::Kind::kRead, fd, dst, per_thread, t * per_thread, 0, {}};
          backend.Execute(std::span(&r, 1));
          if (!w.status.ok() || !r.status.ok() || std::memcmp(src, dst, per_thread) != 0) {
            wrong = true;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    ::close(fd);
    if (wrong) finish(4, "a round trip failed or read other bytes");
    finish(0, io[0]->Describe() + "\n" + io[1]->Describe());
  }
  ::close(out[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) {
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code == 0) return text;
  *error = (code == 2 ? "set-up: " : "child exit " + std::to_string(code) + ": ") + text;
  return "";
}

// A uring backend's rings share one registration of the pool (Linux 6.12's buffer cloning), and
// a second backend over the same pool (an engine's next disk tier) shares that one too, so the
// pool is pinned and charged to RLIMIT_MEMLOCK once, not once per ring and tier: with a limit
// that one registration fits and two do not, every ring of both still has fixed buffers.
// (Registered on each ring, the second ring's registration failed and none had them.)
TEST(UringRegistrationTest, RingsAndTiersShareOneRegistrationOfThePool) {
  KVO_REQUIRE_CAPABILITY("the uring disk I/O backend", testing::MissingDiskIo("uring"));
  testing::TempDir dir;
  KVO_REQUIRE_CAPABILITY("O_DIRECT", testing::MissingODirect(dir.path()));
  constexpr size_t kPool = size_t{1} << 20;
  Aligned pool(kPool);
  KVO_REQUIRE_CAPABILITY("io_uring buffer cloning", testing::MissingBufferCloning());
  std::string error;
  const std::string described =
      DescribeUnderMemlock(dir.path(), pool.p, kPool, 4, kPool * 3 / 2, &error);
  if (described.empty() && error.rfind("set-up: ", 0) == 0) {
    KVO_REQUIRE_CAPABILITY("a child without CAP_IPC_LOCK under a 1.5 MiB memlock limit", error);
  }
  ASSERT_FALSE(described.empty()) << error;
  const size_t line = described.find('\n');
  ASSERT_NE(line, std::string::npos) << described;
  const std::string first = described.substr(0, line);
  const std::string second = described.substr(line + 1);
  EXPECT_NE(first.find("4 rings"), std::string::npos) << first;
  EXPECT_NE(first.find("fixed buffers registered once"), std::string::npos) << first;
  EXPECT_NE(second.find("fixed buffers shared with an earlier tier's registration"),
            std::string::npos)
      << second;
}

TEST(DiskIoFactoryTest, AutoPicksUringWhereTheKernelHasIt) {
  const bool uring_works = NewDiskIo("uring", DiskIoOptions{}).ok();
  Result<std::unique_ptr<DiskIo>> io = NewDiskIo("auto", DiskIoOptions{});
  ASSERT_TRUE(io.ok());
  EXPECT_EQ((*io)->name(), uring_works ? "uring" : "psync");
  EXPECT_FALSE(NewDiskIo("aio", DiskIoOptions{}).ok());
}

}  // namespace
}  // namespace kvoffload
