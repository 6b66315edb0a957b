#include "coord/coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <vector>

#include "coord/catch_up.h"
#include "coord/refit_run.h"
#include "coord/refit_setup.h"
#include "coord/repair.h"
#include "coord/state_dir.h"

namespace dcr {
namespace {

// The state_dir's lock for this run (none without a state_dir: the setup
// refuses that with its own message).
Result<std::optional<StateDirLock>> LockStateDir(const RefitOptions& options,
                                                 std::string_view command) {
  const std::string& dir = options.topology.root.state_dir;
  if (dir.empty()) return std::optional<StateDirLock>();
  DCR_ASSIGN_OR_RETURN(StateDirLock lock,
                       StateDirLock::Acquire(StateDir(dir), command));
  return std::optional<StateDirLock>(std::move(lock));
}

// A refit whose coordinator stopped in its commit phase (after COMMIT went
// down, before root.baseline committed) has nothing left to decide: it is
// finished as `dcr refit --resume` would, before the new refit starts.
Status FinishInterruptedCommit(const RefitOptions& options) {
  DCR_ASSIGN_OR_RETURN(bool interrupted, CommitPhaseInterrupted(options));
  if (!interrupted) return Status::OK();
  spdlog::warn(
      "{} names a refit whose coordinator stopped in its commit phase; "
      "finishing it first (as dcr refit --resume does)",
      StateDir(options.topology.root.state_dir).CurrentPath());
  RefitOptions whole_tree = options;  // the interrupted refit's tree
  whole_tree.only_nodes.clear();
  whole_tree.producers = nullptr;
  RefitRun run(whole_tree);
  auto r = run.Resume();
  if (!r.ok()) {
    return r.status().WithContext("finishing the interrupted refit");
  }
  if (r->outcome == RefitOutcome::kAborted ||
      r->outcome == RefitOutcome::kUnfinished) {
    return Status::Aborted(fmt::format(
        "the interrupted refit {} could not be finished ({}): {}; run dcr "
        "refit --resume once the relays answer",
        r->refit.ToHex(), RefitOutcomeName(r->outcome), r->reason));
  }
  spdlog::warn(
      "finished the interrupted refit {} ({}): root.baseline is step {}",
      r->refit.ToHex(), RefitOutcomeName(r->outcome), r->target.step);
  return Status::OK();
}

}  // namespace

Result<RefitReport> RunRefit(const RefitOptions& options) {
  // One coordinator per state_dir, for the whole run and its catch-ups.
  DCR_ASSIGN_OR_RETURN(std::optional<StateDirLock> lock,
                       LockStateDir(options, "dcr refit"));
  DCR_RETURN_IF_ERROR(FinishInterruptedCommit(options));
  std::vector<NodeResult> behind;
  Version tree_version;
  auto report = [&] {
    // (The run's baseline store is closed before a catch-up opens it,
    // unless the options keep it open: the catch-up then reuses it.)
    RefitRun run(options);
    auto r = run.Run();
    behind = run.behind();
    tree_version = run.baseline_version();
    return r;
  }();
  if (!report.ok() || !options.catch_up || !options.only_nodes.empty() ||
      options.TEST_crash_after_decision || behind.empty() ||
      report->outcome == RefitOutcome::kUnfinished) {
    return report;
  }
  if (report->outcome == RefitOutcome::kAborted) {
    // Repairs and seeds run whatever the outcome; catch-ups only follow a
    // commit (a relay behind stays where it is).
    std::erase_if(behind, [](const NodeResult& r) { return !NeedsRepair(r); });
    if (behind.empty()) return report;
  }
  CatchUpBehind(options, behind, tree_version, &*report);
  return report;
}

Result<RefitReport> ResumeRefit(const RefitOptions& options) {
  DCR_ASSIGN_OR_RETURN(std::optional<StateDirLock> lock,
                       LockStateDir(options, "dcr refit --resume"));
  RefitRun run(options);
  return run.Resume();
}

}  // namespace dcr
