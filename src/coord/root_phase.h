// The phases of the root's refit and the only legal ways between them. The
// refit driver (refit_run.h) calls one transition per step; each names the
// phase(s) it may start from and refuses any other with Internal (a
// coordinator bug, also logged), leaving the phase unchanged. The machine
// holds no I/O, so it is tested alone.
//
//   kNew --Prepared--> kPrepared --Plan--> kPlanning --Stream--> kStreaming
//   kStreaming, kRepairing --Vote--> kVoting --Repair--> kRepairing
//   kPlanning, kStreaming, kVoting --Decide(commit)--> kCommitting
//   kPlanning, kStreaming, kVoting --Decide(abort)--> kAborting
//   kCommitting --Stop--> kStopped (TEST_crash_after_decision)
//   kCommitting, kAborting --Finish--> kDone
//
// `dcr refit --resume` goes kNew, kPrepared, kPlanning (its adoption PLAN)
// and decides from there.
//
// Thread safety: not thread-safe; the coordinator thread owns it.
#ifndef DCR_COORD_ROOT_PHASE_H_
#define DCR_COORD_ROOT_PHASE_H_

#include <initializer_list>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

enum class RootPhase {
  kNew,         // nothing done yet
  kPrepared,    // tree, baseline, target and plan ready; epoch taken
  kPlanning,    // PLAN sent, waiting for the PLAN_REPLYs
  kStreaming,   // chunks going down
  kVoting,      // END sent, waiting for the votes
  kRepairing,   // overwrite chunks of a repair round going down
  kCommitting,  // the commit decision is durable; COMMIT going down
  kAborting,    // ABORT going down
  kStopped,     // stopped after the decision (tests)
  kDone,        // the replies are in and the report is written
};
std::string_view RootPhaseName(RootPhase phase);

class RootPhases {
 public:
  RootPhase phase() const { return phase_; }

  [[nodiscard]] Status Prepared();  // kNew
  [[nodiscard]] Status Plan();      // kPrepared
  [[nodiscard]] Status Stream();    // kPlanning
  [[nodiscard]] Status Vote();      // kStreaming, kRepairing
  [[nodiscard]] Status Repair();    // kVoting
  // kPlanning, kStreaming, kVoting -> kCommitting or kAborting.
  [[nodiscard]] Status Decide(bool commit);
  [[nodiscard]] Status Stop();    // kCommitting
  [[nodiscard]] Status Finish();  // kCommitting, kAborting

 private:
  Status Move(std::string_view transition,
              std::initializer_list<RootPhase> from, RootPhase to);

  RootPhase phase_ = RootPhase::kNew;
};

}  // namespace dcr

#endif  // DCR_COORD_ROOT_PHASE_H_
