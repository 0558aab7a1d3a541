// YAML <-> JSON for inject: yaml-cpp parses and emits; this file only maps types.
#include <simdjson.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "webhook/inject.h"
#include "webhook/json_util.h"

namespace kvoffload::webhook {
namespace {

using ojson = nlohmann::ordered_json;

// yamlStyleFloat of Go's yaml.v2, which kubectl reads manifests with.
const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");

// strconv.ParseInt/ParseUint with base 0, as yaml.v2 calls them: an optional sign (ParseInt
// only), then 0x/0X hex, 0o/0O or a leading 0 octal, 0b/0B binary, or decimal. The value as
// JSON, or nullopt where Go would refuse it (bad digits, out of range).
std::optional<ojson> ParseGoInteger(std::string_view text) {
  bool negative = false;
  const bool signed_text = !text.empty() && (text[0] == '+' || text[0] == '-');
  if (signed_text) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  int base = 10;
  size_t prefix = 0;
  const char second = text.size() > 1 && text[0] == '0' ? text[1] : '\0';
  if (second == 'x' || second == 'X') {
    base = 16;
    prefix = 2;
  } else if (second == 'o' || second == 'O') {
    base = 8;
    prefix = 2;
  } else if (second == 'b' || second == 'B') {
    base = 2;
    prefix = 2;
  } else if (second != '\0') {
    base = 8;  // a leading 0
    prefix = 1;
  }
  text.remove_prefix(prefix);
  if (text.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), magnitude, base);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (negative) {
    if (magnitude > uint64_t{1} << 63) return std::nullopt;
    return ojson(magnitude == uint64_t{1} << 63 ? INT64_MIN : -static_cast<int64_t>(magnitude));
  }
  if (magnitude <= static_cast<uint64_t>(INT64_MAX)) return ojson(static_cast<int64_t>(magnitude));
  if (signed_text) return std::nullopt;  // ParseUint takes no sign
  return ojson(magnitude);
}

// What a plain (unquoted, untagged) scalar is to Go's yaml.v2, which kubectl reads manifests
// with (YAML 1.1): null, a boolean (y/yes/on/... too), an integer (0644 octal, 0x, 0o, 0b,
// underscores ignored), a float, or nullopt for a string. Timestamps stay strings there.
// NaN and the infinities, which JSON cannot hold and kubectl refuses, come back as NaN.
std::optional<ojson> ResolvePlain(const std::string& s) {
  static const std::set<std::string> kTrue = {"y", "Y", "yes", "Yes", "YES", "true", "True",
                                              "TRUE", "on", "On", "ON"};
  static const std::set<std::string> kFalse = {"n", "N", "no", "No", "NO", "false", "False",
                                               "FALSE", "off", "Off", "OFF"};
  static const std::set<std::string> kNotANumber = {
      ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf",
      "-.INF"};
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return ojson();
  if (kTrue.contains(s)) return ojson(true);
  if (kFalse.contains(s)) return ojson(false);
  if (kNotANumber.contains(s)) return ojson(std::numeric_limits<double>::quiet_NaN());
  const char first = s[0];
  auto as_float = [](const std::string& text) -> std::optional<ojson> {
    errno = 0;
    const double d = std::strtod(text.c_str(), nullptr);
    if (errno == ERANGE && std::isinf(d)) return std::nullopt;  // Go: out of range, a string
    return ojson(d);
  };
  if (first == '.') {
    if (std::regex_match(s, kFloat)) return as_float(s);
    return std::nullopt;
  }
  if (!(first == '+' || first == '-' || (first >= '0' && first <= '9'))) return std::nullopt;
  std::string plain = s;
  plain.erase(std::remove(plain.begin(), plain.end(), '_'), plain.end());
  if (std::optional<ojson> n = ParseGoInteger(plain)) return n;
  if (std::regex_match(plain, kFloat)) return as_float(plain);
  return std::nullopt;
}

// A mapping key as kubectl's YAML reader makes it a JSON key: a plain key that YAML 1.1 reads
// as a boolean, an integer or null is that value's text ("off:" is the key "false").
std::string KeyString(const YAML::Node& key) {
  const std::string& s = key.Scalar();
  if (key.Tag() == "!" || key.Tag() == "tag:yaml.org,2002:str") return s;
  const std::optional<ojson> typed = ResolvePlain(s);
  if (!typed || typed->is_number_float()) return s;
  return typed->is_null() ? "null" : typed->dump();
}

// Ignores every event: only the number of documents the parser reports matters.
class IgnoreEvents final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// yaml-cpp 0.7 (Debian 12) never returns from LoadAll on a flow collection followed by a comma
// ("{a: {}},", found by fuzzing): its parser reports an empty document forever without
// consuming input. Every real document takes at least one character, so more documents than
// characters means that loop; this dry run finds it before LoadAll would spin (and allocate)
// forever. Throws YAML::Exception on invalid input, as LoadAll does.
Status CheckDocumentsEnd(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  for (size_t docs = 0; parser.HandleNextDocument(ignore);) {
    if (++docs > text.size() + 1) {
      return Status::InvalidArgument(
          "input is not valid YAML: a flow collection ({...} or [...]) is followed by stray "
          "characters");
    }
  }
  return Status::Ok();
}

// A merge key (`<<: *base`, YAML 1.1's, which kubectl's YAML reader applies): a plain `<<`,
// or one tagged !!merge.
bool IsMergeKey(const YAML::Node& key) {
  return key.IsScalar() && key.Scalar() == "<<" &&
         (key.Tag() == "?" || key.Tag() == "tag:yaml.org,2002:merge");
}

// How many nodes a document may expand to. yaml-cpp shares an aliased node; converting copies
// it at every alias, so a few hundred bytes of aliases of aliases would become gigabytes (a
// "billion laughs"). Each node of a document without aliases takes at least a byte of it.
struct NodeBudget {
  size_t left;
  bool Take() { return left > 0 && left-- > 0; }
};

// U+FFFE and U+FFFF (written escaped in double quotes) are Unicode non-characters: yaml-cpp's
// writer turns them into U+FFFD, so the output would hold another value, and kubectl refuses
// them raw. Refused here with the line, where nothing has been written yet.
Status CheckCharacters(const YAML::Node& scalar) {
  if (!scalar.IsScalar()) return Status::Ok();
  const std::string& s = scalar.Scalar();
  if (s.find("\xEF\xBF\xBE") == std::string::npos && s.find("\xEF\xBF\xBF") == std::string::npos) {
    return Status::Ok();
  }
  return Status::InvalidArgument("input has U+FFFE or U+FFFF in a string (line " +
                                 std::to_string(scalar.Mark().line + 1) +
                                 "), Unicode non-characters that YAML cannot carry; remove them");
}

Result<ojson> Convert(const YAML::Node& node, int depth, NodeBudget& budget) {
  if (depth > kMaxJsonDepth) {
    return Status::InvalidArgument("document nests deeper than " + std::to_string(kMaxJsonDepth));
  }
  if (!budget.Take()) {
    return Status::InvalidArgument("input is not valid YAML: its aliases expand to more nodes "
                                   "than any manifest has (excessive aliasing)");
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return ojson();
    case YAML::NodeType::Sequence: {
      ojson arr = ojson::array();
      for (const YAML::Node& item : node) {
        Result<ojson> v = Convert(item, depth + 1, budget);
        if (!v.ok()) return v;
        arr.push_back(std::move(*v));
      }
      return arr;
    }
    case YAML::NodeType::Map: {
      // The map's own keys win over merged ones wherever they stand, and of the merged maps
      // the first that has a key gives it; merged keys take the place of their `<<`.
      std::set<std::string> own;
      for (const auto& kv : node) {
        // A key that is a mapping or a list read as "" and then "null": an unrendered Helm
        // chart's `name: {{ .Release.Name }}` became {"null": null} and was injected and
        // written out without a word. kubectl refuses such keys too.
        if (!kv.first.IsScalar() && !kv.first.IsNull()) {
          return Status::InvalidArgument(
              "input is not a Kubernetes manifest: a " +
              std::string(kv.first.IsMap() ? "mapping" : "list") + " is used as a key (line " +
              std::to_string(kv.first.Mark().line + 1) +
              "); an unquoted template such as {{ .Values.x }} reads so: render the chart "
              "first (helm template) and inject its output");
        }
        if (Status st = CheckCharacters(kv.first); !st.ok()) return st;
        if (!IsMergeKey(kv.first)) own.insert(KeyString(kv.first));
      }
      ojson obj = ojson::object();
      for (const auto& kv : node) {
        if (!IsMergeKey(kv.first)) {
          Result<ojson> v = Convert(kv.second, depth + 1, budget);
          if (!v.ok()) return v;
          obj[KeyString(kv.first)] = std::move(*v);
          continue;
        }
        std::vector<YAML::Node> sources;
        if (kv.second.IsMap()) sources.push_back(kv.second);
        for (size_t i = 0; kv.second.IsSequence() && i < kv.second.size(); ++i) {
          sources.push_back(kv.second[i]);
        }
        if (sources.empty() || !std::all_of(sources.begin(), sources.end(),
                                            [](const YAML::Node& n) { return n.IsMap(); })) {
          return Status::InvalidArgument("input is not valid YAML: a merge key (<<) must name "
                                         "a mapping or a list of mappings (line " +
                                         std::to_string(kv.first.Mark().line + 1) + ")");
        }
        for (const YAML::Node& source : sources) {
          Result<ojson> merged = Convert(source, depth + 1, budget);
          if (!merged.ok()) return merged;
          for (auto& [key, value] : merged->items()) {
            if (!own.contains(key) && !obj.contains(key)) obj[key] = std::move(value);
          }
        }
      }
      return obj;
    }
    case YAML::NodeType::Scalar:
      break;
  }
  if (Status st = CheckCharacters(node); !st.ok()) return st;
  const std::string& s = node.Scalar();
  const std::string& tag = node.Tag();
  // "!" marks a quoted scalar; an explicit !!str likewise. Only plain scalars are typed.
  if (tag == "!" || tag == "tag:yaml.org,2002:str") return ojson(s);
  std::optional<ojson> typed = ResolvePlain(s);
  if (!typed) return ojson(s);
  if (typed->is_number_float() && !std::isfinite(typed->get<double>())) {
    return Status::InvalidArgument("input has the value " + s + " (line " +
                                   std::to_string(node.Mark().line + 1) +
                                   "), which JSON cannot hold and kubectl refuses; quote it if "
                                   "it is meant as a string");
  }
  return *typed;
}

// True when a plain scalar `s` would not read back as the string `s`, in YAML 1.2 or in the
// YAML 1.1 that kubectl reads (yes/no/on/off booleans, 0644 octal, 1_000, .NaN, ...).
bool NeedsQuotes(const std::string& s) { return s == "<<" || ResolvePlain(s).has_value(); }

// What yaml-cpp writes as it is into a plain scalar but YAML does not read back from one.
enum class Escape { kNone, kControls, kNonAscii };
Escape EscapeNeeded(const std::string& s) {
  Escape need = Escape::kNone;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const auto next = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    const auto after = i + 2 < s.size() ? static_cast<unsigned char>(s[i + 2]) : 0;
    // NEL, LS and PS are line breaks to YAML 1.1 (and so to kubectl's YAML reader); DEL and
    // the byte order mark are not printable, and kubectl refuses them. (U+FFFE and U+FFFF,
    // which yaml-cpp cannot write, are refused on reading: CheckCharacters.)
    // yaml-cpp escapes these in double quotes only with EscapeNonAscii.
    if (c == 0x7f || (c == 0xC2 && next == 0x85) ||
        (c == 0xE2 && next == 0x80 && (after == 0xA8 || after == 0xA9)) ||
        (c == 0xEF && next == 0xBB && after == 0xBF)) {
      return Escape::kNonAscii;
    }
    // C0 controls but tab and LF (a CR is read back as a line break, so "a\rb" became
    // "ab"), and C1 controls: double quotes escape them.
    if ((c < 0x20 && c != '\t' && c != '\n') || (c == 0xC2 && next >= 0x80 && next <= 0x9F)) {
      need = Escape::kControls;
    }
  }
  return need;
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  const Escape escape = EscapeNeeded(s);
  if (escape == Escape::kNonAscii) {
    out << YAML::DoubleQuoted << YAML::EscapeNonAscii;
  } else if (escape == Escape::kControls || NeedsQuotes(s)) {
    out << YAML::DoubleQuoted;
  }
  out << s;
}

void Emit(YAML::Emitter& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, value] : v.items()) {
        out << YAML::Key;
        EmitString(out, key);
        out << YAML::Value;
        Emit(out, value);
      }
      out << YAML::EndMap;
      return;
    case ojson::value_t::array:
      out << YAML::BeginSeq;
      for (const ojson& item : v) Emit(out, item);
      out << YAML::EndSeq;
      return;
    case ojson::value_t::string: {
      EmitString(out, v.get_ref<const std::string&>());
      return;
    }
    case ojson::value_t::boolean:
      out << (v.get<bool>() ? "true" : "false");
      return;
    case ojson::value_t::null:
    case ojson::value_t::discarded:
      out << YAML::Null;
      return;
    default:
      out << v.dump();  // numbers print as JSON does
      return;
  }
}

}  // namespace

constexpr std::string_view kBom = "\xEF\xBB\xBF";

Result<std::vector<ojson>> ParseYamlDocuments(std::string_view text) {
  try {
    // yaml-cpp passes any bytes through into scalars, and nlohmann's dump() throws on invalid
    // UTF-8 later (found by fuzzing: inject terminated). YAML is Unicode text: refuse it here.
    if (!simdjson::validate_utf8(text.data(), text.size())) {
      return Status::InvalidArgument("input is not valid YAML: it is not UTF-8 text");
    }
    // YAML excludes C0 controls but tab, LF and CR; NULs also make yaml-cpp guess UTF-16/32
    // and decode the bytes into invalid UTF-8 (found by fuzzing).
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) {
        return Status::InvalidArgument("input is not valid YAML: control character " +
                                       std::to_string(c) + " at byte " + std::to_string(i));
      }
    }
    // A byte order mark may start any document of a stream (YAML 1.2 section 9.1.1), as it
    // does where files are concatenated and one was saved with it; yaml-cpp keeps one after the
    // first in the document's first key ("\ufeffkind"). Nowhere else can one stand unescaped.
    std::string copy(text);
    for (size_t at = copy.find(kBom); at != std::string::npos; at = copy.find(kBom, at)) {
      if (at == 0 || copy[at - 1] == '\n') {
        copy.erase(at, kBom.size());
      } else {
        at += kBom.size();
      }
    }
    if (Status s = CheckDocumentsEnd(copy); !s.ok()) return s;
    std::vector<ojson> docs;
    // A million nodes of aliases over what the text itself holds.
    NodeBudget budget{copy.size() + 1'000'000};
    for (const YAML::Node& node : YAML::LoadAll(copy)) {
      if (node.IsNull()) continue;  // empty documents between separators
      Result<ojson> doc = Convert(node, 0, budget);
      if (!doc.ok()) return doc.status();
      docs.push_back(std::move(*doc));
    }
    return docs;
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("input is not valid YAML: ") + e.what());
  }
}

std::string EmitYaml(const ojson& doc) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  out.SetMapFormat(YAML::Block);
  Emit(out, doc);
  return std::string(out.c_str()) + "\n";
}

}  // namespace kvoffload::webhook
