#include "webhook/json_util.h"

#include <simdjson.h>

#include <optional>

namespace kvoffload::webhook {

// simdjson's inline code, inlined here at -O2, trips GCC's -Wnull-dereference heuristics
// (false positives inside its tape iterators); the warning stays on for our own code elsewhere.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"

namespace {

nlohmann::json ToJson(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
      nlohmann::json obj = nlohmann::json::object();
      const simdjson::dom::object members = e.get_object().value_unsafe();
      for (simdjson::dom::key_value_pair kv : members) {
        obj.emplace(std::string(kv.key), ToJson(kv.value));
      }
      return obj;
    }
    case simdjson::dom::element_type::ARRAY: {
      nlohmann::json arr = nlohmann::json::array();
      auto& items = arr.get_ref<nlohmann::json::array_t&>();
      const simdjson::dom::array elements = e.get_array().value_unsafe();
      for (simdjson::dom::element item : elements) items.push_back(ToJson(item));
      return arr;
    }
    case simdjson::dom::element_type::STRING:
      return std::string(e.get_string().value_unsafe());
    case simdjson::dom::element_type::INT64:
      return e.get_int64().value_unsafe();
    case simdjson::dom::element_type::UINT64:
      return e.get_uint64().value_unsafe();
    case simdjson::dom::element_type::DOUBLE:
      return e.get_double().value_unsafe();
    case simdjson::dom::element_type::BOOL:
      return e.get_bool().value_unsafe();
    case simdjson::dom::element_type::NULL_VALUE:
      break;
  }
  return nullptr;
}

// Bodies up to this size reuse a per-thread parser; larger ones get a parser of their own that
// is freed after, so one 7 MiB request does not leave every worker thread holding 7 MiB.
constexpr size_t kReusedParserBytes = 64 * 1024;

// A parser that refuses nesting deeper than kMaxJsonDepth (DEPTH_ERROR). Allocation failure
// here is not fatal: parse() allocates again and reports it.
simdjson::dom::parser MakeParser(size_t capacity) {
  simdjson::dom::parser parser;
  [[maybe_unused]] const simdjson::error_code err = parser.allocate(capacity, kMaxJsonDepth);
  return parser;
}

}  // namespace

// simdjson parses (and validates UTF-8) several times faster than nlohmann's parser; the
// mutator still works on an nlohmann DOM, built from simdjson's tape.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  thread_local simdjson::dom::parser reused = MakeParser(kReusedParserBytes);
  std::optional<simdjson::dom::parser> own;
  simdjson::dom::parser* parser = &reused;
  if (text.size() > kReusedParserBytes) parser = &own.emplace(MakeParser(text.size()));
  simdjson::dom::element root;
  const simdjson::error_code err = parser->parse(text.data(), text.size()).get(root);
  if (err == simdjson::DEPTH_ERROR) {
    return Status::InvalidArgument(std::string(what) + " nests deeper than " +
                                   std::to_string(kMaxJsonDepth) + " levels");
  }
  if (err != simdjson::SUCCESS) {
    return Status::InvalidArgument(std::string(what) + " is not valid JSON (" +
                                   simdjson::error_message(err) + ")");
  }
  return ToJson(root);
}

#pragma GCC diagnostic pop

std::string EscapePointerToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string StringAt(const nlohmann::json& obj, std::string_view key) {
  return std::string(StringView(Member(obj, key)));
}

std::string_view StringView(const nlohmann::json& value) {
  return value.is_string() ? std::string_view(value.get_ref<const std::string&>())
                           : std::string_view();
}

const nlohmann::json& Member(const nlohmann::json& obj, std::string_view key) {
  static const nlohmann::json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

}  // namespace kvoffload::webhook
