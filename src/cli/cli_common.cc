#include "cli/cli_common.h"

#include <unistd.h>

#include <cstdio>

namespace dcr::cli {

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return kExitUsage;
    case StatusCode::kCorruption:
    case StatusCode::kUnsupported:
      return kExitBadData;
    case StatusCode::kBaseMismatch:
      return kExitBaseMismatch;
    default:
      return kExitFailed;
  }
}

bool GlobalOptions::ShowProgress() const {
  if (quiet || progress == "never") return false;
  if (progress == "always") return true;
  return ::isatty(STDERR_FILENO) == 1;
}

void AddWorkOptions(CLI::App* cmd, GlobalOptions* g) {
  cmd->add_option("-j,--threads", g->threads,
                  "Worker threads (0: one per core)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--progress", g->progress,
                  "Progress on stderr: auto (on a terminal), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
}

void AddOutputOption(CLI::App* cmd, GlobalOptions* g, bool short_flag) {
  cmd->add_option(short_flag ? "-o,--output" : "--output", g->output,
                  "Output format on stdout: text or json")
      ->check(CLI::IsMember({"text", "json"}));
}

namespace {
const char* program_name = "dcr";
}

void SetProgramName(const char* name) { program_name = name; }

int ReportError(const Status& s) {
  std::fprintf(stderr, "%s: error: %s\n", program_name,
               std::string(s.message()).c_str());
  return ExitCodeFor(s);
}

void UseOneLineUsageErrors(CLI::App* app) {
  app->failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string(program_name) + ": error: " + e.what() +
           " (see --help)\n";
  });
}

std::unique_ptr<ThreadPool> MakePool(const GlobalOptions& g) {
  return std::make_unique<ThreadPool>(static_cast<size_t>(g.threads));
}

}  // namespace dcr::cli
