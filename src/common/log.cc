#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <string>

namespace dcr {

Result<LogFormat> ParseLogFormat(std::string_view s) {
  if (s == "text") return LogFormat::kText;
  if (s == "json") return LogFormat::kJson;
  return Status::InvalidArgument("log format must be 'text' or 'json', got '" +
                                 std::string(s) + "'");
}

Result<spdlog::level::level_enum> ParseLogLevel(std::string_view s) {
  auto level = spdlog::level::from_str(std::string(s));
  if (level == spdlog::level::off && s != "off") {
    return Status::InvalidArgument(
        "log level must be trace, debug, info, warn, error or off, got '" +
        std::string(s) + "'");
  }
  return level;
}

void InitLogging(LogFormat format, spdlog::level::level_enum level) {
  auto logger = std::make_shared<spdlog::logger>(
      "dcr", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (format == LogFormat::kJson) {
    // The message is escaped by the caller-facing helpers only for quotes
    // and backslashes; dcr messages never contain control characters.
    logger->set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%v"})",
        spdlog::pattern_time_type::utc);
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace dcr
