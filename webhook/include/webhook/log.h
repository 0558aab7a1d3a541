// Structured logging on spdlog: one event = a message plus key/value fields, printed as a JSON
// object per line (--log-format json, for log pipelines) or as readable text. Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_LOG_H_
#define KVOFFLOAD_WEBHOOK_LOG_H_

#include <string_view>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace kvoffload::webhook {

enum class LogFormat { kText, kJson };

// Sets the process-wide format and level ("debug", "info", "warn", "error"). Call once at start.
void ConfigureLogging(LogFormat format, std::string_view level);

// Logs `message` with `fields` (a JSON object) at `level`.
void LogEvent(spdlog::level::level_enum level, std::string_view message,
              const nlohmann::json& fields = nlohmann::json::object());

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_LOG_H_
