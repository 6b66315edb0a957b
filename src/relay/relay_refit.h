// One refit as a relay sees it, as an explicit state machine: the phases of
// docs/PROTOCOL.md §"Relay states" and one function per transition. Each
// transition names its source phases and returns InvalidArgument (and
// changes nothing) when called from any other, so a frame out of order,
// a late timer or a second completion cannot move the refit sideways.
//
//   transition  from                          to          event
//   Planned     kPlanning                     kReceiving  children answered
//                                                         PLAN
//   Chunk       kReceiving, kVoted            kReceiving  CHUNK (in kVoted:
//                                                         a repair round)
//   End         kReceiving, kVoted            kVoting     END
//   Vote        kVoting (applies drained)     kVoting     own vote made
//   Voted       kVoting (own vote made)       kVoted      children voted
//   Commit      kPlanning..kVoted             kCommitting COMMIT
//   Abort       kPlanning..kVoted             kAborting   ABORT
//   GiveUp      kPlanning..kVoted             kOrphaned   no new parent in
//                                                         time, or replaced
//   Finish      kCommitting, kAborting,       (same)      applies drained:
//               kOrphaned                                 commit or restore
//   Conclude    kCommitting, kAborting,       kEnded      finished, children
//               kOrphaned                                 answered
//   Shutdown    any but kEnded                kEnded      the relay stops:
//                                                         restore
//
// Events drive it: frames (Chunk, End, Commit, Abort), apply completions
// (Vote, Finish: their guard is ApplyTracker::idle()), the children's
// replies (Planned, Voted, Conclude: the caller checks Fanout::Complete)
// and deadline timers (GiveUp). What to send and to whom (the fan-out, the
// parent link) is the caller's (relay.cc); this class owns the local half:
// the RefitSession on the store, the apply tracker and the decision.
//
// Thread safety: every method runs on the relay's actor thread. The apply
// workers run jobs that point at this refit's session; Vote, Finish,
// Shutdown and the destructor act only once no job is in flight (the
// destructor and Shutdown wait for that on the tracker's condition
// variable).
#ifndef DCR_RELAY_RELAY_REFIT_H_
#define DCR_RELAY_RELAY_REFIT_H_

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "dcr/codec.h"
#include "dcr/status.h"
#include "dcr/thread_pool.h"
#include "dcr/transport.h"
#include "protocol/messages.h"
#include "relay/apply_workers.h"
#include "relay/relay_stats.h"
#include "session/refit_session.h"
#include "wire/signature.h"

namespace dcr {

enum class RefitPhase {
  kPlanning,    // waiting for the children's PLAN_REPLY
  kReceiving,   // chunks flow
  kVoting,      // END arrived: drain applies, vote, wait for children
  kVoted,       // VOTE sent; waiting for COMMIT or ABORT
  kCommitting,  // COMMIT arrived: commit or restore, wait for children
  kAborting,    // ABORT arrived: restore, wait for children
  kOrphaned,    // the parent left before COMMIT: restore, then end
  kEnded,       // concluded; the relay drops it
};

// The name Stats() and `dcr status` show ("planned", "receiving", ...).
const char* RefitPhaseName(RefitPhase phase);

class RelayRefit {
 public:
  // What every refit of a relay shares; outlives the refit.
  struct Env {
    std::string node;
    ApplyWorkers* workers = nullptr;
    ThreadPool* hash_pool = nullptr;  // votes
    ChunkDecoder* decoder = nullptr;  // restores, on the actor thread
    // With it, a vote checks END's signed manifest against the chunks
    // applied (docs/PROTOCOL.md §"Signed refits"); null: not checked.
    const Ed25519PublicKey* signing_key = nullptr;
    // The relay's totals: votes add the tensors they hashed (null: not
    // counted).
    RelayCounters* counters = nullptr;
  };

  // `own`: this node's PLAN result (a refusal, if any); `session` null:
  // forward-only (nothing is applied, the vote is a refusal).
  RelayRefit(const Env* env, const RefitId& id, uint64_t epoch, PlanMsg plan,
             NodeResult own, std::unique_ptr<RefitSession> session);
  ~RelayRefit();  // waits for this refit's applies
  RelayRefit(const RelayRefit&) = delete;
  RelayRefit& operator=(const RelayRefit&) = delete;

  // The outcome of Conclude: the reply the parent gets (kCommitReply,
  // kAbortReply; kError: none, the parent is gone), this node's result,
  // whether it committed and a line for logs and Stats.
  struct Conclusion {
    FrameType reply = FrameType::kError;
    NodeResult local;
    bool committed = false;
    std::string summary;
  };

  // Transitions (see the diagram above).
  Status Planned();
  // True iff a repair round began (from kVoted): the caller streams again.
  Result<bool> Chunk();
  Status End(const EndMsg& end);
  Status Vote();
  // Turns this node's own yes vote into `code` (kVoting, once Vote ran):
  // its serving process did not answer (relay/serving_images.h).
  Status Veto(NodeCode code, const std::string& detail);
  Result<NodeResult> Voted();
  Status Commit(const CommitMsg& commit);
  Status Abort();
  Status GiveUp();
  Status Finish();
  Result<Conclusion> Conclude();
  Status Shutdown();

  // Hands a received chunk (`payload` viewing into `buffer`) to the apply
  // workers, after the relay.apply_chunk failpoint; nothing without a
  // session. Call after Chunk() succeeded.
  void Apply(const FrameBuffer& buffer, std::span<const std::byte> payload);
  // A STREAM_MARK from the parent: the session hashes ahead below it
  // (RefitSession::StreamPassed); nothing without a session.
  void StreamPassed(uint32_t tensor) {
    if (session_) session_->StreamPassed(tensor);
  }

  const RefitId& id() const { return id_; }
  uint64_t epoch() const { return epoch_; }
  // A resumed coordinator's higher epoch (fencing the old one off).
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  const PlanMsg& plan() const { return plan_; }
  RefitPhase phase() const { return phase_; }
  const NodeResult& own() const { return own_; }
  const ApplyTracker& tracker() const { return *tracker_; }
  // This node applies the refit (it began a session at PLAN); false for a
  // node that only forwards it (behind, busy, its store unusable).
  bool applies() const { return applies_; }
  // The phase's own result is in (Vote or Finish ran).
  bool local_done() const { return local_.has_value(); }
  // This node's own vote (kVoting, once Vote ran) is yes.
  bool voted_yes() const { return voted_yes_; }
  // Finish committed the target here (kCommitting).
  bool committed_here() const {
    return phase_ == RefitPhase::kCommitting && local_ &&
           local_->code == NodeCode::kOk && local_->version == plan_.target;
  }
  // Vote or Finish may run now: the phase wants it and no apply is in
  // flight.
  bool WantsLocalWork() const;

 private:
  NodeResult LocalFinish(bool commit);
  Status From(std::initializer_list<RefitPhase> sources,
              const char* transition) const;

  // The refit state, in one place (issue 14).
  const Env* env_;
  RefitId id_;
  uint64_t epoch_;
  PlanMsg plan_;
  NodeResult own_;                         // PLAN result (refusal if any)
  std::unique_ptr<RefitSession> session_;  // null: forward-only, or done
  RefitSession::HashCounts counted_;       // added to Env::counters
  // Adds the session's hashes since counted_ to Env::counters; returns
  // them (with the last vote's times).
  RefitSession::HashCounts CountHashes();
  std::shared_ptr<ApplyTracker> tracker_;  // shared with in-flight jobs
  const bool applies_;                     // a session at PLAN
  RefitPhase phase_ = RefitPhase::kPlanning;
  std::optional<EndMsg> end_;
  Status end_error_;  // the last END's target contradicts the plan
  std::optional<CommitMsg> commit_;
  std::optional<NodeResult> local_;  // this phase's own result, once done
  bool voted_yes_ = false;           // commit only what this node verified
  // The committed session's journal, removed at destruction: after the
  // COMMIT_REPLY (its unlink can wait for a file system commit).
  std::unique_ptr<Journal> spent_journal_;
};

}  // namespace dcr

#endif  // DCR_RELAY_RELAY_REFIT_H_
