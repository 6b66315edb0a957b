// The repair of a relay whose store a crash left holding a mix of two
// versions (docs/PROTOCOL.md §"Repair of a mixed store").
//
// A store whose record names an unfinished refit R (base B, target T)
// holds, at every element, B's bits or T's (a span may be partly applied).
// Overwriting every element R changed with one version's bits makes the
// store exactly that version, and overwriting every element the history
// changed between B and the tree's version `to` as well, with `to`'s bits,
// makes it `to`. So the root sends, as overwrite chunks carrying the
// baseline's bits, the union of the change sets of R's delta (kept in the
// history if R committed, in history/aborted/ if it aborted) and of every
// delta of the chain from B to `to`. When R's delta lies on that chain
// (R committed, or R was a catch-up between versions of the chain) the
// chain alone covers it. When the history cannot say what R changed (R
// was a full refit from no version, its delta was pruned, the chain from
// B no longer exists), the repair is a dense copy.
//
// A repair is a refit of its own, of the named node only, in full mode (a
// relay takes a full refit over an unfinished record): verified against
// the version digest by the relay's vote before it counts as committed,
// and signed like any other refit when signing is on.
//
// Thread safety: pure functions of their arguments (PlanRepair reads the
// history directory).
#ifndef DCR_COORD_REPAIR_H_
#define DCR_COORD_REPAIR_H_

#include <string>
#include <vector>

#include "coord/history.h"
#include "dcr/version.h"
#include "protocol/messages.h"

namespace dcr {

// A PLAN_REPLY the root answers with a repair or a seed rather than a
// catch-up: its store holds an unfinished refit's mix, or is missing.
bool NeedsRepair(const NodeResult& r);

struct RepairPlan {
  enum class By { kUnion, kDense };
  By by = By::kDense;
  // kUnion: the delta files whose change sets' union holds every element
  // the store may hold differently from `to`.
  std::vector<std::string> files;
  // kDense: why the history cannot do it.
  std::string why;
};

// How to bring a store in condition `c` (unfinished set) to the version
// `to`, the baseline's. A target with a zero digest (the relay stopped
// before END named it, and no commit decision names it) is taken as not
// committed: the refit's delta is looked for among the aborted ones.
RepairPlan PlanRepair(const DeltaHistory& history, const StoreCondition& c,
                      const Version& to);

}  // namespace dcr

#endif  // DCR_COORD_REPAIR_H_
