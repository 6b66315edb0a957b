// dcr: the command line of the delta refit service.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/doctor.h"
#include "common/failpoint.h"
#include "common/log.h"

int main(int argc, char** argv) {
  using namespace dcr::cli;
  if (auto s = dcr::InitFailpointsFromEnv(); !s.ok()) return ReportError(s);
  CLI::App app(
      "dcr: refit RL rollout nodes with only the bits that changed.\n"
      "Offline commands work on safetensors checkpoints and .dcr delta "
      "files.",
      "dcr");
  app.set_version_flag("--version", "dcr 0.1.0");
  app.require_subcommand(1);
  UseOneLineUsageErrors(&app);
  app.footer(
      std::string("\nExamples:\n"
                  "  dcr diff v0.safetensors v1.safetensors -o v1.dcr\n"
                  "  dcr apply v1.dcr /models/policy.safetensors\n"
                  "  dcr verify /models/policy.safetensors v1.safetensors\n"
                  "  dcr inspect v1.dcr -o json\n"
                  "  dcr tree --topology topology/local.yaml --format dot\n"
                  "  dcr topo validate topology/two-region.yaml\n"
                  "  dcr layout check layouts/llama3-8b-tp4-pp2.yaml\n"
                  "  dcr refit --topology topology/local.yaml --target "
                  "v1.safetensors\n"
                  "  dcr status --topology topology/local.yaml\n"
                  "  dcr history --topology topology/local.yaml\n"
                  "  dcr plan --topology topology/local.yaml --params 30B "
                  "--change-rate 3%\n"
                  "  dcr doctor --topology topology/local.yaml\n\n") +
      kExitCodeHelp +
      "  6  doctor: a transport the topology needs is not usable here\n");
  GlobalOptions g;
  app.add_flag("-v,--verbose", g.verbose, "Log debug detail to stderr");
  app.add_flag("-q,--quiet", g.quiet, "Log only errors; no progress");
  app.add_option("--log-format", g.log_format, "Log format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  int exit_code = kExitOk;
  AddOfflineCommands(&app, &g, &exit_code);
  AddTopologyCommands(&app, &g, &exit_code);
  AddLayoutCommands(&app, &g, &exit_code);
  AddRefitCommands(&app, &g, &exit_code);
  AddPlanCommand(&app, &g, &exit_code);
  AddKeygenCommand(&app, &exit_code);
  AddGcCommand(&app, &g, &exit_code);
  AddHistoryCommand(&app, &g, &exit_code);
  AddDoctorCommand(&app, &g, &exit_code);
  app.parse_complete_callback([&] {
    auto fmt = dcr::ParseLogFormat(g.log_format);
    dcr::InitLogging(fmt.ok() ? *fmt : dcr::LogFormat::kText,
                     g.quiet     ? spdlog::level::err
                     : g.verbose ? spdlog::level::debug
                                 : spdlog::level::info);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 returns 0 for --help/--version and its own codes otherwise;
    // every usage error is exit code 2.
    return rc == 0 ? kExitOk : kExitUsage;
  }
  return exit_code;
}
