// `dcr refit` and `dcr status`: the coordinator's commands (src/coord).
#include "dcr/refit.h"

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli_common.h"
#include "cli/refit_cli.h"
#include "cli/refit_progress.h"
#include "common/bytes.h"
#include "common/file.h"
#include "coord/coordinator.h"  // QueryStatus
#include "coord/state_dir.h"
#include "dcr/checkpoint.h"
#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/shard_delta.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "wire/hmac_authenticator.h"

namespace dcr::cli {

// Keys the frames of `options` from the topology's defaults.auth_key_file
// when it names one. Returns kExitOk, or kExitUsage after printing a
// one-line error that names the topology and the key file.
int UseTopologyKey(const Topology& topo, TransportOptions* options) {
  if (topo.defaults.auth_key_file.empty()) return kExitOk;
  auto key = LoadFrameKey(topo.defaults.auth_key_file);
  if (!key.ok()) {
    ReportError(
        key.status().WithContext(topo.source + ": defaults.auth_key_file"));
    return kExitUsage;
  }
  options->frames.authenticator = *std::move(key);
  return kExitOk;
}

Result<std::chrono::milliseconds> ParseTimeout(const std::string& s) {
  auto ns = ParseDurationNs(s);
  if (!ns.ok() || *ns < 1000000) {
    return Status::InvalidArgument(
        fmt::format("--timeout '{}': give a duration of at least 1ms, e.g. "
                    "30s or 500ms",
                    s));
  }
  return std::chrono::milliseconds(*ns / 1000000);
}

namespace {
std::string Pct(uint64_t part, uint64_t whole) {
  return whole ? fmt::format("{:.2f}%", 100.0 * part / whole) : "-";
}
}  // namespace

void PrintReport(const RefitReport& r) {
  // (A refit that ended before the stream hashed its target does not know
  // the target's digest.)
  std::printf(
      "refit %s %s: step %llu -> %llu (%s) in %.3f s\n",
      r.refit.ToHex().c_str(), std::string(RefitOutcomeName(r.outcome)).c_str(),
      static_cast<unsigned long long>(r.base.step),
      static_cast<unsigned long long>(r.target.step),
      r.target.digest == Digest128{} ? "digest not computed"
                                     : r.target.digest.ShortHex().c_str(),
      r.total_seconds);
  if (!r.reason.empty()) std::printf("  %s\n", r.reason.c_str());
  bool streamed = r.stream_seconds > 0;
  if (streamed && r.chunks == 0) {
    std::printf("  no element changed: nothing was sent\n");
    streamed = false;
  } else if (!streamed) {
    std::printf("  nothing was sent: the refit stopped after the plan\n");
  } else if (r.mode == RefitMode::kDelta) {
    std::printf("  changed %s of %llu elements\n",
                Pct(r.changed_elements, r.total_elements).c_str(),
                static_cast<unsigned long long>(r.total_elements));
  } else {
    std::printf("  full refit: every span sent as a dense overwrite\n");
  }
  if (streamed) {
    std::printf(
        "  payload %s in %llu chunks; checkpoint %s (%.1fx the payload)\n",
        HumanBytes(r.payload_bytes).c_str(),
        static_cast<unsigned long long>(r.chunks),
        HumanBytes(r.checkpoint_bytes).c_str(),
        r.payload_bytes ? double(r.checkpoint_bytes) / r.payload_bytes : 0.0);
  }
  std::string classes;
  for (auto& [cls, bytes] : r.link_class_bytes) {
    classes += fmt::format("{}{} {}", classes.empty() ? "" : ", ", cls,
                           HumanBytes(bytes));
  }
  std::printf("  bytes per link class: %s\n",
              classes.empty() ? "none" : classes.c_str());
  std::printf(
      "  phases: prepare %.3f s, plan %.3f s, stream %.3f s, vote %.3f s, "
      "commit %.3f s\n",
      r.prepare_seconds, r.plan_seconds, r.stream_seconds, r.vote_seconds,
      r.commit_seconds);
  if (r.applied_seconds > 0) {
    std::printf(
        "  every chunk applied everywhere %.3f s after the stream ended; the "
        "vote itself %.3f s\n",
        r.applied_seconds, std::max(0.0, r.vote_seconds - r.applied_seconds));
  }
  if (r.hashed_in_stream_seconds > 0) {
    std::printf(
        "  target hashed during the stream: %.3f s of the encoder's workers\n",
        r.hashed_in_stream_seconds);
  }
  if (r.baseline_in_stream_seconds > 0) {
    std::printf(
        "  root.baseline updated during the stream and the vote: %.3f s "
        "(%.3f s not hidden: the decision waited for it)\n",
        r.baseline_in_stream_seconds, r.baseline_waited_seconds);
  }
  for (const CatchUpReport& c : r.catch_up) {
    std::string how =
        c.method == "history"
            ? fmt::format("{} deltas from step {}", c.deltas, c.from.step)
        : c.method == "repair"
            ? fmt::format("overwrites of the change sets of {} deltas",
                          c.deltas)
        : c.method == "seed" ? std::string("dense copy into a new store")
                             : std::string("dense copy");
    std::printf(
        "  %s of %s: %s, %s in %llu chunks, %.3f s: %s\n",
        c.repaired.IsZero()
            ? (c.method == "seed" ? "seeding" : "catch-up")
            : fmt::format("repair (refit {})", c.repaired.ToHex().substr(0, 8))
                  .c_str(),
        fmt::format("{}", fmt::join(c.nodes, ", ")).c_str(), how.c_str(),
        HumanBytes(c.payload_bytes).c_str(),
        static_cast<unsigned long long>(c.chunks), c.seconds,
        std::string(RefitOutcomeName(c.outcome)).c_str());
  }
  size_t w = 4;
  for (const NodeOutcome& n : r.nodes) w = std::max(w, n.node.size());
  for (const NodeOutcome& n : r.nodes) {
    std::string result =
        n.committed
            ? fmt::format("committed ({} chunks applied){}", n.chunks_applied,
                          n.detail.empty() ? "" : "; " + n.detail)
        : n.phase.empty()
            ? std::string(r.outcome == RefitOutcome::kAborted ? "base restored"
                                                              : "not committed")
            : fmt::format("{} at {}: {}", NodeCodeName(n.code), n.phase,
                          n.detail);
    std::printf("  %-*s %-12s %s\n", static_cast<int>(w), n.node.c_str(),
                n.cluster.c_str(), result.c_str());
  }
}

int OutcomeExit(RefitOutcome outcome) {
  switch (outcome) {
    case RefitOutcome::kCommitted:
      return kExitOk;
    case RefitOutcome::kPartial:
      return kExitCommittedPartial;
    case RefitOutcome::kAborted:
    case RefitOutcome::kUnfinished:  // the reason says: --resume
      return kExitFailed;
  }
  return kExitFailed;
}

namespace {

using json = nlohmann::json;

struct RefitArgs {
  std::string topology;
  std::string target;
  bool full = false;
  bool no_compress = false;
  std::string context = "auto";
  std::string data_sync = "background";
  std::string timeout = "60s";
  std::string link_rate;
  std::string heartbeat = "1s";
  std::vector<std::string> nodes;
  bool resume = false;
  int repair_rounds = 2;
  bool no_catch_up = false;
  ProducerArgs p;  // producers' refits
};

int RunRefitCommand(const RefitArgs& a, const GlobalOptions& g) {
  auto topo = LoadTopology(a.topology);
  if (!topo.ok()) return ReportError(topo.status());
  auto timeout = ParseTimeout(a.timeout);
  if (!timeout.ok()) return ReportError(timeout.status());
  RefitOptions o;
  if (int rc = UseTopologyKey(*topo, &o.transport_options); rc != kExitOk) {
    return rc;
  }
  if (Status s = UseTlsOptions(&*topo, nullptr, &o.transport_options);
      !s.ok()) {
    return ReportError(s);
  }
  o.signing_key_file = topo->root.signing_key_file;
  o.topology = *std::move(topo);
  o.target = a.target;
  o.mode = a.full ? RefitMode::kFull : RefitMode::kDelta;
  if (a.resume && (!a.target.empty() || a.full || !a.nodes.empty())) {
    return ReportError(Status::InvalidArgument(
        "--resume finishes the refit recorded in root.state_dir: give no "
        "--target, --full or --node"));
  }
  if (a.p.producers > 0 &&
      (a.resume || !a.target.empty() || a.full || !a.nodes.empty())) {
    return ReportError(Status::InvalidArgument(
        "--producers streams the trainer's ranks' changes: give no --target, "
        "--full, --node or --resume"));
  }
  if (a.p.producers > 0 && a.p.layout.empty()) {
    return ReportError(Status::InvalidArgument(
        "--producers needs --layout (the layout file the trainer's ranks "
        "use)"));
  }
  if (a.p.producers == 0 && (!a.p.layout.empty() || a.p.refits != 0)) {
    return ReportError(
        Status::InvalidArgument("--layout and --refits go with --producers N"));
  }
  if (!a.resume && a.target.empty() && a.p.producers == 0) {
    return ReportError(Status::InvalidArgument(
        "--target is required (or --resume to finish an interrupted refit)"));
  }
  if (a.no_compress && !a.full) {
    return ReportError(Status::InvalidArgument(
        "--no-compress applies to full refits: add --full (deltas are always "
        "compressed)"));
  }
  o.compress_full = !a.no_compress;
  o.context_coding = a.context == "on"    ? RefitOptions::ContextCoding::kOn
                     : a.context == "off" ? RefitOptions::ContextCoding::kOff
                                          : RefitOptions::ContextCoding::kAuto;
  o.baseline_data_sync = a.data_sync == "commit"
                             ? StoreSpec::DataSync::kAtCommit
                             : StoreSpec::DataSync::kBackground;
  if (!a.nodes.empty() && !a.full) {
    return ReportError(Status::InvalidArgument(
        "--node seeds or repairs named relays with a full refit: add --full"));
  }
  o.only_nodes = a.nodes;
  o.phase_timeout = *timeout;
  if (a.heartbeat != "0") {
    auto hb = ParseDurationNs(a.heartbeat);
    if (!hb.ok() || *hb < 10000000 || *hb > 3600000000000ull) {
      return ReportError(Status::InvalidArgument(fmt::format(
          "--heartbeat '{}': give a duration from 10ms to 1h, e.g. 1s, or 0 "
          "to turn heartbeats off",
          a.heartbeat)));
    }
    o.heartbeat = std::chrono::milliseconds(*hb / 1000000);
  } else {
    o.heartbeat = std::chrono::milliseconds(0);
  }
  o.repair_rounds = a.repair_rounds;
  o.catch_up = !a.no_catch_up;
  o.threads = static_cast<size_t>(g.threads);
  if (!a.link_rate.empty()) {
    auto bps = ParseBandwidth(a.link_rate);
    if (!bps.ok()) return ReportError(bps.status());
    o.transport_options.max_send_bps = *bps;
  }
  std::unique_ptr<RefitProgress> progress;
  // A refit is a long transfer: a bar on a terminal, otherwise a line
  // every 5 s (logs of a training job), unless asked for silence.
  if (!g.quiet && g.progress != "never") {
    const RefitProgress::Style style =
        g.progress == "json"           ? RefitProgress::Style::kJson
        : ::isatty(STDERR_FILENO) == 1 ? RefitProgress::Style::kBar
                                       : RefitProgress::Style::kLines;
    o.on_progress = [&, style](const RefitOptions::Progress& p) {
      if (!progress) {
        progress = std::make_unique<RefitProgress>(
            a.full ? "refit --full" : "refit", style);
      }
      progress->Update(p);
    };
  }
  if (a.p.producers > 0) return RunProducerRefits(a.p, g, &o, &progress);
  auto report = a.resume ? ResumeRefit(o) : RunRefit(o);
  if (progress) progress->Finish();
  if (a.resume && !report.ok() && report.status().IsNotFound()) {
    std::fprintf(stderr, "dcr: %s\n",
                 std::string(report.status().message()).c_str());
    return kExitOk;
  }
  if (!report.ok()) return ReportError(report.status());
  if (g.format() == OutputFormat::kJson) {
    std::printf("%s\n", report->ToJson().c_str());
  } else {
    PrintReport(*report);
  }
  return OutcomeExit(report->outcome);
}

}  // namespace

void AddRefitCommands(CLI::App* app, GlobalOptions* g, int* exit_code) {
  {
    auto a = std::make_shared<RefitArgs>();
    auto* cmd = app->add_subcommand(
        "refit", "Send the target checkpoint's changes through the relay tree");
    cmd->add_option("-t,--topology", a->topology, "Topology YAML file")
        ->required();
    cmd->add_option("--target", a->target,
                    "The new checkpoint (.safetensors file, index or "
                    "directory)");
    cmd->add_flag("--full", a->full,
                  "Send every span as a dense overwrite (seeds new nodes; the "
                  "transport-only reference)");
    cmd->add_flag("--no-compress", a->no_compress,
                  "With --full: send the checkpoint's bytes as they are, "
                  "uncompressed (the transport-only reference; saves the "
                  "root's CPU where the WAN is fast)");
    cmd->add_option("--context", a->context,
                    "Delta refits: code chunks in the context of the base "
                    "bits (about 0.77x the payload, 2-3x the encode and "
                    "decode CPU). auto (default): whichever the cost model "
                    "predicts faster through this topology (dcr plan "
                    "--no-context compares)")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    cmd->add_option("--timeout", a->timeout,
                    "Deadline for each phase's replies (default 60s)");
    cmd->add_option("--data-sync", a->data_sync,
                    "When root.baseline's data reaches the disk: background "
                    "(default: after the commit, in the background; a "
                    "restart after a reboot re-checks the bits) or commit "
                    "(before the refit counts as committed)")
        ->check(CLI::IsMember({"background", "commit"}));
    cmd->add_flag("--resume", a->resume,
                  "Finish the refit a stopped coordinator left in "
                  "root.state_dir: commit it if its decision was recorded, "
                  "else abort it (exit 0 if there is none); refused while "
                  "another coordinator runs there");
    cmd->add_option("--node", a->nodes,
                    "With --full: refit only this relay (repeatable), fed "
                    "directly by the root, to seed or repair it at the "
                    "tree's current version (the target must be the "
                    "baseline's bits)");
    cmd->add_option("--heartbeat", a->heartbeat,
                    "Heartbeat interval on every tree link; a link silent "
                    "for 4 intervals is dropped and its subtree re-parented "
                    "(default 1s; 0: off)");
    cmd->add_option("--repair-rounds", a->repair_rounds,
                    "Times the root resends, as overwrites, the tensors that "
                    "receivers report as differing after the vote (default "
                    "2; 0: exclude them at once)")
        ->check(CLI::Range(0, 100));
    cmd->add_flag("--no-catch-up", a->no_catch_up,
                  "Leave relays that are versions behind stale instead of "
                  "bringing them up after the commit (from the delta "
                  "history in root.state_dir, else with a dense copy)");
    cmd->add_option("--producers", a->p.producers,
                    "Run producers' refits: wait for this many trainer ranks "
                    "(dcr.Producer; the layout's tp x pp x ep) to stream "
                    "their shards' changes, one refit per trainer step")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--layout", a->p.layout,
                    "With --producers: the layout YAML the ranks use "
                    "(docs/PLACEMENT.md); producers of another are refused");
    cmd->add_option("--listen", a->p.listen,
                    "With --producers: where producers connect (default "
                    "127.0.0.1:7480; 0.0.0.0:PORT for ranks on other hosts)");
    cmd->add_option("--producer-wait", a->p.producer_wait,
                    "With --producers: once the first rank of a step "
                    "connected, how long to wait for the others (default "
                    "60s); the missing ranks are named");
    cmd->add_option("--refits", a->p.refits,
                    "With --producers: stop after this many refits (default "
                    "0: until SIGINT or SIGTERM, which end the wait for the "
                    "next step; a refit in progress finishes)")
        ->check(CLI::Range(0, 1 << 30));
    cmd->add_option("--link-rate", a->link_rate,
                    "Pace each of the root's links to this bandwidth, e.g. "
                    "200Mbps (testing without tc)");
    AddOutputOption(cmd, g);
    AddWorkOptions(cmd, g, /*json_progress=*/true);
    cmd->footer(
        "\nThe baseline is root.baseline of the topology; every relay must "
        "hold it (or take\na --full refit). The refit commits on every "
        "receiver that verified the target\ndigest, if they are at least "
        "min_commit; then the baseline becomes the target. With\n"
        "defaults.auth_key_file set, every frame is signed and checked with "
        "HMAC-SHA256\n(dcr status uses the key too). With "
        "root.signing_key_file "
        "set, END carries a\nmanifest of every chunk's SHA-256 signed with "
        "that Ed25519 key (dcr keygen).\n\nExamples:\n"
        "  dcr refit --topology topology/local.yaml --target "
        "step42.safetensors\n"
        "  dcr refit --topology topology/local.yaml --target "
        "step42.safetensors "
        "--full -o json\n\n"
        "Progress goes to stderr, phase by phase (plan, stream, vote, "
        "repair, commit): a bar\non a terminal, a line every 5 s otherwise "
        "(--progress json: an object per line;\n--progress never or -q: "
        "none). The stream counts the chunk bytes every\nreceiver applied, "
        "not those queued.\n\n"
        "Exit codes: 0 committed everywhere, 3 committed with nodes excluded "
        "or unconfirmed,\n1 aborted (every relay restored its base) or "
        "unfinished (the commit reached no\nrelay: dcr refit --resume "
        "finishes it), 2 usage or configuration error, or\nanother "
        "coordinator is running on root.state_dir (its pid is named).\n");
    cmd->callback([=] { *exit_code = RunRefitCommand(*a, *g); });
  }
  {
    auto path = std::make_shared<std::string>();
    auto timeout = std::make_shared<std::string>("3s");
    auto* cmd = app->add_subcommand(
        "status", "Ask every relay of a topology for its committed version");
    cmd->add_option("-t,--topology", *path, "Topology YAML file")->required();
    cmd->add_option("--timeout", *timeout,
                    "How long to wait for each relay (default 3s)");
    AddOutputOption(cmd, g);
    cmd->footer(
        "\nExamples:\n  dcr status --topology topology/local.yaml\n"
        "  dcr status --topology topology/local.yaml -o json\n\n"
        "Each relay's state: current (the baseline's version), stale "
        "(another committed version), empty (none), unfinished (a mix of "
        "an unfinished refit's base and target: no version), "
        "unreachable.\n\n"
        "Exit codes: 0 every relay answered and none is unfinished, 1 some "
        "relay is unreachable or unfinished, 2 usage.\n");
    cmd->callback([=] { *exit_code = RunStatusCommand(*path, *timeout, *g); });
  }
}

}  // namespace dcr::cli
