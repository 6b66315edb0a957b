#include "common/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace dcr {
namespace {

// One JSON object per line on stderr: {"ts", "level", "msg"}, with the
// message escaped properly (spdlog patterns do not escape).
class JsonStderrSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    auto secs = std::chrono::duration<double>(msg.time.time_since_epoch());
    nlohmann::ordered_json j{
        {"ts", secs.count()},
        {"level", spdlog::level::to_string_view(msg.level).data()},
        {"msg", std::string(msg.payload.data(), msg.payload.size())}};
    std::string line =
        j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

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
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (format == LogFormat::kJson) {
    sink = std::make_shared<JsonStderrSink>();
  } else {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    sink->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  auto logger = std::make_shared<spdlog::logger>("dcr", std::move(sink));
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace dcr
