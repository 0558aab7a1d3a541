#include "kvoffload/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/read_file.h"

namespace kvoffload {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// One hierarchy that can hold a CPU limit: where it is mounted and the cgroup's path in it.
struct Hierarchy {
  bool v2 = false;
  std::string path;        // the process's cgroup, from /proc/<pid>/cgroup
  fs::path mount_point;    // from mountinfo
  std::string mount_root;  // the hierarchy's directory that is mounted there
};

// The limit one cgroup directory sets, in CPUs; none for "max", -1 or a malformed file.
std::optional<double> DirectoryLimit(const fs::path& dir, bool v2) {
  double quota = 0;
  double period = 0;
  if (v2) {
    Result<std::string> max = ReadWholeFile(dir / "cpu.max");
    if (!max.ok()) return std::nullopt;
    std::istringstream in(*max);
    std::string q;
    if (!(in >> q >> period) || q == "max") return std::nullopt;
    try {
      quota = std::stod(q);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  } else {
    Result<std::string> q = ReadWholeFile(dir / "cpu.cfs_quota_us");
    Result<std::string> p = ReadWholeFile(dir / "cpu.cfs_period_us");
    if (!q.ok() || !p.ok() || !(std::istringstream(*q) >> quota) ||
        !(std::istringstream(*p) >> period)) {
      return std::nullopt;
    }
  }
  if (quota <= 0 || period <= 0) return std::nullopt;
  return quota / period;
}

}  // namespace

std::optional<double> CgroupCpuLimit(const fs::path& proc, const fs::path& root) {
  Result<std::string> cgroups = ReadWholeFile(proc / "cgroup");
  Result<std::string> mountinfo = ReadWholeFile(proc / "mountinfo");
  if (!cgroups.ok() || !mountinfo.ok()) return std::nullopt;

  // /proc/<pid>/cgroup: "id:controllers:path"; cgroup v2's line is "0::path". The v1 hierarchy
  // that limits CPU time is the one whose controllers include "cpu".
  std::vector<Hierarchy> hierarchies;
  for (const std::string& line : Split(*cgroups, '\n')) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::vector<std::string> names = Split(controllers, ',');
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    if (v2 || std::find(names.begin(), names.end(), "cpu") != names.end()) {
      hierarchies.push_back(
          {.v2 = v2, .path = line.substr(b + 1), .mount_point = {}, .mount_root = {}});
    }
  }
  // mountinfo: "id parent major:minor root mount-point options [optional...] - type source
  // super-options". A cgroup2 mount serves the v2 hierarchy; a cgroup mount whose super
  // options name "cpu" serves the v1 one.
  for (const std::string& line : Split(*mountinfo, '\n')) {
    std::istringstream in(line);
    std::vector<std::string> fields;
    for (std::string f; in >> f;) fields.push_back(f);
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string& type = dash[1];
    const std::vector<std::string> options = Split(dash[3], ',');
    const bool cpu_v1 =
        type == "cgroup" && std::find(options.begin(), options.end(), "cpu") != options.end();
    for (Hierarchy& h : hierarchies) {
      if (h.mount_point.empty() && (h.v2 ? type == "cgroup2" : cpu_v1)) {
        h.mount_root = fields[3];
        h.mount_point = fields[4];
      }
    }
  }

  std::optional<double> limit;
  for (const Hierarchy& h : hierarchies) {
    if (h.mount_point.empty()) continue;
    // The cgroup's directory under the mount: its path less the part of the hierarchy above
    // the mounted root (a container sees its own cgroup mounted as the root, with path "/").
    std::string rel = h.path;
    if (h.mount_root != "/" && rel.compare(0, h.mount_root.size(), h.mount_root) == 0) {
      rel = rel.substr(h.mount_root.size());
    }
    const fs::path top = root / h.mount_point.relative_path();
    fs::path dir = (top / fs::path(rel).relative_path()).lexically_normal();
    // Where that directory is not there (or lies outside the mount), the mount's own root is
    // the closest the process can see of its cgroup. A directory without the limit's file (the
    // controller not enabled at that level) is walked up from like any other.
    std::error_code ec;
    if (dir.string().compare(0, top.string().size(), top.string()) != 0 ||
        !fs::is_directory(dir, ec)) {
      dir = top;
    }
    // A limit anywhere above counts as well: the smallest wins.
    for (fs::path d = dir;; d = d.parent_path()) {
      std::optional<double> l = DirectoryLimit(d, h.v2);
      if (l && (!limit || *l < *limit)) limit = l;
      if (d == top || !d.has_relative_path() || d.parent_path() == d) break;
    }
  }
  return limit;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0
                 ? CPU_COUNT(&set)
                 : static_cast<int>(std::thread::hardware_concurrency());
  if (std::optional<double> limit = CgroupCpuLimit()) {
    cpus = std::min(cpus, static_cast<int>(std::ceil(*limit)));
  }
  return std::max(cpus, 1);
}

}  // namespace kvoffload
