// DecidePlan, table-driven: every outcome of a PLAN, with no sockets.
#include "relay/plan_decision.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace dcr {
namespace {

using Outcome = PlanDecision::Outcome;

RefitId Id(uint8_t b) {
  RefitId id;
  id.bytes[0] = b;
  return id;
}

// A relay "n1" whose parent is "root", at epoch 5, with nothing held: a
// fresh PLAN of epoch 6 from the root is accepted.
PlanFacts Base() {
  PlanFacts f;
  f.node = "n1";
  f.plan_senders = {"root", "n0"};
  f.max_epoch = 5;
  f.refit = Id(1);
  f.epoch = 6;
  f.sender = "root";
  f.receiver = "n1";
  return f;
}

PlanFacts::Held Holding(uint64_t epoch, bool on_parent = false,
                        bool orphaned = false, bool idle = true) {
  return PlanFacts::Held{Id(1), epoch, on_parent, orphaned, idle};
}

struct Case {
  std::string name;
  std::function<void(PlanFacts&)> edit;
  Outcome outcome;
  NodeCode code;
  std::string detail_has;
  bool raise_epoch;
  bool rejoin;
  bool replace_orphan;
  bool rejoin_restored;

  Case(std::string n, std::function<void(PlanFacts&)> e, Outcome o,
       NodeCode c = NodeCode::kOk, std::string d = "", bool raise = false,
       bool rj = false, bool replace = false, bool restored = false)
      : name(std::move(n)),
        edit(std::move(e)),
        outcome(o),
        code(c),
        detail_has(std::move(d)),
        raise_epoch(raise),
        rejoin(rj),
        replace_orphan(replace),
        rejoin_restored(restored) {}
};

TEST(PlanDecisionTest, EveryOutcome) {
  const std::vector<Case> cases = {
      {"fresh plan", [](PlanFacts&) {}, Outcome::kAccept},
      {"no allowlist takes any sender",
       [](PlanFacts& f) {
         f.plan_senders.clear();
         f.sender = "stranger";
       },
       Outcome::kAccept},
      {"sender not an ancestor", [](PlanFacts& f) { f.sender = "stranger"; },
       Outcome::kRefuse, NodeCode::kRejected, "'stranger' is not one"},
      {"an adoption into the held run may come from any node",
       [](PlanFacts& f) {
         f.sender = "cousin";
         f.adopt = true;
         f.held = Holding(6);
       },
       Outcome::kAdopt},
      {"a non-ancestor's adoption into another run is refused",
       [](PlanFacts& f) {
         f.sender = "cousin";
         f.adopt = true;
         f.held = Holding(5);
       },
       Outcome::kRefuse, NodeCode::kRejected, "ancestors"},
      {"plan for another node", [](PlanFacts& f) { f.receiver = "n2"; },
       Outcome::kRefuse, NodeCode::kRejected, "the plan is for 'n2'"},
      {"parent places orphans (amend)",
       [](PlanFacts& f) {
         f.adopt = true;
         f.held = Holding(6, /*on_parent=*/true);
       },
       Outcome::kAmend},
      {"same plan again on the parent link",
       [](PlanFacts& f) { f.held = Holding(6, /*on_parent=*/true); },
       Outcome::kDuplicate},
      {"same run on another link: adoption",
       [](PlanFacts& f) {
         f.adopt = true;
         f.held = Holding(6, false, /*orphaned=*/true);
       },
       Outcome::kAdopt},
      {"resume at a higher epoch",
       [](PlanFacts& f) {
         f.resume = true;
         f.epoch = 7;
         f.held = Holding(6);
       },
       Outcome::kResume},
      {"resume at the same epoch is the held run: adoption",
       [](PlanFacts& f) {
         f.resume = true;
         f.held = Holding(6);
       },
       Outcome::kAdopt},
      {"resume of a refit not held",
       [](PlanFacts& f) {
         f.resume = true;
         f.epoch = 7;
       },
       Outcome::kRefuse, NodeCode::kRejected, "is not in progress here"},
      {"parent lost the last reply: answer again",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 5;
         f.ended = PlanFacts::Ended{Id(1), 5};
       },
       Outcome::kAnswerAgain},
      {"resumed coordinator asks an ended refit: answer again, raise epoch",
       [](PlanFacts& f) {
         f.resume = true;
         f.epoch = 7;
         f.ended = PlanFacts::Ended{Id(1), 5};
       },
       Outcome::kAnswerAgain, NodeCode::kOk, "", /*raise_epoch=*/true},
      {"an adoption of an ended refit at another epoch is stale",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 4;
         f.ended = PlanFacts::Ended{Id(1), 5};
       },
       Outcome::kRefuse, NodeCode::kRejected, "stale coordinator epoch 4"},
      {"restarted mid-refit: rejoin at the accepted epoch",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 5;
         f.unfinished = Id(1);
       },
       Outcome::kAccept, NodeCode::kOk, "", false, /*rejoin=*/true},
      {"restarted mid-refit, base restored from the journal: rejoin with "
       "a normal session",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 5;
         f.restored = Id(1);
       },
       Outcome::kAccept, NodeCode::kOk, "", false, /*rejoin=*/false,
       /*replace=*/false, /*restored=*/true},
      {"restored another refit: stale",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 5;
         f.restored = Id(2);
       },
       Outcome::kRefuse, NodeCode::kRejected, "stale coordinator epoch 5"},
      {"restored, but a resume at a higher epoch is not a rejoin",
       [](PlanFacts& f) {
         f.adopt = true;
         f.resume = true;
         f.epoch = 6;
         f.restored = Id(1);
       },
       Outcome::kRefuse, NodeCode::kRejected, "not in progress here"},
      {"restored, a new refit's plan: a plain accept",
       [](PlanFacts& f) {
         f.refit = Id(2);
         f.restored = Id(1);
       },
       Outcome::kAccept},
      {"unfinished refit is another one: stale",
       [](PlanFacts& f) {
         f.adopt = true;
         f.epoch = 5;
         f.unfinished = Id(2);
       },
       Outcome::kRefuse, NodeCode::kRejected, "(in memory)"},
      {"stale epoch names the epoch file",
       [](PlanFacts& f) {
         f.epoch = 5;
         f.epoch_file = "/s/p.dcr-epoch";
       },
       Outcome::kRefuse, NodeCode::kRejected, "(/s/p.dcr-epoch)"},
      {"busy with another refit",
       [](PlanFacts& f) {
         f.refit = Id(2);
         f.epoch = 7;
         f.held = Holding(6);
       },
       Outcome::kRefuse, NodeCode::kBusy, "is in progress"},
      {"orphan replaced by a newer run",
       [](PlanFacts& f) {
         f.refit = Id(2);
         f.epoch = 7;
         f.held = Holding(6, false, /*orphaned=*/true);
       },
       Outcome::kAccept, NodeCode::kOk, "", false, false,
       /*replace_orphan=*/true},
      {"orphan with applies in flight stays busy",
       [](PlanFacts& f) {
         f.refit = Id(2);
         f.epoch = 7;
         f.held = Holding(6, false, /*orphaned=*/true, /*idle=*/false);
       },
       Outcome::kRefuse, NodeCode::kBusy, "is in progress"},
  };
  std::set<Outcome> covered;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    covered.insert(c.outcome);
    PlanFacts f = Base();
    c.edit(f);
    const PlanDecision d = DecidePlan(f);
    EXPECT_EQ(PlanOutcomeName(d.outcome),
              std::string(PlanOutcomeName(c.outcome)));
    EXPECT_EQ(d.code, c.code);
    EXPECT_NE(d.detail.find(c.detail_has), std::string::npos) << d.detail;
    EXPECT_EQ(d.raise_epoch, c.raise_epoch);
    EXPECT_EQ(d.rejoin, c.rejoin);
    EXPECT_EQ(d.replace_orphan, c.replace_orphan);
    EXPECT_EQ(d.rejoin_restored, c.rejoin_restored);
  }
  EXPECT_EQ(covered.size(), 7u) << "a case per outcome";
}

}  // namespace
}  // namespace dcr
