// The CPU limit read from cgroup trees laid out as the kernel shows them to a container.
#include "kvoffload/cpu_budget.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <string>

#include "test_pki.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;

class CgroupCpuLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "proc");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` at `path` under the test's tree, making its directories.
  void Write(const std::string& path, const std::string& text) {
    const fs::path p = dir_ / fs::path(path).relative_path();
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::optional<double> Limit() { return CgroupCpuLimit(dir_ / "proc", dir_); }

  static constexpr const char* kV2Mount =
      "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n";
  fs::path dir_;
};

// A container with its own cgroup namespace sees its cgroup as "/", mounted at /sys/fs/cgroup:
// `limits.cpu: 1500m` is cpu.max "150000 100000".
TEST_F(CgroupCpuLimitTest, CgroupV2InItsOwnNamespace) {
  Write("proc/cgroup", "0::/\n");
  Write("proc/mountinfo", std::string("22 1 0:20 / / rw - overlay overlay rw\n") + kV2Mount);
  Write("sys/fs/cgroup/cpu.max", "150000 100000\n");
  ASSERT_TRUE(Limit().has_value());
  EXPECT_DOUBLE_EQ(*Limit(), 1.5);
}

// Without a cgroup namespace the path is the host's, and a limit on an ancestor (the pod's
// cgroup above the container's) binds too: the smallest wins.
TEST_F(CgroupCpuLimitTest, CgroupV2AncestorLimitBinds) {
  Write("proc/cgroup", "0::/kubepods/pod1/c1\n");
  Write("proc/mountinfo", kV2Mount);
  Write("sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
  Write("sys/fs/cgroup/kubepods/pod1/cpu.max", "50000 100000\n");
  Write("sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  ASSERT_TRUE(Limit().has_value());
  EXPECT_DOUBLE_EQ(*Limit(), 0.5);
}

// A level where the cpu controller is not enabled has no cpu.max; the levels above still count.
TEST_F(CgroupCpuLimitTest, CgroupV2LevelWithoutTheControllerIsWalkedPast) {
  Write("proc/cgroup", "0::/system.slice/serve.service\n");
  Write("proc/mountinfo", kV2Mount);
  Write("sys/fs/cgroup/system.slice/serve.service/cgroup.procs", "1\n");
  Write("sys/fs/cgroup/system.slice/cpu.max", "200000 100000\n");
  ASSERT_TRUE(Limit().has_value());
  EXPECT_DOUBLE_EQ(*Limit(), 2.0);
}

TEST_F(CgroupCpuLimitTest, CgroupV2WithoutLimit) {
  Write("proc/cgroup", "0::/\n");
  Write("proc/mountinfo", kV2Mount);
  Write("sys/fs/cgroup/cpu.max", "max 100000\n");
  EXPECT_FALSE(Limit().has_value());
}

// cgroup v1: the hierarchy with the cpu controller (here joined with cpuacct), its own cgroup
// bind-mounted as the mount's root, as older container runtimes do.
TEST_F(CgroupCpuLimitTest, CgroupV1CpuController) {
  Write("proc/cgroup", "5:memory:/kubepods/pod1/c1\n4:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n");
  Write("proc/mountinfo",
        "40 30 0:35 /kubepods/pod1/c1 /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup "
        "rw,cpu,cpuacct\n"
        "41 30 0:36 /kubepods/pod1/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n");
  Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  ASSERT_TRUE(Limit().has_value());
  EXPECT_DOUBLE_EQ(*Limit(), 2.0);
}

// A cpuacct-only or cpuset hierarchy is no CPU limit, nor is a quota of -1.
TEST_F(CgroupCpuLimitTest, CgroupV1OnlyTheCpuControllerAndARealQuotaCount) {
  Write("proc/cgroup", "3:cpuacct:/\n2:cpu:/\n");
  Write("proc/mountinfo",
        "40 30 0:35 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"
        "41 30 0:36 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
  Write("sys/fs/cgroup/cpuacct/cpu.cfs_quota_us", "100000\n");
  Write("sys/fs/cgroup/cpuacct/cpu.cfs_period_us", "100000\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
  Write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(Limit().has_value());
}

// Where the cgroup's own directory is not visible, the mount's root is the closest there is.
TEST_F(CgroupCpuLimitTest, MissingCgroupDirectoryFallsBackToTheMountRoot) {
  Write("proc/cgroup", "0::/elsewhere/c9\n");
  Write("proc/mountinfo", kV2Mount);
  Write("sys/fs/cgroup/cpu.max", "300000 100000\n");
  ASSERT_TRUE(Limit().has_value());
  EXPECT_DOUBLE_EQ(*Limit(), 3.0);
}

// What cannot be read or parsed never lowers the count.
TEST_F(CgroupCpuLimitTest, UnreadableOrMalformedIsNoLimit) {
  EXPECT_FALSE(Limit().has_value()) << "no /proc files";
  Write("proc/cgroup", "0::/\n");
  Write("proc/mountinfo", "garbage\n35 24 0:30 / /sys/fs/cgroup rw\n");
  EXPECT_FALSE(Limit().has_value()) << "no cgroup mount";
  Write("proc/mountinfo", kV2Mount);
  for (const char* bad : {"", "150000", "x 100000", "150000 0", "-5 100000", "150000 y"}) {
    Write("sys/fs/cgroup/cpu.max", bad);
    EXPECT_FALSE(Limit().has_value()) << "cpu.max \"" << bad << "\"";
  }
}

TEST(UsableCpusTest, NeverMoreThanTheAffinityMaskAndAtLeastOne) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  const int cpus = UsableCpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, CPU_COUNT(&set));
}

}  // namespace
}  // namespace kvoffload::webhook
