// `dcr status`: every relay's committed version and state, and the
// root's (src/coord/status_query.cc does the asking).
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/refit_cli.h"
#include "common/bytes.h"
#include "coord/coordinator.h"  // QueryStatus
#include "coord/state_dir.h"
#include "dcr/store.h"
#include "dcr/topology.h"

namespace dcr::cli {

using json = nlohmann::json;

int RunStatusCommand(const std::string& path, const std::string& timeout_text,
                     const GlobalOptions& g) {
  auto topo = LoadTopology(path);
  if (!topo.ok()) return ReportError(topo.status());
  auto timeout = ParseTimeout(timeout_text);
  if (!timeout.ok()) return ReportError(timeout.status());
  TransportOptions transport_options;
  if (int rc = UseTopologyKey(*topo, &transport_options); rc != kExitOk) {
    return rc;
  }
  if (Status s = UseTlsOptions(&*topo, nullptr, &transport_options); !s.ok()) {
    return ReportError(s);
  }
  std::vector<NodeStatus> nodes =
      QueryStatus(*topo, *timeout, "", transport_options);
  // The root's side: its baseline's version and the last refit's report.
  json root = {{"name", topo->root.name}};
  if (!topo->root.baseline.empty()) {
    StoreSpec spec;
    spec.kind = StoreSpec::Kind::kFile;
    spec.path = topo->root.baseline;
    auto rec = ReadVersionRecord(DefaultRecordPath(spec));
    root["baseline"] = topo->root.baseline;
    if (rec.ok() && *rec && (*rec)->committed) {
      const Version& v = (*rec)->committed->version;
      root["baseline_version"] = {{"step", v.step},
                                  {"digest", v.digest.ToHex()}};
    }
  }
  json last;
  if (!topo->root.state_dir.empty()) {
    auto report = StateDir(topo->root.state_dir).ReadLastRefit();
    if (report.ok()) {
      last = json::parse(report->ToJson());
    } else if (!report.status().IsNotFound()) {
      std::fprintf(stderr, "dcr: last refit not shown: %s\n",
                   report.status().ToString().c_str());
    }
  }
  // A relay is stale when it holds another version than the baseline.
  std::optional<Version> baseline_version;
  if (root.contains("baseline_version")) {
    auto d = Digest128::FromHex(root["baseline_version"].value("digest", ""));
    if (d.ok()) {
      baseline_version =
          Version{root["baseline_version"].value("step", uint64_t{0}), *d};
    }
  }
  auto stale = [&](const NodeStatus& n) {
    return n.reachable && baseline_version &&
           (!n.committed || *n.committed != *baseline_version);
  };
  // Exit 1 when a relay cannot be reached or holds an unfinished refit's
  // mix; a stale relay holds a whole (older) version.
  bool all_whole = true;
  for (const NodeStatus& n : nodes) {
    const NodeState st = StateOf(n, baseline_version);
    all_whole &= st != NodeState::kUnreachable &&
                 st != NodeState::kUnfinished && st != NodeState::kRepairing;
  }
  // The last refit's target, when it committed somewhere.
  std::optional<Version> last_target;
  if (last.is_object() && last.value("outcome", "") != "aborted" &&
      last.contains("target") && last["target"].is_object() &&
      last["target"].contains("digest") &&
      last["target"]["digest"].is_string()) {
    auto d = Digest128::FromHex(last["target"].value("digest", ""));
    if (d.ok()) {
      last_target = Version{last["target"].value("step", uint64_t{0}), *d};
    }
  }
  auto last_for = [&](const NodeStatus& s) -> std::string {
    if (!last.is_object() || !last.contains("nodes")) return "";
    for (const json& n : last["nodes"]) {
      if (n.value("node", "") != s.node) continue;
      if (n.value("committed", false)) return "committed";
      // Its COMMIT_REPLY was lost (or came late), but the version it
      // reports now is the refit's target: it committed.
      if (last_target && s.committed && *s.committed == *last_target) {
        return "committed (reply lost; its version confirms it)";
      }
      return n.value("code", "") + (n.value("phase", "").empty()
                                        ? ""
                                        : " at " + n.value("phase", ""));
    }
    return "";
  };
  // A coordinator run holding root.state_dir (read without locking it).
  std::optional<LockHolder> running;
  if (!topo->root.state_dir.empty()) {
    running = StateDir(topo->root.state_dir).Running();
  }
  if (g.format() == OutputFormat::kJson) {
    if (running) {
      root["running"] = {{"pid", running->pid},
                         {"command", running->command},
                         {"since", running->since}};
    } else {
      root["running"] = nullptr;
    }
    json out = {{"root", root}, {"nodes", json::array()}};
    if (!last.is_null()) out["last_refit"] = last;
    for (const NodeStatus& n : nodes) {
      json j = {
          {"node", n.node},
          {"cluster", n.cluster},
          {"address", n.address},
          {"reachable", n.reachable},
          {"error", n.error},
          {"code", std::string(NodeCodeName(n.code))},
          {"detail", n.detail},
          {"last_refit_result", last_for(n)},
          {"stale", stale(n)},
          {"state", std::string(NodeStateName(StateOf(n, baseline_version)))},
          {"serving_ready", ServingReady(StateOf(n, baseline_version))}};
      if (n.store.unfinished) {
        j["unfinished"] = {
            {"refit", n.store.unfinished->ToHex()},
            {"base",
             {{"step", n.store.base.step},
              {"digest", n.store.base.digest.ToHex()}}},
            {"target",
             {{"step", n.store.target.step},
              // null: not known yet (the relay stopped
              // before END named it).
              {"digest", n.store.target.digest == Digest128{}
                             ? nlohmann::json()
                             : nlohmann::json(n.store.target.digest.ToHex())}}},
            {"prepared", n.store.prepared},
            {"repairing", n.store.repairing}};
      } else {
        j["unfinished"] = nullptr;
      }
      if (n.committed) {
        j["committed"] = {{"step", n.committed->step},
                          {"digest", n.committed->digest.ToHex()}};
      } else {
        j["committed"] = nullptr;
      }
      out["nodes"].push_back(std::move(j));
    }
    std::printf(
        "%s\n",
        out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    if (root.contains("baseline_version")) {
      const json& v = root["baseline_version"];
      std::printf("root %s: baseline step %llu (%s)\n", topo->root.name.c_str(),
                  static_cast<unsigned long long>(v.value("step", uint64_t{0})),
                  v.value("digest", "").substr(0, 12).c_str());
    }
    if (running) {
      std::printf("a refit is running (pid %lld, %s, since %s)\n",
                  static_cast<long long>(running->pid),
                  running->command.c_str(), running->since.c_str());
    }
    if (last.is_object()) {
      std::printf("last refit %s: %s, step %llu -> %llu\n",
                  last.value("refit", "?").c_str(),
                  last.value("outcome", "?").c_str(),
                  static_cast<unsigned long long>(
                      last["base"].value("step", uint64_t{0})),
                  static_cast<unsigned long long>(
                      last["target"].value("step", uint64_t{0})));
    }
    std::printf("%-10s %-12s %-21s %-6s %-14s %s\n", "NODE", "CLUSTER",
                "ADDRESS", "STEP", "DIGEST", "STATE");
    for (const NodeStatus& n : nodes) {
      std::string step = n.committed ? std::to_string(n.committed->step) : "-";
      std::string digest = n.committed ? n.committed->digest.ShortHex() : "-";
      std::string state =
          n.reachable
              ? (n.code == NodeCode::kOk
                     ? n.detail
                     : fmt::format("{} ({})", NodeCodeName(n.code), n.detail))
              : "unreachable: " + n.error;
      if (n.reachable && n.store.unfinished) {
        // The bits are no version: no step or digest to show.
        step = digest = "-";
        state = fmt::format("{}: {}; last committed step {}; {}",
                            n.store.repairing ? "REPAIRING" : "UNFINISHED",
                            DescribeUnfinished(n.store),
                            n.committed ? std::to_string(n.committed->step)
                                        : std::string("none"),
                            state);
      } else if (stale(n)) {
        state = fmt::format("STALE (baseline is step {}) {}",
                            baseline_version->step, state);
      }
      std::printf("%-10s %-12s %-21s %-6s %-14s %s\n", n.node.c_str(),
                  n.cluster.c_str(), n.address.c_str(), step.c_str(),
                  digest.c_str(), state.c_str());
    }
  }
  return all_whole ? kExitOk : kExitFailed;
}

}  // namespace dcr::cli
