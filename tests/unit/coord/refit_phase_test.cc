// The root's refit phase machine: every transition from each legal source
// phase, and refused (Internal, phase unchanged) from an illegal one.
#include "coord/refit_phase.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace dcr {
namespace {

using Step = std::function<Status(RefitPhases&)>;

// Drives a fresh machine to `phase` along legal transitions.
RefitPhases At(RefitPhase phase) {
  RefitPhases m;
  auto ok = [](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); };
  if (phase == RefitPhase::kNew) return m;
  ok(m.Prepared());
  if (phase == RefitPhase::kPrepared) return m;
  ok(m.Plan());
  if (phase == RefitPhase::kPlanning) return m;
  if (phase == RefitPhase::kCommitting || phase == RefitPhase::kAborting ||
      phase == RefitPhase::kStopped || phase == RefitPhase::kDone) {
    ok(m.Decide(phase != RefitPhase::kAborting));
    if (phase == RefitPhase::kStopped) ok(m.Stop());
    if (phase == RefitPhase::kDone) ok(m.Finish());
    return m;
  }
  ok(m.Stream());
  if (phase == RefitPhase::kStreaming) return m;
  ok(m.Vote());
  if (phase == RefitPhase::kVoting) return m;
  ok(m.Repair());
  return m;  // kRepairing
}

const std::vector<RefitPhase> kAll = {
    RefitPhase::kNew,        RefitPhase::kPrepared, RefitPhase::kPlanning,
    RefitPhase::kStreaming,  RefitPhase::kVoting,   RefitPhase::kRepairing,
    RefitPhase::kCommitting, RefitPhase::kAborting, RefitPhase::kStopped,
    RefitPhase::kDone};

struct Transition {
  std::string name;
  Step step;
  std::vector<RefitPhase> from;
  RefitPhase to;
};

const std::vector<Transition>& Transitions() {
  static const std::vector<Transition> t = {
      {"Prepared",
       [](RefitPhases& m) { return m.Prepared(); },
       {RefitPhase::kNew},
       RefitPhase::kPrepared},
      {"Plan",
       [](RefitPhases& m) { return m.Plan(); },
       {RefitPhase::kPrepared},
       RefitPhase::kPlanning},
      {"Stream",
       [](RefitPhases& m) { return m.Stream(); },
       {RefitPhase::kPlanning},
       RefitPhase::kStreaming},
      {"Vote",
       [](RefitPhases& m) { return m.Vote(); },
       {RefitPhase::kStreaming, RefitPhase::kRepairing},
       RefitPhase::kVoting},
      {"Repair",
       [](RefitPhases& m) { return m.Repair(); },
       {RefitPhase::kVoting},
       RefitPhase::kRepairing},
      {"DecideCommit",
       [](RefitPhases& m) { return m.Decide(true); },
       {RefitPhase::kPlanning, RefitPhase::kStreaming, RefitPhase::kVoting},
       RefitPhase::kCommitting},
      {"DecideAbort",
       [](RefitPhases& m) { return m.Decide(false); },
       {RefitPhase::kPlanning, RefitPhase::kStreaming, RefitPhase::kVoting},
       RefitPhase::kAborting},
      {"Stop",
       [](RefitPhases& m) { return m.Stop(); },
       {RefitPhase::kCommitting},
       RefitPhase::kStopped},
      {"Finish",
       [](RefitPhases& m) { return m.Finish(); },
       {RefitPhase::kCommitting, RefitPhase::kAborting},
       RefitPhase::kDone},
  };
  return t;
}

TEST(RefitPhaseTest, EveryTransitionFromEveryPhase) {
  for (const Transition& t : Transitions()) {
    for (RefitPhase from : kAll) {
      RefitPhases m = At(from);
      ASSERT_EQ(m.phase(), from) << RefitPhaseName(from);
      Status s = t.step(m);
      bool legal =
          std::find(t.from.begin(), t.from.end(), from) != t.from.end();
      if (legal) {
        EXPECT_TRUE(s.ok()) << t.name << " from " << RefitPhaseName(from)
                            << ": " << s.ToString();
        EXPECT_EQ(m.phase(), t.to)
            << t.name << " from " << RefitPhaseName(from);
      } else {
        EXPECT_EQ(s.code(), StatusCode::kInternal)
            << t.name << " from " << RefitPhaseName(from);
        EXPECT_EQ(m.phase(), from)
            << t.name << " moved from " << RefitPhaseName(from);
        // The refusal names the transition and where it was.
        EXPECT_NE(s.message().find(RefitPhaseName(from)), std::string::npos)
            << s.ToString();
      }
    }
  }
}

TEST(RefitPhaseTest, DeltaRefitWithTwoRepairRounds) {
  RefitPhases m;
  ASSERT_TRUE(m.Prepared().ok());
  ASSERT_TRUE(m.Plan().ok());
  ASSERT_TRUE(m.Stream().ok());
  ASSERT_TRUE(m.Vote().ok());
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(m.Repair().ok());
    ASSERT_TRUE(m.Vote().ok());
  }
  ASSERT_TRUE(m.Decide(true).ok());
  ASSERT_TRUE(m.Finish().ok());
  EXPECT_EQ(m.phase(), RefitPhase::kDone);
  // Nothing moves a finished refit.
  EXPECT_FALSE(m.Plan().ok());
  EXPECT_FALSE(m.Decide(false).ok());
  EXPECT_EQ(m.phase(), RefitPhase::kDone);
}

TEST(RefitPhaseTest, ResumeDecidesFromPlanning) {
  RefitPhases m;
  ASSERT_TRUE(m.Prepared().ok());
  ASSERT_TRUE(m.Plan().ok());
  ASSERT_TRUE(m.Decide(false).ok());
  EXPECT_EQ(m.phase(), RefitPhase::kAborting);
  // An abort cannot be stopped as if a commit decision were durable.
  EXPECT_FALSE(m.Stop().ok());
  ASSERT_TRUE(m.Finish().ok());
}

TEST(RefitPhaseTest, Names) {
  for (RefitPhase p : kAll) EXPECT_NE(RefitPhaseName(p), "unknown");
  EXPECT_EQ(RefitPhaseName(RefitPhase::kRepairing), "repairing");
}

}  // namespace
}  // namespace dcr
