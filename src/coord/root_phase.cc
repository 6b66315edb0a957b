#include "coord/root_phase.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

namespace dcr {

std::string_view RootPhaseName(RootPhase phase) {
  switch (phase) {
    case RootPhase::kNew:
      return "new";
    case RootPhase::kPrepared:
      return "prepared";
    case RootPhase::kPlanning:
      return "planning";
    case RootPhase::kStreaming:
      return "streaming";
    case RootPhase::kVoting:
      return "voting";
    case RootPhase::kRepairing:
      return "repairing";
    case RootPhase::kCommitting:
      return "committing";
    case RootPhase::kAborting:
      return "aborting";
    case RootPhase::kStopped:
      return "stopped";
    case RootPhase::kDone:
      return "done";
  }
  return "unknown";
}

Status RootPhases::Move(std::string_view transition,
                        std::initializer_list<RootPhase> from, RootPhase to) {
  if (std::find(from.begin(), from.end(), phase_) == from.end()) {
    std::vector<std::string_view> names;
    for (RootPhase p : from) names.push_back(RootPhaseName(p));
    Status s = Status::Internal(fmt::format(
        "refit phase: {} from '{}' (only from {}): a coordinator bug",
        transition, RootPhaseName(phase_), fmt::join(names, ", ")));
    spdlog::error("{}", s.ToString());
    return s;
  }
  phase_ = to;
  return Status::OK();
}

Status RootPhases::Prepared() {
  return Move("prepared", {RootPhase::kNew}, RootPhase::kPrepared);
}

Status RootPhases::Plan() {
  return Move("plan", {RootPhase::kPrepared}, RootPhase::kPlanning);
}

Status RootPhases::Stream() {
  return Move("stream", {RootPhase::kPlanning}, RootPhase::kStreaming);
}

Status RootPhases::Vote() {
  return Move("vote", {RootPhase::kStreaming, RootPhase::kRepairing},
              RootPhase::kVoting);
}

Status RootPhases::Repair() {
  return Move("repair", {RootPhase::kVoting}, RootPhase::kRepairing);
}

Status RootPhases::Decide(bool commit) {
  return Move(commit ? "decide commit" : "decide abort",
              {RootPhase::kPlanning, RootPhase::kStreaming, RootPhase::kVoting},
              commit ? RootPhase::kCommitting : RootPhase::kAborting);
}

Status RootPhases::Stop() {
  return Move("stop", {RootPhase::kCommitting}, RootPhase::kStopped);
}

Status RootPhases::Finish() {
  return Move("finish", {RootPhase::kCommitting, RootPhase::kAborting},
              RootPhase::kDone);
}

}  // namespace dcr
