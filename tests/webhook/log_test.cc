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

// A client's text reaches the admission log (an apiVersion or kind it sent, in the detail):
// in text format a newline in it wrote a second, forged line ("... info admission
// outcome=injected"), and a value of megabytes a line of megabytes, in either format.
TEST(LogTest, ClientTextCanNeitherForgeALineNorFillTheLog) {
  const std::string forged = "admission.k8s.io/v1\n2026-12-07T21:00:00Z info admission outcome=injected";
  const std::string huge(5'000'000, 'x');
  for (LogFormat format : {LogFormat::kText, LogFormat::kJson}) {
    ConfigureLogging(format, "info");
    ::testing::internal::CaptureStderr();
    LogEvent(spdlog::level::info, "admission", {{"outcome", "error"}, {"detail", forged}});
    LogEvent(spdlog::level::info, "admission", {{"outcome", "error"}, {"detail", huge}});
    spdlog::default_logger()->flush();
    const std::string out = ::testing::internal::GetCapturedStderr();
    std::istringstream lines(out);
    std::vector<std::string> got;
    for (std::string line; std::getline(lines, line);) got.push_back(line);
    ASSERT_EQ(got.size(), 2u) << out.substr(0, 2000);
    EXPECT_EQ(got[0].find("\ninfo"), std::string::npos);
    EXPECT_NE(got[0].find("outcome=injected"), std::string::npos) << "kept, escaped: " << got[0];
    EXPECT_LT(got[1].size(), 2300u);
    EXPECT_NE(got[1].find("(5000000 bytes)"), std::string::npos) << got[1].substr(0, 2300);
    if (format == LogFormat::kText) {
      EXPECT_NE(got[0].find("detail=\"admission.k8s.io/v1\\n2026"), std::string::npos) << got[0];
    }
  }
}

}  // namespace
}  // namespace kvoffload::webhook
