// The root's baseline pass after a commit decision (DESIGN.md invariant 8:
// the baseline reads as the target once the decision is durable): the
// baseline store takes the target's bits of every span the refit changed
// (every span when `all`), recorded as the refit in progress in its version
// record, and is checked against the target digest. A delta refit that
// records its history updates the baseline while it streams instead
// (coord/baseline_stream.h); this pass serves full refits, --resume of a
// commit, and what a failed history record left. The caller commits the
// store (WeightStore::Commit) once the history record is durable and the
// COMMIT reached someone (CommitReachedNoOne).
//
// Thread safety: runs on the calling thread and the pool's workers; the
// pool must not be used by anyone else meanwhile.
#ifndef DCR_COORD_BASELINE_UPDATE_H_
#define DCR_COORD_BASELINE_UPDATE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "dcr/version.h"
#include "protocol/messages.h"

namespace dcr {

struct BaselineUpdate {
  const Checkpoint* target = nullptr;
  ThreadPool* pool = nullptr;
  RefitId refit;
  Version base;
  Version to;  // the target version
  // The target's per-tensor digests, to name the first tensor that differs.
  const std::vector<Digest128>* tensor_digests = nullptr;
  uint64_t span_elems = 0;
  bool all = false;  // every span (a full refit, or resume)
  // Else the spans the refit changed: (tensor, span), sorted and distinct.
  std::vector<std::pair<uint32_t, uint32_t>> changed;
};

// Whether a COMMIT reached no one: no node of `commit_set` answered it
// (`replies`, the commit phase's results) with ok, at the target or, for
// one that ended the refit without it (its --prepared-wait passed), at its
// version. Relays refuse (rejected) or drop the frames of a run that a
// newer one fenced off, so a fenced-off COMMIT reads as refusals and
// timeouts, which a lost link cannot be told from: then root.baseline
// must not record the target (DESIGN.md invariant 8). Its version stays
// where it was, whatever the pass wrote, and the refit stays in state_dir
// for --resume. Once some node answered, this run is the relays' parent
// and the recorded decision stands: the baseline records the target.
bool CommitReachedNoOne(const std::vector<NodeResult>& replies,
                        const std::set<std::string>& commit_set);

// Writes and checks the baseline. `*baseline` null: created from `spec` at
// the target's manifest (the first full refit seeds it). `spec.path`
// empty (no root.baseline): OK with a warning, nothing done.
Status UpdateBaseline(const BaselineUpdate& update, const StoreSpec& spec,
                      std::shared_ptr<WeightStore>* baseline);

}  // namespace dcr

#endif  // DCR_COORD_BASELINE_UPDATE_H_
