#include "coord/coordinator.h"

#include <vector>

#include "coord/catch_up.h"
#include "coord/refit_run.h"
#include "coord/repair.h"

namespace dcr {

Result<RefitReport> RunRefit(const RefitOptions& options) {
  std::vector<NodeResult> behind;
  Version tree_version;
  auto report = [&] {
    // (The run's baseline store is closed before a catch-up opens it.)
    RefitRun run(options);
    auto r = run.Run();
    behind = run.behind();
    tree_version = run.baseline_version();
    return r;
  }();
  if (!report.ok() || !options.catch_up || !options.only_nodes.empty() ||
      options.TEST_crash_after_decision || behind.empty()) {
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
  RefitRun run(options);
  return run.Resume();
}

}  // namespace dcr
