// JSON helpers shared by the webhook layers: bounded parsing of untrusted text and RFC 6901
// pointer escaping. Thread-safe (no shared state).
#ifndef KVOFFLOAD_WEBHOOK_JSON_UTIL_H_
#define KVOFFLOAD_WEBHOOK_JSON_UTIL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// Nesting deeper than this is refused: Kubernetes objects stay far below it, and dump() and
// the patch code recurse, so an unbounded depth would let a request exhaust the stack.
inline constexpr int kMaxJsonDepth = 128;

// Bytes past the end of JSON text that the parser may read (simdjson's SIMDJSON_PADDING,
// checked in json_util.cc). Text followed by this many readable bytes is parsed where it lies;
// other text is first copied into a padded buffer, which for a 12 KB review was a twentieth of
// the admission's instructions.
inline constexpr size_t kJsonPadding = 64;

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

// Appends '/' and one RFC 6901 reference token ('~' -> "~0", '/' -> "~1") to a JSON pointer.
void AppendPointerToken(std::string& pointer, std::string_view token);

// Reads a string member or returns "" (absent, null or not a string).
std::string StringAt(const nlohmann::json& obj, std::string_view key);

class JsonView;
// The same for a value read through a JsonView.
std::string StringAt(const JsonView& obj, std::string_view key);

// A member of an object, or a null value when `obj` is not an object or lacks it. Never copies
// (nlohmann's value() does): the pod's env alone can be a few KB.
const nlohmann::json& Member(const nlohmann::json& obj, std::string_view key);

class JsonDocument;

// A read-only value inside a JsonDocument: an object member, an array element or the root. The
// admission reads the pod through these instead of an nlohmann DOM: building and freeing that
// tree (a KServe pod's 640 values, a hundred env entries) was half of an admission's
// instructions, and the mutator reads a few dozen of them. Copying one is copying two words.
// Valid while its document lives. An absent value (a missing member, a member of a non-object)
// reads as null, as Member() does for nlohmann values.
class JsonView {
 public:
  JsonView() = default;  // absent

  bool IsNull() const;  // absent, or JSON null
  bool IsObject() const;
  bool IsArray() const;
  bool IsString() const;
  // A whole number that fits int64_t; nullopt for anything else.
  std::optional<int64_t> Int() const;
  // The string, as a view into the document; "" when this is not a string.
  std::string_view String() const;

  // The member `key` (the first, if the object repeats it); absent unless this is an object
  // that has it.
  JsonView operator[](std::string_view key) const;
  // Whether this is an object that has `key`, even with a null value.
  bool Contains(std::string_view key) const;
  // The members of an object or the elements of an array; 0 for anything else.
  size_t Size() const;
  // The element `index` of an array; absent past its end, and for anything else. Walks the
  // array from its start: to visit each element, use Elements().
  JsonView At(size_t index) const;
  // The elements of an array, in order, in one pass; empty for anything else.
  std::vector<JsonView> Elements() const;
  // The elements of an array as strings, in order ("" for an element that is not a string);
  // empty for anything else.
  std::vector<std::string_view> Strings() const;
  // For each element of an array, in order, its member `key` when that is a string, else ""
  // (an element that is not an object, lacks `key` or holds another type there); empty for
  // anything else. One pass over the document: reading a KServe container's hundred env names
  // through a view per element and per member was a seventh of an admission's instructions.
  std::vector<std::string_view> StringMembers(std::string_view key) const;

  // This value as an nlohmann value (a copy), for the code that builds JSON from what it read.
  nlohmann::json ToJson() const;

 private:
  friend class JsonDocument;
  // A present value: `element` points at a simdjson::dom::element.
  explicit JsonView(const void* element);
  // The bytes of a simdjson::dom::element (a document pointer and a tape index; json_util.cc
  // checks the size): this header is included by every layer, and simdjson's is 1.2 MB.
  std::array<unsigned char, 16> element_{};
  bool present_ = false;
};

// JSON text parsed with simdjson into a tape it owns, read through JsonView.
class JsonDocument {
 public:
  // Parses untrusted JSON, with ParseJson's limits and error messages. `readable_after`: how
  // many bytes after `text` may be read (never written), such as a std::string's spare
  // capacity; with kJsonPadding or more the text is not copied.
  static Result<JsonDocument> Parse(std::string_view text, std::string_view what,
                                    size_t readable_after = 0);
  // The document of an nlohmann value (its text, parsed again): for callers that hold one.
  static JsonDocument Of(const nlohmann::json& value);

  JsonDocument(JsonDocument&&) noexcept;
  JsonDocument& operator=(JsonDocument&&) noexcept;
  ~JsonDocument();

  JsonView Root() const;

 private:
  struct Tape;
  JsonDocument();
  std::unique_ptr<Tape> tape_;
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_JSON_UTIL_H_
