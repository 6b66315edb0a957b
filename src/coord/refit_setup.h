// Everything a coordinator run needs before it asks any relay, shared by a
// refit and `dcr refit --resume`: the tree, the state directory, the
// baseline store (root.baseline), the target checkpoint, the thread pool,
// the signing key, a new epoch and the PLAN. Every error here comes before
// the tree is touched (RunRefit's "errors, not a report").
//
// Thread safety: functions of their arguments; RefitSetup is owned by one
// coordinator run.
#ifndef DCR_COORD_REFIT_SETUP_H_
#define DCR_COORD_REFIT_SETUP_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coord/end_signer.h"
#include "coord/history.h"
#include "coord/serving_ranks.h"
#include "coord/state_dir.h"
#include "dcr/checkpoint.h"
#include "dcr/refit.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "dcr/topology.h"
#include "protocol/messages.h"

namespace dcr {

// What a run of named nodes streams from the history instead of a diff:
// the composition of a chain of deltas (catch-up: XOR chunks from the
// chain's base to the baseline's version), or the union of their change
// sets (the repair of a store left with a mix: overwrites with the
// baseline's bits, coord/repair.h).
struct HistoryFeed {
  std::vector<std::string> files;
  ComposedDelta::Kind kind = ComposedDelta::Kind::kChain;
  bool empty() const { return files.empty(); }
};

struct RefitSetup {
  Tree tree;
  StateDir state{""};
  StoreSpec baseline_spec;  // path empty: no root.baseline configured
  std::shared_ptr<WeightStore> baseline;  // shared with a KeptBaseline
  std::unique_ptr<Checkpoint> target;
  std::unique_ptr<ComposedDelta> composed;  // catch-up or repair (HistoryFeed)
  std::unique_ptr<EndSigner> signer;        // null: END is unsigned
  std::unique_ptr<ThreadPool> pool;
  // The tree's serving ranks (empty: none): the root names their bits.
  ServingRanks serving;
  // The nodes that must not get context-coded chunks: every node of each
  // root child's subtree that holds a serving rank (its relays forward one
  // encoding to all), and under --context auto those of a subtree the
  // cost model keeps base-independent. With plan.context_coded, the tree
  // is mixed: those
  // subtrees get each context-coded chunk in a base-independent encoding
  // too, at the same sequence number (docs/PROTOCOL.md §"Context-coded
  // chunks").
  std::set<std::string> plain_nodes;
  PlanMsg plan;

  bool mixed() const { return plan.context_coded && !plain_nodes.empty(); }
};

// A refit of options (RunRefit): `feed` (history delta files, with
// options.only_nodes) feeds the named relays from the history. Fills
// report's refit, epoch, mode, base, target, checkpoint and element
// counts. InvalidArgument, NotFound, Corruption or IOError as RunRefit
// documents.
Result<RefitSetup> SetUpRefit(const RefitOptions& options, HistoryFeed feed,
                              RefitReport* report);

// What `dcr refit --resume` resumes: the interrupted refit and its
// decision, if it reached one.
struct Resumption {
  bool commit = false;
  std::set<std::string> commit_set;
  // The baseline already holds the target (nothing to advance).
  bool baseline_done = false;
  // No decision, and the baseline was being updated as the refit streamed:
  // it goes back to the base (coord/baseline_stream.h).
  bool restore_base = false;
  std::string target_path;
  // A producers' refit (kProducersTarget): root.baseline took its stream
  // through a session whose journal settles it (SettleRootSession).
  bool producers = false;
};

// The refit state_dir/current.json names (NotFound: none), at a new epoch:
// report gets its refit, mode, base, target and the epoch. The target is
// opened only when the baseline must still be advanced to it, or restored
// from it (restore_base).
Result<RefitSetup> SetUpResume(const RefitOptions& options, RefitReport* report,
                               Resumption* resumption);

// Whether the refit state_dir/current.json names stopped in its commit
// phase at the root: its commit decision is durable and root.baseline's
// record names it as the update in progress (the baseline pass begins
// only after COMMIT went down; a run whose COMMIT no receiver confirmed
// leaves the same state). Such a refit has nothing left to decide, so the
// next refit finishes it first (ResumeRefit) instead of refusing.
// NotFound/Corruption only for a current.json or decision it cannot read;
// false when there is no current.json, no baseline, or another state.
Result<bool> CommitPhaseInterrupted(const RefitOptions& options);

}  // namespace dcr

#endif  // DCR_COORD_REFIT_SETUP_H_
