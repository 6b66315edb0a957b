// The root's refit phase machine: every transition from each legal source
// phase, and refused (Internal, phase unchanged) from an illegal one.
#include "coord/root_phase.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace dcr {
namespace {

using Step = std::function<Status(RootPhases&)>;

// Drives a fresh machine to `phase` along legal transitions.
RootPhases At(RootPhase phase) {
  RootPhases m;
  auto ok = [](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); };
  if (phase == RootPhase::kNew) return m;
  ok(m.Prepared());
  if (phase == RootPhase::kPrepared) return m;
  ok(m.Plan());
  if (phase == RootPhase::kPlanning) return m;
  if (phase == RootPhase::kCommitting || phase == RootPhase::kAborting ||
      phase == RootPhase::kStopped || phase == RootPhase::kDone) {
    ok(m.Decide(phase != RootPhase::kAborting));
    if (phase == RootPhase::kStopped) ok(m.Stop());
    if (phase == RootPhase::kDone) ok(m.Finish());
    return m;
  }
  ok(m.Stream());
  if (phase == RootPhase::kStreaming) return m;
  ok(m.Vote());
  if (phase == RootPhase::kVoting) return m;
  ok(m.Repair());
  return m;  // kRepairing
}

const std::vector<RootPhase> kAll = {
    RootPhase::kNew,        RootPhase::kPrepared, RootPhase::kPlanning,
    RootPhase::kStreaming,  RootPhase::kVoting,   RootPhase::kRepairing,
    RootPhase::kCommitting, RootPhase::kAborting, RootPhase::kStopped,
    RootPhase::kDone};

struct Transition {
  std::string name;
  Step step;
  std::vector<RootPhase> from;
  RootPhase to;
};

const std::vector<Transition>& Transitions() {
  static const std::vector<Transition> t = {
      {"Prepared",
       [](RootPhases& m) { return m.Prepared(); },
       {RootPhase::kNew},
       RootPhase::kPrepared},
      {"Plan",
       [](RootPhases& m) { return m.Plan(); },
       {RootPhase::kPrepared},
       RootPhase::kPlanning},
      {"Stream",
       [](RootPhases& m) { return m.Stream(); },
       {RootPhase::kPlanning},
       RootPhase::kStreaming},
      {"Vote",
       [](RootPhases& m) { return m.Vote(); },
       {RootPhase::kStreaming, RootPhase::kRepairing},
       RootPhase::kVoting},
      {"Repair",
       [](RootPhases& m) { return m.Repair(); },
       {RootPhase::kVoting},
       RootPhase::kRepairing},
      {"DecideCommit",
       [](RootPhases& m) { return m.Decide(true); },
       {RootPhase::kPlanning, RootPhase::kStreaming, RootPhase::kVoting},
       RootPhase::kCommitting},
      {"DecideAbort",
       [](RootPhases& m) { return m.Decide(false); },
       {RootPhase::kPlanning, RootPhase::kStreaming, RootPhase::kVoting},
       RootPhase::kAborting},
      {"Stop",
       [](RootPhases& m) { return m.Stop(); },
       {RootPhase::kCommitting},
       RootPhase::kStopped},
      {"Finish",
       [](RootPhases& m) { return m.Finish(); },
       {RootPhase::kCommitting, RootPhase::kAborting},
       RootPhase::kDone},
  };
  return t;
}

TEST(RootPhaseTest, EveryTransitionFromEveryPhase) {
  for (const Transition& t : Transitions()) {
    for (RootPhase from : kAll) {
      RootPhases m = At(from);
      ASSERT_EQ(m.phase(), from) << RootPhaseName(from);
      Status s = t.step(m);
      bool legal =
          std::find(t.from.begin(), t.from.end(), from) != t.from.end();
      if (legal) {
        EXPECT_TRUE(s.ok()) << t.name << " from " << RootPhaseName(from) << ": "
                            << s.ToString();
        EXPECT_EQ(m.phase(), t.to) << t.name << " from " << RootPhaseName(from);
      } else {
        EXPECT_EQ(s.code(), StatusCode::kInternal)
            << t.name << " from " << RootPhaseName(from);
        EXPECT_EQ(m.phase(), from)
            << t.name << " moved from " << RootPhaseName(from);
        // The refusal names the transition and where it was.
        EXPECT_NE(s.message().find(RootPhaseName(from)), std::string::npos)
            << s.ToString();
      }
    }
  }
}

TEST(RootPhaseTest, DeltaRefitWithTwoRepairRounds) {
  RootPhases m;
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
  EXPECT_EQ(m.phase(), RootPhase::kDone);
  // Nothing moves a finished refit.
  EXPECT_FALSE(m.Plan().ok());
  EXPECT_FALSE(m.Decide(false).ok());
  EXPECT_EQ(m.phase(), RootPhase::kDone);
}

TEST(RootPhaseTest, ResumeDecidesFromPlanning) {
  RootPhases m;
  ASSERT_TRUE(m.Prepared().ok());
  ASSERT_TRUE(m.Plan().ok());
  ASSERT_TRUE(m.Decide(false).ok());
  EXPECT_EQ(m.phase(), RootPhase::kAborting);
  // An abort cannot be stopped as if a commit decision were durable.
  EXPECT_FALSE(m.Stop().ok());
  ASSERT_TRUE(m.Finish().ok());
}

TEST(RootPhaseTest, Names) {
  for (RootPhase p : kAll) EXPECT_NE(RootPhaseName(p), "unknown");
  EXPECT_EQ(RootPhaseName(RootPhase::kRepairing), "repairing");
}

}  // namespace
}  // namespace dcr
