// ReadWholeFile against what a stream read passed over: a directory, a read that fails.
#include "kvoffload/read_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvoffload {
namespace {

TEST(ReadWholeFileTest, ReadsEveryByte) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / "read_file_bytes";
  std::string bytes(200000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  std::ofstream(path, std::ios::binary) << bytes;
  Result<std::string> got = ReadWholeFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, bytes);
}

TEST(ReadWholeFileTest, AMissingFileIsNamedWithItsErrno) {
  Result<std::string> got = ReadWholeFile("/nonexistent/kvoffload/file");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(), "/nonexistent/kvoffload/file: cannot read: No such file or directory");
}

// A directory opens for reading and then fails each read with EISDIR: a stream read it as an
// empty file (a token or CA path mounted as a directory read as an empty token or CA).
TEST(ReadWholeFileTest, ADirectoryIsRefusedByName) {
  const std::string dir = ::testing::TempDir();
  Result<std::string> got = ReadWholeFile(dir);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(), dir + ": is a directory, not a file");
}

// /proc/self/mem opens, and its first read fails with EIO (nothing is mapped at address 0), as
// a file on a failing disk does.
TEST(ReadWholeFileTest, AReadErrorIsAnErrorNotAnEmptyFile) {
  Result<std::string> got = ReadWholeFile("/proc/self/mem");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(), "/proc/self/mem: cannot read: Input/output error");
}

}  // namespace
}  // namespace kvoffload
