// Listing a directory in several streams over parts of ext4's hash space: every entry comes
// back exactly once, whatever the number of streams, including streams whose part of the hash
// space holds no entry at all.
#include "dir_listing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvoffload {
namespace {

using testing::TempDir;

// How many times each name was listed, with `streams` asked for; *used: how many listed it.
std::map<std::string, int> List(const std::string& dir, size_t streams, size_t* used) {
  std::map<std::string, int> seen;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << dir;
  *used = ForEachEntry(
      fd, [&](std::string_view name, unsigned char, ino_t) { ++seen[std::string(name)]; },
      streams);
  ::close(fd);
  return seen;
}

constexpr size_t kFiles = 3000;

// "" once `dir` holds kFiles empty files and several streams can list it, else why not.
std::string MakeHashedDirectory(const std::string& dir) {
  for (size_t i = 0; i < kFiles; ++i) {
    const std::string path = dir + "/entry-" + std::to_string(i * 7919) + ".blk";
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot create " + path;
    ::close(fd);
  }
  // 3000 names fill a few dozen blocks: on ext4 the directory is a hashed one by now.
  size_t used = 0;
  List(dir, 2, &used);
  return used == 2 ? "" : "the scratch directory is not a hashed ext4 one";
}

TEST(DirListingTest, EveryEntryOnceWhateverTheStreams) {
  TempDir dir;
  KVO_REQUIRE_CAPABILITY("a hashed ext4 directory", MakeHashedDirectory(dir.path()));
  // A descriptor per stream: a soft limit of 1024 would leave 1000 streams to one.
  struct rlimit files {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
  size_t used = 0;
  // 1000 streams for 3000 names: dozens of parts of the hash space hold none.
  for (size_t streams : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{1000}}) {
    const std::map<std::string, int> seen = List(dir.path(), streams, &used);
    EXPECT_EQ(used, streams);
    EXPECT_EQ(seen.size(), kFiles) << streams << " streams";
    for (const auto& [name, times] : seen) {
      ASSERT_EQ(times, 1) << name << " with " << streams << " streams";
    }
  }
}

// Streams read through descriptors of their own: where they run out, one stream lists the
// whole directory instead of some parts going unlisted.
TEST(DirListingTest, OutOfDescriptorsListsEverythingWithOneStream) {
  TempDir dir;
  KVO_REQUIRE_CAPABILITY("a hashed ext4 directory", MakeHashedDirectory(dir.path()));
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // Every free descriptor taken, then four given back: the listing's own and three streams'.
  std::vector<int> taken;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
  for (int i = 0; i < 4 && !taken.empty(); ++i) {
    ::close(taken.back());
    taken.pop_back();
  }
  size_t used = 0;
  const std::map<std::string, int> seen = List(dir.path(), 64, &used);
  for (int fd : taken) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(used, 1u);
  EXPECT_EQ(seen.size(), kFiles);
  for (const auto& [name, times] : seen) ASSERT_EQ(times, 1) << name;
}

}  // namespace
}  // namespace kvoffload
