#include "webhook/log.h"

#include <algorithm>

#include <atomic>
#include <chrono>
#include <ctime>

#include <spdlog/sinks/stdout_sinks.h>

#include "webhook/json_util.h"

namespace kvoffload::webhook {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1'000'000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(micros));
  return buf;
}

}  // namespace

void ConfigureLogging(LogFormat format, std::string_view level) {
  g_format = format;
  // Logs go to stderr so `inject` can print the manifest on stdout. Configured again (tests of
  // both formats in one process): the earlier logger of that name goes first.
  spdlog::drop("kv-offload");
  auto logger = spdlog::stderr_logger_mt("kv-offload");
  // Our events carry their own timestamp and level in JSON mode; the text pattern adds them.
  logger->set_pattern(format == LogFormat::kJson ? "%v" : "%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ %v",
                      spdlog::pattern_time_type::utc);
  logger->set_level(spdlog::level::from_str(std::string(level)));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

namespace {

// A client's text reaches the log through a field (an apiVersion or kind it sent, quoted in
// the detail): any field's text is cut to this many bytes, so that a request of megabytes
// writes no line of megabytes. Our own messages (a denial listing every error) stay far under.
constexpr size_t kMaxFieldBytes = 2048;

nlohmann::json Bounded(const nlohmann::json& value) {
  if (!value.is_string() || value.get_ref<const std::string&>().size() <= kMaxFieldBytes) {
    return value;
  }
  const std::string& text = value.get_ref<const std::string&>();
  return text.substr(0, kMaxFieldBytes) + "... (" + std::to_string(text.size()) + " bytes)";
}

// In text format a value is written as it is where that reads back as one value, and as a JSON
// string otherwise: a newline in it wrote a second, forged line, a space or '=' a forged field.
std::string TextValue(const nlohmann::json& value) {
  if (!value.is_string()) return DumpJson(value);
  const std::string& text = value.get_ref<const std::string&>();
  const bool plain = !text.empty() && std::none_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= ' ' || u == 0x7f || c == '"' || c == '=' || c == '\\';
  });
  return plain ? text : DumpJson(value);
}

}  // namespace

void LogEvent(spdlog::level::level_enum level, std::string_view message,
              const nlohmann::json& fields) {
  if (!spdlog::default_logger_raw()->should_log(level)) return;
  if (g_format == LogFormat::kJson) {
    nlohmann::json event = {{"ts", Timestamp()},
                            {"level", spdlog::level::to_string_view(level).data()},
                            {"msg", message}};
    for (const auto& [key, value] : fields.items()) event[key] = Bounded(value);
    spdlog::log(level, "{}", DumpJson(event));
    return;
  }
  std::string line(message);
  for (const auto& [key, value] : fields.items()) {
    line += " " + key + "=" + TextValue(Bounded(value));
  }
  spdlog::log(level, "{}", line);
}

}  // namespace kvoffload::webhook
