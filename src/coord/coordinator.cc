#include "coord/coordinator.h"

#include <vector>

#include "coord/catch_up.h"
#include "coord/refit_run.h"

namespace dcr {

Result<RefitReport> RunRefit(const RefitOptions& options) {
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
      report->outcome == RefitOutcome::kAborted) {
    return report;
  }
  CatchUpBehind(options, behind, &*report);
  return report;
}

Result<RefitReport> ResumeRefit(const RefitOptions& options) {
  RefitRun run(options);
  return run.Resume();
}

}  // namespace dcr
