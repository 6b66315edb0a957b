#include "cli/cli_common.h"

#include <unistd.h>

#include <cstdio>

#include "dcr/topology.h"

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

void AddWorkOptions(CLI::App* cmd, GlobalOptions* g, bool json_progress) {
  cmd->add_option("-j,--threads", g->threads,
                  "Worker threads (0: one per core)")
      ->check(CLI::NonNegativeNumber);
  if (json_progress) {
    cmd->add_option("--progress", g->progress,
                    "Progress on stderr: auto (a bar on a terminal, else a "
                    "line every 5 s), always, never, or json (an object per "
                    "line, every 250 ms)")
        ->check(CLI::IsMember({"auto", "always", "never", "json"}));
  } else {
    cmd->add_option("--progress", g->progress,
                    "Progress on stderr: auto (on a terminal), always, never")
        ->check(CLI::IsMember({"auto", "always", "never"}));
  }
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

Status UseTlsOptions(const Topology* topo, const TlsOptions* flags,
                     TransportOptions* options) {
  struct Key {
    const char* name;  // in the topology's defaults
    const char* flag;
    std::string TlsOptions::*field;
    const std::string* in_topology;
  };
  const Key keys[] = {
      {"tls_ca_file", "--tls-ca-file", &TlsOptions::ca_file,
       topo ? &topo->defaults.tls_ca_file : nullptr},
      {"tls_cert_file", "--tls-cert-file", &TlsOptions::cert_file,
       topo ? &topo->defaults.tls_cert_file : nullptr},
      {"tls_key_file", "--tls-key-file", &TlsOptions::key_file,
       topo ? &topo->defaults.tls_key_file : nullptr}};
  const std::string where = topo ? topo->source + ": " : "";
  TlsOptions tls;
  std::string origin;  // where the files were named, for errors
  for (const Key& k : keys) {
    const bool by_flag = flags && !(flags->*k.field).empty();
    tls.*k.field = by_flag         ? flags->*k.field
                   : k.in_topology ? *k.in_topology
                                   : std::string();
    if (!(tls.*k.field).empty() && origin.empty()) {
      origin = by_flag ? std::string(k.flag) : where + "defaults." + k.name;
    }
  }
  options->tls = TlsOptions{};
  if (!tls.enabled()) return Status::OK();
  for (const Key& k : keys) {
    if (!(tls.*k.field).empty()) continue;
    std::string missing = topo ? where + "defaults." + k.name : "";
    if (flags) {
      missing += missing.empty() ? k.flag : std::string(" (or ") + k.flag + ")";
    }
    return Status::InvalidArgument(
        missing + " is not set: TLS needs tls_ca_file, tls_cert_file and " +
        "tls_key_file together (" + origin + " is set)");
  }
  // The message names the file; the topology, when it named all three.
  const bool any_flag = flags && flags->enabled();
  Status loaded = CheckTlsOptions(tls);
  if (!loaded.ok())
    return topo && !any_flag ? loaded.WithContext(topo->source) : loaded;
  options->tls = std::move(tls);
  return Status::OK();
}

}  // namespace dcr::cli
