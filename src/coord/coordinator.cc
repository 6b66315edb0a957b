#include "coord/coordinator.h"

#include <optional>
#include <vector>

#include "coord/catch_up.h"
#include "coord/refit_run.h"
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

}  // namespace

Result<RefitReport> RunRefit(const RefitOptions& options) {
  // One coordinator per state_dir, for the whole run and its catch-ups.
  DCR_ASSIGN_OR_RETURN(std::optional<StateDirLock> lock,
                       LockStateDir(options, "dcr refit"));
  std::vector<NodeResult> behind;
  auto report = [&] {
    // (The run's baseline store is closed before a catch-up opens it.)
    RefitRun run(options);
    auto r = run.Run();
    behind = run.behind();
    return r;
  }();
  if (!report.ok() || !options.catch_up || !options.only_nodes.empty() ||
      options.TEST_crash_after_decision || behind.empty() ||
      report->outcome == RefitOutcome::kAborted ||
      report->outcome == RefitOutcome::kUnfinished) {
    return report;
  }
  CatchUpBehind(options, behind, &*report);
  return report;
}

Result<RefitReport> ResumeRefit(const RefitOptions& options) {
  DCR_ASSIGN_OR_RETURN(std::optional<StateDirLock> lock,
                       LockStateDir(options, "dcr refit --resume"));
  RefitRun run(options);
  return run.Resume();
}

}  // namespace dcr
