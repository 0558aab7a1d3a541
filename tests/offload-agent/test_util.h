// Helpers shared by the agent tests: scratch directories, deterministic block contents and
// engine configurations sized in blocks.
#ifndef KVOFFLOAD_TESTS_TEST_UTIL_H_
#define KVOFFLOAD_TESTS_TEST_UTIL_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvoffload/config.h"
#include "kvoffload/disk_io.h"
#include "kvoffload/engine.h"

namespace kvoffload::testing {

// Where scratch directories go: $KVOFFLOAD_TEST_SCRATCH, else the build tree's disk (ext4
// here, so O_DIRECT works).
inline std::string ScratchBase() {
  const char* env = std::getenv("KVOFFLOAD_TEST_SCRATCH");
  return env != nullptr && *env != '\0' ? env : KVOFFLOAD_TEST_SCRATCH;
}

// True on CI (CI=true, as .ci/run and hosted CI services set it), where every capability below
// is expected: a test that cannot run there fails instead of being skipped.
inline bool OnCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

// Runs the rest of the test only where the machine has `capability`; `missing` is "" when it
// does, else what was tried and why it failed. Elsewhere the test is reported as skipped with
// that reason (never as passed), and on CI as failed. A macro: GTEST_SKIP and FAIL return from
// the test body (or SetUp) they are written in.
#define KVO_REQUIRE_CAPABILITY(capability, missing)                                         \
  do {                                                                                     \
    const std::string kvo_missing_ = (missing);                                            \
    if (!kvo_missing_.empty()) {                                                           \
      if (::kvoffload::testing::OnCi()) {                                                  \
        FAIL() << "CI must have " << (capability) << " for this test: " << kvo_missing_;   \
      }                                                                                    \
      GTEST_SKIP() << "not run: needs " << (capability) << ": " << kvo_missing_;           \
    }                                                                                      \
  } while (0)

// "" when files under `dir` open with O_DIRECT, else why not.
inline std::string MissingODirect(const std::string& dir) {
  if (SupportsODirect(dir)) return "";
  return "the file system of " + dir +
         " refuses O_DIRECT (set KVOFFLOAD_TEST_SCRATCH to a directory on ext4 or xfs)";
}

// "" when the disk I/O backend `name` can be opened here (io_uring may be left out of the
// build, or refused by the kernel or a seccomp profile), else the factory's reason.
inline std::string MissingDiskIo(const std::string& name) {
  Result<std::unique_ptr<DiskIo>> io = NewDiskIo(name, DiskIoOptions{});
  return io.ok() ? "" : io.status().ToString();
}

// "" when the kernel can share io_uring buffer registrations between rings
// (IORING_REGISTER_CLONE_BUFFERS, Linux 6.12), else why not.
inline std::string MissingBufferCloning() {
  utsname uts{};
  int major = 0;
  int minor = 0;
  if (::uname(&uts) != 0 || std::sscanf(uts.release, "%d.%d", &major, &minor) != 2) {
    return "cannot read the kernel's release";
  }
  if (major > 6 || (major == 6 && minor >= 12)) return "";
  return std::string("kernel ") + uts.release + " is older than 6.12";
}

// A fresh directory removed with everything in it at the end of the scope.
class TempDir {
 public:
  explicit TempDir(const std::string& base = ScratchBase()) {
    std::filesystem::create_directories(base);
    std::string tmpl = base + "/kvo-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp in " << base;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A directory on a file system that refuses O_DIRECT. tmpfs did before Linux 6.6 and accepts it
// since, so on newer kernels this mounts a ramfs (which never does) over a scratch directory;
// that needs root. available() is false (with the reason) where neither works.
class NoDirectDir {
 public:
  NoDirectDir() {
    if (std::filesystem::is_directory("/dev/shm")) {
      shm_ = std::make_unique<TempDir>("/dev/shm");
      if (!SupportsODirect(shm_->path())) {
        path_ = shm_->path();
        return;
      }
    }
    if (::mount("ramfs", mount_point_.path().c_str(), "ramfs", 0, nullptr) != 0) {
      reason_ = std::string("tmpfs takes O_DIRECT here and ramfs cannot be mounted: ") +
                std::strerror(errno);
      return;
    }
    mounted_ = true;
    path_ = mount_point_.path();
  }
  ~NoDirectDir() {
    if (mounted_) ::umount2(mount_point_.path().c_str(), MNT_DETACH);
  }
  NoDirectDir(const NoDirectDir&) = delete;
  NoDirectDir& operator=(const NoDirectDir&) = delete;
  bool available() const { return !path_.empty(); }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<TempDir> shm_;
  TempDir mount_point_;
  bool mounted_ = false;
  std::string path_;
  std::string reason_;
};

inline BlockKey Key(uint64_t i) { return BlockKey{0xABCD000000000000ULL ^ (i * 7919), i}; }

// Deterministic bytes for a key (and a salt to tell versions apart).
inline std::vector<std::byte> Pattern(const BlockKey& key, size_t n, uint64_t salt = 0) {
  std::vector<std::byte> out(n);
  uint64_t x = key.hi ^ (key.lo * 0x9E3779B97F4A7C15ULL) ^ salt;
  for (size_t i = 0; i < n; ++i) {
    x += 0x9E3779B97F4A7C15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    out[i] = static_cast<std::byte>(z >> 56);
  }
  return out;
}

// Block size that is not a multiple of 4096, so padding and the trailer are exercised:
// a block file (and a pinned slot) is then exactly one 4 KiB page.
inline constexpr size_t kBlock = 4000;
inline constexpr size_t kSlot = 4096;

inline ModelFingerprint TestModel(const std::string& model = "llama-3-8b") {
  return ModelFingerprint{model, "rev1", "bf16", "nhd", 0};
}

inline DiskTierConfig Tier(const std::string& path, size_t blocks, bool persistent = false,
                           bool shared = false) {
  return DiskTierConfig{path, persistent ? "pvcRef" : "emptyDir", blocks * kSlot, persistent,
                        shared};
}

inline EngineConfig Config(size_t cpu_blocks, std::vector<DiskTierConfig> tiers = {},
                           const std::string& policy = "lru") {
  EngineConfig c;
  c.cpu_bytes = cpu_blocks * kSlot;
  c.eviction_policy = policy;
  c.tiers = std::move(tiers);
  c.block_bytes = kBlock;
  c.fingerprint = TestModel();
  c.device = "host";
  return c;
}

// Device-side buffers for the host device: one block each.
struct Blocks {
  std::vector<BlockKey> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<void*> ptrs;

  static Blocks Make(uint64_t first, size_t n, uint64_t salt = 0) {
    Blocks b;
    for (size_t i = 0; i < n; ++i) {
      b.keys.push_back(Key(first + i));
      b.data.push_back(Pattern(b.keys.back(), kBlock, salt));
    }
    for (auto& d : b.data) b.ptrs.push_back(d.data());
    return b;
  }
  // Block i alone, in a buffer of its own.
  Blocks One(size_t i) const {
    Blocks b;
    b.keys = {keys[i]};
    b.data = {data[i]};
    b.ptrs = {b.data[0].data()};
    return b;
  }
  // Same keys, zeroed buffers to load into.
  Blocks Empty() const {
    Blocks b;
    b.keys = keys;
    b.data.assign(keys.size(), std::vector<std::byte>(kBlock));
    for (auto& d : b.data) b.ptrs.push_back(d.data());
    return b;
  }
};

inline Status StoreAndWait(Engine& e, const Blocks& b) {
  Result<JobId> job = e.Store(b.keys, b.ptrs);
  if (!job.ok()) return job.status();
  return e.Wait(*job);
}

inline Status LoadAndWait(Engine& e, const Blocks& b) {
  Result<JobId> job = e.Load(b.keys, b.ptrs);
  if (!job.ok()) return job.status();
  return e.Wait(*job);
}

inline uint64_t FilesUnder(const std::string& dir, const std::string& suffix = ".blk") {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (f.path().string().ends_with(suffix)) ++n;
  }
  return n;
}

// The slot file under a tier root (a private tier that starts empty keeps its blocks there:
// FORMAT.md, Slot file), or "" when there is none.
inline std::string SlotFileUnder(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (f.path().filename().string().starts_with("slots.")) return f.path().string();
  }
  return "";
}

// Overwrites the first `bytes` bytes of the slot that holds `key`'s block (its payload is
// Pattern(key, block_bytes): a slot holds the payload alone, rounded up to 4096) in the slot
// file under `dir`, as a torn or rotten write would leave them. False when no slot holds it.
inline bool DamageSlot(const std::string& dir, size_t block_bytes, const BlockKey& key,
                       size_t bytes = 2048) {
  const std::string path = SlotFileUnder(dir);
  const int fd = path.empty() ? -1 : ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t slot_bytes = (block_bytes + 4095) / 4096 * 4096;
  const std::vector<std::byte> want = Pattern(key, std::min<size_t>(block_bytes, 256));
  std::vector<std::byte> got(want.size());
  struct stat st {};
  ::fstat(fd, &st);
  bool found = false;
  for (off_t off = 0; !found && off + static_cast<off_t>(slot_bytes) <= st.st_size;
       off += static_cast<off_t>(slot_bytes)) {
    if (::pread(fd, got.data(), got.size(), off) != static_cast<ssize_t>(got.size())) break;
    if (got == want) {
      const std::vector<char> junk(bytes, '\xee');
      found = ::pwrite(fd, junk.data(), junk.size(), off) == static_cast<ssize_t>(junk.size());
    }
  }
  ::close(fd);
  return found;
}

// Bytes of block and temp files under dir, each inode once: publishing links the temp file to
// its final name, and for that moment both names share the same data blocks.
inline uint64_t BytesUnder(const std::string& dir) {
  uint64_t n = 0;
  std::set<ino_t> seen;
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    const std::string p = f.path().string();
    struct stat st {};
    if ((p.ends_with(".blk") || p.ends_with(".tmp")) && ::stat(p.c_str(), &st) == 0 &&
        S_ISREG(st.st_mode) && seen.insert(st.st_ino).second) {
      n += static_cast<uint64_t>(st.st_size);
    }
  }
  return n;
}

// Starts `args[0]` with `args` (the helper processes of the multi-process tests).
inline pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// Waits for `pid`: its exit code, or 128 + the signal that ended it.
inline int Reap(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace kvoffload::testing

#endif  // KVOFFLOAD_TESTS_TEST_UTIL_H_
