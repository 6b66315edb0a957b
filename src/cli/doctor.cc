// `dcr doctor` / `dcr-relay --doctor`: the report (cli/doctor.h).
#include "cli/doctor.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "codec/context_scan.h"
#include "common/linear_digest.h"
#include "dcr/topology.h"

// The build's configuration, from src/cli/CMakeLists.txt.
#ifndef DCR_BUILD_VERSION
#define DCR_BUILD_VERSION "unknown"
#endif
#ifndef DCR_BUILD_TYPE
#define DCR_BUILD_TYPE ""
#endif
#ifndef DCR_BUILD_COMPILER
#define DCR_BUILD_COMPILER ""
#endif
#ifndef DCR_BUILD_UCX_OPTION
#define DCR_BUILD_UCX_OPTION ""
#endif
#ifndef DCR_BUILD_CUDA_OPTION
#define DCR_BUILD_CUDA_OPTION ""
#endif
#ifndef DCR_BUILD_CUDA_COMPILER_FOUND
#define DCR_BUILD_CUDA_COMPILER_FOUND 0
#endif
#ifndef DCR_BUILD_SANITIZED
#define DCR_BUILD_SANITIZED 0
#endif

namespace dcr::cli {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Text output lists at most this many node names per transport.
constexpr size_t kMaxNamesShown = 12;

// The path of `exe` in $PATH, or empty.
std::string FindOnPath(std::string_view exe) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "/usr/bin:/bin";
  while (true) {
    const size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + std::string(exe);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return "";
    rest.remove_prefix(colon + 1);
  }
}

// The GPUs nvidia-smi lists ("NVIDIA H200, driver 550.54.15"), one each.
std::vector<std::string> ListGpus(const std::string& nvidia_smi) {
  std::vector<std::string> out;
  const std::string cmd =
      "'" + nvidia_smi +
      "' --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) continue;
    const size_t comma = s.find(", ");
    if (comma != std::string::npos) {
      s = s.substr(0, comma) + ", driver " + s.substr(comma + 2);
    }
    out.push_back(s);
  }
  if (::pclose(p) != 0) out.clear();  // nvidia-smi failed: no driver
  return out;
}

std::string CudaVersion(int v) {
  return v == 0 ? std::string("none")
                : fmt::format("{}.{}", v / 1000, v % 1000 / 10);
}

// What the CUDA runtime sees, where this build has it: each device with
// its compute capability and whether CUDA IPC works (what applying into a
// serving process's buffers needs). Falls back on nvidia-smi's view.
void ProbeCudaRuntime(DoctorReport* r) {
  if (!r->cuda_built) return;
  auto rt = cuda::Probe();
  if (!rt.ok()) {
    r->gpu_detail += "; CUDA runtime: " + std::string(rt.status().message());
    return;
  }
  r->cuda_driver_version = rt.value().driver_version;
  r->cuda_runtime_version = rt.value().runtime_version;
  r->gpus = rt.value().devices;
  r->gpu_present = true;
  std::string list;
  for (const cuda::DeviceInfo& d : r->gpus) {
    list += fmt::format(
        "{}GPU {}: {}, compute capability {}.{}, {:.0f} GiB, {} SMs, CUDA IPC "
        "{}",
        list.empty() ? "" : "; ", d.index, d.name, d.cc_major, d.cc_minor,
        d.memory_bytes / 1073741824.0, d.multiprocessors,
        d.ipc ? "works" : "fails (" + d.ipc_detail + ")");
  }
  r->gpu_detail = fmt::format("{} (driver CUDA {}, runtime {})", list,
                              CudaVersion(r->cuda_driver_version),
                              CudaVersion(r->cuda_runtime_version));
}

void ProbeGpu(DoctorReport* r) {
  const bool dev = ::access("/dev/nvidia0", F_OK) == 0;
  const std::string smi = FindOnPath("nvidia-smi");
  std::vector<std::string> gpus;
  if (!smi.empty()) gpus = ListGpus(smi);
  r->gpu_present = dev || !gpus.empty();
  if (!gpus.empty()) {
    std::string list;
    for (size_t i = 0; i < gpus.size(); ++i) {
      list += fmt::format("{}GPU {}: {}", i ? "; " : "", i, gpus[i]);
    }
    r->gpu_detail = "GPU present (" + list + ")";
  } else if (dev) {
    r->gpu_detail = smi.empty()
                        ? "GPU present (/dev/nvidia0; nvidia-smi not found)"
                        : "GPU device /dev/nvidia0 present, but nvidia-smi "
                          "lists no GPU (driver not loaded?)";
  } else {
    r->gpu_detail = smi.empty()
                        ? "no GPU found (no /dev/nvidia0, no nvidia-smi)"
                        : "no GPU found (no /dev/nvidia0; nvidia-smi lists "
                          "none)";
  }
}

const char* YesNo(bool b) { return b ? "yes" : "no"; }

std::string JoinNames(const std::vector<std::string>& names, size_t most) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < most; ++i) {
    out += (i ? ", " : "") + names[i];
  }
  if (names.size() > most) {
    out += fmt::format(" and {} more", names.size() - most);
  }
  return out;
}

// Rows of cells as left-aligned columns two spaces apart; the last column
// is not padded.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size())
        line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string CudaText(const DoctorReport& r) {
  std::string s = r.cuda_built ? "built (kernels for sm_90 plus PTX)"
                  : r.cuda_option == "OFF"
                      ? "not built (-DDCR_CUDA=OFF)"
                      : "not built: no nvcc at configure time (put the CUDA "
                        "toolkit's bin on PATH and reconfigure)";
  return s + "; " + r.gpu_detail;
}

std::string CpuText(const DoctorReport& r) {
  std::string s = "digest kernel " + r.digest_kernel;
  if (r.digest_kernel == "pclmul") {
    s += " (no VPCLMULQDQ kernel for this CPU: votes and store hashes run at "
         "about a third of their speed on Zen 3, Ice Lake and later)";
  } else if (r.digest_kernel == "generic") {
    s += " (bitwise: no PCLMULQDQ kernel for this CPU; votes and store hashes "
         "are many times slower)";
  }
  return s + ", context scan " + r.context_scan;
}

}  // namespace

bool DoctorReport::ready() const {
  if (!tls_usable) return false;
  for (const DoctorNeed& n : needs) {
    if (!n.usable) return false;
  }
  return true;
}

Result<DoctorReport> BuildDoctorReport(const DoctorOptions& options) {
  DoctorReport r;
  r.version = DCR_BUILD_VERSION;
  r.build_type = DCR_BUILD_TYPE;
  r.compiler = DCR_BUILD_COMPILER;
  r.ucx_option = DCR_BUILD_UCX_OPTION;
  r.cuda_option = DCR_BUILD_CUDA_OPTION;
  r.cuda_compiler_found = DCR_BUILD_CUDA_COMPILER_FOUND != 0;
  r.sanitized = DCR_BUILD_SANITIZED != 0;
  r.openssl_version = OpenSSL_version(OPENSSL_VERSION);
  r.cuda_built = cuda::Built();
  r.digest_kernel = linear_digest::AllKernels().back().first;
  r.context_scan = ContextScans().back().first;

  std::optional<Topology> topo;
  std::optional<Tree> tree;
  int self = 0;  // the root: every node of the tree
  if (!options.topology.empty()) {
    DCR_ASSIGN_OR_RETURN(topo, LoadTopology(options.topology));
    DCR_ASSIGN_OR_RETURN(tree, BuildTree(*topo));
    if (!options.node.empty()) {
      self = tree->Find(options.node);
      if (self < 0) {
        return Status::NotFound(
            fmt::format("{}: no relay named '{}' (dcr topo show {} lists them)",
                        options.topology, options.node, options.topology));
      }
    }
    r.topology = options.topology;
    r.node = self == 0 ? "" : options.node;
  }

  r.transports = ProbeTransports();
  ProbeGpu(&r);
  ProbeCudaRuntime(&r);

  if (topo || (options.tls_flags && options.tls_flags->enabled())) {
    TransportOptions transport;
    Status s =
        UseTlsOptions(topo ? &*topo : nullptr, options.tls_flags, &transport);
    r.tls_needed = !s.ok() || transport.tls.enabled();
    r.tls_usable = s.ok();
    if (!s.ok()) r.tls_detail = std::string(s.message());
  }

  if (tree) {
    // A node needs the transport of the link into it and of the links to
    // every node below it: it adopts its grandchildren when a child fails.
    // The root's view is every node of the tree.
    for (int i : tree->Subtree(self)) {
      if (i == 0) continue;  // the root has no link into it
      const std::string kind(TransportKindName(tree->nodes[i].transport));
      auto need =
          std::find_if(r.needs.begin(), r.needs.end(),
                       [&](const DoctorNeed& n) { return n.kind == kind; });
      if (need == r.needs.end()) {
        DoctorNeed n;
        n.kind = kind;
        n.detail = "this build does not know transport '" + kind + "'";
        for (const TransportSupport& t : r.transports) {
          if (t.kind != kind) continue;
          n.usable = t.usable;
          n.detail = t.usable ? "" : t.detail;
        }
        r.needs.push_back(std::move(n));
        need = r.needs.end() - 1;
      }
      need->nodes.push_back(tree->nodes[i].name);
    }
  }
  return r;
}

std::string DoctorReportText(const DoctorReport& r) {
  std::string out =
      fmt::format("dcr {} ({}, {}; -DDCR_UCX={} -DDCR_CUDA={}{})\n\n",
                  r.version, r.build_type, r.compiler, r.ucx_option,
                  r.cuda_option, r.sanitized ? ", sanitized" : "");
  std::vector<std::vector<std::string>> rows = {
      {"TRANSPORT", "BUILT", "USABLE", "VERSION", "DETAIL"}};
  for (const TransportSupport& t : r.transports) {
    rows.push_back({t.kind, YesNo(t.built), YesNo(t.usable),
                    t.version.empty() ? "-" : t.version, t.detail});
  }
  out += Table(rows) + "\n";
  out += Table(
      {{"TLS", "built: " + r.openssl_version + " (TLS 1.2+ on TCP links)"},
       {"CUDA", CudaText(r)},
       {"CPU", CpuText(r)}});
  if (r.topology.empty() && !r.tls_needed) return out;

  out += "\n";
  if (!r.topology.empty()) {
    out +=
        r.node.empty()
            ? fmt::format("topology {}: the links of every node\n", r.topology)
            : fmt::format(
                  "topology {}, node {}: its link in and the links to the "
                  "nodes below it\n",
                  r.topology, r.node);
  }
  rows = {{"NEEDS", "USABLE", "FOR"}};
  for (const DoctorNeed& n : r.needs) {
    rows.push_back({n.kind, n.usable ? "yes" : "NO",
                    JoinNames(n.nodes, kMaxNamesShown) +
                        (n.usable ? "" : " (" + n.detail + ")")});
  }
  if (r.tls_needed) {
    rows.push_back({"TLS", r.tls_usable ? "yes" : "NO",
                    r.tls_usable ? "every TCP link (the files load)"
                                 : "every TCP link (" + r.tls_detail + ")"});
  }
  out += Table(rows);
  if (r.ready()) {
    out += "\nready: everything the topology needs is usable here\n";
  } else {
    std::string missing;
    for (const DoctorNeed& n : r.needs) {
      if (!n.usable) missing += (missing.empty() ? "" : ", ") + n.kind;
    }
    if (!r.tls_usable) missing += missing.empty() ? "TLS" : ", TLS";
    out += "\nNOT READY: not usable here: " + missing + "\n";
  }
  return out;
}

std::string DoctorReportJson(const DoctorReport& r) {
  OrderedJson j;
  j["build"] =
      OrderedJson{{"version", r.version},
                  {"build_type", r.build_type},
                  {"compiler", r.compiler},
                  {"options", OrderedJson{{"DCR_UCX", r.ucx_option},
                                          {"DCR_CUDA", r.cuda_option},
                                          {"DCR_SANITIZE", r.sanitized}}},
                  {"cuda_compiler_found", r.cuda_compiler_found}};
  OrderedJson transports = OrderedJson::array();
  for (const TransportSupport& t : r.transports) {
    transports.push_back(OrderedJson{{"kind", t.kind},
                                     {"built", t.built},
                                     {"usable", t.usable},
                                     {"version", t.version},
                                     {"detail", t.detail}});
  }
  j["transports"] = std::move(transports);
  j["tls"] = OrderedJson{{"built", true},
                         {"library", r.openssl_version},
                         {"needed", r.tls_needed},
                         {"usable", r.tls_usable},
                         {"detail", r.tls_detail}};
  OrderedJson gpus = OrderedJson::array();
  for (const cuda::DeviceInfo& d : r.gpus) {
    gpus.push_back(OrderedJson{
        {"index", d.index},
        {"name", d.name},
        {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
        {"memory_bytes", d.memory_bytes},
        {"multiprocessors", d.multiprocessors},
        {"pci_bus_id", d.pci_bus_id},
        {"ipc", d.ipc},
        {"ipc_detail", d.ipc_detail}});
  }
  j["cuda"] = OrderedJson{
      {"built", r.cuda_built},
      {"gpu_present", r.gpu_present},
      {"driver_version", r.cuda_driver_version == 0
                             ? OrderedJson()
                             : OrderedJson(CudaVersion(r.cuda_driver_version))},
      {"runtime_version",
       r.cuda_runtime_version == 0
           ? OrderedJson()
           : OrderedJson(CudaVersion(r.cuda_runtime_version))},
      {"devices", std::move(gpus)},
      {"detail", CudaText(r)}};
  j["cpu"] = OrderedJson{{"digest_kernel", r.digest_kernel},
                         {"context_scan", r.context_scan},
                         {"detail", CpuText(r)}};
  if (r.topology.empty()) {
    j["topology"] = nullptr;
  } else {
    OrderedJson needs = OrderedJson::array();
    for (const DoctorNeed& n : r.needs) {
      needs.push_back(OrderedJson{{"transport", n.kind},
                                  {"usable", n.usable},
                                  {"nodes", n.nodes},
                                  {"detail", n.detail}});
    }
    j["topology"] = OrderedJson{
        {"file", r.topology},
        {"node", r.node.empty() ? OrderedJson() : OrderedJson(r.node)},
        {"needs", std::move(needs)}};
  }
  j["ready"] = r.ready();
  return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

int RunDoctor(const DoctorOptions& options) {
  Result<DoctorReport> r = BuildDoctorReport(options);
  if (!r.ok()) return ReportError(r.status());
  const std::string text = options.format == OutputFormat::kJson
                               ? DoctorReportJson(*r)
                               : DoctorReportText(*r);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return r->ready() ? kExitOk : kExitNotReady;
}

void AddDoctorCommand(CLI::App* app, GlobalOptions* g, int* exit_code) {
  auto o = std::make_shared<DoctorOptions>();
  auto* cmd = app->add_subcommand(
      "doctor",
      "Show what this build and machine support for relay links (transports, "
      "TLS, CUDA)");
  auto* topology =
      cmd->add_option("-t,--topology", o->topology,
                      "Also check that every transport this topology uses is "
                      "usable here");
  cmd->add_option("-n,--node", o->node,
                  "With --topology: check for this relay only (its link in and "
                  "the links below it); default: every node")
      ->needs(topology);
  AddOutputOption(cmd, g);
  cmd->footer(
      std::string(
          "\nProbes each transport (for UCX: opens a context and a worker and "
          "lists the\ntransports it found), the TLS library and the GPU. "
          "dcr-relay --doctor prints the\nsame report on a relay's "
          "host.\n\nExamples:\n"
          "  dcr doctor\n"
          "  dcr doctor --topology topology/local.yaml -o json\n"
          "  dcr doctor --topology topology/two-region.yaml --node a0\n\n") +
      kDoctorExitCodeHelp);
  cmd->callback([o, g, exit_code] {
    o->format = g->format();
    *exit_code = RunDoctor(*o);
  });
}

}  // namespace dcr::cli
