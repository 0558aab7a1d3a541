// JSON helpers shared by the webhook layers: bounded parsing of untrusted text and RFC 6901
// pointer escaping. Thread-safe (no shared state).
#ifndef KVOFFLOAD_WEBHOOK_JSON_UTIL_H_
#define KVOFFLOAD_WEBHOOK_JSON_UTIL_H_

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// Nesting deeper than this is refused: Kubernetes objects stay far below it, and dump() and
// the patch code recurse, so an unbounded depth would let a request exhaust the stack.
inline constexpr int kMaxJsonDepth = 128;

// Parses untrusted JSON; InvalidArgument naming `what` and the byte offset on failure.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

// Compact JSON text of `value`, byte for byte what nlohmann's dump() gives, except that a
// string which is not valid UTF-8 gets U+FFFD for its bad bytes (dump()'s `replace` handler)
// instead of an exception. The admission writes several KB of it per pod (the patch, the
// status annotation, the hashed canonical spec) and nlohmann's serializer, which decodes every
// byte of every string as UTF-8 and formats integers digit by digit, was a sixth of an
// admission's instructions; this copies runs of plain bytes and checks UTF-8 with simdjson.
std::string DumpJson(const nlohmann::json& value);
// DumpJson(value) appended to `out`.
void AppendJson(std::string& out, const nlohmann::json& value);
// The JSON string for `text` (quoted, escaped, as AppendJson writes strings) appended to `out`.
void AppendJsonString(std::string& out, std::string_view text);

// One RFC 6901 reference token: '~' -> "~0", '/' -> "~1".
std::string EscapePointerToken(std::string_view token);

// Reads a string member or returns "" (absent, null or not a string).
std::string StringAt(const nlohmann::json& obj, std::string_view key);

// A string value as a view into the JSON it lives in, or "" when it is not a string. For the
// admission's hot loops (a KServe pod's env has about a hundred entries), where a copy per
// entry showed in the profile.
std::string_view StringView(const nlohmann::json& value);

// A member of an object, or a null value when `obj` is not an object or lacks it. Never copies
// (nlohmann's value() does): the pod's env alone can be a few KB.
const nlohmann::json& Member(const nlohmann::json& obj, std::string_view key);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_JSON_UTIL_H_
