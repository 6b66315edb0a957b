// Shared plumbing of the dcr command line: exit codes, output format,
// global options.
#ifndef DCR_CLI_CLI_COMMON_H_
#define DCR_CLI_CLI_COMMON_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "dcr/status.h"
#include "dcr/thread_pool.h"
#include "dcr/transport.h"

namespace dcr {
struct Topology;
}  // namespace dcr

namespace dcr::cli {

// Exit codes; the table is printed by `dcr --help`.
enum ExitCode : int {
  kExitOk = 0,                // success; verify: identical
  kExitFailed = 1,            // verify: different; runtime failure (I/O, ...)
  kExitUsage = 2,             // bad command line, missing file, bad config
  kExitCommittedPartial = 3,  // refit: committed, some nodes excluded
  kExitBadData = 4,           // corrupt or malformed delta or checkpoint
  kExitBaseMismatch = 5,      // delta does not apply to this target's version
};

inline constexpr const char* kExitCodeHelp =
    "Exit codes:\n"
    "  0  success (verify: identical)\n"
    "  1  failure: checkpoints differ (verify), I/O or other runtime error\n"
    "  2  usage error: bad arguments, missing file, invalid configuration\n"
    "  3  refit committed with some nodes excluded\n"
    "  4  bad input data: a corrupt or malformed delta or checkpoint\n"
    "  5  base mismatch: the delta does not apply to the target's version\n";

int ExitCodeFor(const Status& s);

enum class OutputFormat { kText, kJson };

struct GlobalOptions {
  std::string output = "text";  // text | json
  int threads = 0;              // 0: all cores
  std::string progress = "auto";
  bool verbose = false;
  bool quiet = false;
  std::string log_format = "text";

  OutputFormat format() const {
    return output == "json" ? OutputFormat::kJson : OutputFormat::kText;
  }
  // Whether to draw progress on stderr.
  bool ShowProgress() const;
};

// Adds --threads, --progress to a subcommand.
void AddWorkOptions(CLI::App* cmd, GlobalOptions* g,
                    bool json_progress = false);
// Adds -o/--output text|json to a subcommand.
void AddOutputOption(CLI::App* cmd, GlobalOptions* g, bool short_flag = true);

// The name errors start with: "dcr" (default) or "dcr-relay".
void SetProgramName(const char* name);
// Prints "<program>: error: <message>" to stderr and returns the exit code.
int ReportError(const Status& s);
// Makes CLI11 report a usage error as one line, "<program>: error: <what>
// (see --help)"; the caller maps it to kExitUsage.
void UseOneLineUsageErrors(CLI::App* app);

std::unique_ptr<ThreadPool> MakePool(const GlobalOptions& g);

// Sets options->tls from `topo`'s defaults.tls_ca_file, tls_cert_file and
// tls_key_file (topo may be null), each replaced by the matching field of
// `flags` when that is set (dcr-relay's --tls-* flags; null: none), then
// loads the files (CheckTlsOptions). All three or none: an error names the
// key (and flag) that is missing, or the file that is wrong and where it
// was named.
[[nodiscard]] Status UseTlsOptions(const Topology* topo,
                                   const TlsOptions* flags,
                                   TransportOptions* options);

// Registers the offline subcommands: diff, apply, verify, inspect.
void AddOfflineCommands(CLI::App* app, GlobalOptions* g, int* exit_code);
// Registers `tree` and `topo` (validate, show, add-node, remove-node, set).
void AddTopologyCommands(CLI::App* app, GlobalOptions* g, int* exit_code);
void AddLayoutCommands(CLI::App* app, GlobalOptions* g, int* exit_code);
// A serving rank's store (one file of the rank's shards, as a serving relay
// keeps it) against a canonical checkpoint, as `dcr layout verify
// --serving` compares a rank (layout.cc): `dcr verify --layout`.
int VerifyServingStore(const GlobalOptions& g, const std::string& layout,
                       uint32_t rank, const std::string& store,
                       const std::string& canonical);
// `dcr inspect --layout`: what a serving rank's store holds, and its bits
// digest (ReceiverMap::BitsDigest: what its vote compares with the root's).
int InspectServingStore(const GlobalOptions& g, const std::string& layout,
                        uint32_t rank, const std::string& store);

// Registers `refit` and `status` (the coordinator).
void AddRefitCommands(CLI::App* app, GlobalOptions* g, int* exit_code);
void AddPlanCommand(CLI::App* app, GlobalOptions* g, int* exit_code);
// Registers `keygen` (the root's signing key pair).
void AddKeygenCommand(CLI::App* app, int* exit_code);
// Registers `gc` (the object store's retention, coord/object_retention.h).
void AddGcCommand(CLI::App* app, GlobalOptions* g, int* exit_code);
void AddHistoryCommand(CLI::App* app, GlobalOptions* g, int* exit_code);

}  // namespace dcr::cli

#endif  // DCR_CLI_CLI_COMMON_H_
