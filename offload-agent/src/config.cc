// Configuration from the webhook's environment variables and its validation.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <vector>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <nlohmann/json.hpp>

#include "kvoffload/config.h"
#include "kvoffload/tier_headroom.h"
#include "device_backends.h"
#include "disk_io_backends.h"
#include "eviction_policies.h"

namespace kvoffload {
namespace {

// `v` as a JSON string: a NUL cut the message where it stood (the C API returns it through
// c_str()), and other control characters went into the log raw.
std::string Quote(std::string_view v) {
  return nlohmann::json(std::string(v)).dump(-1, ' ', false,
                                             nlohmann::json::error_handler_t::replace);
}

// The keys of one KVOFFLOAD_TIERS entry. Any other is refused: a misspelt "persistent" read as
// absent would start the tier empty on every restart, and nothing would say why.
constexpr const char* kTierKeys[] = {"path", "kind", "capacityBytes", "persistent", "shared"};

Result<uint64_t> ParseBytes(std::string_view name, std::string_view value) {
  uint64_t out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec == std::errc::result_out_of_range && ptr == value.data() + value.size()) {
    return Status::InvalidArgument(std::string(name) + "=" + Quote(value) +
                                   " is more than 2^64-1 bytes");
  }
  if (value.empty() || ec != std::errc() || ptr != value.data() + value.size()) {
    return Status::InvalidArgument(std::string(name) + "=" + Quote(value) +
                                   " is not an integer byte count (the webhook writes bytes, "
                                   "e.g. 10737418240)");
  }
  return out;
}

// A tier's directory as a name to compare: "/mnt/a/", "/mnt//a" and "/mnt/b/../a" are "/mnt/a".
std::filesystem::path TierDir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).lexically_normal();
  return dir.has_filename() ? dir : dir.parent_path();
}

// Where a tier's directory is on the file system: the device and inode of its deepest directory
// that exists, and the names below that one that do not exist yet. Two tiers whose paths differ
// can still name one directory, through a symbolic link or two mounts of one volume (two subPath
// mounts of one claim's directory), which comparing the names cannot see.
struct DirIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string rest;
  bool operator==(const DirIdentity&) const = default;
};

std::optional<DirIdentity> IdentifyDir(const std::string& path) {
  std::filesystem::path dir = TierDir(path);
  std::string rest;
  for (;;) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) return DirIdentity{st.st_dev, st.st_ino, rest};
    if (!dir.has_relative_path()) return std::nullopt;
    rest = dir.filename().string() + (rest.empty() ? "" : "/" + rest);
    dir = dir.parent_path();
  }
}

// capacityBytes 0 is the webhook's "size unknown" (a pvc.ref it could not read, as in offline
// inject): the tier takes its file system's size, less the headroom the webhook keeps from a
// size it knows (docs/design.md) for what du counts besides block files. The total, not the free
// space: a persistent tier's own blocks are not free at restart, and a capacity that shrank by
// them would shed them. A volume that holds other data too fills before that; the tier then
// counts the blocks the full disk refused.
Result<uint64_t> FileSystemCapacity(const std::string& at, const std::string& path) {
  struct statvfs fs {};
  if (::statvfs(path.c_str(), &fs) != 0) {
    return Status::InvalidArgument(at + ".capacityBytes=0 sizes the tier from its file system, "
                                   "but " + path + " cannot be read: " + std::strerror(errno) +
                                   "; mount the tier's volume there or give its size");
  }
  const uint64_t size = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  return size - TierHeadroomBytes(size);
}

// Edits (insert, delete, substitute) from `a` to `b`, compared without case.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = std::toupper(static_cast<unsigned char>(a[i - 1])) ==
                        std::toupper(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

Status RefuseMisspeltVariables(const char* const* names) {
  static constexpr std::string_view kRead[] = {"KVOFFLOAD_CPU_BYTES", "KVOFFLOAD_EVICTION_POLICY",
                                               "KVOFFLOAD_TIERS"};
  for (const char* const* entry = names; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view whole(*entry);
    const std::string_view name = whole.substr(0, whole.find('='));
    if (std::find(std::begin(kRead), std::end(kRead), name) != std::end(kRead)) continue;
    for (std::string_view meant : kRead) {
      // Three edits: KVOFFLOAD_EVICTION_POLICIES is three from ..._POLICY; our other variables
      // (KVOFFLOAD_LIBRARY, KVOFFLOAD_CONFIG_HASH) are five or more from any of these.
      if (EditDistance(name, meant) <= 3) {
        return Status::InvalidArgument(std::string(name) +
                                       " is set, but no such variable is read; did you mean " +
                                       std::string(meant) + "?");
      }
    }
  }
  return Status::Ok();
}

std::optional<std::string> ProcessEnv(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

Result<std::vector<DiskTierConfig>> ParseTiersJson(std::string_view json) {
  const std::string where = "KVOFFLOAD_TIERS=" + Quote(json);
  // JSON parsers keep the last of a key given twice: "persistent":true,"persistent":false made
  // a pvcRef tier start empty, removing the blocks it held. Each object's keys are tracked.
  std::vector<std::vector<std::string>> keys;  // of the objects open at this point
  int tier_at = -1;
  std::string twice;
  const nlohmann::json::parser_callback_t seen = [&](int depth, nlohmann::json::parse_event_t event,
                                                    nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      if (depth == 1) ++tier_at;
      keys.emplace_back();
    } else if (event == Event::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == Event::key && !keys.empty() && twice.empty()) {
      std::vector<std::string>& open = keys.back();
      const std::string& key = parsed.get_ref<const std::string&>();
      if (std::find(open.begin(), open.end(), key) != open.end()) {
        twice = (tier_at >= 0 ? "KVOFFLOAD_TIERS[" + std::to_string(tier_at) + "]" : "KVOFFLOAD_TIERS") +
                " has the key " + Quote(key) + " twice; give each key once";
      }
      open.push_back(key);
    }
    return true;
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json, seen);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(where + " is not JSON: " + e.what());
  }
  if (!twice.empty()) return Status::InvalidArgument(twice);
  if (!doc.is_array()) return Status::InvalidArgument(where + " must be a JSON array");
  std::vector<DiskTierConfig> tiers;
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& t = doc[i];
    const std::string at = "KVOFFLOAD_TIERS[" + std::to_string(i) + "]";
    if (!t.is_object()) return Status::InvalidArgument(at + " must be an object");
    for (const auto& item : t.items()) {
      const std::string& key = item.key();
      if (std::find(std::begin(kTierKeys), std::end(kTierKeys), key) == std::end(kTierKeys)) {
        std::string known;
        for (const char* k : kTierKeys) known += std::string(known.empty() ? "" : ", ") + k;
        return Status::InvalidArgument(at + " has an unknown key " + Quote(key) +
                                       "; the keys are " + known);
      }
    }
    DiskTierConfig tier;
    if (!t.contains("path") || !t["path"].is_string() || t["path"].get<std::string>().empty()) {
      return Status::InvalidArgument(at + ".path=" + t.value("path", nlohmann::json()).dump() +
                                     " must be a non-empty string");
    }
    tier.path = t["path"].get<std::string>();
    // Required, as the Python adapter requires it: the default of persistent hangs on it.
    if (!t.contains("kind") || !t["kind"].is_string()) {
      return Status::InvalidArgument(at + ".kind must be a string, one of emptyDir, pvcSpec or "
                                     "pvcRef");
    }
    tier.kind = t["kind"].get<std::string>();
    if (tier.kind != "emptyDir" && tier.kind != "pvcSpec" && tier.kind != "pvcRef") {
      return Status::InvalidArgument(at + ".kind=" + Quote(tier.kind) +
                                     " must be emptyDir, pvcSpec or pvcRef");
    }
    if (!t.contains("capacityBytes") || !t["capacityBytes"].is_number_unsigned()) {
      return Status::InvalidArgument(
          at + ".capacityBytes=" + t.value("capacityBytes", nlohmann::json()).dump() +
          " must be a non-negative integer number of bytes, at most 2^64-1 (0: the size of the "
          "tier's file system)");
    }
    tier.capacity_bytes = t["capacityBytes"].get<uint64_t>();
    if (tier.capacity_bytes == 0) {
      Result<uint64_t> size = FileSystemCapacity(at, tier.path);
      if (!size.ok()) return size.status();
      tier.capacity_bytes = *size;
    }
    for (const char* flag : {"persistent", "shared"}) {
      if (t.contains(flag) && !t[flag].is_boolean()) {
        return Status::InvalidArgument(at + "." + flag + " must be true or false");
      }
    }
    tier.persistent = t.value("persistent", tier.kind == "pvcRef");
    tier.shared = t.value("shared", false);
    tiers.push_back(std::move(tier));
  }
  return tiers;
}

Result<EngineConfig> ConfigFromEnv(EngineConfig base, const EnvLookup& env) {
  // An empty variable is an unset one, for all three: `KVOFFLOAD_TIERS=` in a shell or a
  // pod's `value: ""` means no value, and the Python adapter then reads its extra config's.
  std::optional<std::string> cpu = env("KVOFFLOAD_CPU_BYTES");
  if (!cpu || cpu->empty()) {
    return Status::InvalidArgument(
        "KVOFFLOAD_CPU_BYTES is not set (or empty); the webhook sets it from "
        "kvCacheOffloading.cpu");
  }
  Result<uint64_t> cpu_bytes = ParseBytes("KVOFFLOAD_CPU_BYTES", *cpu);
  if (!cpu_bytes.ok()) return cpu_bytes.status();
  base.cpu_bytes = *cpu_bytes;
  if (std::optional<std::string> policy = env("KVOFFLOAD_EVICTION_POLICY");
      policy && !policy->empty()) {
    // The registered policies, not a list of our own: a registered policy is selectable here
    // with no other change.
    if (!EvictionPolicies().Contains(*policy)) {
      return EvictionPolicies().Unknown(*policy, "KVOFFLOAD_EVICTION_POLICY");
    }
    base.eviction_policy = *policy;
  }
  if (std::optional<std::string> tiers = env("KVOFFLOAD_TIERS"); tiers && !tiers->empty()) {
    Result<std::vector<DiskTierConfig>> parsed = ParseTiersJson(*tiers);
    if (!parsed.ok()) return parsed.status();
    base.tiers = std::move(parsed).value();
  }
  if (Status s = base.Validate(); !s.ok()) return s;
  return base;
}

Status EngineConfig::Validate() const {
  if (block_bytes == 0) return Status::InvalidArgument("block_bytes must be > 0");
  // A block's file (block, trailer, 4 KiB alignment) must fit size_t, and one disk read or
  // write of it an io_uring op (32-bit length); vLLM's blocks are KiB to tens of MiB.
  if (block_bytes > kMaxBlockBytes) {
    return Status::InvalidArgument("block_bytes=" + std::to_string(block_bytes) + " is over " +
                                   std::to_string(kMaxBlockBytes) +
                                   ", the largest block the agent stores; use smaller blocks");
  }
  if (segments == 0 || block_bytes % segments != 0) {
    return Status::InvalidArgument("segments=" + std::to_string(segments) +
                                   " must be > 0 and divide block_bytes=" +
                                   std::to_string(block_bytes));
  }
  if (fingerprint.model.empty()) {
    return Status::InvalidArgument("fingerprint.model must be set: blocks are scoped by model");
  }
  if (cpu_bytes < block_bytes) {
    return Status::InvalidArgument("KVOFFLOAD_CPU_BYTES=" + std::to_string(cpu_bytes) +
                                   " holds no block of " + std::to_string(block_bytes) +
                                   " bytes; raise kvCacheOffloading.cpu");
  }
  if (!EvictionPolicies().Contains(eviction_policy)) {
    return EvictionPolicies().Unknown(eviction_policy, "eviction_policy");
  }
  if (!DeviceBackends().Contains(device)) return DeviceBackends().Unknown(device, "device");
  if (!DiskIoBackends().Contains(disk_io)) return DiskIoBackends().Unknown(disk_io, "disk_io");
  if (worker_threads == 0 || io_parallelism == 0) {
    return Status::InvalidArgument("worker_threads and io_parallelism must be > 0");
  }
  if (tiers.size() > kMaxDiskTiers) {
    return Status::InvalidArgument("KVOFFLOAD_TIERS has " + std::to_string(tiers.size()) +
                                   " disk tiers; at most " + std::to_string(kMaxDiskTiers) +
                                   " are taken (the stats report the CPU tier and " +
                                   std::to_string(kMaxDiskTiers) + " more)");
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    const DiskTierConfig& t = tiers[i];
    const std::string at = "KVOFFLOAD_TIERS[" + std::to_string(i) + "]";
    if (t.path.empty() || t.path[0] != '/') {
      return Status::InvalidArgument(at + ".path=" + Quote(t.path) + " must be absolute");
    }
    if (std::any_of(t.path.begin(), t.path.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      return Status::InvalidArgument(at + ".path=" + Quote(t.path) +
                                     " has a control character; a tier's mount path has none");
    }
    if (t.capacity_bytes == 0) {
      return Status::InvalidArgument(at + ".capacityBytes must be > 0 (path " + t.path + ")");
    }
    // Two tiers in one directory would each spend the same disk's room as if it were theirs
    // alone, persistent ones would serve and evict each other's files, and a tier that starts
    // empty would remove the other's blocks as it opens.
    for (size_t j = 0; j < i; ++j) {
      const bool same_name = TierDir(tiers[j].path) == TierDir(t.path);
      if (!same_name) {
        const std::optional<DirIdentity> a = IdentifyDir(tiers[j].path);
        if (!a || a != IdentifyDir(t.path)) continue;
      }
      return Status::InvalidArgument(
          at + ".path=" + Quote(t.path) + " is tier " + std::to_string(j) + "'s directory too (" +
          Quote(tiers[j].path) + (same_name ? "" : ", through a link or a second mount") +
          "); give each tier its own");
    }
  }
  return Status::Ok();
}

}  // namespace kvoffload
