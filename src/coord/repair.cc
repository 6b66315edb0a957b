#include "coord/repair.h"

#include <fmt/format.h>

#include <algorithm>

#include "dcr/delta.h"

namespace dcr {

bool NeedsRepair(const NodeResult& r) {
  return r.code == NodeCode::kNeedsCatchUp && !r.store.empty();
}

RepairPlan PlanRepair(const DeltaHistory& history, const StoreCondition& c,
                      const Version& to) {
  RepairPlan plan;
  auto dense = [&](std::string why) {
    plan.by = RepairPlan::By::kDense;
    plan.files.clear();
    plan.why = std::move(why);
    return plan;
  };
  if (!c.unfinished) return dense("the store is missing");
  const Version& base = c.base;
  const Version& target = c.target;
  if (base.digest == Digest128{}) {
    return dense("the unfinished refit started from no version");
  }
  // The chain from R's base to the tree's version.
  std::vector<std::string> chain;
  std::vector<Version> reached{base};  // every version the chain passes
  if (base != to) {
    auto found = history.Chain(base, to);
    if (!found.ok()) return dense(found.status().ToString());
    chain = *std::move(found);
    for (const std::string& path : chain) {
      auto reader = DeltaReader::Open(path);
      if (!reader.ok()) return dense(reader.status().ToString());
      reached.push_back((*reader)->header().target);
    }
  }
  // R's own change set, unless the chain covers it (R committed, or R went
  // between two versions of the chain).
  const bool covered =
      target.digest != Digest128{} &&
      std::find(reached.begin(), reached.end(), target) != reached.end();
  if (!covered) {
    // Its base is the record's, or a later version of the chain (after a
    // crash of the host the record's base is the last version on disk).
    Version from;
    auto aborted = history.Aborted(*c.unfinished, target, &from);
    if (!aborted.ok()) return dense(aborted.status().ToString());
    if (std::find(reached.begin(), reached.end(), from) == reached.end()) {
      return dense(fmt::format(
          "{} starts from step {}, which the chain from step {} does not "
          "pass",
          *aborted, from.step, base.step));
    }
    plan.files.push_back(*std::move(aborted));
  }
  plan.files.insert(plan.files.end(), chain.begin(), chain.end());
  if (plan.files.empty()) {
    // R changed nothing and the store's base is the tree's version: only a
    // verified vote is missing; a dense copy gives it.
    return dense("nothing in the history to repair from");
  }
  plan.by = RepairPlan::By::kUnion;
  return plan;
}

}  // namespace dcr
