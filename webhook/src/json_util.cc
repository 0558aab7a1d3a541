#include "webhook/json_util.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <type_traits>

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
      auto& map = obj.get_ref<nlohmann::json::object_t&>();
      const simdjson::dom::object members = e.get_object().value_unsafe();
      for (simdjson::dom::key_value_pair kv : members) {
        // Hinted at the end: Kubernetes writes most objects' keys in sorted order (an env
        // entry's name before its value), and then an insert needs no search. A repeated key
        // keeps its first value, as emplace does.
        map.emplace_hint(map.end(), std::string(kv.key), ToJson(kv.value));
      }
      return obj;
    }
    case simdjson::dom::element_type::ARRAY: {
      nlohmann::json arr = nlohmann::json::array();
      auto& items = arr.get_ref<nlohmann::json::array_t&>();
      const simdjson::dom::array elements = e.get_array().value_unsafe();
      items.reserve(elements.size());
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

// The parser for `size` bytes of text: the thread's own, or for large text one made in `own`.
simdjson::dom::parser& ParserFor(size_t size, std::optional<simdjson::dom::parser>& own) {
  thread_local simdjson::dom::parser reused = MakeParser(kReusedParserBytes);
  return size > kReusedParserBytes ? own.emplace(MakeParser(size)) : reused;
}

Status ParseError(simdjson::error_code err, std::string_view what) {
  if (err == simdjson::DEPTH_ERROR) {
    return Status::InvalidArgument(std::string(what) + " nests deeper than " +
                                   std::to_string(kMaxJsonDepth) + " levels");
  }
  return Status::InvalidArgument(std::string(what) + " is not valid JSON (" +
                                 simdjson::error_message(err) + ")");
}

// JsonView keeps a simdjson::dom::element as bytes; these two convert.
static_assert(std::is_trivially_copyable_v<simdjson::dom::element>);
static_assert(sizeof(simdjson::dom::element) == 16);

simdjson::dom::element ElementOf(const std::array<unsigned char, 16>& bytes) {
  simdjson::dom::element e;
  std::memcpy(static_cast<void*>(&e), bytes.data(), sizeof e);
  return e;
}

}  // namespace

// simdjson parses (and validates UTF-8) several times faster than nlohmann's parser; callers
// that need an nlohmann value get one built from simdjson's tape.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  std::optional<simdjson::dom::parser> own;
  simdjson::dom::element root;
  const simdjson::error_code err =
      ParserFor(text.size(), own).parse(text.data(), text.size()).get(root);
  if (err != simdjson::SUCCESS) return ParseError(err, what);
  return ToJson(root);
}

struct JsonDocument::Tape {
  simdjson::dom::document doc;
  simdjson::dom::element root;
};

JsonDocument::JsonDocument() : tape_(std::make_unique<Tape>()) {}
JsonDocument::JsonDocument(JsonDocument&&) noexcept = default;
JsonDocument& JsonDocument::operator=(JsonDocument&&) noexcept = default;
JsonDocument::~JsonDocument() = default;

static_assert(kJsonPadding == simdjson::SIMDJSON_PADDING);

Result<JsonDocument> JsonDocument::Parse(std::string_view text, std::string_view what,
                                         size_t readable_after) {
  JsonDocument out;
  std::optional<simdjson::dom::parser> own;
  simdjson::dom::parser& parser = ParserFor(text.size(), own);
  const bool copy = readable_after < kJsonPadding;
  const simdjson::error_code err =
      parser.parse_into_document(out.tape_->doc, text.data(), text.size(), copy)
          .get(out.tape_->root);
  if (err != simdjson::SUCCESS) return ParseError(err, what);
  return out;
}

JsonDocument JsonDocument::Of(const nlohmann::json& value) {
  Result<JsonDocument> doc = Parse(DumpJson(value), "value");
  // Only the depth can fail: text DumpJson wrote is valid JSON.
  if (!doc.ok()) throw std::invalid_argument("JsonDocument::Of: " + doc.status().message());
  return std::move(*doc);
}

JsonView JsonDocument::Root() const { return JsonView(&tape_->root); }

JsonView::JsonView(const void* element) : present_(true) {
  std::memcpy(element_.data(), element, element_.size());
}

bool JsonView::IsNull() const { return !present_ || ElementOf(element_).is_null(); }

bool JsonView::IsObject() const { return present_ && ElementOf(element_).is_object(); }

bool JsonView::IsArray() const { return present_ && ElementOf(element_).is_array(); }

bool JsonView::IsString() const { return present_ && ElementOf(element_).is_string(); }

std::optional<int64_t> JsonView::Int() const {
  if (!present_) return std::nullopt;
  const simdjson::dom::element e = ElementOf(element_);
  if (e.is_int64()) return e.get_int64().value_unsafe();
  return std::nullopt;
}

std::string_view JsonView::String() const {
  if (!present_) return {};
  const simdjson::dom::element e = ElementOf(element_);
  return e.is_string() ? e.get_string().value_unsafe() : std::string_view();
}

JsonView JsonView::operator[](std::string_view key) const {
  if (!IsObject()) return {};
  simdjson::dom::element member;
  if (ElementOf(element_).get_object().value_unsafe().at_key(key).get(member) !=
      simdjson::SUCCESS) {
    return {};
  }
  return JsonView(&member);
}

bool JsonView::Contains(std::string_view key) const { return (*this)[key].present_; }

size_t JsonView::Size() const {
  if (!present_) return 0;
  const simdjson::dom::element e = ElementOf(element_);
  if (e.is_array()) return e.get_array().value_unsafe().size();
  if (e.is_object()) return e.get_object().value_unsafe().size();
  return 0;
}

JsonView JsonView::At(size_t index) const {
  if (!IsArray()) return {};
  simdjson::dom::element item;
  if (ElementOf(element_).get_array().value_unsafe().at(index).get(item) != simdjson::SUCCESS) {
    return {};
  }
  return JsonView(&item);
}

std::vector<JsonView> JsonView::Elements() const {
  std::vector<JsonView> out;
  if (!IsArray()) return out;
  const simdjson::dom::array items = ElementOf(element_).get_array().value_unsafe();
  out.reserve(items.size());
  for (simdjson::dom::element item : items) out.push_back(JsonView(&item));
  return out;
}

std::vector<std::string_view> JsonView::Strings() const {
  std::vector<std::string_view> out;
  if (!IsArray()) return out;
  const simdjson::dom::array items = ElementOf(element_).get_array().value_unsafe();
  out.reserve(items.size());
  for (simdjson::dom::element item : items) {
    out.push_back(item.is_string() ? item.get_string().value_unsafe() : std::string_view());
  }
  return out;
}

std::vector<std::string_view> JsonView::StringMembers(std::string_view key) const {
  std::vector<std::string_view> out;
  if (!IsArray()) return out;
  const simdjson::dom::array items = ElementOf(element_).get_array().value_unsafe();
  out.reserve(items.size());
  for (simdjson::dom::element item : items) {
    std::string_view found;
    simdjson::dom::object members;
    if (item.get_object().get(members) == simdjson::SUCCESS) {
      // The first member named `key`, as operator[] finds it.
      for (simdjson::dom::key_value_pair member : members) {
        if (member.key != key) continue;
        if (member.value.is_string()) found = member.value.get_string().value_unsafe();
        break;
      }
    }
    out.push_back(found);
  }
  return out;
}

nlohmann::json JsonView::ToJson() const {
  return present_ ? webhook::ToJson(ElementOf(element_)) : nlohmann::json();
}

#pragma GCC diagnostic pop

namespace {

// What a byte becomes inside a JSON string: 0 for itself, kHigh for a byte of a multi-byte
// UTF-8 sequence (copied as it is, once the string is known to be valid UTF-8), else the
// letter after the backslash ('u' for \u00XX).
constexpr char kHigh = 1;
constexpr std::array<char, 256> kEscapes = [] {
  std::array<char, 256> t{};
  for (size_t c = 0; c < 0x20; ++c) t[c] = 'u';
  for (size_t c = 0x80; c < 0x100; ++c) t[c] = kHigh;
  t['\b'] = 'b';
  t['\t'] = 't';
  t['\n'] = 'n';
  t['\f'] = 'f';
  t['\r'] = 'r';
  t['"'] = '"';
  t['\\'] = '\\';
  return t;
}();

// The bytes of w that are below 0x20, '"', '\\' or 0x80 and above, as the high bit of each
// (the classic "has a zero byte" tests). Bits above the lowest may be false positives (a
// borrow); the lowest set bit always marks a byte that is one of them.
uint64_t SpecialBytes(uint64_t w) {
  constexpr uint64_t kOnes = 0x0101010101010101;
  constexpr uint64_t kHighBits = 0x8080808080808080;
  auto has_zero = [](uint64_t v) { return (v - kOnes) & ~v & kHighBits; };
  const uint64_t below_space = (w - kOnes * 0x20) & ~w;
  const uint64_t quote = has_zero(w ^ (kOnes * '"'));
  const uint64_t backslash = has_zero(w ^ (kOnes * '\\'));
  // w itself: a byte of 0x80 or above has its high bit set already.
  return (below_space | quote | backslash | w) & kHighBits;
}

}  // namespace

void AppendJsonString(std::string& out, std::string_view s) {
  const size_t start = out.size();
  // Written through a pointer into room for the worst case (every byte a 6-byte \u00XX, plus
  // the quotes), then cut to size: the values we write are often JSON themselves (the tiers'
  // env, the vLLM flag, the status annotation), a quote every few bytes, and two appends per
  // escape were half of this function's cost.
  out.resize(start + 2 + 6 * s.size());
  char* w = out.data() + start;
  *w++ = '"';
  bool ascii = true;
  const char* r = s.data();
  const char* const end = r + s.size();
  while (r < end) {
    if (end - r >= 8) {
      // Eight bytes copied as they are, then kept up to the first that needs a look: in the
      // JSON we quote (the status annotation, the vLLM flag) that is a quote every few bytes,
      // and the byte-by-byte loop this replaced cost ten instructions for each of them.
      uint64_t word = 0;
      std::memcpy(&word, r, 8);
      std::memcpy(w, r, 8);
      const uint64_t special = SpecialBytes(word);
      if (special == 0) {
        w += 8;
        r += 8;
        continue;
      }
      if constexpr (std::endian::native == std::endian::little) {
        const auto plain = static_cast<size_t>(std::countr_zero(special) / 8);
        w += plain;
        r += plain;
      }
    }
    const auto c = static_cast<unsigned char>(*r++);
    const char e = kEscapes[c];
    if (e == 0 || e == kHigh) {
      ascii = ascii && e == 0;
      *w++ = static_cast<char>(c);
      continue;
    }
    *w++ = '\\';
    *w++ = e;
    if (e == 'u') {
      constexpr char kHex[] = "0123456789abcdef";
      *w++ = '0';
      *w++ = '0';
      *w++ = kHex[c >> 4];
      *w++ = kHex[c & 0xf];
    }
  }
  *w++ = '"';
  out.resize(static_cast<size_t>(w - out.data()));
  if (!ascii && !simdjson::validate_utf8(s.data(), s.size())) {
    // Rare (simdjson validated everything parsed; this is text from elsewhere): nlohmann's
    // own replacement of the bad bytes.
    out.resize(start);
    out += nlohmann::json(std::string(s))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

namespace {

template <typename Int>
void AppendInteger(std::string& out, Int v) {
  std::array<char, 24> buf{};
  const std::to_chars_result r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  out.append(buf.data(), r.ptr);
}

}  // namespace

void AppendJson(std::string& out, const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, member] : value.get_ref<const nlohmann::json::object_t&>()) {
        if (!first) out += ',';
        first = false;
        AppendJsonString(out, key);
        out += ':';
        AppendJson(out, member);
      }
      out += '}';
      return;
    }
    case Type::array: {
      out += '[';
      bool first = true;
      for (const nlohmann::json& item : value.get_ref<const nlohmann::json::array_t&>()) {
        if (!first) out += ',';
        first = false;
        AppendJson(out, item);
      }
      out += ']';
      return;
    }
    case Type::string:
      AppendJsonString(out, value.get_ref<const std::string&>());
      return;
    case Type::number_integer:
      AppendInteger(out, value.get<int64_t>());
      return;
    case Type::number_unsigned:
      AppendInteger(out, value.get<uint64_t>());
      return;
    case Type::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case Type::null:
      out += "null";
      return;
    case Type::number_float:
    case Type::binary:
    case Type::discarded:
      // Floats keep nlohmann's shortest round-trip form; none is on the admission's path.
      out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      return;
  }
}

std::string DumpJson(const nlohmann::json& value) {
  std::string out;
  AppendJson(out, value);
  return out;
}

void AppendPointerToken(std::string& pointer, std::string_view token) {
  pointer += '/';
  for (char c : token) {
    if (c == '~') {
      pointer += "~0";
    } else if (c == '/') {
      pointer += "~1";
    } else {
      pointer += c;
    }
  }
}

std::string StringAt(const nlohmann::json& obj, std::string_view key) {
  const nlohmann::json& value = Member(obj, key);
  return value.is_string() ? value.get_ref<const std::string&>() : std::string();
}

std::string StringAt(const JsonView& obj, std::string_view key) {
  return std::string(obj[key].String());
}

const nlohmann::json& Member(const nlohmann::json& obj, std::string_view key) {
  static const nlohmann::json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

}  // namespace kvoffload::webhook
