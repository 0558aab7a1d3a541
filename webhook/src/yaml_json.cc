// YAML <-> JSON for inject: yaml-cpp parses and emits; this file only maps types.
#include <simdjson.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
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

const std::regex kInt(R"([-+]?[0-9]+)");
const std::regex kHex(R"(0x[0-9a-fA-F]+)");
const std::regex kOct(R"(0o[0-7]+)");
const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");

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

bool IsNull(const std::string& s) { return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL"; }

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
        if (!IsMergeKey(kv.first)) own.insert(kv.first.as<std::string>());
      }
      ojson obj = ojson::object();
      for (const auto& kv : node) {
        if (!IsMergeKey(kv.first)) {
          Result<ojson> v = Convert(kv.second, depth + 1, budget);
          if (!v.ok()) return v;
          obj[kv.first.as<std::string>()] = std::move(*v);
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
  const std::string& s = node.Scalar();
  const std::string& tag = node.Tag();
  // "!" marks a quoted scalar; an explicit !!str likewise. Only plain scalars are typed.
  if (tag == "!" || tag == "tag:yaml.org,2002:str") return ojson(s);
  if (IsNull(s)) return ojson();
  if (s == "true" || s == "True" || s == "TRUE") return ojson(true);
  if (s == "false" || s == "False" || s == "FALSE") return ojson(false);
  try {
    if (std::regex_match(s, kInt)) return ojson(std::stoll(s));
    if (std::regex_match(s, kHex)) return ojson(std::stoll(s.substr(2), nullptr, 16));
    if (std::regex_match(s, kOct)) return ojson(std::stoll(s.substr(2), nullptr, 8));
    if (std::regex_match(s, kFloat)) return ojson(std::stod(s));
  } catch (const std::out_of_range&) {
    return ojson(s);  // too large for a number: keep the text
  }
  return ojson(s);
}

// True when a plain scalar `s` would not read back as the string `s` (in YAML 1.2, or in the
// YAML 1.1 that Go's yaml libraries speak: yes/no/on/off are booleans there).
bool NeedsQuotes(const std::string& s) {
  static const char* kWords[] = {"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
                                 "on", "On", "ON", "off", "Off", "OFF", "true", "True", "TRUE",
                                 "false", "False", "FALSE", ".inf", ".nan", "-.inf", "+.inf"};
  if (IsNull(s)) return true;
  for (const char* w : kWords) {
    if (s == w) return true;
  }
  return std::regex_match(s, kInt) || std::regex_match(s, kHex) || std::regex_match(s, kOct) ||
         std::regex_match(s, kFloat);
}

// NEL, LS and PS are line breaks to YAML 1.1 (and so to kubectl's YAML reader), which
// yaml-cpp writes into a plain scalar as they are: the output would not read back. Written
// escaped in double quotes instead.
bool HasUnicodeBreak(const std::string& s) {
  return s.find("\xC2\x85") != std::string::npos || s.find("\xE2\x80\xA8") != std::string::npos ||
         s.find("\xE2\x80\xA9") != std::string::npos;
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  if (HasUnicodeBreak(s)) {
    out << YAML::DoubleQuoted << YAML::EscapeNonAscii;
  } else if (NeedsQuotes(s)) {
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
    const std::string copy(text);
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
