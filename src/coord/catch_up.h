// Catch-up and repair after a refit (RefitOptions::catch_up): relays that
// refused its plan because they hold an older version, a store left with
// an unfinished refit's mix, or no store, are brought to the tree's
// version, each fed directly by the root, with the composition of the
// history's deltas from their version (coord/history.h), the overwrites
// of a repair (coord/repair.h) or a dense copy (docs/PROTOCOL.md
// §"Catch-up", §"Repair of a mixed store").
//
// Thread safety: blocking calls on the caller's thread (each catch-up is a
// refit of its own).
#ifndef DCR_COORD_CATCH_UP_H_
#define DCR_COORD_CATCH_UP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "coord/history.h"
#include "dcr/refit.h"
#include "protocol/messages.h"

namespace dcr {

// How catch-up brings a relay whose PLAN_REPLY named version `v` to the
// tree's version: with the history chain from `v` to `reached` (the
// baseline before the commit, the target after; *chain gets it), or with a
// dense copy if `v` is an older step of this tree (its record says so).
// kNone for a store without a record of this tree, unfinished or missing.
enum class CatchUpBy { kNone, kHistory, kDense };
CatchUpBy HowToCatchUp(const DeltaHistory& history, const Version& v,
                       const Version& reached, uint64_t target_step,
                       std::vector<std::string>* chain = nullptr);

// Brings the relays `behind` (PLAN_REPLYs that need catch-up) to the
// tree's version `to` (the baseline's, after the refit of `report`): stores
// left with an unfinished refit's mix are repaired (coord/repair.h) and
// missing ones seeded whatever the refit's outcome; relays at an older
// version are caught up, grouped by the chain that brings them up, then a
// dense copy for the rest. Folds each run into the report (catch_up,
// nodes, outcome, reason, total_seconds) and rewrites
// state_dir/last-refit.json.
void CatchUpBehind(const RefitOptions& options,
                   const std::vector<NodeResult>& behind, const Version& to,
                   RefitReport* report);

}  // namespace dcr

#endif  // DCR_COORD_CATCH_UP_H_
