#include "webhook/json_util.h"

namespace kvoffload::webhook {

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  bool too_deep = false;
  // The callback sees every value with its depth; deep values are discarded and flagged, so
  // the parse finishes in bounded stack and we report one clear error.
  nlohmann::json::parser_callback_t limit = [&too_deep](int depth, nlohmann::json::parse_event_t,
                                                        nlohmann::json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;
  };
  try {
    nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), limit);
    if (too_deep) {
      return Status::InvalidArgument(std::string(what) + " nests deeper than " +
                                     std::to_string(kMaxJsonDepth) + " levels");
    }
    return value;
  } catch (const nlohmann::json::parse_error& e) {
    if (too_deep) {
      return Status::InvalidArgument(std::string(what) + " nests deeper than " +
                                     std::to_string(kMaxJsonDepth) + " levels");
    }
    return Status::InvalidArgument(std::string(what) + " is not valid JSON (byte " +
                                   std::to_string(e.byte) + ")");
  }
}

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
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace kvoffload::webhook
