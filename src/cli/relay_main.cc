// dcr-relay: the daemon on each rollout node. Receives a refit's chunks
// from its parent, forwards them to its children and applies them to its
// store in place (src/relay/relay.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <tuple>

#include "cli/cli_common.h"
#include "cli/doctor.h"
#include "cli/relay_objstore.h"
#include "cli/relay_topology.h"
#include "cli/relay_watchdog.h"
#include "common/bytes.h"
#include "common/failpoint.h"
#include "common/file.h"
#include "common/log.h"
#include "common/metrics.h"
#include "dcr/topology.h"
#include "relay/memory_budget.h"
#include "relay/relay.h"
#include "relay/relay_stats.h"
#include "wire/hmac_authenticator.h"
#include "wire/signature.h"

namespace {

using namespace dcr;

struct Args {
  std::string topology;
  std::string node;
  std::string name;
  std::string listen;
  std::string store;
  int metrics_port = -1;
  std::string metrics_host = "0.0.0.0";
  std::string ready_file;
  std::string log_format = "text";
  bool verbose = false;
  size_t apply_threads = 0;  // 0: the topology's, else kDefaultApplyThreads
  std::string apply_window = "64MiB";
  std::string memory_limit;
  std::string data_sync = "background";
  std::string write_back_delay = "30s";
  std::string undo_dir;
  std::string serving_layout;
  std::optional<uint32_t> serving_rank;
  std::string serving_socket;
  std::string serving_deadline = "5s";
  std::string on_commit;
  std::string on_commit_timeout = "60s";
  std::string link_rate;
  std::string connect_timeout = "5s";
  std::string prepared_wait = "10min";
  std::string hello_timeout = "10s";
  std::string idle_timeout = "60s";
  std::string auth_key_file;
  std::string signing_public_key_file;
  std::vector<std::string> allow_peers;
  TlsOptions tls;  // --tls-ca-file, --tls-cert-file, --tls-key-file
  bool doctor = false;
  std::string output = "text";  // of --doctor
};

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& s) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument(fmt::format(
        "--listen '{}': expected HOST:PORT, e.g. 0.0.0.0:17001", s));
  }
  std::string host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(s.substr(colon + 1), &used);
    if (used != s.size() - colon - 1) port = -1;
  } catch (...) {
  }
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument(
        fmt::format("--listen '{}': the port must be 0-65535", s));
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

int Run(const Args& a) {
  using namespace dcr::cli;
  RelayOptions o;
  int metrics_port = a.metrics_port;
  // Where the frame key comes from, for error messages.
  std::string key_file = a.auth_key_file;
  std::string key_origin = "--auth-key-file";
  // The root's signing public key, and where it came from.
  std::string public_key_file = a.signing_public_key_file;
  std::string public_key_origin = "--signing-public-key-file";
  uint32_t topology_threads = kDefaultApplyThreads;
  std::string threads_origin = "the default";
  if (!a.topology.empty()) {
    if (a.node.empty()) {
      return ReportError(Status::InvalidArgument(
          "--topology needs --node NAME: which node of the topology this is"));
    }
    auto topo = LoadTopology(a.topology);
    if (!topo.ok()) return ReportError(topo.status());
    const NodeSpec* n = topo->FindNode(a.node);
    if (!n) {
      return ReportError(Status::NotFound(
          fmt::format("{}: no relay named '{}' (dcr topo show {} lists them)",
                      a.topology, a.node, a.topology)));
    }
    o.name = n->name;
    topology_threads = ApplyThreads(topo->defaults);
    if (topo->defaults.apply_threads != 0) {
      threads_origin = a.topology + " defaults.apply_threads";
    }
    if (Status s = UseTree(*topo, a.allow_peers, &o); !s.ok()) {
      return ReportError(s);
    }
    o.listen_host = n->host;
    o.listen_port = n->port;
    o.store = FromTopology(n->store);
    if (n->serving) {
      // The layout as the tree resolves it (the node's, else its
      // cluster's).
      auto tree = BuildTree(*topo);
      if (!tree.ok()) return ReportError(tree.status());
      const int i = tree->Find(n->name);
      if (i < 0 || !tree->nodes[static_cast<size_t>(i)].serving) {
        return ReportError(Status::Internal(fmt::format(
            "{}: node '{}' serves, but the tree built from the topology "
            "does not say which rank",
            a.topology, n->name)));
      }
      o.serving_layout = tree->nodes[static_cast<size_t>(i)].serving->layout;
      o.serving_rank = tree->nodes[static_cast<size_t>(i)].serving->rank;
      o.serving_socket = tree->nodes[static_cast<size_t>(i)].serving->socket;
    }
    // The head of a source: objstore cluster pulls its chunks from the
    // topology's object store, opened now (cli/relay_objstore.h).
    auto objects = dcr::cli::OpenPullingHeadStore(*topo, a.topology, n->name);
    if (!objects.ok()) return ReportError(objects.status());
    o.objects = std::move(*objects);
    if (metrics_port < 0 && n->metrics_port) metrics_port = *n->metrics_port;
    if (key_file.empty() && !topo->defaults.auth_key_file.empty()) {
      key_file = topo->defaults.auth_key_file;
      key_origin = a.topology + ": defaults.auth_key_file";
    }
    if (public_key_file.empty() &&
        !topo->defaults.signing_public_key_file.empty()) {
      public_key_file = topo->defaults.signing_public_key_file;
      public_key_origin = a.topology + ": defaults.signing_public_key_file";
    }
    if (Status s = UseTlsOptions(&*topo, &a.tls, &o.transport_options);
        !s.ok()) {
      return ReportError(s);
    }
  } else {
    if (a.name.empty() || a.listen.empty() || a.store.empty()) {
      return ReportError(Status::InvalidArgument(
          "give --topology F --node NAME, or all of --name, --listen and "
          "--store"));
    }
    o.name = a.name;
    if (Status s = UseTlsOptions(nullptr, &a.tls, &o.transport_options);
        !s.ok()) {
      return ReportError(s);
    }
  }
  if (!a.listen.empty()) {
    auto hp = ParseHostPort(a.listen);
    if (!hp.ok()) return ReportError(hp.status());
    o.listen_host = hp->first;
    o.listen_port = hp->second;
  }
  if (!a.store.empty()) {
    auto spec = ParseStoreSpec(a.store);
    if (!spec.ok()) return ReportError(spec.status());
    o.store = *spec;
  }
  o.undo_dir = a.undo_dir;
  if (!a.serving_layout.empty() || a.serving_rank) {
    if (a.serving_layout.empty() || !a.serving_rank) {
      return ReportError(Status::InvalidArgument(
          "give both --serving-layout FILE and --serving-rank N"));
    }
    o.serving_layout = a.serving_layout;
    o.serving_rank = *a.serving_rank;
  }
  if (!a.serving_socket.empty()) o.serving_socket = a.serving_socket;
  o.on_commit = a.on_commit;
  o.store.data_sync = a.data_sync == "commit"
                          ? StoreSpec::DataSync::kAtCommit
                          : StoreSpec::DataSync::kBackground;
  auto delay = ParseDurationNs(a.write_back_delay);
  if (!delay.ok() || *delay > uint64_t{24} * 3600 * 1000000000) {
    return ReportError(Status::InvalidArgument(fmt::format(
        "--write-back-delay '{}': give a duration up to 24h, e.g. 30s (0: "
        "at once)",
        a.write_back_delay)));
  }
  o.store.write_back_delay = std::chrono::milliseconds(*delay / 1000000);
  o.apply_threads = a.apply_threads != 0 ? a.apply_threads : topology_threads;
  if (a.apply_threads != 0) threads_origin = "--apply-threads";
  auto window = ParseSize(a.apply_window);
  if (!window.ok()) return ReportError(window.status());
  o.apply_window_bytes = std::max<uint64_t>(*window, 1u << 20);
  bool default_limit = false;
  uint64_t machine = 0;
  if (a.memory_limit.empty() || a.memory_limit == "auto") {
    default_limit = true;
    machine = MachineMemoryBytes();
    o.memory_limit_bytes = DefaultMemoryLimit(
        machine, o.apply_threads, o.transport_options.frames.max_payload);
  } else {
    auto limit = ParseSize(a.memory_limit);
    if (!limit.ok()) {
      return ReportError(Status::InvalidArgument(
          "--memory-limit: " + std::string(limit.status().message())));
    }
    o.memory_limit_bytes = *limit;
    if (o.memory_limit_bytes == 0) {
      return ReportError(Status::InvalidArgument(
          "--memory-limit 0: give a size such as 1GiB, or leave it out for "
          "the default (a quarter of the machine's memory, at most 2GiB)"));
    }
  }
  if (!a.link_rate.empty()) {
    auto bps = ParseBandwidth(a.link_rate);
    if (!bps.ok()) return ReportError(bps.status());
    o.transport_options.max_send_bps = *bps;
  }
  auto ct = ParseDurationNs(a.connect_timeout);
  if (!ct.ok()) return ReportError(ct.status());
  o.connect_timeout = std::chrono::milliseconds(*ct / 1000000);
  auto pw = ParseDurationNs(a.prepared_wait);
  if (!pw.ok() || *pw < 1000000) {
    return ReportError(Status::InvalidArgument(
        fmt::format("--prepared-wait '{}': give a duration of at least 1ms, "
                    "e.g. 10min",
                    a.prepared_wait)));
  }
  o.prepared_wait = std::chrono::milliseconds(*pw / 1000000);
  for (auto [flag, text, out] :
       {std::tuple{"--hello-timeout", &a.hello_timeout, &o.hello_timeout},
        std::tuple{"--idle-timeout", &a.idle_timeout, &o.idle_timeout},
        std::tuple{"--serving-deadline", &a.serving_deadline,
                   &o.serving_deadline},
        std::tuple{"--on-commit-timeout", &a.on_commit_timeout,
                   &o.on_commit_timeout}}) {
    auto ns = ParseDurationNs(*text);
    if (!ns.ok() || *ns < 100000000) {
      return ReportError(Status::InvalidArgument(
          fmt::format("{} '{}': give a duration of at least 100ms, e.g. 10s",
                      flag, *text)));
    }
    *out = std::chrono::milliseconds(*ns / 1000000);
  }
  // Loaded before anything is logged, so that its error stays one line.
  if (!public_key_file.empty()) {
    auto key = Ed25519PublicKey::Load(public_key_file);
    if (!key.ok()) {
      ReportError(key.status().WithContext(public_key_origin));
      return kExitUsage;
    }
    o.signing_public_key = *std::move(key);
  }
  if (!key_file.empty()) {
    auto key = LoadFrameKey(key_file);
    if (!key.ok()) {
      ReportError(key.status().WithContext(key_origin));
      return kExitUsage;  // whatever went wrong, the configuration is bad
    }
    o.transport_options.frames.authenticator = *std::move(key);
    spdlog::info("{}: frames are authenticated (HMAC-SHA256, key file {})",
                 o.name, key_file);
  }
  if (o.signing_public_key) {
    spdlog::info(
        "{}: refits must be signed by the root (Ed25519, public key file {})",
        o.name, public_key_file);
  }
  spdlog::info("{}: {} apply threads ({})", o.name, o.apply_threads,
               threads_origin);
  if (default_limit) {
    spdlog::info(
        "{}: default memory limit {}: a quarter of this machine's {} (its "
        "cgroup's limit if lower), at most {}{}; --memory-limit sets another",
        o.name, HumanBytes(o.memory_limit_bytes), HumanBytes(machine),
        HumanBytes(kDefaultMemoryLimitMax),
        o.memory_limit_bytes > kDefaultMemoryLimitMax
            ? fmt::format(", or the least {} apply threads need",
                          o.apply_threads)
            : std::string());
  }
  if (o.transport_options.tls.enabled()) {
    spdlog::info("{}: links use TLS, mutual certificates (CA {}, cert {})",
                 o.name, o.transport_options.tls.ca_file,
                 o.transport_options.tls.cert_file);
  }

  // Signals are taken by sigwait in this thread only: block them before
  // any thread starts so every thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto relay = Relay::Start(o);
  if (!relay.ok()) {
    int rc = ReportError(relay.status());
    return rc == kExitUsage ? kExitUsage : kExitFailed;
  }
  std::unique_ptr<MetricsServer> metrics;
  if (metrics_port >= 0) {
    Relay* r = relay->get();
    std::string node = o.name;
    auto server = MetricsServer::Start(
        a.metrics_host, static_cast<uint16_t>(metrics_port),
        [r, node, limit = o.memory_limit_bytes] {
          return RenderRelayMetrics(r->Stats(), node, AnonResidentBytes(),
                                    limit);
        });
    if (!server.ok()) {
      std::fprintf(stderr, "dcr-relay: error: %s\n",
                   std::string(server.status().message()).c_str());
      return kExitFailed;
    }
    metrics = *std::move(server);
    spdlog::info("{}: metrics on http://{}:{}/metrics", o.name, a.metrics_host,
                 metrics->port());
  }
  if (!a.ready_file.empty()) {
    std::string text = fmt::format(
        "{{\"node\":\"{}\",\"port\":{},\"metrics_port\":{},\"pid\":{}}}\n",
        o.name, (*relay)->port(), metrics ? int(metrics->port()) : -1,
        static_cast<long>(getpid()));
    Status s = WriteFileAtomic(
        a.ready_file,
        std::as_bytes(std::span<const char>(text.data(), text.size())));
    if (!s.ok()) {
      std::fprintf(stderr, "dcr-relay: error: --ready-file: %s\n",
                   std::string(s.message()).c_str());
      return kExitFailed;
    }
  }
  // Under systemd (Type=notify): ready now; WATCHDOG=1 while healthy.
  RelayWatchdog watchdog(
      relay->get(),
      fmt::format("port {}{}", (*relay)->port(),
                  metrics ? fmt::format(", metrics port {}", metrics->port())
                          : std::string()));
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("{}: {} received, stopping", o.name, strsignal(sig));
  watchdog.Stop();
  if (metrics) metrics->Stop();
  (*relay)->Stop();
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "dcr-relay: receive refits from the parent relay, forward them to the "
      "children and\napply them in place to this node's weight store.",
      "dcr-relay");
  app.set_version_flag("--version", "dcr-relay 0.1.0");
  dcr::cli::SetProgramName("dcr-relay");
  if (auto s = dcr::InitFailpointsFromEnv(); !s.ok()) {
    return dcr::cli::ReportError(s);
  }
  dcr::cli::UseOneLineUsageErrors(&app);
  app.add_option("-t,--topology", a.topology, "Topology YAML file");
  app.add_option("-n,--node", a.node, "This node's name in the topology");
  app.add_option("--name", a.name, "Node name (without --topology)");
  app.add_option("--listen", a.listen,
                 "HOST:PORT to listen on (default: the node's in the "
                 "topology)");
  app.add_option("--store", a.store,
                 "Weight store: file:PATH, shm:NAME or memory: (default: the "
                 "node's in the topology)");
  app.add_option("--metrics-port", a.metrics_port,
                 "Serve Prometheus metrics on this port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", a.metrics_host,
                 "Address for the metrics endpoint (default 0.0.0.0)");
  app.add_option("--ready-file", a.ready_file,
                 "Write {node, port, metrics_port, pid} as JSON here once "
                 "listening");
  app.add_option("--log-format", a.log_format, "Log format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_flag("-v,--verbose", a.verbose, "Log debug detail");
  app.add_option("--apply-threads", a.apply_threads,
                 "Threads applying chunks and hashing (default: the "
                 "topology's defaults.apply_threads, else 2)")
      ->check(CLI::Range(uint32_t{1}, kMaxApplyThreads));
  app.add_option("--apply-window", a.apply_window,
                 "Received-but-unapplied bytes before reading pauses "
                 "(default 64MiB)");
  app.add_option("--memory-limit", a.memory_limit,
                 "Keep the relay's memory outside its store under this, "
                 "e.g. 1GiB: sizes the windows, the resend buffer, the frame "
                 "bound and the inbound links from it (at least about "
                 "220MiB with 2 apply threads; default, or auto: a quarter "
                 "of the machine's memory, or of its cgroup's limit if "
                 "lower, at most 2GiB)");
  app.add_option("--hello-timeout", a.hello_timeout,
                 "Close an inbound connection that has not sent a valid "
                 "HELLO within this (default 10s)");
  app.add_option("--idle-timeout", a.idle_timeout,
                 "Close an inbound connection that greeted and then sent "
                 "nothing for this, unless it is the refit's parent "
                 "(default 60s). When every slot is taken, a new "
                 "connection takes the slot of one silent for 2s");
  app.add_option("--data-sync", a.data_sync,
                 "When a file store's data reaches the disk: background "
                 "(default: the commit is acknowledged once the version "
                 "record is durable, the data follows in the background, "
                 "and a restart after a reboot re-checks the bits) or "
                 "commit (before the commit is acknowledged)")
      ->check(CLI::IsMember({"background", "commit"}));
  app.add_option("--write-back-delay", a.write_back_delay,
                 "With --data-sync background: how long after a commit the "
                 "write-back starts (default 30s, the kernel's own expiry "
                 "of dirty pages; 0: at once). Commits closer together "
                 "share one write-back, and a refit that comes sooner does "
                 "not fault on every page it changes. A clean shutdown "
                 "writes back at once");
  app.add_option("--undo-dir", a.undo_dir,
                 "Directory for refits' journals (default: beside the "
                 "store's version record). A full refit's journal holds "
                 "every value it replaces, up to the store's size: keep it "
                 "on a disk when the store is in shared memory");
  app.add_option("--serving-layout", a.serving_layout,
                 "Keep one serving rank's shards in the store instead of "
                 "the canonical checkpoint: the serving layout file "
                 "(docs/PLACEMENT.md; overrides the topology's `serving`)");
  app.add_option("--serving-rank", a.serving_rank,
                 "With --serving-layout: the rank whose shards the store "
                 "holds");
  app.add_option("--serving-socket", a.serving_socket,
                 "A serving process computes on the store: keep it as two "
                 "shm images, flip them at COMMIT and speak the pause "
                 "protocol on this Unix socket (docs/PROTOCOL.md; overrides "
                 "the topology's serving.socket)");
  app.add_option("--serving-deadline", a.serving_deadline,
                 "How long a yes vote waits for the serving process's "
                 "answer before it is a no")
      ->default_val("5s");
  app.add_option("--on-commit", a.on_commit,
                 "Run this shell command after each refit the relay "
                 "commits, with DCR_STEP, DCR_DIGEST, DCR_REFIT, DCR_NODE, "
                 "DCR_STORE and DCR_IMAGE set; its output goes to the log "
                 "and it never delays the refit (docs/PLACEMENT.md)");
  app.add_option("--on-commit-timeout", a.on_commit_timeout,
                 "Kill an --on-commit command still running after this")
      ->default_val("60s");
  app.add_option("--link-rate", a.link_rate,
                 "Pace each link to children to this bandwidth, e.g. "
                 "500Mbps (testing without tc)");
  app.add_option("--connect-timeout", a.connect_timeout,
                 "Timeout connecting to a child (default 5s)");
  app.add_option("--allow-peer", a.allow_peers,
                 "With --topology: also take connections from this IP "
                 "address (repeatable; e.g. an operator's host running dcr "
                 "status); by default only the topology's hosts may connect");
  app.add_option("--prepared-wait", a.prepared_wait,
                 "After voting, how long to wait for the decision when the "
                 "parent is gone (a new parent, or dcr refit --resume) "
                 "before restoring the base (default 10min)");
  app.add_option("--auth-key-file", a.auth_key_file,
                 "Authenticate every frame with HMAC-SHA256 keyed from this "
                 "file (mode 600, 32+ random bytes; default: the topology's "
                 "defaults.auth_key_file)");
  app.add_option("--tls-ca-file", a.tls.ca_file,
                 "TLS on every link: the CA (PEM) that signs every node's "
                 "certificate (default: the topology's defaults.tls_ca_file)");
  app.add_option("--tls-cert-file", a.tls.cert_file,
                 "TLS: this node's certificate chain (PEM; default: "
                 "defaults.tls_cert_file)");
  app.add_option("--tls-key-file", a.tls.key_file,
                 "TLS: this node's private key (PEM, unencrypted; default: "
                 "defaults.tls_key_file)");
  app.add_option("--signing-public-key-file", a.signing_public_key_file,
                 "Vote yes only on refits whose chunks the root signed: its "
                 "Ed25519 public key (PEM, from dcr keygen; default: the "
                 "topology's defaults.signing_public_key_file)");
  app.add_flag("--doctor", a.doctor,
               "Print what this build and machine support for relay links "
               "(as dcr doctor; with --topology: for this node) and exit "
               "without starting");
  app.add_option("-o,--output", a.output,
                 "With --doctor: text or json on stdout")
      ->check(CLI::IsMember({"text", "json"}));
  app.footer(
      "\nRuns in the foreground until SIGTERM or SIGINT; a refit in progress "
      "is then\naborted and the store restored to its base bits.\n\n"
      "With a key file (--auth-key-file, or defaults.auth_key_file of the "
      "topology), every\nframe is signed and checked with HMAC-SHA256; the "
      "root and every relay need the\nsame key (head -c 32 /dev/urandom > "
      "key && chmod 600 key).\n\n"
      "Examples:\n"
      "  dcr-relay --topology topology/local.yaml --node a0 --metrics-port "
      "9101\n"
      "  dcr-relay --name a0 --listen 0.0.0.0:17001 --store "
      "file:/models/policy.safetensors\n"
      "  dcr-relay --doctor --topology topology/local.yaml --node a0\n\n"
      "Exit codes: 0 stopped by a signal, 1 runtime failure, 2 usage or "
      "configuration error;\n--doctor: 0 report printed (with --topology: "
      "everything this node needs is\nusable here), 6 a transport (or the "
      "TLS files) it needs is not usable.\n");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : dcr::cli::kExitUsage;
  }
  auto fmt = dcr::ParseLogFormat(a.log_format);
  dcr::InitLogging(fmt.ok() ? *fmt : dcr::LogFormat::kText,
                   a.verbose ? spdlog::level::debug : spdlog::level::info);
  if (a.doctor) {
    dcr::cli::DoctorOptions d;
    d.topology = a.topology;
    d.node = a.node;
    d.format = a.output == "json" ? dcr::cli::OutputFormat::kJson
                                  : dcr::cli::OutputFormat::kText;
    d.tls_flags = &a.tls;
    return dcr::cli::RunDoctor(d);
  }
  return Run(a);
}
