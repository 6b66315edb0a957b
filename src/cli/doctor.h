// `dcr doctor` and `dcr-relay --doctor`: what this build and machine offer
// for relay links (each transport, TLS, CUDA, the build's options) and,
// given a topology, whether every transport it needs here is usable.
//
// One report, built once and rendered as a table or as JSON; both binaries
// use it, so they print the same facts.
#ifndef DCR_CLI_DOCTOR_H_
#define DCR_CLI_DOCTOR_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "dcr/cuda.h"
#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr::cli {

// Exit code of a doctor run with a topology when something the topology
// needs on this machine (a transport, the TLS files) is not usable. Above
// the codes of cli_common.h, so that scripts can tell it from a usage error.
inline constexpr int kExitNotReady = 6;

inline constexpr const char* kDoctorExitCodeHelp =
    "Exit codes: 0 report printed (with --topology: everything it needs here "
    "is usable),\n6 with --topology: a transport (or the TLS files) it needs "
    "here is not usable,\n2 usage error (bad topology, unknown node).\n";

struct DoctorOptions {
  std::string topology;  // empty: no topology checks
  std::string node;      // empty: the root's view (every node of the tree)
  OutputFormat format = OutputFormat::kText;
  // dcr-relay's --tls-* flags, which override the topology's; null: none.
  const TlsOptions* tls_flags = nullptr;
};

// One transport kind the topology uses, and who needs it here.
struct DoctorNeed {
  std::string kind;                // "tcp", "ucx"
  std::vector<std::string> nodes;  // nodes whose links use it, tree order
  bool usable = false;
  std::string detail;  // why not, when not usable
};

struct DoctorReport {
  // The build.
  std::string version;     // "0.1.0"
  std::string build_type;  // "RelWithDebInfo"
  std::string compiler;    // "GNU 12.2.0"
  std::string ucx_option;  // -DDCR_UCX as configured: AUTO, ON, OFF
  std::string cuda_option;
  bool cuda_compiler_found = false;  // nvcc found at configure time
  bool sanitized = false;

  std::vector<TransportSupport> transports;  // ProbeTransports()

  std::string openssl_version;  // OpenSSL_version(OPENSSL_VERSION)

  bool cuda_built = false;  // CUDA kernels compiled in (cuda/)
  bool gpu_present = false;
  std::string gpu_detail;  // the GPUs found, or why none
  // From the CUDA runtime (cuda_built only): versions as 13000 for 13.0,
  // the driver's 0 when there is none.
  int cuda_driver_version = 0;
  int cuda_runtime_version = 0;
  std::vector<cuda::DeviceInfo> gpus;  // empty: none usable

  // The CPU kernels picked at run time for this CPU: the digest's
  // ("vpclmulqdq", "vpclmulqdq/avx2", "pclmul", "generic") and the context
  // coder's scan ("avx512vbmi2", "avx512", "avx2", "generic").
  std::string digest_kernel;
  std::string context_scan;

  // With a topology.
  std::string topology;
  std::string node;  // empty: the root's view
  std::vector<DoctorNeed> needs;
  bool tls_needed = false;  // the topology (or flags) turn TLS on
  bool tls_usable = true;   // its files load
  std::string tls_detail;   // the files' error, when not usable

  // True iff everything the topology needs here is usable (true without a
  // topology).
  bool ready() const;
};

// Probes the build and the machine and, with options.topology, checks
// what the topology needs. Errors: the topology does not load or build a
// tree, or options.node is not one of its relays.
Result<DoctorReport> BuildDoctorReport(const DoctorOptions& options);

std::string DoctorReportText(const DoctorReport& report);
std::string DoctorReportJson(const DoctorReport& report);

// Builds and prints the report on stdout; returns the exit code (kExitOk,
// kExitNotReady, or the code of an error reported on stderr).
int RunDoctor(const DoctorOptions& options);

// Registers `dcr doctor`.
void AddDoctorCommand(CLI::App* app, GlobalOptions* g, int* exit_code);

}  // namespace dcr::cli

#endif  // DCR_CLI_DOCTOR_H_
