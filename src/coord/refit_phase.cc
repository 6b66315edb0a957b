#include "coord/refit_phase.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

namespace dcr {

std::string_view RefitPhaseName(RefitPhase phase) {
  switch (phase) {
    case RefitPhase::kNew:
      return "new";
    case RefitPhase::kPrepared:
      return "prepared";
    case RefitPhase::kPlanning:
      return "planning";
    case RefitPhase::kStreaming:
      return "streaming";
    case RefitPhase::kVoting:
      return "voting";
    case RefitPhase::kRepairing:
      return "repairing";
    case RefitPhase::kCommitting:
      return "committing";
    case RefitPhase::kAborting:
      return "aborting";
    case RefitPhase::kStopped:
      return "stopped";
    case RefitPhase::kDone:
      return "done";
  }
  return "unknown";
}

Status RefitPhases::Move(std::string_view transition,
                         std::initializer_list<RefitPhase> from,
                         RefitPhase to) {
  if (std::find(from.begin(), from.end(), phase_) == from.end()) {
    std::vector<std::string_view> names;
    for (RefitPhase p : from) names.push_back(RefitPhaseName(p));
    Status s = Status::Internal(fmt::format(
        "refit phase: {} from '{}' (only from {}): a coordinator bug",
        transition, RefitPhaseName(phase_), fmt::join(names, ", ")));
    spdlog::error("{}", s.ToString());
    return s;
  }
  phase_ = to;
  return Status::OK();
}

Status RefitPhases::Prepared() {
  return Move("prepared", {RefitPhase::kNew}, RefitPhase::kPrepared);
}

Status RefitPhases::Plan() {
  return Move("plan", {RefitPhase::kPrepared}, RefitPhase::kPlanning);
}

Status RefitPhases::Stream() {
  return Move("stream", {RefitPhase::kPlanning}, RefitPhase::kStreaming);
}

Status RefitPhases::Vote() {
  return Move("vote", {RefitPhase::kStreaming, RefitPhase::kRepairing},
              RefitPhase::kVoting);
}

Status RefitPhases::Repair() {
  return Move("repair", {RefitPhase::kVoting}, RefitPhase::kRepairing);
}

Status RefitPhases::Decide(bool commit) {
  return Move(
      commit ? "decide commit" : "decide abort",
      {RefitPhase::kPlanning, RefitPhase::kStreaming, RefitPhase::kVoting},
      commit ? RefitPhase::kCommitting : RefitPhase::kAborting);
}

Status RefitPhases::Stop() {
  return Move("stop", {RefitPhase::kCommitting}, RefitPhase::kStopped);
}

Status RefitPhases::Finish() {
  return Move("finish", {RefitPhase::kCommitting, RefitPhase::kAborting},
              RefitPhase::kDone);
}

}  // namespace dcr
