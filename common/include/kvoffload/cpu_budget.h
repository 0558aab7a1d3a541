// How many CPUs this process can use at once, as a container runtime limits it: the CPUs of its
// affinity mask (a cpuset, such as the kubelet's static CPU manager gives), and no more than its
// cgroup's CPU bandwidth limit (a container's `resources.limits.cpu`), rounded up. The webhook's
// server and the agent's host copy pool size their threads by it: more threads than that only
// queue for the same CPU time, and under a bandwidth limit they spend a period's quota early in
// the period in parallel and are then all throttled until the next one.
#ifndef KVOFFLOAD_CPU_BUDGET_H_
#define KVOFFLOAD_CPU_BUDGET_H_

#include <filesystem>
#include <optional>

namespace kvoffload {

// The CPU bandwidth limit of the cgroup `proc` (a /proc/<pid> directory) is in, in CPUs: the
// smallest quota/period of it and its ancestors within the mount, from cgroup v2's cpu.max or
// v1's cpu.cfs_quota_us and cpu.cfs_period_us. Mount points from `proc`/mountinfo are looked up
// under `root` (so a test can lay out a tree). None when there is no limit or nothing can be
// read: an unreadable cgroup never lowers the count.
std::optional<double> CgroupCpuLimit(const std::filesystem::path& proc = "/proc/self",
                                     const std::filesystem::path& root = "/");

// The CPUs of this process's affinity mask, capped by CgroupCpuLimit() rounded up; at least 1.
int UsableCpus();

}  // namespace kvoffload

#endif  // KVOFFLOAD_CPU_BUDGET_H_
