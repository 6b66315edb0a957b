// What a relay does with a PLAN frame, as a pure function of the PLAN and
// what the relay holds (its refit in progress, the refit that ended last,
// its epoch, its store's unfinished refit, its allowlist of plan senders).
// No sockets, no store: the relay gathers PlanFacts on its actor thread,
// calls DecidePlan, and carries out the decision (relay.cc); the table
// tests in tests/unit/relay/plan_decision_test.cc cover every outcome.
//
// The outcomes, in the order they are tried (docs/PROTOCOL.md §"Relay
// states", §"Heartbeats and re-parenting", §"Resume"):
//   kRefuse      answer PLAN_REPLY with `code` for the whole subtree: a
//                sender that is not an ancestor, a plan for another node, a
//                resume of a refit not held here, a stale epoch, busy;
//   kAmend       the live parent placed orphans in this subtree (an adoption
//                PLAN on the parent link);
//   kDuplicate   the same PLAN again on the parent link: ignored;
//   kAdopt       another node adopts this relay into the refit it holds;
//   kResume      `dcr refit --resume` takes the refit over at a higher
//                epoch (persist it, then adopt);
//   kAnswerAgain the refit already ended here: send PLAN_REPLY and the last
//                reply again (raise the epoch first if `raise_epoch`);
//   kAccept      start a new refit (persist the epoch first); `rejoin`: the
//                store's unfinished refit is this one (restarted mid-refit:
//                overwrites only); `rejoin_restored`: this relay restarted
//                mid-refit and restored the refit's base from its journal,
//                so it rejoins with a normal session (XOR applies, Abort
//                restores); `replace_orphan`: first end the orphaned refit
//                this relay still waits in, which a newer coordinator run
//                replaced.
//
// Thread safety: a pure function; call it from any thread.
#ifndef DCR_RELAY_PLAN_DECISION_H_
#define DCR_RELAY_PLAN_DECISION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcr/version.h"
#include "protocol/messages.h"

namespace dcr {

struct PlanFacts {
  // This relay.
  std::string node;
  std::vector<std::string> plan_senders;  // empty: any sender
  uint64_t max_epoch = 0;                 // the highest epoch it accepted
  std::string epoch_file;                 // for messages; empty: in memory
  // The PLAN: its frame header and what it asks.
  RefitId refit;
  uint64_t epoch = 0;
  std::string sender;    // the HELLO node of the link it came on
  std::string receiver;  // plan.nodes[0].name
  bool adopt = false;
  bool resume = false;
  // The refit in progress here, if any.
  struct Held {
    RefitId id;
    uint64_t epoch = 0;
    bool on_parent_link = false;  // the PLAN came on its parent's link
    bool orphaned = false;        // its parent link is gone
    bool applies_idle = true;     // no apply in flight
  };
  std::optional<Held> held;
  // The refit that ended last here, if any.
  struct Ended {
    RefitId id;
    uint64_t epoch = 0;
  };
  std::optional<Ended> ended;
  // The refit the store's record names unfinished, if any.
  std::optional<RefitId> unfinished;
  // The refit whose base this relay restored at start from its journal
  // (restarted mid-refit without a yes vote), if no refit ran since.
  std::optional<RefitId> restored;
};

struct PlanDecision {
  enum class Outcome {
    kRefuse,
    kAmend,
    kDuplicate,
    kAdopt,
    kResume,
    kAnswerAgain,
    kAccept,
  };
  Outcome outcome = Outcome::kRefuse;
  NodeCode code = NodeCode::kOk;  // kRefuse
  std::string detail;             // kRefuse: why
  bool raise_epoch = false;       // kAnswerAgain
  bool rejoin = false;            // kAccept
  bool rejoin_restored = false;   // kAccept
  bool replace_orphan = false;    // kAccept
};

[[nodiscard]] PlanDecision DecidePlan(const PlanFacts& facts);

const char* PlanOutcomeName(PlanDecision::Outcome outcome);

}  // namespace dcr

#endif  // DCR_RELAY_PLAN_DECISION_H_
