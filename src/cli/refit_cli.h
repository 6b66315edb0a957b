// What `dcr refit`'s files share (refit.cc, producer_refits.cc): parsing,
// the printed report, exit codes, and the producers' loop.
#ifndef DCR_CLI_REFIT_CLI_H_
#define DCR_CLI_REFIT_CLI_H_

#include <chrono>
#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "cli/refit_progress.h"
#include "dcr/refit.h"
#include "dcr/topology.h"
#include "dcr/transport.h"

namespace dcr::cli {

// --timeout and --producer-wait: a duration of at least 1 ms.
Result<std::chrono::milliseconds> ParseTimeout(const std::string& s);
// A refit's report as text on stdout.
void PrintReport(const RefitReport& r);
// Keys the frames of `options` from the topology's defaults.auth_key_file
// when it names one: kExitOk, or kExitUsage after printing the error.
int UseTopologyKey(const Topology& topo, TransportOptions* options);
// `dcr status --topology PATH [--timeout T]`; the exit code.
int RunStatusCommand(const std::string& path, const std::string& timeout_text,
                     const GlobalOptions& g);
// The exit code of a refit that ended with `outcome`.
int OutcomeExit(RefitOutcome outcome);

// dcr refit --producers: its own flags.
struct ProducerArgs {
  int producers = 0;
  std::string layout;
  std::string listen = "127.0.0.1:7480";
  std::string producer_wait = "60s";
  int refits = 0;  // 0: until SIGINT or SIGTERM
};
// Runs producers' refits with `o` (topology, transport, timeouts set)
// until a.refits of them ran or a signal stops it; the exit code.
int RunProducerRefits(const ProducerArgs& a, const GlobalOptions& g,
                      RefitOptions* o,
                      std::unique_ptr<RefitProgress>* progress);

}  // namespace dcr::cli

#endif  // DCR_CLI_REFIT_CLI_H_
