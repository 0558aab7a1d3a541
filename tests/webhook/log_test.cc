#include "webhook/log.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace kvoffload::webhook {
namespace {

TEST(LogTest, JsonFormatIsOneParseableObjectPerLine) {
  ConfigureLogging(LogFormat::kJson, "info");
  ::testing::internal::CaptureStderr();
  LogEvent(spdlog::level::info, "admission", {{"outcome", "injected"}, {"detail", "a \"quoted\"\nline"}});
  LogEvent(spdlog::level::debug, "hidden at info level");
  LogEvent(spdlog::level::warn, "bad bytes \xff\xfe", {{"n", 3}});
  spdlog::default_logger()->flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::istringstream lines(out);
  std::string line;
  std::vector<nlohmann::json> events;
  while (std::getline(lines, line)) {
    nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(e.is_discarded()) << line;
    events.push_back(e);
  }
  ASSERT_EQ(events.size(), 2u) << out;
  EXPECT_EQ(events[0]["msg"], "admission");
  EXPECT_EQ(events[0]["level"], "info");
  EXPECT_EQ(events[0]["outcome"], "injected");
  EXPECT_EQ(events[0]["detail"], "a \"quoted\"\nline");
  EXPECT_TRUE(events[0].contains("ts"));
  EXPECT_EQ(events[1]["level"], "warning");
  EXPECT_EQ(events[1]["n"], 3);
}

}  // namespace
}  // namespace kvoffload::webhook
