#include "coord/catch_up.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <utility>

#include "coord/refit_report.h"
#include "coord/refit_run.h"
#include "coord/repair.h"
#include "coord/state_dir.h"

namespace dcr {
namespace {

// What one run of named nodes is for.
struct Feed {
  std::string method;  // CatchUpReport::method
  HistoryFeed history;
  Version from;
  RefitId repaired;
};

// Runs one catch-up, repair or seeding (a refit of `nodes` only, from the
// root) and folds its outcome into `report`. Returns the nodes it did not
// bring up to date that a dense copy may still help (they answered, with
// other bits).
std::vector<std::string> RunCatchUp(const RefitOptions& options,
                                    std::vector<std::string> nodes, Feed feed,
                                    RefitReport* report) {
  RefitOptions o = options;
  o.only_nodes = nodes;
  const bool chain = feed.method == "history";
  o.mode = chain ? RefitMode::kDelta : RefitMode::kFull;
  o.catch_up = false;
  CatchUpReport c;
  c.nodes = nodes;
  c.method = feed.method;
  c.from = feed.from;
  c.deltas = feed.history.files.size();
  c.repaired = feed.repaired;
  const std::string what =
      !feed.repaired.IsZero()
          ? fmt::format(
                "repairing {} (unfinished refit {}) with {}",
                fmt::join(nodes, ", "), feed.repaired.ToHex(),
                feed.method == "repair"
                    ? fmt::format("the change sets of {} deltas", c.deltas)
                    : std::string("a dense copy"))
      : feed.method == "seed"
          ? fmt::format("seeding {} (no store) with a dense copy",
                        fmt::join(nodes, ", "))
          : fmt::format("catching up {} from {}", fmt::join(nodes, ", "),
                        chain ? fmt::format("step {} ({} deltas)",
                                            feed.from.step, c.deltas)
                              : std::string("nothing (a dense copy)"));
  spdlog::info("{}", what);
  RefitRun run(o, std::move(feed.history));
  auto sub = run.Run();
  std::vector<std::string> retry;
  const bool can_retry_dense = c.method == "history" || c.method == "repair";
  if (!sub.ok()) {
    c.reason = sub.status().ToString();
    spdlog::warn("{} failed: {}", what, c.reason);
    for (NodeOutcome& n : report->nodes) {
      if (std::count(nodes.begin(), nodes.end(), n.node)) {
        n.detail += fmt::format("; {} failed: {}", c.method, c.reason);
      }
    }
    if (can_retry_dense) retry = nodes;
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
  const bool aborted = report->outcome == RefitOutcome::kAborted;
  for (const NodeOutcome& s : sub->nodes) {
    for (NodeOutcome& n : report->nodes) {
      if (n.node != s.node) continue;
      if (s.committed) {
        std::string how =
            c.method == "history"
                ? fmt::format("caught up from step {} with {} composed deltas",
                              c.from.step, c.deltas)
            : c.method == "repair"
                ? fmt::format(
                      "repaired (unfinished refit {}) with the overwrites "
                      "of {} deltas' change sets",
                      c.repaired.ToHex().substr(0, 8), c.deltas)
            : c.method == "seed" ? std::string("seeded with a dense copy")
            : !c.repaired.IsZero()
                ? fmt::format(
                      "repaired (unfinished refit {}) with a dense "
                      "copy",
                      c.repaired.ToHex().substr(0, 8))
                : std::string("caught up with a dense copy");
        if (aborted) {
          // This refit did not commit: the node is at the tree's version,
          // which is this refit's base.
          n.detail += fmt::format("; {} at step {}", how, sub->target.step);
        } else {
          n.committed = true;
          n.code = NodeCode::kOk;
          n.phase.clear();
          n.chunks_applied = s.chunks_applied;
          n.detail = how;
        }
      } else {
        n.detail += fmt::format("; {}: {} at {}: {}", c.method,
                                NodeCodeName(s.code), s.phase, s.detail);
        if (can_retry_dense && s.code != NodeCode::kUnreachable &&
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
                   const std::vector<NodeResult>& behind, const Version& to,
                   RefitReport* report) {
  const bool aborted = report->outcome == RefitOutcome::kAborted;
  const StateDir state(options.topology.root.state_dir);
  DeltaHistory history(state.HistoryDir(), options.topology.root.keep_deltas);
  // The bits every run sends are the baseline's (the tree's version `to`);
  // without a baseline, the target of a refit that committed holds them.
  RefitOptions o = options;
  o.producers = nullptr;  // the bits come from root.baseline
  if (!options.topology.root.baseline.empty()) {
    o.target = options.topology.root.baseline;
  } else if (aborted) {
    return;
  }
  // Stores left with an unfinished refit's mix are repaired, missing ones
  // seeded, whatever this refit's outcome. The relays behind at an older
  // version of this tree are grouped by the chain that brings them up;
  // those the history no longer reaches get a dense copy. A store without
  // a record (seeded offline with other bits) is left alone: the operator
  // seeds it with dcr refit --full --node.
  std::map<std::vector<std::string>,
           std::pair<Version, std::vector<std::string>>>
      groups;
  std::vector<std::string> dense;
  std::vector<std::string> seed;
  std::vector<std::pair<Feed, std::vector<std::string>>> repairs;
  for (const NodeResult& r : behind) {
    if (NeedsRepair(r)) {
      if (r.store.missing) {
        seed.push_back(r.node);
        continue;
      }
      StoreCondition c = r.store;
      if (c.target.digest == Digest128{}) {
        // The relay stopped before END named the target: a commit
        // decision names it (an abort leaves it unknown; its delta is
        // found by refit id).
        auto d = state.ReadDecision(*c.unfinished);
        if (d.ok() && *d && (*d)->commit) c.target = (*d)->target;
      }
      RepairPlan plan = PlanRepair(history, c, to);
      Feed f;
      f.repaired = *c.unfinished;
      f.from = c.target;
      if (plan.by == RepairPlan::By::kUnion) {
        f.method = "repair";
        f.history =
            HistoryFeed{std::move(plan.files), ComposedDelta::Kind::kUnion};
      } else {
        spdlog::info("{}: repairing with a dense copy: {}", r.node, plan.why);
        f.method = "dense";
      }
      repairs.emplace_back(std::move(f), std::vector<std::string>{r.node});
      continue;
    }
    std::vector<std::string> chain;
    switch (HowToCatchUp(history, r.version, to, to.step, &chain)) {
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
  for (auto& [feed, nodes] : repairs) {
    RefitId repaired = feed.repaired;
    Version from = feed.from;
    for (std::string& n : RunCatchUp(o, nodes, std::move(feed), report)) {
      Feed d;
      d.method = "dense";
      d.repaired = repaired;
      d.from = from;
      RunCatchUp(o, {std::move(n)}, std::move(d), report);
    }
  }
  if (!seed.empty()) {
    Feed f;
    f.method = "seed";
    RunCatchUp(o, seed, std::move(f), report);
  }
  for (auto& [chain, group] : groups) {
    Feed f;
    f.method = "history";
    f.history = HistoryFeed{chain, ComposedDelta::Kind::kChain};
    f.from = group.first;
    for (std::string& n : RunCatchUp(o, group.second, std::move(f), report)) {
      dense.push_back(std::move(n));
    }
  }
  if (!dense.empty()) {
    Feed f;
    f.method = "dense";
    RunCatchUp(o, dense, std::move(f), report);
  }
  if (!aborted) {
    bool all = std::all_of(report->nodes.begin(), report->nodes.end(),
                           [](const NodeOutcome& n) { return n.committed; });
    report->outcome = all ? RefitOutcome::kCommitted : RefitOutcome::kPartial;
    report->reason = all ? std::string() : ExcludedReason(*report);
  }
  state.WriteReport(report);
}

}  // namespace dcr
