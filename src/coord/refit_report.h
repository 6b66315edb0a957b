// The refit report (dcr/refit.h RefitReport): its JSON (RefitReport::ToJson,
// also state_dir/last-refit.json) and back, the per-node summary of a refit
// from the replies of its phases, and the reason a partial commit gives.
//
// Thread safety: pure functions over values.
#ifndef DCR_COORD_REFIT_REPORT_H_
#define DCR_COORD_REFIT_REPORT_H_

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/refit.h"
#include "dcr/topology.h"
#include "protocol/messages.h"

namespace dcr {

// What each phase's replies said, for the summary.
struct PhaseReplies {
  std::vector<NodeResult> plan;
  std::vector<NodeResult> votes;
  std::vector<NodeResult> final;  // COMMIT_REPLY or ABORT_REPLY
};

// Appends a NodeOutcome for every receiver of `tree` (tree order) to
// report->nodes: committed if it is in `commit_set` and confirmed the
// target, else the first phase that failed; a node of the commit set that
// never answered the COMMIT gets a detail starting kCommitUnconfirmed. Adds
// report->stream_bytes to report->link_class_bytes for every edge the stream
// crossed (towards a subtree in which some node took the plan). Reads
// report->outcome, target and stream_bytes.
void SummarizeNodes(const Tree& tree, const PhaseReplies& replies,
                    const std::set<std::string>& commit_set,
                    RefitReport* report);

// The report RefitReport::ToJson wrote (state_dir/last-refit.json, which
// adds "format"), read strictly: Corruption naming `file` and the field
// for anything missing, mistyped, unknown or out of its enum.
Result<RefitReport> RefitReportFromJson(const nlohmann::json& j,
                                        const std::string& file);

// "excluded, now stale: a (timeout at vote), b; commit unconfirmed (...):
// c": who a partial commit left out, and why. A node of the commit set
// whose COMMIT_REPLY never came (timeout, unreachable) is not called stale:
// it voted yes, so it holds the target as soon as COMMIT reached it, which
// its status or its next PLAN_REPLY shows.
std::string ExcludedReason(const RefitReport& report);

// Why a commit that reached no one (fenced off, or lost) is unfinished, and
// what happens next (RefitOutcome::kUnfinished), from the commit phase's
// replies.
std::string UnfinishedReason(const std::vector<NodeResult>& final,
                             const RefitReport& report);

// The start of a NodeOutcome detail for a node of the commit set that did
// not answer the COMMIT.
inline constexpr std::string_view kCommitUnconfirmed = "commit unconfirmed";

}  // namespace dcr

#endif  // DCR_COORD_REFIT_REPORT_H_
