#include "webhook/mutator.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <deque>
#include <initializer_list>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>

#include "kvoffload/tier_headroom.h"
#include "webhook/eviction_policies.h"
#include "webhook/json_util.h"
#include "webhook/launch.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

std::string TierMountPath(size_t i) { return "/mnt/kv-cache-" + std::to_string(i); }
std::string TierVolumeName(size_t i) { return "kv-cache-secondary-" + std::to_string(i); }
std::string TierFieldPath(size_t i) {
  return "kvCacheOffloading.secondary[" + std::to_string(i) + "]";
}

// One step of a pointer walk: an object member, or an array element by decimal index.
JsonView Child(const JsonView& node, std::string_view token) {
  if (node.IsArray()) {
    size_t index = 0;
    for (char c : token) {
      if (c < '0' || c > '9') return {};
      index = index * 10 + static_cast<size_t>(c - '0');
    }
    return token.empty() ? JsonView() : node.At(index);
  }
  return node[token];
}

// {"key":value}, value being JSON text.
std::string ObjectText(std::string_view key, std::string_view value_json) {
  std::string out = "{";
  AppendJsonString(out, key);
  out += ':';
  out += value_json;
  out += '}';
  return out;
}

std::string Quoted(std::string_view text) {
  std::string out;
  AppendJsonString(out, text);
  return out;
}

// An env entry {"name":...,"value":...} as JSON text, keys in the order dump() writes them.
std::string EnvEntry(std::string_view name, std::string_view value) {
  std::string out = "{\"name\":";
  AppendJsonString(out, name);
  out += ",\"value\":";
  AppendJsonString(out, value);
  out += '}';
  return out;
}

// Collects RFC 6902 operations as JSON text. Paths are built by the caller from escaped tokens.
// The answer carries the patch as text, so the operations are written as they come: building
// them as a DOM only to serialise and free it cost a tenth of an admission.
class Patch {
 public:
  // A KServe pod's patch is about 3 KB: growing the text from empty copied it eight times.
  Patch() { ops_.reserve(4096); }
  // Values are JSON text.
  void Add(std::string_view path, std::string_view value_json) {
    Open("add");
    AppendJsonString(ops_, path);
    Close(value_json);
  }
  // The same with the path given as a JSON string (quoted, escaped): an array's items are
  // appended to one path, quoted once.
  void AddAtQuoted(std::string_view path_json, std::string_view value_json) {
    Open("add");
    ops_ += path_json;
    Close(value_json);
  }
  void Replace(std::string_view path, std::string_view value_json) {
    Open("replace");
    AppendJsonString(ops_, path);
    Close(value_json);
  }
  // Sets root[path...][key] = value (JSON text), creating missing parent objects in a single
  // add: the API server's JSON patch fails an add whose parent is missing.
  void SetMember(const JsonView& root, std::initializer_list<std::string_view> path,
                 std::string_view key, std::string_view value_json) {
    JsonView node = root;
    std::string pointer;
    const std::string_view* step = path.begin();
    for (; step != path.end(); ++step) {
      const JsonView next = Child(node, *step);
      // Arrays along the way are walked, never created: only objects are filled in.
      if (!next.IsObject() && !next.IsArray()) break;
      node = next;
      AppendPointerToken(pointer, *step);
    }
    if (step == path.end()) {
      AppendPointerToken(pointer, key);
      Add(pointer, value_json);
      return;
    }
    // The missing objects, innermost first: {"key":value}, then {"path[i]":{...}}.
    std::string nested = ObjectText(key, value_json);
    for (const std::string_view* inner = path.end() - 1; inner > step; --inner) {
      nested = ObjectText(*inner, nested);
    }
    AppendPointerToken(pointer, *step);
    Add(pointer, nested);
  }
  // The operations as a JSON array; "" when there are none.
  std::string Take() {
    if (!ops_.empty()) ops_ += ']';
    return std::move(ops_);
  }

 private:
  // An operation's start and end, around its path. Members come in the order nlohmann's
  // sorted objects gave them (op, path, value): the text earlier releases sent. The literals
  // are string_views: appending a char* measured each one with strlen() on every operation.
  void Open(std::string_view op) {
    ops_ += ops_.empty() ? std::string_view("[{\"op\":\"") : std::string_view(",{\"op\":\"");
    ops_ += op;
    ops_ += std::string_view("\",\"path\":");
  }
  void Close(std::string_view value_json) {
    ops_ += std::string_view(",\"value\":");
    ops_ += value_json;
    ops_ += '}';
  }

  std::string ops_;
};

// Appends to an array that may be missing (or null) in the original: a missing array is added
// whole, an existing one gets "/-" adds, so the patch applies on the API server either way.
class ArrayAppend {
 public:
  ArrayAppend(const JsonView& current, std::string path)
      : exists_(current.IsArray()), path_(std::move(path)) {}
  // An item as JSON text, kept until Flush.
  void Push(std::string value_json) { Borrow(owned_.emplace_back(std::move(value_json))); }
  // An item as JSON text that outlives this object (the workload's FromSpec, a constant).
  void Borrow(std::string_view value_json) { items_.push_back(value_json); }
  void Flush(Patch* patch) {
    if (items_.empty()) return;
    if (exists_) {
      std::string append_path;
      AppendJsonString(append_path, path_ + "/-");
      for (std::string_view item : items_) patch->AddAtQuoted(append_path, item);
    } else {
      std::string array = "[";
      for (std::string_view item : items_) {
        if (array.size() > 1) array += ',';
        array += item;
      }
      array += ']';
      patch->Add(path_, array);
    }
    items_.clear();
    owned_.clear();
  }

 private:
  bool exists_;
  std::string path_;
  std::vector<std::string_view> items_;  // JSON text
  std::deque<std::string> owned_;        // what Push kept (a deque never moves its elements)
};

// The agent's install step, as JSON text. It depends only on the agent image, which is one per
// webhook, so each thread writes it once per image instead of building it for every pod.
const std::string& AgentInitContainer(const std::string& image) {
  thread_local std::string cached_image;
  thread_local std::string cached;
  if (cached.empty() || cached_image != image) {
    cached_image = image;
    cached = DumpJson(
        {{"name", kAgentInitContainer},
         {"image", image},
         {"command", {std::string(kAgentMountPath) + "/bin/kvoffload-install", kAgentInstallDest}},
         {"volumeMounts", {{{"name", kAgentVolume}, {"mountPath", kAgentInstallDest}}}},
         {"resources",
          {{"requests", {{"cpu", "10m"}, {"memory", "32Mi"}}}, {"limits", {{"memory", "64Mi"}}}}},
         {"securityContext",
          {{"allowPrivilegeEscalation", false},
           {"capabilities", {{"drop", {"ALL"}}}},
           {"readOnlyRootFilesystem", true},
           {"runAsNonRoot", true},
           {"runAsUser", 65532},
           {"seccompProfile", {{"type", "RuntimeDefault"}}}}}});
  }
  return cached;
}

bool Contains(const std::vector<std::string_view>& values, std::string_view value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Which entry of the pod's env gives each of a few names its value (the last: the kubelet
// keeps the last of a repeated name), found in one pass over its names: a KServe container's
// env has about a hundred entries, and scanning them once for every name the admission sets or
// reads (about ten) was a twentieth of its instructions; a hash index of all the names cost
// more than the scans.
class EnvPositions {
 public:
  EnvPositions(const std::vector<std::string_view>& names, std::vector<std::string_view> wanted)
      : wanted_(std::move(wanted)), last_(wanted_.size()) {
    // The wanted names by length (one list per length, the last for 63 bytes and more): a
    // pod's name is compared only with those of its own length, and first by its first byte.
    constexpr size_t kLists = 64;
    std::array<size_t, kLists> head;
    head.fill(kNone);
    std::vector<size_t> next(wanted_.size(), kNone);
    for (size_t k = wanted_.size(); k-- > 0;) {
      const size_t list = std::min(wanted_[k].size(), kLists - 1);
      next[k] = head[list];
      head[list] = k;
    }
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string_view name = names[i];
      for (size_t k = head[std::min(name.size(), kLists - 1)]; k != kNone; k = next[k]) {
        if ((!name.empty() && name[0] != wanted_[k][0]) || name != wanted_[k]) continue;
        last_[k] = i;
      }
    }
  }
  // The index of the entry the container gets for `name`, if the pod sets it.
  std::optional<size_t> Of(std::string_view name) const { return last_[Slot(name)]; }

 private:
  size_t Slot(std::string_view name) const {
    const auto it = std::find(wanted_.begin(), wanted_.end(), name);
    // Only a name the constructor was given can be asked for: anything else is a bug here.
    if (it == wanted_.end()) throw std::logic_error("EnvPositions: " + std::string(name));
    return static_cast<size_t>(it - wanted_.begin());
  }

  static constexpr size_t kNone = ~size_t{0};
  std::vector<std::string_view> wanted_;
  std::vector<std::optional<size_t>> last_;
};

// Whether `entry` is exactly the env entry {"name": name, "value": value}.
bool IsEnvEntry(const JsonView& entry, std::string_view name, std::string_view value) {
  return entry.IsObject() && entry.Size() == 2 && entry["name"].String() == name &&
         entry["value"].IsString() && entry["value"].String() == value;
}

std::string Sha256Hex(std::string_view data, size_t hex_chars) {
  // Fetched once: OpenSSL 3's implicit fetch behind EVP_sha256() costs more than hashing a
  // spec. EVP_MD objects are immutable and safe to share between threads.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &len, sha256, nullptr);
  constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len && hex.size() < hex_chars; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

bool IsReadWriteMany(const PvcInfo& pvc) {
  for (const std::string& m : pvc.access_modes) {
    if (m == "ReadWriteMany") return true;
  }
  return false;
}

// Equal and printed alike (ToString depends on the format too): what the hash reads.
bool SameQuantity(const Quantity& a, const Quantity& b) {
  return a == b && a.format() == b.format();
}

bool SameSpec(const OffloadSpec& a, const OffloadSpec& b) {
  if (!SameQuantity(a.cpu, b.cpu) || a.eviction_policy != b.eviction_policy ||
      a.secondary.size() != b.secondary.size()) {
    return false;
  }
  for (size_t i = 0; i < a.secondary.size(); ++i) {
    const Tier& x = a.secondary[i];
    const Tier& y = b.secondary[i];
    if (x.kind != y.kind || !SameQuantity(x.size, y.size) || x.pvc_spec != y.pvc_spec ||
        x.ref_name != y.ref_name || x.ref_path != y.ref_path) {
      return false;
    }
  }
  return true;
}

bool SamePvcs(const std::map<std::string, PvcInfo>& a, const std::map<std::string, PvcInfo>& b) {
  if (a.size() != b.size()) return false;
  for (auto x = a.begin(), y = b.begin(); x != a.end(); ++x, ++y) {
    if (x->first != y->first || x->second.exists != y->second.exists ||
        x->second.access_modes != y->second.access_modes ||
        x->second.capacity.has_value() != y->second.capacity.has_value() ||
        (x->second.capacity && !SameQuantity(*x->second.capacity, *y->second.capacity))) {
      return false;
    }
  }
  return true;
}

// A FromSpec with what it was derived from.
struct SpecDerived {
  OffloadSpec spec;
  std::map<std::string, PvcInfo> pvcs;
  Mode mode = Mode::kVllmNative;
  std::string container;
  std::string agent_image;
  std::shared_ptr<const FromSpec> derived;
};

// The pods of one workload share their FromSpec, and building it (the tiers' JSON, the
// canonical spec and its SHA-256, the vLLM flag's JSON) was a quarter of a small pod's
// admission: each thread keeps its last.
std::shared_ptr<const FromSpec> Derive(const MutationInput& in, Mode mode,
                                       const std::string& container) {
  thread_local std::optional<SpecDerived> last;
  if (last && last->mode == mode && last->container == container &&
      last->agent_image == in.options.agent_image && SameSpec(last->spec, in.spec) &&
      SamePvcs(last->pvcs, in.pvcs)) {
    return last->derived;
  }
  SpecDerived d;
  d.spec = in.spec;
  d.pvcs = in.pvcs;
  d.mode = mode;
  d.container = container;
  d.agent_image = in.options.agent_image;
  auto derived = std::make_shared<FromSpec>();
  const json tiers_env = TiersEnv(in.spec, in.pvcs);
  derived->tiers_text = DumpJson(tiers_env);
  derived->config_hash = ConfigHash(in.spec, mode, container, tiers_env, in.options.agent_image);
  derived->transfer_config = DumpJson(KvTransferConfig(in.spec, mode));
  derived->flag_argument = FlagArgument(FlagRoute::kArgs, derived->transfer_config);
  derived->flag_argument_for_eval =
      FlagArgument(FlagRoute::kArgsForEval, derived->transfer_config);
  AppendJsonString(derived->flag_argument_json, derived->flag_argument);
  AppendJsonString(derived->flag_argument_for_eval_json, derived->flag_argument_for_eval);
  for (const auto& [name, value] : std::initializer_list<std::pair<const char*, std::string>>{
           {"KVOFFLOAD_CPU_BYTES", std::to_string(in.spec.cpu.Value())},
           {"KVOFFLOAD_EVICTION_POLICY",
            in.spec.eviction_policy.empty() ? "lru" : in.spec.eviction_policy},
           {"KVOFFLOAD_TIERS", derived->tiers_text},
           {"KVOFFLOAD_CONFIG_HASH", derived->config_hash}}) {
    derived->env.push_back({name, value, EnvEntry(name, value)});
  }
  for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
    const Tier& t = in.spec.secondary[i];
    json volume = {{"name", TierVolumeName(i)}};
    switch (t.kind) {
      case TierKind::kEmptyDir:
        volume["emptyDir"] = {{"sizeLimit", t.size.ToString()}};
        break;
      case TierKind::kPvcSpec:
        volume["ephemeral"] = {
            {"volumeClaimTemplate",
             {{"metadata", {{"labels", {{kLabelTier, std::to_string(i)}}}}},
              {"spec", t.pvc_spec}}}};
        break;
      case TierKind::kPvcRef:
        volume["persistentVolumeClaim"] = {{"claimName", t.ref_name}};
        break;
    }
    derived->tier_volumes.push_back(DumpJson(volume));
    json mount = {{"name", TierVolumeName(i)}, {"mountPath", TierMountPath(i)}};
    if (t.kind == TierKind::kPvcRef && !t.ref_path.empty()) mount["subPath"] = t.ref_path;
    derived->tier_mounts.push_back(DumpJson(mount));
  }
  d.derived = std::move(derived);
  last = std::move(d);
  return last->derived;
}

}  // namespace

KServePod KServePodKind(const JsonView& labels) {
  if (labels["app.kubernetes.io/part-of"].String() != "llminferenceservice") {
    return KServePod::kNone;
  }
  const std::string_view component = labels["app.kubernetes.io/component"].String();
  const std::string_view kserve_component = labels["kserve.io/component"].String();
  if (component.empty() && kserve_component.empty()) return KServePod::kWorkload;
  return kserve_component == "workload" || component.starts_with("llminferenceservice-workload")
             ? KServePod::kWorkload
             : KServePod::kOther;
}

std::string KServeRole(const JsonView& labels) {
  const std::string_view role = labels["llm-d.ai/role"].String();
  if (!role.empty()) return std::string(role);
  return labels["app.kubernetes.io/component"].String().ends_with("-prefill") ? "prefill" : "";
}

const char* ModeName(Mode mode) { return mode == Mode::kAgent ? "agent" : "vllm-native"; }

Result<Mode> ParseMode(const std::string& text) {
  if (text == "agent") return Mode::kAgent;
  if (text == "vllm-native") return Mode::kVllmNative;
  return Status::InvalidArgument("\"" + text + "\" is not a mode: use agent or vllm-native");
}

MutationInput::MutationInput(JsonDocument document_in, JsonView pod_in,
                             std::string namespace_name_in, Resolution resolution,
                             const MutationOptions& options_in, int workload_replicas)
    : document(std::move(document_in)),
      pod(pod_in),
      namespace_name(std::move(namespace_name_in)),
      spec(std::move(*resolution.spec)),
      source(std::move(resolution.source)),
      options(options_in),
      replicas(std::max(resolution.replicas, workload_replicas)),
      pvcs(std::move(resolution.pvcs)) {}

MutationInput::MutationInput(const json& pod_in, std::string namespace_name_in,
                             Resolution resolution, const MutationOptions& options_in,
                             int workload_replicas)
    : MutationInput(JsonDocument::Of(pod_in), JsonView(), std::move(namespace_name_in),
                    std::move(resolution), options_in, workload_replicas) {
  pod = document.Root();
}

bool OptedOut(const JsonView& pod) {
  return pod["metadata"]["labels"][kLabelInject].String() == "false";
}

bool OptedIn(const JsonView& pod) {
  return pod["metadata"]["labels"][kLabelInject].String() == "true";
}

std::string ConfigHash(const OffloadSpec& spec, Mode mode, const std::string& container,
                       const json& tiers_env, const std::string& agent_image) {
  // The text of the object {agentImage (agent mode only), container, mode, spec, tiers}, keys
  // sorted as a JSON object's dump writes them (earlier releases hashed that dump), written
  // directly: built as a DOM, the spec and the tiers were copied into it first.
  std::string canonical = "{";
  if (mode == Mode::kAgent) {
    canonical += "\"agentImage\":";
    AppendJsonString(canonical, agent_image);
    canonical += ',';
  }
  canonical += "\"container\":";
  AppendJsonString(canonical, container);
  canonical += ",\"mode\":";
  AppendJsonString(canonical, ModeName(mode));
  canonical += ",\"spec\":";
  AppendJson(canonical, spec.Canonical());
  canonical += ",\"tiers\":";
  AppendJson(canonical, tiers_env);
  canonical += '}';
  return Sha256Hex(canonical, 16);
}

std::string JoinDenials(const std::vector<std::string>& denials) {
  if (denials.size() == 1) return denials.front();
  std::string out = std::to_string(denials.size()) + " problems:";
  for (size_t i = 0; i < denials.size(); ++i) {
    out += (i == 0 ? " (" : "; (") + std::to_string(i + 1) + ") " + denials[i];
  }
  return out;
}

int TargetContainer(const JsonView& pod, std::string* error) {
  const std::vector<std::string_view> containers = pod["spec"]["containers"].StringMembers("name");
  if (containers.empty()) {
    *error = "the pod has no containers";
    return -1;
  }
  const std::string_view wanted = pod["metadata"]["annotations"][kAnnotationContainer].String();
  std::string names;
  for (size_t i = 0; i < containers.size(); ++i) {
    const std::string_view name = containers[i];
    if (!wanted.empty() && name == wanted) return static_cast<int>(i);
    names += names.empty() ? "" : ", ";
    names += name;
  }
  if (!wanted.empty()) {
    *error = std::string("annotation ") + kAnnotationContainer + " names container \"" +
             std::string(wanted) + "\" but the pod's containers are [" + names + "]";
    return -1;
  }
  for (size_t i = 0; i < containers.size(); ++i) {
    if (containers[i] == "main") return static_cast<int>(i);
  }
  return 0;
}

std::string UncheckedPvcWarning(const std::string& pvc_name, Mode mode) {
  std::string text = "PVC " + pvc_name + " was not checked (webhook has no API access)";
  if (mode == Mode::kAgent) {
    text += ": the agent sizes its tier from the file system mounted there and does not share "
            "it across replicas; give the webhook the PVC (in inject's input, or API access) to "
            "use its size and access modes";
  }
  return text;
}

json TiersEnv(const OffloadSpec& spec, const std::map<std::string, PvcInfo>& pvcs) {
  json tiers = json::array();
  for (size_t i = 0; i < spec.secondary.size(); ++i) {
    const Tier& t = spec.secondary[i];
    int64_t size = t.kind == TierKind::kPvcRef ? 0 : t.size.Value();
    bool shared = false;
    if (t.kind == TierKind::kPvcRef) {
      auto it = pvcs.find(t.ref_name);
      if (it != pvcs.end()) {
        if (it->second.capacity) size = it->second.capacity->Value();
        shared = IsReadWriteMany(it->second);
      }
    }
    // capacityBytes 0 means "unknown": the agent then sizes the tier from the file system.
    // Never negative (the spec's sizes are checked, a PVC's is read only when above 0).
    const auto bytes = static_cast<uint64_t>(size);
    tiers.push_back({{"path", TierMountPath(i)},
                     {"kind", TierKindName(t.kind)},
                     {"capacityBytes", bytes - TierHeadroomBytes(bytes)},
                     {"persistent", t.kind == TierKind::kPvcRef},
                     {"shared", shared}});
  }
  return tiers;
}

json KvTransferConfig(const OffloadSpec& spec, Mode mode) {
  json extra;
  if (mode == Mode::kAgent) {
    extra = {{"spec_name", "KVOffloadAgentSpec"}, {"spec_module_path", "kvoffload.vllm"}};
  } else {
    json secondary = json::array();
    for (size_t i = 0; i < spec.secondary.size(); ++i) {
      secondary.push_back({{"type", "fs"}, {"root_dir", TierMountPath(i)}});
    }
    extra = {{"spec_name", "TieringOffloadingSpec"},
             {"cpu_bytes_to_use", spec.cpu.Value()},
             {"secondary_tiers", secondary}};
    if (!spec.eviction_policy.empty()) extra["eviction_policy"] = spec.eviction_policy;
  }
  json config = {{"kv_connector", "OffloadingConnector"},
                 {"kv_role", "kv_both"},
                 {"kv_connector_extra_config", extra}};
  // A load the agent cannot complete (a torn or corrupt block, an I/O error) is a cache
  // miss: vLLM 0.34 recomputes the request's blocks under this policy, where its default
  // ("fail") ends the request with an error. vLLM 0.32 and 0.33 accept the field and still
  // stop on a failed offloading load. vllm-native mode keeps exactly KServe's flag.
  if (mode == Mode::kAgent) config["kv_load_failure_policy"] = "recompute";
  return config;
}

// A mount path as the kubelet reads it: "/mnt/kv-cache-0/" is "/mnt/kv-cache-0".
std::string_view WithoutTrailingSlashes(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

// What the pod already has under the names and at the paths of our volumes and mounts. KServe
// renders the tiers as we do (our volume, at our path, of the tier's kind), and those are kept;
// anything else would go wrong later, and is refused here: another volume at one of our paths
// (the API server refuses two mounts at one path, or the tier writes into the user's volume),
// our volume mounted elsewhere (the tier's directory would be no mount at all), or a volume of
// our name that is not the tier's (a hostPath where an emptyDir was asked for).
void CheckRenderedMounts(const MutationInput& in, const MutationPlan& plan,
                         const std::vector<std::string_view>& volume_names,
                         const std::string& from, std::vector<std::string>* denials) {
  const std::vector<std::string_view>& names = plan.mount_names;
  const std::vector<std::string_view>& paths = plan.mount_paths;
  // `what(i)` names tier i, or the agent's library for i == npos; built only for a denial.
  auto what = [](size_t i) {
    return i == std::string::npos ? std::string("the agent's library")
                                  : "disk tier " + std::to_string(i);
  };
  auto check = [&](std::string_view volume, std::string_view path, size_t i) {
    bool ours_there = false;
    for (size_t k = 0; k < names.size(); ++k) {
      const bool at_path = WithoutTrailingSlashes(paths[k]) == path;
      ours_there = ours_there || (at_path && names[k] == volume);
      if (at_path && names[k] != volume) {
        denials->push_back("container \"" + plan.container_name + "\" mounts volume \"" +
                           std::string(names[k]) + "\" at " + std::string(paths[k]) +
                           ", where " + what(i) + " is mounted; mount it elsewhere" + from);
      }
    }
    for (size_t k = 0; k < names.size() && !ours_there; ++k) {
      if (names[k] == volume) {
        denials->push_back("container \"" + plan.container_name + "\" mounts volume \"" +
                           std::string(volume) + "\" at " + std::string(paths[k]) +
                           ", but that name is " + what(i) + "'s, mounted at " +
                           std::string(path) + ": rename the volume, or mount it at " +
                           std::string(path) + from);
        break;
      }
    }
  };
  const JsonView volumes = in.pod["spec"]["volumes"];
  for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
    const std::string volume = TierVolumeName(i);
    check(volume, TierMountPath(i), i);
    const auto at = std::find(volume_names.begin(), volume_names.end(), volume);
    if (at == volume_names.end()) continue;
    const Tier& t = in.spec.secondary[i];
    const JsonView v = volumes.At(static_cast<size_t>(at - volume_names.begin()));
    const char* want = t.kind == TierKind::kEmptyDir  ? "emptyDir"
                       : t.kind == TierKind::kPvcSpec ? "ephemeral"
                                                      : "persistentVolumeClaim";
    if (!v.Contains(want) ||
        (t.kind == TierKind::kPvcRef && StringAt(v[want], "claimName") != t.ref_name)) {
      denials->push_back("volume \"" + volume + "\" is already in the pod, but not as " +
                         what(i) + " (" + TierKindName(t.kind) +
                         (t.kind == TierKind::kPvcRef ? " of claim " + t.ref_name : "") +
                         ") would have it: rename the pod's volume" + from);
    }
  }
  if (plan.mode == Mode::kAgent) check(kAgentVolume, kAgentMountPath, std::string::npos);
}

// Whether `value`, a --kv-transfer-config value as we write it (single-quoted where a script
// evals it), is one of ours: the agent's spec or vLLM's own tiering spec.
bool IsOurFlagValue(std::string_view value) {
  // ShellQuote's quoting undone: ours beside the user's carries their text, which may hold a
  // quote ('\'' in the quoted form).
  const std::string text = value.starts_with('\'') ? ShellUnquote(value) : std::string(value);
  Result<json> flag = ParseJson(text, "--kv-transfer-config");
  if (!flag.ok()) return false;
  auto ours = [](const json& f) {
    const std::string spec = StringAt(Member(f, "kv_connector_extra_config"), "spec_name");
    return spec == "KVOffloadAgentSpec" || spec == "TieringOffloadingSpec";
  };
  if (ours(*flag)) return true;
  // Ours beside the user's P/D connector (BesideTheirs): the last of a MultiConnector's.
  const json& children = Member(Member(*flag, "kv_connector_extra_config"), "connectors");
  return StringAt(*flag, "kv_connector") == "MultiConnector" && children.is_array() &&
         !children.empty() && ours(children.back());
}

// vLLM's connectors that move KV between a prefill and a decode instance (P/D), as vLLM 0.32
// and 0.33 register them. Offloading runs beside one of these (KServe's P/D sample composes
// NixlConnector with OffloadingConnector); beside an offloading connector of the user's
// (LMCache, a store) it would keep every block twice, in pinned memory the pod was not sized
// for, so the user's is kept alone there.
constexpr std::array<std::string_view, 5> kPdConnectors = {
    "NixlConnector", "NixlPullConnector", "NixlPushConnector", "MooncakeConnector",
    "MoRIIOConnector"};

// The P/D connectors a --kv-transfer-config value runs ("NixlConnector",
// "NixlConnector+MooncakeConnector" for a MultiConnector of them); "" where it runs anything
// else, alone or in its MultiConnector.
std::string PdConnectors(const json& flag) {
  auto pd = [](const json& f) {
    const std::string name = StringAt(f, "kv_connector");
    return std::find(kPdConnectors.begin(), kPdConnectors.end(), name) != kPdConnectors.end();
  };
  if (!flag.is_object()) return "";
  if (pd(flag)) return StringAt(flag, "kv_connector");
  const json& children = Member(Member(flag, "kv_connector_extra_config"), "connectors");
  if (StringAt(flag, "kv_connector") != "MultiConnector" || !children.is_array() ||
      children.empty() || !std::all_of(children.begin(), children.end(), pd)) {
    return "";
  }
  std::string names;
  for (const json& child : children) {
    names += (names.empty() ? "" : "+") + StringAt(child, "kv_connector");
  }
  return names;
}

// `theirs`, a user's --kv-transfer-config naming P/D connectors only (PdConnectors), with
// `ours` beside it: one MultiConnector running theirs first and ours second (a request's KV
// loads from the first that has it, a prefill pod's handover; stores go to both), kv_role
// kv_both, theirs' kv_load_failure_policy or else ours. A MultiConnector of theirs gets ours
// appended (and kv_role kv_both: ours stores and loads whatever their role).
json BesideTheirs(const json& theirs, const json& ours) {
  json multi;
  if (StringAt(theirs, "kv_connector") == "MultiConnector") {
    multi = theirs;
    multi["kv_role"] = "kv_both";
  } else {
    multi = {{"kv_connector", "MultiConnector"},
             {"kv_role", "kv_both"},
             {"kv_connector_extra_config", {{"connectors", json::array({theirs})}}}};
    if (theirs.contains("kv_load_failure_policy")) {
      multi["kv_load_failure_policy"] = theirs["kv_load_failure_policy"];
    }
  }
  if (!multi.contains("kv_load_failure_policy") && ours.contains("kv_load_failure_policy")) {
    multi["kv_load_failure_policy"] = ours["kv_load_failure_policy"];
  }
  multi["kv_connector_extra_config"]["connectors"].push_back(ours);
  return multi;
}

// The connector a --kv-transfer-config value runs when it is no offloading one (a P/D pod's
// NixlConnector, LMCache): its name, or "" where it offloads (OffloadingConnector, or a
// MultiConnector with one among its connectors).
std::string OtherConnector(const json& flag) {
  const std::string name = StringAt(flag, "kv_connector");
  if (name.empty() || name == "OffloadingConnector") return "";
  if (name == "MultiConnector") {
    const json& children = Member(Member(flag, "kv_connector_extra_config"), "connectors");
    if (children.is_array()) {
      for (const json& child : children) {
        if (StringAt(child, "kv_connector") == "OffloadingConnector") return "";
      }
    }
  }
  return name;
}

// The end of the shell word that starts at `start` of `value` (quotes and backslashes kept
// together with what they quote).
size_t FlagWordEnd(const std::string& value, size_t start) {
  size_t end = start;
  for (bool quoted = false; end < value.size(); ++end) {
    const char c = value[end];
    if (c == '\'') {
      quoted = !quoted;
    } else if (c == '\\' && !quoted) {
      ++end;
    } else if ((c == ' ' || c == '\t') && !quoted) {
      break;
    }
  }
  return std::min(end, value.size());
}

// `value` (VLLM_ADDITIONAL_ARGS) without its --kv-transfer-config=VALUE word, as we append it:
// one shell word, single-quoted where the script evals it. nullopt when there is none.
std::optional<std::string> WithoutFlagWord(const std::string& value) {
  static constexpr std::string_view kWord = "--kv-transfer-config=";
  // The last such word that is ours: a flag of the user's written the same way after ours
  // (added by hand since) was taken for ours and removed.
  for (size_t start = value.rfind(kWord); start != std::string::npos;
       start = start == 0 ? std::string::npos : value.rfind(kWord, start - 1)) {
    const size_t end = FlagWordEnd(value, start);
    if (!IsOurFlagValue(std::string_view(value).substr(start + kWord.size(),
                                                       end - start - kWord.size()))) {
      continue;
    }
    std::string before = value.substr(0, start);
    std::string after = value.substr(std::min(end, value.size()));
    before.erase(before.find_last_not_of(" \t") + 1);
    after.erase(0, std::min(after.size(), after.find_first_not_of(" \t")));
    return before.empty() || after.empty() ? before + after : before + " " + after;
  }
  return std::nullopt;
}


CheckedMutation CheckMutation(const MutationInput& in) {
  CheckedMutation out;
  MutationPlan& plan = out.plan;
  std::vector<std::string>& denials = out.denials;
  const JsonView& pod = in.pod;
  const JsonView annotations = pod["metadata"]["annotations"];
  const std::string from = " (kvCacheOffloading from " + in.source.description + ")";

  // Checks that need the mode or the container are skipped when those are unknown: their
  // denial would only repeat the one already given.
  bool mode_known = true;
  plan.mode = in.options.default_mode;
  if (const std::string m = StringAt(annotations, kAnnotationMode); !m.empty()) {
    Result<Mode> parsed = ParseMode(m);
    if (parsed.ok()) {
      plan.mode = *parsed;
    } else {
      mode_known = false;
      denials.push_back(std::string("annotation ") + kAnnotationMode + ": " +
                        parsed.status().message());
    }
  }
  // The spec parser refused names no mode accepts; which mode accepts it is known only here.
  if (mode_known) {
    if (std::string e = EvictionPolicyModeError(in.spec.eviction_policy, plan.mode); !e.empty()) {
      denials.push_back("kvCacheOffloading.evictionPolicy: " + e + from);
    }
  }
  if (mode_known && plan.mode == Mode::kAgent && in.options.agent_image.empty()) {
    denials.push_back(
        "mode agent needs the webhook's --agent-image flag, which is not set; ask the platform "
        "team to set it, or annotate the pod kvoffload.io/mode=vllm-native");
  }

  std::string container_error;
  const int c_index = TargetContainer(pod, &container_error);
  if (c_index < 0) denials.push_back(container_error);

  // pvc.ref tiers: existence (denial), access mode (shared flag, RWO warning).
  for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
    const Tier& t = in.spec.secondary[i];
    if (t.kind != TierKind::kPvcRef) continue;
    auto it = in.pvcs.find(t.ref_name);
    if (it == in.pvcs.end()) {
      plan.warnings.push_back(UncheckedPvcWarning(t.ref_name, plan.mode));
      continue;
    }
    if (!it->second.exists) {
      denials.push_back(TierFieldPath(i) + ".fileSystem.pvc.ref.name: PersistentVolumeClaim \"" +
                        t.ref_name + "\" not found in namespace \"" + in.namespace_name +
                        "\"; create it first or fix the name" + from);
      continue;
    }
    if (IsReadWriteMany(it->second)) {
      plan.any_shared = true;
    } else if (in.replicas > 1) {
      plan.warnings.push_back("PVC " + t.ref_name + " is not ReadWriteMany but the workload has " +
                              std::to_string(in.replicas) +
                              " replicas (pods: a multi-node replica counts its leader and "
                              "workers)");
    }
  }
  if (c_index < 0 || !mode_known) return out;

  plan.container = static_cast<size_t>(c_index);
  const JsonView container = pod["spec"]["containers"].At(plan.container);
  plan.container_name = StringAt(container, "name");
  const std::string& c_name = plan.container_name;

  // The pinned CPU tier is charged to the container's memory cgroup.
  const JsonView limits = container["resources"]["limits"];
  const JsonView requests = container["resources"]["requests"];
  if (const std::string mem = StringAt(limits, "memory"); !mem.empty()) {
    if (Result<Quantity> limit = Quantity::Parse(mem); limit.ok() && limit->Sign() > 0) {
      if (in.spec.cpu.Compare(*limit) >= 0) {
        denials.push_back("kvCacheOffloading.cpu: " + in.spec.cpu.ToString() +
                          " does not fit in container \"" + c_name + "\"'s memory limit " +
                          limit->ToString() +
                          " (pinned CPU tier memory counts against it); raise limits.memory or "
                          "lower cpu" + from);
      } else if (static_cast<Int128>(in.spec.cpu.Value()) * 5 >
                 static_cast<Int128>(limit->Value()) * 4) {
        // cpu > 80% of the limit, compared exactly as cpu*5 > limit*4.
        plan.warnings.push_back("kvCacheOffloading.cpu " + in.spec.cpu.ToString() +
                                " is over 80% of container " + c_name + "'s memory limit " +
                                limit->ToString());
      }
    }
  }

  plan.from_spec = Derive(in, plan.mode, c_name);

  // Reinvocation and re-apply: our own status with the same hash means nothing to do; under
  // another hash, Mutate() takes our earlier parts out first.
  if (const std::string status = StringAt(annotations, kAnnotationStatus); !status.empty()) {
    Result<json> parsed = ParseJson(status, kAnnotationStatus);
    if (parsed.ok() && parsed->is_object() && !StringAt(*parsed, "configHash").empty()) {
      if (StringAt(*parsed, "configHash") == plan.from_spec->config_hash && denials.empty()) {
        plan.already_injected = true;
        plan.warnings.clear();
        return out;
      }
      plan.earlier_status = std::move(*parsed);
    }
  }

  const std::vector<std::string_view> volume_names = pod["spec"]["volumes"].StringMembers("name");
  const JsonView mounts = container["volumeMounts"];
  plan.mount_names = mounts.StringMembers("name");
  plan.mount_paths = mounts.StringMembers("mountPath");
  CheckRenderedMounts(in, plan, volume_names, from, &denials);

  // Tier volumes the pod lacks are added; the emptyDir ones among them raise the container's
  // ephemeral-storage request, which must stay within its limit.
  plan.add_agent_volume = !Contains(volume_names, kAgentVolume);
  std::optional<Quantity> ephemeral_added;
  bool sum_ok = true;
  for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
    const Tier& t = in.spec.secondary[i];
    const bool add = !Contains(volume_names, TierVolumeName(i));
    plan.add_tier_volume.push_back(add);
    if (!add || t.kind != TierKind::kEmptyDir || !sum_ok) continue;
    Result<Quantity> sum =
        ephemeral_added ? ephemeral_added->Add(t.size) : Result<Quantity>(t.size);
    if (!sum.ok()) {
      denials.push_back(TierFieldPath(i) + ": " + sum.status().message() + from);
      sum_ok = false;
      continue;
    }
    ephemeral_added = *sum;
  }
  if (ephemeral_added && sum_ok) {
    Quantity request;
    bool request_ok = true;
    // A Pod without a request has its limit for one: the API server sets it before any
    // admission webhook sees the pod. A template or an offline manifest has not been through
    // that yet, and taken as no request, inject and the apply-time check passed what the
    // webhook then denied at every pod of the workload.
    std::string cur = StringAt(requests, "ephemeral-storage");
    const bool limit_as_request = cur.empty();
    if (limit_as_request) cur = StringAt(limits, "ephemeral-storage");
    if (!cur.empty()) {
      Result<Quantity> parsed = Quantity::Parse(cur);
      if (parsed.ok()) {
        request = *parsed;
      } else {
        request_ok = false;
        denials.push_back("container \"" + c_name + "\": resources." +
                          (limit_as_request ? "limits" : "requests") + ".ephemeral-storage \"" +
                          cur + "\" is not a valid quantity");
      }
    }
    if (request_ok) {
      Result<Quantity> total = request.Add(*ephemeral_added);
      if (!total.ok()) {
        denials.push_back("container \"" + c_name + "\": " + total.status().message());
      } else if (const std::string lim = StringAt(limits, "ephemeral-storage"); !lim.empty()) {
        Result<Quantity> limit = Quantity::Parse(lim);
        if (limit.ok() && limit->Compare(*total) < 0) {
          denials.push_back("container \"" + c_name + "\": ephemeral-storage limit " +
                            limit->ToString() + " is below the request " + total->ToString() +
                            " after adding " + ephemeral_added->ToString() +
                            " of emptyDir tiers" +
                            (limit_as_request
                                 ? " (without a request, a pod's request is its limit); set "
                                   "resources.requests.ephemeral-storage to what the container "
                                   "itself needs, raise the limit or shrink the emptyDir tiers"
                                 : "; raise the limit or shrink the emptyDir tiers") +
                            from);
        } else {
          plan.ephemeral_request = *total;
        }
      } else {
        plan.ephemeral_request = *total;
      }
    }
  }
  return out;
}

std::string BuildPatch(const MutationInput& in, const MutationPlan& plan,
                       std::vector<std::string>* warnings) {
  const JsonView& pod = in.pod;
  const JsonView annotations = pod["metadata"]["annotations"];
  const JsonView labels = pod["metadata"]["labels"];
  const Mode mode = plan.mode;
  const size_t c_index = plan.container;
  const JsonView container = pod["spec"]["containers"].At(c_index);
  const std::string& c_name = plan.container_name;
  const std::string c_path = "/spec/containers/" + std::to_string(c_index);
  const std::string& hash = plan.from_spec->config_hash;
  const bool any_shared = plan.any_shared;

  Patch patch;
  const JsonView volumes = pod["spec"]["volumes"];
  const JsonView mounts = container["volumeMounts"];
  ArrayAppend add_volumes(volumes, "/spec/volumes");
  ArrayAppend add_mounts(mounts, c_path + "/volumeMounts");
  // Each read once, by CheckMutation: the tiers and the agent look for several entries in them.
  const std::vector<std::string_view>& mount_names = plan.mount_names;
  const std::vector<std::string_view>& mount_paths = plan.mount_paths;

  // Tier volumes and mounts; only what is missing (KServe may have rendered some already).
  std::vector<std::string> tier_paths;
  for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
    tier_paths.push_back(TierMountPath(i));
    if (plan.add_tier_volume[i]) add_volumes.Borrow(plan.from_spec->tier_volumes[i]);
    if (!Contains(mount_paths, tier_paths.back()) && !Contains(mount_names, TierVolumeName(i))) {
      add_mounts.Borrow(plan.from_spec->tier_mounts[i]);
    }
  }

  if (plan.ephemeral_request) {
    const std::string index = std::to_string(c_index);
    patch.SetMember(pod, {"spec", "containers", index, "resources", "requests"},
                    "ephemeral-storage", Quoted(plan.ephemeral_request->ToString()));
  }

  // Agent mode: the install step and its volume.
  if (mode == Mode::kAgent) {
    static const std::string kVolume =
        DumpJson({{"name", kAgentVolume}, {"emptyDir", json::object()}});
    static const std::string kMount = DumpJson(
        {{"name", kAgentVolume}, {"mountPath", kAgentMountPath}, {"readOnly", true}});
    if (plan.add_agent_volume) add_volumes.Borrow(kVolume);
    if (!Contains(mount_names, kAgentVolume)) add_mounts.Borrow(kMount);
    const JsonView init = pod["spec"]["initContainers"];
    if (!Contains(init.StringMembers("name"), kAgentInitContainer)) {
      ArrayAppend add_init(init, "/spec/initContainers");
      add_init.Push(AgentInitContainer(in.options.agent_image));
      add_init.Flush(&patch);
    }
  }
  add_volumes.Flush(&patch);
  add_mounts.Flush(&patch);

  // Environment: ours replaced in place, never duplicated; the user's left alone. Of a repeated
  // name, the last entry is read and replaced: it is the one the container gets.
  const JsonView env = container["env"];
  // The names this admission sets or reads.
  std::vector<std::string_view> env_wanted = {"PYTHONHASHSEED", "KVOFFLOAD_LIBRARY",
                                              "PYTHONPATH", "VLLM_ADDITIONAL_ARGS",
                                              kWorkerShutdownEnv};
  for (const FromSpec::Env& e : plan.from_spec->env) env_wanted.push_back(e.name);
  const EnvPositions env_at(env.StringMembers("name"), std::move(env_wanted));
  ArrayAppend add_env(env, c_path + "/env");
  // `entry_json`: the entry as JSON text, when the workload's FromSpec has it already.
  auto set_env = [&](const std::string& name, const std::string& value,
                     const std::string* entry_json = nullptr) {
    const std::optional<size_t> at = env_at.Of(name);
    if (at && IsEnvEntry(env.At(*at), name, value)) return;
    if (at) {
      patch.Replace(c_path + "/env/" + std::to_string(*at),
                    entry_json != nullptr ? *entry_json : EnvEntry(name, value));
    } else if (entry_json != nullptr) {
      add_env.Borrow(*entry_json);
    } else {
      add_env.Push(EnvEntry(name, value));
    }
  };
  for (const FromSpec::Env& e : plan.from_spec->env) set_env(e.name, e.value, &e.entry);
  // Hash-keyed sharing across replicas needs the same Python hash seed everywhere.
  if (any_shared && !env_at.Of("PYTHONHASHSEED")) set_env("PYTHONHASHSEED", "0");
  if (mode == Mode::kAgent) {
    set_env("KVOFFLOAD_LIBRARY", kAgentLibrary);
    if (!env_at.Of(kWorkerShutdownEnv)) set_env(kWorkerShutdownEnv, kAgentWorkerShutdownSeconds);
    const std::optional<size_t> at = env_at.Of("PYTHONPATH");
    const JsonView entry = at ? env.At(*at) : JsonView();
    if (!at) {
      set_env("PYTHONPATH", kAgentPythonPath);
    } else if (entry["valueFrom"].IsNull()) {
      const std::string cur = StringAt(entry, "value");
      const std::string prefix = std::string(kAgentPythonPath);
      if (cur != prefix && cur.rfind(prefix + ":", 0) != 0) {
        set_env("PYTHONPATH", cur.empty() ? prefix : prefix + ":" + cur);
      }
    } else {
      warnings->push_back("PYTHONPATH of container " + c_name +
                             " uses valueFrom; add /opt/kvoffload/python to it yourself");
    }
  }

  // The vLLM flag, when the container runs vLLM: exactly one --kv-transfer-config must reach
  // vLLM, through whatever launch form the container uses (webhook/launch.h).
  const bool runs_vllm = KServePodKind(labels) == KServePod::kWorkload ||
                         StringAt(annotations, kAnnotationVllm) == "true";
  // For the status annotation: how the flag reaches vLLM, and why ours does not where it does not.
  std::string vllm_flag;
  std::string vllm_flag_reason = runs_vllm ? "" : kFlagReasonNotVllm;
  std::string vllm_flag_beside;  // the user's P/D connector(s) ours runs beside
  if (runs_vllm) {
    const std::string& ours = plan.from_spec->transfer_config;
    const std::optional<size_t> additional = env_at.Of("VLLM_ADDITIONAL_ARGS");
    const LaunchPlan launch =
        PlanLaunch(container, additional ? env.At(*additional) : JsonView());
    const bool env_route = launch.route == FlagRoute::kAdditionalArgsEnv ||
                           launch.route == FlagRoute::kAdditionalArgsEnvForEval;
    Result<json> theirs = launch.has_user_flag
                              ? ParseJson(launch.user_flag_value, "--kv-transfer-config")
                              : Result<json>(json());
    // A P/D connector of the user's gets ours beside it, in one MultiConnector that follows
    // theirs in vLLM's argv (the later flag wins): in args after theirs there, or in
    // VLLM_ADDITIONAL_ARGS after theirs there.
    std::string beside_names;  // theirs, where ours goes beside them
    FlagRoute beside_route = FlagRoute::kUnreachable;
    // Not beside a flag given key by key: vLLM lays those keys over any whole flag, so ours
    // would come out as theirs again. Nor where the user passes several: vLLM takes the last,
    // which need not be the one read, nor come before ours.
    if (launch.has_user_flag && theirs.ok() && !launch.user_flag_dotted &&
        launch.user_flags == 1) {
      if (launch.user_flag_where == "args" &&
          (launch.route == FlagRoute::kArgs || launch.route == FlagRoute::kArgsForEval)) {
        beside_route = launch.route;
      } else if (launch.user_flag_where == "VLLM_ADDITIONAL_ARGS") {
        beside_route = launch.additional_args_route;
      }
      if (beside_route != FlagRoute::kUnreachable) beside_names = PdConnectors(*theirs);
    }
    // Ours onto vLLM's command line along `route` (`arg` the flag as the route passes it,
    // `arg_json` that as a JSON string), with the agent's shutdown timeout after it.
    auto add_flag = [&](FlagRoute route, std::string_view arg, std::string_view arg_json) {
      // What follows our flag: the agent's write-back needs vLLM to wait for it on SIGTERM.
      std::string shutdown_timeout;
      if (mode == Mode::kAgent && !launch.has_shutdown_timeout) {
        shutdown_timeout = "--shutdown-timeout=" + std::to_string(kAgentShutdownTimeoutSeconds);
        const std::optional<int64_t> grace = pod["spec"]["terminationGracePeriodSeconds"].Int();
        if (grace && *grace < kAgentShutdownTimeoutSeconds + 5) {
          warnings->push_back("terminationGracePeriodSeconds " + std::to_string(*grace) +
                                 " ends vLLM before the agent writes back; use 25 or more");
        }
      }
      if (route == FlagRoute::kAdditionalArgsEnv ||
          route == FlagRoute::kAdditionalArgsEnvForEval) {
        std::string value =
            additional ? StringAt(env.At(*additional), "value") : "";
        if (!value.empty()) value += ' ';
        value += arg;
        if (!shutdown_timeout.empty()) value += ' ' + shutdown_timeout;
        set_env("VLLM_ADDITIONAL_ARGS", value);
        vllm_flag = "VLLM_ADDITIONAL_ARGS";
      } else {
        ArrayAppend add_args(container["args"], c_path + "/args");
        if (launch.needs_arg0) add_args.Push(Quoted("--"));
        add_args.Borrow(arg_json);
        if (!shutdown_timeout.empty()) add_args.Push(Quoted(shutdown_timeout));
        add_args.Flush(&patch);
        vllm_flag = "args";
      }
    };
    if (!beside_names.empty()) {
      const std::string arg =
          FlagArgument(beside_route, DumpJson(BesideTheirs(*theirs, json::parse(ours))));
      add_flag(beside_route, arg, Quoted(arg));
      vllm_flag_beside = beside_names;
      warnings->push_back("container " + c_name + " passes its own --kv-transfer-config (" +
                          beside_names + ") in " + launch.user_flag_where +
                          "; ours follows it as one MultiConnector with " + beside_names +
                          " first, which vLLM takes (the later flag wins)");
    } else if (launch.has_user_flag) {
      if (!theirs.ok() && !launch.user_flag_expanded) {
        warnings->push_back("container " + c_name + ": its own --kv-transfer-config in " +
                               launch.user_flag_where + " reaches vLLM as invalid JSON; quote it");
        vllm_flag = "user";
        vllm_flag_reason = kFlagReasonUserFlagInvalid;
      } else if (!theirs.ok() || DumpJson(*theirs) != ours) {
        std::string warning = "container " + c_name + " already passes --kv-transfer-config in " +
                              launch.user_flag_where + "; kept it instead of ours";
        if (const std::string other = theirs.ok() ? OtherConnector(*theirs) : ""; !other.empty()) {
          if (!PdConnectors(*theirs).empty()) {
            // A P/D connector where ours cannot be placed after it (in the script itself).
            warning += ", so vLLM runs " + other +
                       " and no offloading: to run both, pass one MultiConnector with yours "
                       "first and ours second (docs/deploy.md, \"Beside another connector\")";
          } else {
            warning += ", so vLLM runs " + other + " and not kv-offload's tiers";
          }
        }
        warnings->push_back(std::move(warning));
        vllm_flag = "user";
        vllm_flag_reason = kFlagReasonUserFlag;
      } else {
        vllm_flag = env_route ? "VLLM_ADDITIONAL_ARGS" : "args";  // ours, from an earlier admission
      }
    } else if (launch.route == FlagRoute::kUnreachable) {
      warnings->push_back("container " + c_name + ": its script " +
                          (launch.unreachable_why.empty()
                               ? "passes vLLM no args; add \"$@\" to its vllm command"
                               : launch.unreachable_why) +
                          " or pass --kv-transfer-config yourself");
      vllm_flag = "not-injected";
      vllm_flag_reason = kFlagReasonLaunchDropsArgs;
    } else {
      if (launch.additional_args_unseen) {
        warnings->push_back("container " + c_name +
                            ": VLLM_ADDITIONAL_ARGS comes through valueFrom or envFrom, which "
                            "the webhook cannot read; a --kv-transfer-config there reaches vLLM "
                            "before ours, and ours wins");
      }
      const bool evals = RouteEvals(launch.route);
      const FromSpec& derived = *plan.from_spec;
      add_flag(launch.route, evals ? derived.flag_argument_for_eval : derived.flag_argument,
               evals ? derived.flag_argument_for_eval_json : derived.flag_argument_json);
    }
  }
  add_env.Flush(&patch);

  // vLLM's own fs tier writes until the disk is full; an emptyDir's sizeLimit is enforced by
  // evicting the pod. Only agent mode keeps a tier under its size. And vLLM names a tier's
  // files by the model's name, which KServe makes /mnt/models for every model: a PVC that
  // outlives the pod then serves one model's KV to the next (agent mode scopes by weights).
  if (mode == Mode::kVllmNative) {
    for (size_t i = 0; i < in.spec.secondary.size(); ++i) {
      const Tier& tier = in.spec.secondary[i];
      if (tier.kind == TierKind::kEmptyDir) {
        warnings->push_back("secondary[" + std::to_string(i) +
                            "] emptyDir: vllm-native never bounds it, so the kubelet evicts the "
                            "pod past " + tier.size.ToString() + "; agent mode enforces it");
      } else if (tier.kind == TierKind::kPvcRef) {
        warnings->push_back("secondary[" + std::to_string(i) + "] pvc.ref " + tier.ref_name +
                            ": vllm-native names its files by the model's path (/mnt/models in "
                            "KServe's pods), not its weights, so after a model change this PVC "
                            "serves the old model's KV; give each model its own pvc.ref.path, "
                            "or use agent mode, which scopes by the weights");
      }
    }
  }

  // The status annotation's JSON, keys in the order dump() writes them (earlier releases did).
  std::string status = "{\"configHash\":";
  AppendJsonString(status, hash);
  status += ",\"mode\":";
  AppendJsonString(status, ModeName(mode));
  status += ",\"source\":";
  AppendJsonString(status, in.source.description);
  status += ",\"tiers\":[";
  for (size_t i = 0; i < tier_paths.size(); ++i) {
    if (i > 0) status += ',';
    AppendJsonString(status, tier_paths[i]);
  }
  status += ']';
  if (!vllm_flag.empty()) {
    status += ",\"vllmFlag\":";
    AppendJsonString(status, vllm_flag);
  }
  if (!vllm_flag_beside.empty()) {
    status += ",\"vllmFlagBeside\":";
    AppendJsonString(status, vllm_flag_beside);
  }
  status += vllm_flag_reason.empty() ? ",\"vllmFlagInjected\":true" : ",\"vllmFlagInjected\":false";
  if (!vllm_flag_reason.empty()) {
    status += ",\"vllmFlagReason\":";
    AppendJsonString(status, vllm_flag_reason);
  }
  status += '}';
  patch.SetMember(pod, {"metadata", "annotations"}, kAnnotationStatus, Quoted(status));
  return patch.Take();
}

namespace {

// Erases the items of the array `obj[key]` that `drop` picks; the key goes when none is left.
template <typename Drop>
void EraseItems(json& obj, const char* key, Drop drop) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_array()) return;
  json& items = obj[key];
  items.erase(std::remove_if(items.begin(), items.end(), drop), items.end());
  if (items.empty()) obj.erase(key);
}

// `pod` without what an earlier injection of ours added, as its status annotation `old`
// describes it (its mode, its tiers, where its flag went): the status itself, tier volumes 0 to
// n-1 and, after agent mode, the agent volume, their mounts, the install step, the env we set,
// our PYTHONPATH entry, the ephemeral-storage the emptyDir tiers raised on the target
// container, our --kv-transfer-config (in whichever container holds it: the target may have
// changed) and the --shutdown-timeout we appended right after it. Anything of the user's under
// other names, or past what the status names, stays.
json WithoutOurEarlierParts(json pod, const json& old) {
  json& annotations = pod["metadata"]["annotations"];
  annotations.erase(kAnnotationStatus);
  if (annotations.empty()) pod["metadata"].erase("annotations");
  std::string target_error;
  const int target = TargetContainer(JsonDocument::Of(pod).Root(), &target_error);
  const bool agent = StringAt(old, "mode") == "agent";
  // A status edited by hand may hold anything here: json::value() threw on a non-boolean, and
  // the admission answered 500.
  const auto injected = old.find("vllmFlagInjected");
  const bool flag_ours = injected != old.end() && injected->is_boolean() && injected->get<bool>();
  const std::string flag_where = StringAt(old, "vllmFlag");
  const size_t tiers = old.contains("tiers") && old["tiers"].is_array() ? old["tiers"].size() : 0;
  auto ours = [&](const json& item) {
    const std::string name = StringAt(item, "name");
    if (agent && name == kAgentVolume) return true;
    for (size_t i = 0; i < tiers; ++i) {
      if (name == TierVolumeName(i)) return true;
    }
    return false;
  };
  static const std::set<std::string> kOurEnv = {"KVOFFLOAD_CPU_BYTES", "KVOFFLOAD_EVICTION_POLICY",
                                                "KVOFFLOAD_TIERS", "KVOFFLOAD_CONFIG_HASH",
                                                "KVOFFLOAD_LIBRARY"};
  const std::string shutdown =
      "--shutdown-timeout=" + std::to_string(kAgentShutdownTimeoutSeconds);
  json& spec = pod["spec"];
  // What the tiers' emptyDirs added to the request: their sizeLimits.
  Quantity added;
  if (spec.contains("volumes") && spec["volumes"].is_array()) {
    for (const json& v : spec["volumes"]) {
      if (!ours(v) || !v.contains("emptyDir")) continue;
      Result<Quantity> size = Quantity::Parse(StringAt(v["emptyDir"], "sizeLimit"));
      if (size.ok()) {
        if (Result<Quantity> sum = added.Add(*size); sum.ok()) added = *sum;
      }
    }
  }
  EraseItems(spec, "volumes", ours);
  if (agent) {
    EraseItems(spec, "initContainers",
               [](const json& c) { return StringAt(c, "name") == kAgentInitContainer; });
  }
  if (!spec.contains("containers") || !spec["containers"].is_array()) return pod;
  for (size_t index = 0; index < spec["containers"].size(); ++index) {
    json& c = spec["containers"][index];
    if (!c.is_object()) continue;
    if (flag_ours && flag_where == "args" && c.contains("args") && c["args"].is_array()) {
      json& args = c["args"];
      for (size_t i = args.size(); i-- > 0;) {
        const std::string a = args[i].is_string() ? args[i].get<std::string>() : "";
        if (!a.starts_with("--kv-transfer-config=") ||
            !IsOurFlagValue(std::string_view(a).substr(21))) {
          continue;
        }
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
        if (agent && i < args.size() && args[i] == shutdown) {
          args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      }
      if (args.empty()) c.erase("args");
    }
    EraseItems(c, "volumeMounts", ours);
    // A PYTHONPATH that is only ours goes: a user's own empty one, which cannot be told from
    // none, means what no PYTHONPATH means. So does the worker shutdown timeout at our value
    // (the user's own at that value is told from ours no more than such a PYTHONPATH).
    EraseItems(c, "env", [agent](const json& e) {
      const std::string name = StringAt(e, "name");
      return kOurEnv.contains(name) ||
             (agent && name == "PYTHONPATH" && StringAt(e, "value") == kAgentPythonPath) ||
             (agent && name == kWorkerShutdownEnv &&
              StringAt(e, "value") == kAgentWorkerShutdownSeconds && !e.contains("valueFrom"));
    });
    json no_env = json::array();
    for (json& e : c.contains("env") && c["env"].is_array() ? c["env"] : no_env) {
      if (!e.is_object() || !e.contains("value") || !e["value"].is_string()) continue;
      const std::string name = StringAt(e, "name");
      std::string value = e["value"].get<std::string>();
      if (agent && name == "PYTHONPATH" &&
                 value.starts_with(std::string(kAgentPythonPath) + ":")) {
        e["value"] = value.substr(std::string(kAgentPythonPath).size() + 1);
      } else if (name == "VLLM_ADDITIONAL_ARGS" && flag_ours &&
                 flag_where == "VLLM_ADDITIONAL_ARGS") {
        if (std::optional<std::string> without = WithoutFlagWord(value)) {
          value = *without;
          // Our shutdown timeout follows our flag: it is now at the end.
          if (agent && value.ends_with(shutdown)) {
            value.resize(value.size() - shutdown.size());
            while (!value.empty() && value.back() == ' ') value.pop_back();
          }
          e["value"] = value;
        }
      }
    }
    if (static_cast<int>(index) != target || added.IsZero()) continue;
    json& requests = c["resources"]["requests"];
    const std::string cur = StringAt(requests, "ephemeral-storage");
    if (!cur.empty()) {
      Result<Quantity> request = Quantity::Parse(cur);
      if (request.ok() && request->Compare(added) >= 0) {
        Result<Quantity> left =
            request->Add(Quantity::FromInt(-added.Value(), request->format()));
        if (left.ok() && left->IsZero()) {
          requests.erase("ephemeral-storage");
        } else if (left.ok()) {
          requests["ephemeral-storage"] = left->ToString();
        }
      }
    }
    if (requests.empty()) c["resources"].erase("requests");
    if (c["resources"].empty()) c.erase("resources");
  }
  return pod;
}

// A patch from `before` to `after`, which differ only where a mutation writes: the
// annotations, the volumes, the init containers and each container, each replaced whole where
// it changed (added or removed where only one side has it).
json ReplaceWhereChanged(const json& before, const json& after) {
  json ops = json::array();
  auto at = [](const json& doc, const json::json_pointer& p) {
    return doc.contains(p) ? doc[p] : json();
  };
  auto compare = [&](const std::string& path) {
    const json::json_pointer p(path);
    const json old_value = at(before, p);
    const json new_value = at(after, p);
    if (old_value == new_value) return;
    if (new_value.is_null()) {
      ops.push_back({{"op", "remove"}, {"path", path}});
    } else {
      ops.push_back({{"op", old_value.is_null() ? "add" : "replace"}, {"path", path},
                     {"value", new_value}});
    }
  };
  compare("/metadata/annotations");
  compare("/spec/volumes");
  compare("/spec/initContainers");
  const json containers = at(after, json::json_pointer("/spec/containers"));
  for (size_t i = 0; containers.is_array() && i < containers.size(); ++i) {
    compare("/spec/containers/" + std::to_string(i));
  }
  return ops;
}

Mutation Finish(const MutationInput& in, CheckedMutation checked) {
  Mutation out;
  if (!checked.denials.empty()) {
    out.allowed = false;
    out.denial = JoinDenials(checked.denials);
    out.denials = std::move(checked.denials);
    return out;
  }
  if (checked.plan.already_injected) return out;
  out.warnings = std::move(checked.plan.warnings);
  out.patch = BuildPatch(in, checked.plan, &out.warnings);
  return out;
}

}  // namespace

Mutation Mutate(const MutationInput& in) {
  CheckedMutation checked = CheckMutation(in);
  if (!checked.plan.earlier_status) return Finish(in, std::move(checked));
  // Injected before under another spec, mode or agent image (a GitOps repository re-running
  // inject over its output, a template injected offline whose service changed since): our
  // earlier parts come out first, so that the pod ends as a fresh injection leaves it. Kept,
  // they held the old tiers' sizes (the agent filled the new capacity past the old sizeLimit,
  // and the kubelet evicted the pod), a removed tier's volume, or the agent after a switch to
  // vllm-native. The patch is the difference between the pod and that result.
  const json original = in.pod.ToJson();
  const json stripped = WithoutOurEarlierParts(original, *checked.plan.earlier_status);
  Resolution resolution;
  resolution.spec = in.spec;
  resolution.source = in.source;
  resolution.replicas = in.replicas;
  resolution.pvcs = in.pvcs;
  const MutationInput again(stripped, in.namespace_name, std::move(resolution), in.options,
                            in.replicas);
  Mutation m = Finish(again, CheckMutation(again));
  if (!m.allowed || m.patch.empty()) return m;
  m.patch = DumpJson(ReplaceWhereChanged(original, stripped.patch(json::parse(m.patch))));
  return m;
}

}  // namespace kvoffload::webhook
