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

}  // namespace
}  // namespace kvoffload::webhook
