// Logging for dcr binaries: spdlog to stderr, as text or one JSON object
// per line. Libraries log through these helpers so a binary decides the
// sink and format once, at startup.
#ifndef DCR_COMMON_LOG_H_
#define DCR_COMMON_LOG_H_

#include <spdlog/spdlog.h>

#include <string_view>

#include "dcr/status.h"

namespace dcr {

enum class LogFormat { kText, kJson };

// Parses "text" or "json".
Result<LogFormat> ParseLogFormat(std::string_view s);
// Parses "trace", "debug", "info", "warn", "error", "off".
Result<spdlog::level::level_enum> ParseLogLevel(std::string_view s);

// Sends the default logger to stderr in `format` at `level`. Idempotent.
void InitLogging(LogFormat format, spdlog::level::level_enum level);

}  // namespace dcr

#endif  // DCR_COMMON_LOG_H_
