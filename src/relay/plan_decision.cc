#include "relay/plan_decision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace dcr {
namespace {

using Outcome = PlanDecision::Outcome;

PlanDecision Refuse(NodeCode code, std::string detail) {
  PlanDecision d;
  d.outcome = Outcome::kRefuse;
  d.code = code;
  d.detail = std::move(detail);
  return d;
}

PlanDecision Decided(Outcome outcome) {
  PlanDecision d;
  d.outcome = outcome;
  return d;
}

}  // namespace

PlanDecision DecidePlan(const PlanFacts& f) {
  const std::optional<PlanFacts::Held>& held = f.held;
  const bool same_run = held && held->id == f.refit && held->epoch == f.epoch;
  // An adoption into the refit this relay holds may come from any node of
  // the topology (peer_addresses): an ancestor may place it under another
  // node (docs/PROTOCOL.md §"Heartbeats and re-parenting").
  if (!(same_run && f.adopt) && !f.plan_senders.empty() &&
      std::find(f.plan_senders.begin(), f.plan_senders.end(), f.sender) ==
          f.plan_senders.end()) {
    return Refuse(
        NodeCode::kRejected,
        fmt::format("plans are taken only from {}'s ancestors in "
                    "the topology ({}); '{}' is not one",
                    f.node, fmt::join(f.plan_senders, ", "), f.sender));
  }
  if (f.receiver != f.node) {
    return Refuse(NodeCode::kRejected,
                  fmt::format("this is node '{}', the plan is for '{}'", f.node,
                              f.receiver));
  }
  if (same_run) {
    // On the parent link: our parent placed orphans in our subtree; else a
    // duplicate.
    if (held->on_parent_link) {
      return Decided(f.adopt ? Outcome::kAmend : Outcome::kDuplicate);
    }
    return Decided(Outcome::kAdopt);
  }
  if (held && held->id == f.refit && f.resume && f.epoch > held->epoch) {
    // dcr refit --resume: a new coordinator run takes the refit over; its
    // epoch fences the old one off from now on.
    return Decided(Outcome::kResume);
  }
  if (!held && (f.adopt || f.resume) && f.ended && f.ended->id == f.refit &&
      (f.ended->epoch == f.epoch || (f.resume && f.epoch > f.ended->epoch))) {
    // Our parent lost our last reply (and its link to us), or a resumed
    // coordinator asks: answer again.
    PlanDecision d = Decided(Outcome::kAnswerAgain);
    d.raise_epoch = f.epoch > f.ended->epoch;
    return d;
  }
  // Restarted mid-refit: the store's record names this refit (unfinished)
  // and the parent reconnects with an adoption PLAN of the same run. The
  // relay rejoins; what it applied before is unknown, so it takes only
  // overwrites from now on and the root's repair round fixes the rest.
  // Or it restored the refit's base from its journal at start: the same
  // rejoin, with bits that are exactly the base again.
  const bool rejoin_restored = !held && f.adopt && f.restored &&
                               *f.restored == f.refit && f.epoch == f.max_epoch;
  const bool rejoin = (!held && f.adopt && f.unfinished &&
                       *f.unfinished == f.refit && f.epoch == f.max_epoch) ||
                      rejoin_restored;
  if (f.resume && !rejoin) {
    return Refuse(NodeCode::kRejected,
                  fmt::format("refit {} is not in progress here (it never "
                              "started here, or the relay restarted since)",
                              f.refit.ToHex()));
  }
  // Every coordinator run takes a new epoch: a PLAN at an epoch this relay
  // already accepted is a replay or comes from a coordinator that another
  // one has since replaced (fencing).
  if (f.epoch <= f.max_epoch && !rejoin) {
    return Refuse(
        NodeCode::kRejected,
        fmt::format("stale coordinator epoch {}: this relay has accepted "
                    "epoch {} ({}); a newer coordinator ran since, or its "
                    "state_dir was reset (then write an epoch above {} into "
                    "state_dir/epoch)",
                    f.epoch, f.max_epoch,
                    f.epoch_file.empty() ? "in memory" : f.epoch_file,
                    f.max_epoch));
  }
  // An orphan of a run that a newer coordinator run replaced: that run is
  // over (the coordinator starts a refit only once the last one is decided
  // and concluded, or resumed), so the relay stops waiting for it, restores
  // its base and takes the new plan; if the old run committed, the new one
  // finds this relay behind and catches it up.
  const bool replace = held && held->orphaned && !f.adopt && !f.resume &&
                       f.epoch > held->epoch && held->applies_idle;
  if (held && !replace) {
    return Refuse(NodeCode::kBusy,
                  fmt::format("refit {} is in progress", held->id.ToHex()));
  }
  PlanDecision d = Decided(Outcome::kAccept);
  d.rejoin = rejoin && !rejoin_restored;
  d.rejoin_restored = rejoin_restored;
  d.replace_orphan = replace;
  return d;
}

const char* PlanOutcomeName(PlanDecision::Outcome outcome) {
  switch (outcome) {
    case Outcome::kRefuse:
      return "refuse";
    case Outcome::kAmend:
      return "amend";
    case Outcome::kDuplicate:
      return "duplicate";
    case Outcome::kAdopt:
      return "adopt";
    case Outcome::kResume:
      return "resume";
    case Outcome::kAnswerAgain:
      return "answer again";
    case Outcome::kAccept:
      return "accept";
  }
  return "?";
}

}  // namespace dcr
