#include "webhook/spec.h"

#include <optional>
#include <string_view>

#include "webhook/eviction_policies.h"
#include "webhook/json_util.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

constexpr std::string_view kRoot = "kvCacheOffloading";

std::string Quoted(const json& value) {
  // Render what the user wrote, short: strings as "x", anything else as compact JSON.
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return json(text).dump(-1, ' ', false, json::error_handler_t::replace);
}

class Validator {
 public:
  explicit Validator(std::vector<FieldError>* errors) : errors_(errors) {}

  void Error(std::string path, std::string message) {
    errors_->push_back({std::move(path), std::move(message)});
  }

  // Checks that `obj` has only `allowed` keys; a typo is an error, never silently ignored.
  void OnlyKnownFields(const json& obj, const std::string& path,
                       std::initializer_list<std::string_view> allowed) {
    for (const auto& [key, value] : obj.items()) {
      bool known = false;
      for (std::string_view a : allowed) known = known || key == a;
      if (!known) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        Error(path + "." + key, "unknown field; known fields here: " + list);
      }
    }
  }

  // A number of bytes that must be > 0. Returns false (and records why) when it is not.
  bool PositiveQuantity(const json& value, const std::string& path, Quantity* out) {
    if (!value.is_string() && !value.is_number()) {
      Error(path, Quoted(value) + " must be a quantity string such as \"10Gi\"");
      return false;
    }
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    Result<Quantity> q = Quantity::Parse(text);
    if (!q.ok()) {
      Error(path, Quoted(value) + " is not a valid quantity (" + q.status().message() +
                      "); write it like \"10Gi\" or \"500M\"");
      return false;
    }
    if (q->Sign() <= 0) {
      Error(path, "must be greater than 0, got " + Quoted(value));
      return false;
    }
    // A fraction of a byte is a typo ("100m", milli, for "100M"): taken as it stood, the tier
    // was one byte and an emptyDir of 1 byte got the pod evicted.
    if (!q->IsWhole()) {
      Error(path, Quoted(value) + " is not a whole number of bytes" +
                      (text.ends_with('m') ? " (m is milli, a thousandth); for megabytes write "
                                             "\"" + text.substr(0, text.size() - 1) +
                                                 "M\" or \"" + text.substr(0, text.size() - 1) +
                                                 "Mi\""
                                           : std::string()));
      return false;
    }
    *out = *q;
    return true;
  }

  void Tier(const json& entry, const std::string& path, std::vector<webhook::Tier>* tiers) {
    if (!entry.is_object() || !entry.contains("fileSystem") || entry["fileSystem"].is_null()) {
      Error(path + ".fileSystem", "only fileSystem tiers are supported; fileSystem must be set");
      return;
    }
    OnlyKnownFields(entry, path, {"fileSystem"});
    const json& fs = entry["fileSystem"];
    const std::string fs_path = path + ".fileSystem";
    if (!fs.is_object()) {
      Error(fs_path, "must be an object with emptyDir or pvc, got " + Quoted(fs));
      return;
    }
    OnlyKnownFields(fs, fs_path, {"emptyDir", "pvc"});
    const bool has_empty_dir = fs.contains("emptyDir") && !fs["emptyDir"].is_null();
    const bool has_pvc = fs.contains("pvc") && !fs["pvc"].is_null();
    if (has_empty_dir == has_pvc) {
      Error(fs_path, has_pvc ? "exactly one of emptyDir or pvc must be set; multiple are set"
                             : "exactly one of emptyDir or pvc must be set");
      return;
    }
    webhook::Tier tier;
    if (has_empty_dir) {
      tier.kind = TierKind::kEmptyDir;
      const json& ed = fs["emptyDir"];
      const std::string ed_path = fs_path + ".emptyDir";
      if (!ed.is_object()) {
        Error(ed_path, "must be an object like {\"size\": \"100Gi\"}");
        return;
      }
      OnlyKnownFields(ed, ed_path, {"size"});
      if (!ed.contains("size") || ed["size"].is_null()) {
        Error(ed_path + ".size", "size is required: the tier's capacity, e.g. \"100Gi\"");
        return;
      }
      if (!PositiveQuantity(ed["size"], ed_path + ".size", &tier.size)) return;
      tiers->push_back(std::move(tier));
      return;
    }
    const json& pvc = fs["pvc"];
    const std::string pvc_path = fs_path + ".pvc";
    if (!pvc.is_object()) {
      Error(pvc_path, "must be an object with spec or ref");
      return;
    }
    OnlyKnownFields(pvc, pvc_path, {"spec", "ref"});
    const bool has_spec = pvc.contains("spec") && !pvc["spec"].is_null();
    const bool has_ref = pvc.contains("ref") && !pvc["ref"].is_null();
    if (has_spec == has_ref) {
      Error(pvc_path, has_ref ? "exactly one of spec or ref must be set; multiple are set"
                              : "exactly one of spec or ref must be set");
      return;
    }
    if (has_spec) {
      tier.kind = TierKind::kPvcSpec;
      const json& spec = pvc["spec"];
      const std::string spec_path = pvc_path + ".spec";
      if (!spec.is_object()) {
        Error(spec_path, "must be a PersistentVolumeClaimSpec object");
        return;
      }
      const json* storage = nullptr;
      if (spec.contains("resources") && spec["resources"].is_object() &&
          spec["resources"].contains("requests") && spec["resources"]["requests"].is_object() &&
          spec["resources"]["requests"].contains("storage")) {
        storage = &spec["resources"]["requests"]["storage"];
      }
      if (storage == nullptr) {
        Error(spec_path + ".resources.requests.storage",
              "storage is required: the tier's capacity, e.g. \"200Gi\"");
        return;
      }
      if (!PositiveQuantity(*storage, spec_path + ".resources.requests.storage", &tier.size)) return;
      // The API server refuses a volume claim without one, naming the pod's volume we added
      // rather than this field.
      if (!spec.contains("accessModes") || !spec["accessModes"].is_array() ||
          spec["accessModes"].empty()) {
        Error(spec_path + ".accessModes",
              "at least one access mode is required, as for any volume claim; a tier of one "
              "pod takes [\"ReadWriteOnce\"]");
        return;
      }
      tier.pvc_spec = spec;
      tiers->push_back(std::move(tier));
      return;
    }
    tier.kind = TierKind::kPvcRef;
    const json& ref = pvc["ref"];
    const std::string ref_path = pvc_path + ".ref";
    if (!ref.is_object()) {
      Error(ref_path, "must be an object like {\"name\": \"my-pvc\", \"path\": \"kv-cache/\"}");
      return;
    }
    OnlyKnownFields(ref, ref_path, {"name", "path"});
    bool ok = true;
    if (!ref.contains("name") || ref["name"].is_null() ||
        (ref["name"].is_string() && ref["name"].get<std::string>().empty())) {
      Error(ref_path + ".name", "name is required");
      ok = false;
    } else if (!ref["name"].is_string() || !IsDns1123Subdomain(ref["name"].get<std::string>())) {
      Error(ref_path + ".name", Quoted(ref["name"]) +
                                    " is not a valid PVC name: use lowercase letters, digits, "
                                    "'-' and '.', starting and ending with a letter or digit");
      ok = false;
    } else {
      tier.ref_name = ref["name"].get<std::string>();
    }
    if (ref.contains("path") && !ref["path"].is_null()) {
      if (!ref["path"].is_string()) {
        Error(ref_path + ".path", Quoted(ref["path"]) + " must be a string");
        ok = false;
      } else if (std::string reason; !ValidSubPath(ref["path"].get<std::string>(), &reason)) {
        Error(ref_path + ".path", Quoted(ref["path"]) + " " + reason);
        ok = false;
      } else {
        tier.ref_path = ref["path"].get<std::string>();
      }
    }
    if (ok) tiers->push_back(std::move(tier));
  }

 private:
  // subPath rules (the kubelet's, plus no control characters so logs and files stay sane).
  static bool ValidSubPath(const std::string& path, std::string* reason) {
    if (!path.empty() && path[0] == '/') {
      *reason = "must be relative to the volume root: drop the leading '/'";
      return false;
    }
    for (char c : path) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        *reason = "must not contain control characters";
        return false;
      }
    }
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find('/', start);
      if (end == std::string::npos) end = path.size();
      if (path.compare(start, end - start, "..") == 0 && end - start == 2) {
        *reason = "must not contain a '..' segment: name a directory inside the volume";
        return false;
      }
      start = end + 1;
    }
    return true;
  }

  std::vector<FieldError>* errors_;
};

// A valid subPath as the directory it names: "kv", "kv/", "./kv" and "kv//" are one.
std::string NormalSubPath(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string_view segment(path.data() + start, end - start);
    if (!segment.empty() && segment != ".") {
      if (!out.empty()) out += '/';
      out += segment;
    }
    start = end + 1;
  }
  return out;
}

}  // namespace

SpecSource SpecSource::PodAnnotation() {
  return {Kind::kPodAnnotation, "pod annotation kvoffload.io/config"};
}
SpecSource SpecSource::LLMInferenceService(const std::string& ns, const std::string& name,
                                           const std::vector<std::string>& configs) {
  std::string description = "LLMInferenceService " + ns + "/" + name;
  for (size_t i = 0; i < configs.size(); ++i) {
    description += (i == 0 ? " with LLMInferenceServiceConfig " : ", ") + configs[i];
  }
  return {Kind::kLLMInferenceService, std::move(description)};
}
SpecSource SpecSource::NamespaceDefault(const std::string& ns) {
  return {Kind::kNamespaceDefault, "namespace " + ns + " annotation kvoffload.io/default-config"};
}
SpecSource SpecSource::CommandLine() { return {Kind::kCommandLine, "the --config flag"}; }

const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kEmptyDir: return "emptyDir";
    case TierKind::kPvcSpec: return "pvcSpec";
    case TierKind::kPvcRef: return "pvcRef";
  }
  return "unknown";
}

bool IsDns1123Subdomain(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (alnum(c) || c == '-') continue;
    // Each dot-separated label must itself start and end with an alphanumeric.
    if (c == '.' && alnum(name[i - 1]) && alnum(name[i + 1])) continue;
    return false;
  }
  return true;
}

bool IsDns1123Label(const std::string& name) {
  return name.size() <= 63 && name.find('.') == std::string::npos && IsDns1123Subdomain(name);
}

nlohmann::json OffloadSpec::Canonical() const {
  json tiers = json::array();
  for (const Tier& t : secondary) {
    json fs;
    switch (t.kind) {
      case TierKind::kEmptyDir: fs = {{"emptyDir", {{"size", t.size.ToString()}}}}; break;
      case TierKind::kPvcSpec: fs = {{"pvc", {{"spec", t.pvc_spec}}}}; break;
      case TierKind::kPvcRef:
        fs = {{"pvc", {{"ref", {{"name", t.ref_name}, {"path", t.ref_path}}}}}};
        break;
    }
    tiers.push_back({{"fileSystem", fs}});
  }
  json out = {{"cpu", cpu.ToString()}, {"secondary", tiers}};
  if (!eviction_policy.empty()) out["evictionPolicy"] = eviction_policy;
  return out;
}

SpecParse ParseSpec(const nlohmann::json& spec) {
  SpecParse out;
  Validator v(&out.errors);
  const std::string root(kRoot);
  if (!spec.is_object()) {
    v.Error(root, "must be an object like {\"cpu\": \"10Gi\"}, got " + Quoted(spec));
    return out;
  }
  v.OnlyKnownFields(spec, root, {"cpu", "evictionPolicy", "secondary"});

  const bool has_secondary = spec.contains("secondary") && !spec["secondary"].is_null();
  if (!spec.contains("cpu") || spec["cpu"].is_null()) {
    v.Error(root + ".cpu", has_secondary
                               ? "cpu must be set when secondary tiers are configured"
                               : "cpu is required: the CPU RAM tier size, e.g. \"10Gi\"");
  } else {
    (void)v.PositiveQuantity(spec["cpu"], root + ".cpu", &out.spec.cpu);
  }

  if (spec.contains("evictionPolicy") && !spec["evictionPolicy"].is_null()) {
    const json& p = spec["evictionPolicy"];
    // Here only names no mode accepts; whether the pod's mode accepts it is decided where the
    // mode is resolved (Mutate), since the annotation or the webhook's default sets it.
    if (p.is_string() && IsEvictionPolicyOfSomeMode(p.get<std::string>())) {
      out.spec.eviction_policy = p.get<std::string>();
    } else {
      v.Error(root + ".evictionPolicy", NoModeAcceptsEvictionPolicy(Quoted(p)));
    }
  }

  if (has_secondary) {
    const json& secondary = spec["secondary"];
    if (!secondary.is_array()) {
      v.Error(root + ".secondary", "must be a list of tiers, got " + Quoted(secondary));
    } else {
      std::vector<std::string> paths;  // of the tiers parsed so far, in out.spec.secondary
      for (size_t i = 0; i < secondary.size(); ++i) {
        const std::string path = root + ".secondary[" + std::to_string(i) + "]";
        const size_t before = out.spec.secondary.size();
        v.Tier(secondary[i], path, &out.spec.secondary);
        if (out.spec.secondary.size() == before) continue;
        paths.push_back(path);
        const Tier& t = out.spec.secondary.back();
        if (t.kind != TierKind::kPvcRef) continue;
        // Two tiers in one directory of one claim would each count the other's files against
        // its own capacity and evict the other's blocks as their own.
        for (size_t j = 0; j + 1 < out.spec.secondary.size(); ++j) {
          const Tier& other = out.spec.secondary[j];
          if (other.kind != TierKind::kPvcRef || other.ref_name != t.ref_name ||
              NormalSubPath(other.ref_path) != NormalSubPath(t.ref_path)) {
            continue;
          }
          const std::string dir = NormalSubPath(t.ref_path).empty()
                                      ? "the root of claim " + t.ref_name
                                      : Quoted(json(t.ref_path)) + " of claim " + t.ref_name;
          v.Error(path + ".fileSystem.pvc.ref.path", dir + " is " + paths[j] +
                      "'s directory too; two tiers cannot share one: give each its own path "
                      "(e.g. \"kv-cache-" + std::to_string(j) + "/\" and \"kv-cache-" +
                      std::to_string(i) + "/\")");
          break;
        }
      }
    }
  }
  return out;
}

std::string FormatSpecErrors(const std::vector<FieldError>& errors, const SpecSource& source) {
  std::string msg = "kvCacheOffloading from " + source.description + " is invalid: ";
  for (size_t i = 0; i < errors.size(); ++i) {
    if (i > 0) msg += "; ";
    msg += errors[i].path + ": " + errors[i].message;
  }
  return msg;
}

Result<OffloadSpec> ParseSpecFrom(const nlohmann::json& spec, const SpecSource& source) {
  SpecParse parsed = ParseSpec(spec);
  if (!parsed.errors.empty()) {
    return Status::InvalidArgument(FormatSpecErrors(parsed.errors, source));
  }
  return std::move(parsed.spec);
}

namespace {

Result<OffloadSpec> ParseSpecTextUncached(const std::string& text, const SpecSource& source) {
  Result<json> spec = ParseJson(text, source.description);
  if (!spec.ok()) {
    return Status::InvalidArgument(spec.status().message() +
                                   "; it must hold the kvCacheOffloading spec as JSON, e.g. "
                                   "{\"cpu\":\"10Gi\",\"evictionPolicy\":\"lru\"}");
  }
  return ParseSpecFrom(*spec, source);
}

}  // namespace

Result<OffloadSpec> ParseSpecText(const std::string& text, const SpecSource& source) {
  // The pods of one workload carry the same text from the same source, so each thread keeps
  // its last answer: parsing and checking it again was a tenth of a small pod's admission.
  struct Last {
    std::string text;
    std::string source;
    Result<OffloadSpec> answer = Status::Internal("unset");
  };
  thread_local std::optional<Last> last;
  if (!last || last->text != text || last->source != source.description) {
    last = Last{text, source.description, ParseSpecTextUncached(text, source)};
  }
  return last->answer;
}

}  // namespace kvoffload::webhook
