#include "webhook/quantity.h"

#include <gtest/gtest.h>

#include <string_view>

namespace kvoffload::webhook {
namespace {

struct ParseCase {
  std::string_view input;
  const char* canonical;  // nullptr: must be rejected
  int64_t value;          // whole units, rounded up
};

class QuantityParseTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(QuantityParseTest, ParsesAndPrintsCanonically) {
  const ParseCase& c = GetParam();
  Result<Quantity> q = Quantity::Parse(c.input);
  if (c.canonical == nullptr) {
    EXPECT_FALSE(q.ok()) << c.input << " parsed as " << q->ToString();
    return;
  }
  ASSERT_TRUE(q.ok()) << c.input << ": " << q.status().message();
  EXPECT_EQ(q->ToString(), c.canonical) << c.input;
  EXPECT_EQ(q->Value(), c.value) << c.input;
  // Canonical output parses back to the same value and prints the same.
  Result<Quantity> again = Quantity::Parse(q->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Compare(*q), 0);
  EXPECT_EQ(again->ToString(), q->ToString());
}

// Expected strings are what the API server prints for the same input.
INSTANTIATE_TEST_SUITE_P(
    Table, QuantityParseTest,
    ::testing::Values(
        ParseCase{"0", "0", 0}, ParseCase{"00", "0", 0}, ParseCase{"0Gi", "0", 0},
        ParseCase{"1", "1", 1}, ParseCase{"1000", "1k", 1000}, ParseCase{"1500", "1500", 1500},
        ParseCase{"1k", "1k", 1000}, ParseCase{"1.5k", "1500", 1500},
        ParseCase{"10Gi", "10Gi", 10LL << 30}, ParseCase{"1024Mi", "1Gi", 1LL << 30},
        ParseCase{"1536Mi", "1536Mi", 1536LL << 20}, ParseCase{"1.5Gi", "1536Mi", 1536LL << 20},
        ParseCase{"0.5Gi", "512Mi", 512LL << 20}, ParseCase{"1Ki", "1Ki", 1024},
        ParseCase{"1023", "1023", 1023}, ParseCase{"0.5Ki", "512", 512},
        ParseCase{"100M", "100M", 100'000'000}, ParseCase{"1G", "1G", 1'000'000'000},
        ParseCase{"1000M", "1G", 1'000'000'000}, ParseCase{"500m", "500m", 1},
        ParseCase{"0.5", "500m", 1}, ParseCase{"1.5", "1500m", 2},
        ParseCase{"0.1", "100m", 1}, ParseCase{"1n", "1n", 1},
        ParseCase{"0.0000000001", "1n", 1},  // below 1n rounds up to 1n
        ParseCase{"1u", "1u", 1}, ParseCase{"1000u", "1m", 1},
        ParseCase{"12e6", "12e6", 12'000'000}, ParseCase{"1e3", "1e3", 1000},
        ParseCase{"1E3", "1e3", 1000}, ParseCase{"1.5e3", "1500", 1500},
        ParseCase{"1e-3", "1e-3", 1}, ParseCase{"+1Ki", "1Ki", 1024},
        ParseCase{"-1Ki", "-1Ki", -1024}, ParseCase{"-500m", "-500m", -1},
        ParseCase{".5", "500m", 1}, ParseCase{"1.G", "1G", 1'000'000'000},
        ParseCase{"0.1Ki", "102400m", 103}, ParseCase{"1Ei", "1Ei", 1LL << 60},
        ParseCase{"7Ei", "7Ei", 7LL << 60}, ParseCase{"8E", "8E", 8'000'000'000'000'000'000},
        ParseCase{"9223372036854775807", "9223372036854775807", INT64_MAX},
        ParseCase{"1.000000000001k", "1000000000001n", 1001},
        // Rejected: malformed, unknown suffixes, overflow past int64.
        ParseCase{"", nullptr, 0}, ParseCase{"Gi", nullptr, 0}, ParseCase{"10Gx", nullptr, 0},
        ParseCase{"10 Gi", nullptr, 0}, ParseCase{"10gi", nullptr, 0}, ParseCase{"1.2.3", nullptr, 0},
        ParseCase{"--1", nullptr, 0}, ParseCase{"1e", nullptr, 0}, ParseCase{"1e+", nullptr, 0},
        ParseCase{"1Kib", nullptr, 0}, ParseCase{".", nullptr, 0}, ParseCase{"8Ei", nullptr, 0},
        ParseCase{"9223372036854775808", nullptr, 0}, ParseCase{"10E", nullptr, 0},
        ParseCase{"1e100", nullptr, 0}, ParseCase{"99999999999999999999999999999999999999999", nullptr, 0},
        ParseCase{std::string_view("1\0Gi", 4), nullptr, 0}));

TEST(QuantityAddTest, SumsExactlyAndCanonically) {
  struct Case {
    const char* a;
    const char* b;
    const char* sum;
  } cases[] = {
      {"10Gi", "100Gi", "110Gi"}, {"1Gi", "512Mi", "1536Mi"}, {"1G", "1Gi", "2073741824"},
      {"500m", "500m", "1"},      {"1k", "24", "1024"},       {"1Ki", "1k", "2024"},
      {"0", "100Gi", "100Gi"},   {"12e6", "1e6", "13e6"},    {"1.5", "1.5", "3"},
  };
  for (const Case& c : cases) {
    Result<Quantity> a = Quantity::Parse(c.a);
    Result<Quantity> b = Quantity::Parse(c.b);
    ASSERT_TRUE(a.ok() && b.ok()) << c.a << " " << c.b;
    Result<Quantity> sum = a->Add(*b);
    ASSERT_TRUE(sum.ok()) << sum.status().message();
    EXPECT_EQ(sum->ToString(), c.sum) << c.a << " + " << c.b;
  }
}

TEST(QuantityAddTest, ZeroTakesTheAddendsFormat) {
  Result<Quantity> gi = Quantity::Parse("100Gi");
  ASSERT_TRUE(gi.ok());
  Result<Quantity> sum = Quantity().Add(*gi);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->format(), Quantity::Format::kBinarySI);
  EXPECT_EQ(sum->ToString(), "100Gi");
}

TEST(QuantityAddTest, OverflowIsAnError) {
  Result<Quantity> big = Quantity::Parse("7Ei");
  ASSERT_TRUE(big.ok());
  Result<Quantity> sum = big->Add(*big);
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("overflows"), std::string::npos);
}

TEST(QuantityCompareTest, OrdersAcrossFormats) {
  EXPECT_LT(*Quantity::Parse("1G"), *Quantity::Parse("1Gi"));
  EXPECT_EQ(*Quantity::Parse("1024"), *Quantity::Parse("1Ki"));
  EXPECT_LT(*Quantity::Parse("-1"), *Quantity::Parse("1n"));
}

}  // namespace
}  // namespace kvoffload::webhook
