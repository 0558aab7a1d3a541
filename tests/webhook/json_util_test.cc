// DumpJson against nlohmann's own dump(): the admission's patch, status annotation and hashed
// spec went through dump() before, so every byte must stay the same (the config hash is
// compared across webhook versions on reinvocation).
#include "webhook/json_util.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

std::string Reference(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(DumpJsonTest, MatchesNlohmannForEveryKindOfValue) {
  std::string controls;
  for (int c = 0; c < 0x20; ++c) controls += static_cast<char>(c);
  const json cases[] = {
      nullptr,
      true,
      false,
      0,
      -1,
      std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(),
      std::numeric_limits<uint64_t>::max(),
      1.5,
      -0.1,
      1e300,
      "",
      "plain",
      "quote \" backslash \\ slash / tab \t newline \n",
      controls,
      std::string("nul \0 inside", 12),
      "\x7f del stays",
      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
      json::object(),
      json::array(),
      {{"b", 1}, {"a", {1, "two", nullptr}}, {"k\"ey\n", {{"nested", json::object()}}}},
      json::array({json::array(), json::object(), json::array({json::array({1})})}),
  };
  for (const json& value : cases) {
    EXPECT_EQ(DumpJson(value), Reference(value)) << Reference(value);
  }
}

TEST(DumpJsonTest, ReplacesInvalidUtf8AsNlohmannDoes) {
  const std::string bad[] = {
      "\xff",               // never valid
      "ok \xc3 cut short",  // truncated sequence
      "\xc0\xaf overlong",  // overlong '/'
      "\xed\xa0\x80 surrogate",
      "\xf4\x90\x80\x80 over U+10FFFF",
  };
  for (const std::string& s : bad) {
    const json value = {{"key", s}, {s, "value"}};
    const std::string out = DumpJson(value);
    EXPECT_EQ(out, Reference(value));
    EXPECT_NE(out.find("\xef\xbf\xbd"), std::string::npos) << out;  // U+FFFD
  }
}

// Strings are scanned 8 bytes at a time: every kind of byte at every offset and length, valid
// UTF-8 or not, against the reference.
TEST(DumpJsonTest, MatchesNlohmannAtEveryOffset) {
  const std::string pieces[] = {
      "a",    "Z",   "\"",   "\\",       "\n",           std::string(1, '\0'),
      "\x1f", " ",   "\x7f", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
      "\xff", "\xc3"};
  std::mt19937 rng(7);
  for (int round = 0; round < 20000; ++round) {
    std::string s;
    const size_t n = rng() % 24;
    for (size_t i = 0; i < n; ++i) {
      // Mostly plain letters, so that whole 8-byte words take the fast path.
      s += rng() % 3 == 0 ? pieces[rng() % std::size(pieces)] : "x";
    }
    ASSERT_EQ(DumpJson(s), Reference(s)) << Reference(s);
  }
}

TEST(DumpJsonTest, AppendsToWhatIsThere) {
  std::string out = "patch=";
  AppendJson(out, json({{"op", "add"}}));
  EXPECT_EQ(out, R"(patch={"op":"add"})");
}

// ParseJson builds objects with insertion hinted at the end (keys usually come sorted): keys in
// any order land sorted, and a repeated key keeps its first value (the API server never sends
// one: it serialises the objects it reviews).
TEST(ParseJsonTest, KeysInAnyOrderAndARepeatedKeyKeepsItsFirstValue) {
  const std::string text = R"({"z":1,"a":{"y":[3,{"q":1,"p":2}],"b":null},"m":"x","a":5,"z":2})";
  Result<json> parsed = ParseJson(text, "test");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(DumpJson(*parsed), R"({"a":{"b":null,"y":[3,{"p":2,"q":1}]},"m":"x","z":1})");
}

// JsonView reads what Member()/StringAt() read on the nlohmann value of the same text: the
// admission switched from one to the other, and the mutator's decisions must not change.
TEST(JsonViewTest, ReadsWhatTheNlohmannValueHolds) {
  const std::string text =
      R"({"s":"text","n":null,"i":-7,"u":18446744073709551615,"d":1.5,"b":true,)"
      R"("o":{"k":"v","k":"second"},"a":["x",{"name":"y"},3],"e":[],"esc":"a\"b\u00e9"})";
  Result<JsonDocument> doc = JsonDocument::Parse(text, "test");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  const JsonView root = doc->Root();
  EXPECT_TRUE(root.IsObject());
  EXPECT_EQ(root.Size(), 10u);
  EXPECT_EQ(root["s"].String(), "text");
  EXPECT_TRUE(root["s"].IsString());
  EXPECT_TRUE(root["n"].IsNull());
  EXPECT_TRUE(root.Contains("n"));  // null, but there
  EXPECT_TRUE(root["missing"].IsNull());
  EXPECT_FALSE(root.Contains("missing"));
  EXPECT_EQ(root["i"].Int(), -7);
  EXPECT_EQ(root["u"].Int(), std::nullopt);  // does not fit int64_t
  EXPECT_EQ(root["d"].Int(), std::nullopt);
  EXPECT_EQ(root["s"].Int(), std::nullopt);
  EXPECT_EQ(root["b"].String(), "");  // not a string
  EXPECT_EQ(root["o"]["k"].String(), "v");  // a repeated key: the first, as ParseJson keeps
  EXPECT_EQ(root["esc"].String(), "a\"b\xc3\xa9");
  // Members of what is not an object, elements of what is not an array: absent, never a crash.
  EXPECT_TRUE(root["s"]["k"].IsNull());
  EXPECT_TRUE(root["a"]["k"].IsNull());
  EXPECT_TRUE(root["missing"]["k"]["j"].IsNull());
  EXPECT_TRUE(root["o"].At(0).IsNull());
  EXPECT_TRUE(root["o"].Strings().empty());
  EXPECT_TRUE(root["o"].StringMembers("k").empty());
  EXPECT_TRUE(JsonView().At(0).IsNull());
  EXPECT_TRUE(JsonView().Strings().empty());
  EXPECT_EQ(JsonView().Size(), 0u);
  EXPECT_EQ(root["a"].Size(), 3u);
  EXPECT_EQ(root["a"].At(0).String(), "x");
  EXPECT_EQ(root["a"].At(1)["name"].String(), "y");
  EXPECT_EQ(root["a"].At(2).Int(), 3);
  EXPECT_TRUE(root["a"].At(3).IsNull());
  EXPECT_EQ(StringAt(root["a"].At(1), "name"), "y");
  EXPECT_EQ(root["a"].Strings(), (std::vector<std::string_view>{"x", "", ""}));
  EXPECT_EQ(root["a"].StringMembers("name"), (std::vector<std::string_view>{"", "y", ""}));
  EXPECT_TRUE(root["e"].IsArray());
  EXPECT_TRUE(root["e"].Strings().empty());
  EXPECT_TRUE(root["e"].StringMembers("name").empty());

  Result<json> reference = ParseJson(text, "test");
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(root.ToJson(), *reference);
  EXPECT_EQ(JsonView().ToJson(), json());
}

// The document owns its tape: views stay valid when it moves, and Of() reads an nlohmann value.
// StringMembers reads, for each element, what operator[] then String() read: the mutator's
// env and volume lookups went from one to the other.
TEST(JsonViewTest, StringMembersReadWhatEachElementsMemberReads) {
  const std::string text =
      R"([{"value":"1","name":"a"},{"name":"b","name":"second"},{"name":7},{"other":"c"},)"
      R"("text",null,[{"name":"nested"}],{"name":"\u00e9\""},{"name":""}])";
  Result<JsonDocument> doc = JsonDocument::Parse(text, "test");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  const JsonView root = doc->Root();
  const std::vector<std::string_view> names = root.StringMembers("name");
  ASSERT_EQ(names.size(), root.Size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(names[i], root.At(i)["name"].String()) << "element " << i;
  }
  EXPECT_EQ(names[0], "a");
  EXPECT_EQ(names[1], "b");  // a repeated key: the first
  EXPECT_EQ(names[7], "\xc3\xa9\"");
  EXPECT_EQ(root.StringMembers("nam"), std::vector<std::string_view>(names.size()));
}

TEST(JsonViewTest, DocumentsOwnTheirTextAndMoveWithIt) {
  const json value = {{"metadata", {{"labels", {{"app", "x"}}}}}, {"list", {1, 2}}};
  JsonDocument doc = JsonDocument::Of(value);
  const JsonView labels = doc.Root()["metadata"]["labels"];
  JsonDocument moved = std::move(doc);
  EXPECT_EQ(labels["app"].String(), "x");
  EXPECT_EQ(moved.Root().ToJson(), value);
  // Another parse on this thread leaves the first document as it was.
  Result<JsonDocument> other = JsonDocument::Parse(R"({"metadata":{"labels":{"app":"y"}}})", "t");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(labels["app"].String(), "x");
  EXPECT_EQ(other->Root()["metadata"]["labels"]["app"].String(), "y");
}

// The same refusals, word for word, as ParseJson: the admission's error answers quote them.
TEST(JsonViewTest, ParseRefusesWhatParseJsonRefuses) {
  const size_t depth = kMaxJsonDepth + 1;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string& text : {std::string("{\"a\":"), std::string("[1,]"), deep,
                                   std::string("\"\xff\"")}) {
    Result<JsonDocument> doc = JsonDocument::Parse(text, "AdmissionReview");
    Result<json> reference = ParseJson(text, "AdmissionReview");
    ASSERT_FALSE(doc.ok()) << text;
    ASSERT_FALSE(reference.ok()) << text;
    EXPECT_EQ(doc.status().message(), reference.status().message());
  }
  EXPECT_NE(JsonDocument::Parse(deep, "x").status().message().find("nests deeper than 128"),
            std::string::npos);
}

// Parsed where it lies (spare capacity after the text), a document reads only the text: what
// follows it in the buffer, however JSON-like, is neither read as content nor hides an error.
TEST(JsonViewTest, InPlaceParseReadsOnlyTheText) {
  const std::string tail = R"(,"b":"tail"}   ]]]] "unterminated)";
  auto in_buffer = [&tail](std::string_view text) {
    std::string buf;
    buf.reserve(text.size() + tail.size() + kJsonPadding);
    buf.append(text).append(tail);  // the tail's bytes stay in the buffer past the end
    buf.resize(text.size());
    return buf;
  };
  const std::string good = in_buffer(R"({"a":"x"})");
  ASSERT_GE(good.capacity() - good.size(), kJsonPadding);
  Result<JsonDocument> doc = JsonDocument::Parse(good, "t", good.capacity() - good.size());
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  EXPECT_EQ(doc->Root().ToJson(), json({{"a", "x"}}));
  EXPECT_FALSE(doc->Root().Contains("b"));
  for (std::string_view bad : {R"({"a":)", R"({"a":"x")", R"("x)", "[1,"}) {
    const std::string text = in_buffer(bad);
    Result<JsonDocument> in_place = JsonDocument::Parse(text, "t", text.capacity() - text.size());
    ASSERT_FALSE(in_place.ok()) << bad;
    EXPECT_EQ(in_place.status().message(), JsonDocument::Parse(bad, "t").status().message());
  }
}

}  // namespace
}  // namespace kvoffload::webhook
