#include "coord/catch_up.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <utility>

#include "coord/refit_report.h"
#include "coord/refit_run.h"
#include "coord/state_dir.h"

namespace dcr {
namespace {

// Runs one catch-up (a refit of `nodes` only, from the root) and folds its
// outcome into `report`. Returns the nodes it did not bring up to date
// that a dense copy may still help (they answered, with other bits).
std::vector<std::string> RunCatchUp(const RefitOptions& options,
                                    std::vector<std::string> nodes,
                                    std::vector<std::string> chain,
                                    const Version& from, RefitReport* report) {
  RefitOptions o = options;
  o.only_nodes = nodes;
  o.mode = chain.empty() ? RefitMode::kFull : RefitMode::kDelta;
  o.catch_up = false;
  CatchUpReport c;
  c.nodes = nodes;
  c.method = chain.empty() ? "dense" : "history";
  c.from = from;
  c.deltas = chain.size();
  spdlog::info("catching up {} from {}", fmt::join(nodes, ", "),
               chain.empty() ? std::string("nothing (a dense copy)")
                             : fmt::format("step {} ({} deltas)", from.step,
                                           chain.size()));
  RefitRun run(o, std::move(chain));
  auto sub = run.Run();
  std::vector<std::string> retry;
  if (!sub.ok()) {
    c.reason = sub.status().ToString();
    spdlog::warn("catch-up of {} failed: {}", fmt::join(nodes, ", "), c.reason);
    for (NodeOutcome& n : report->nodes) {
      if (std::count(nodes.begin(), nodes.end(), n.node)) {
        n.detail += "; catch-up failed: " + c.reason;
      }
    }
    if (c.method == "history") retry = nodes;
    report->catch_up.push_back(std::move(c));
    return retry;
  }
  c.refit = sub->refit;
  c.epoch = sub->epoch;
  c.chunks = sub->chunks;
  c.payload_bytes = sub->payload_bytes + sub->repair_bytes;
  c.seconds = sub->total_seconds;
  c.outcome = sub->outcome;
  c.reason = sub->reason;
  report->total_seconds += sub->total_seconds;
  for (const NodeOutcome& s : sub->nodes) {
    for (NodeOutcome& n : report->nodes) {
      if (n.node != s.node) continue;
      if (s.committed) {
        n.committed = true;
        n.code = NodeCode::kOk;
        n.phase.clear();
        n.chunks_applied = s.chunks_applied;
        n.detail =
            c.method == "history"
                ? fmt::format("caught up from step {} with {} composed deltas",
                              from.step, c.deltas)
                : std::string("caught up with a dense copy");
      } else {
        n.detail += fmt::format("; catch-up: {} at {}: {}",
                                NodeCodeName(s.code), s.phase, s.detail);
        if (c.method == "history" && s.code != NodeCode::kUnreachable &&
            s.code != NodeCode::kTimeout) {
          retry.push_back(s.node);
        }
      }
    }
  }
  report->catch_up.push_back(std::move(c));
  return retry;
}

}  // namespace

CatchUpBy HowToCatchUp(const DeltaHistory& history, const Version& v,
                       const Version& reached, uint64_t target_step,
                       std::vector<std::string>* chain) {
  if (v.digest == Digest128{}) return CatchUpBy::kNone;
  auto c = history.Chain(v, reached);
  if (c.ok()) {
    if (chain) *chain = *std::move(c);
    return CatchUpBy::kHistory;
  }
  if (v.step > 0 && v.step < target_step) return CatchUpBy::kDense;
  return CatchUpBy::kNone;
}

void CatchUpBehind(const RefitOptions& options,
                   const std::vector<NodeResult>& behind, RefitReport* report) {
  // Group the relays behind by the chain that brings them up. Those whose
  // record names an older step of this tree that the history no longer
  // reaches get a dense copy. A store without a record (seeded offline with
  // other bits), left unfinished, or missing is left alone: the operator
  // seeds or repairs it with dcr refit --full --node.
  const StateDir state(options.topology.root.state_dir);
  DeltaHistory history(state.HistoryDir(), options.topology.root.keep_deltas);
  std::map<std::vector<std::string>,
           std::pair<Version, std::vector<std::string>>>
      groups;
  std::vector<std::string> dense;
  for (const NodeResult& r : behind) {
    std::vector<std::string> chain;
    switch (HowToCatchUp(history, r.version, report->target,
                         report->target.step, &chain)) {
      case CatchUpBy::kHistory: {
        auto& g = groups[chain];
        g.first = r.version;
        g.second.push_back(r.node);
        break;
      }
      case CatchUpBy::kDense:
        spdlog::info("{}: the history does not reach step {}; a dense copy",
                     r.node, r.version.step);
        dense.push_back(r.node);
        break;
      case CatchUpBy::kNone:
        break;
    }
  }
  for (auto& [chain, group] : groups) {
    for (std::string& n :
         RunCatchUp(options, group.second, chain, group.first, report)) {
      dense.push_back(std::move(n));
    }
  }
  if (!dense.empty()) RunCatchUp(options, dense, {}, Version{}, report);
  bool all = std::all_of(report->nodes.begin(), report->nodes.end(),
                         [](const NodeOutcome& n) { return n.committed; });
  report->outcome = all ? RefitOutcome::kCommitted : RefitOutcome::kPartial;
  report->reason = all ? std::string() : ExcludedReason(*report);
  state.WriteLastRefit(*report);
}

}  // namespace dcr
