#include "relay/relay_refit.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/failpoint.h"
#include "protocol/refit_manifest.h"
#include "relay/chunk_forward.h"

namespace dcr {

using P = RefitPhase;

const char* RefitPhaseName(RefitPhase phase) {
  switch (phase) {
    case P::kPlanning:
      return "planned";
    case P::kReceiving:
      return "receiving";
    case P::kVoting:
      return "voting";
    case P::kVoted:
      return "voted";
    case P::kCommitting:
      return "committing";
    case P::kAborting:
    case P::kOrphaned:
      return "aborting";
    case P::kEnded:
      return "ended";
  }
  return "?";
}

RelayRefit::RelayRefit(const Env* env, const RefitId& id, uint64_t epoch,
                       PlanMsg plan, NodeResult own,
                       std::unique_ptr<RefitSession> session)
    : env_(env),
      id_(id),
      epoch_(epoch),
      plan_(std::move(plan)),
      own_(std::move(own)),
      session_(std::move(session)),
      tracker_(std::make_shared<ApplyTracker>()),
      applies_(session_ != nullptr) {}

RefitSession::HashCounts RelayRefit::CountHashes() {
  if (!session_) return {};
  RefitSession::HashCounts hc = session_->hash_counts();
  const RefitSession::HashCounts counted = counted_;
  counted_ = hc;
  hc.ahead -= counted.ahead;
  hc.at_vote -= counted.at_vote;
  if (env_->counters != nullptr) {
    env_->counters->tensors_hashed_ahead += hc.ahead;
    env_->counters->tensors_hashed_at_vote += hc.at_vote;
  }
  return hc;
}

RelayRefit::~RelayRefit() {
  tracker_->WaitIdle();
  // After the COMMIT_REPLY went out (LocalFinish).
  if (spent_journal_) (void)spent_journal_->Remove();
}

Status RelayRefit::From(std::initializer_list<RefitPhase> sources,
                        const char* transition) const {
  if (std::find(sources.begin(), sources.end(), phase_) != sources.end()) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      fmt::format("refit {}: {} is not a transition out of {}", id_.ToHex(),
                  transition, RefitPhaseName(phase_)));
}

bool RelayRefit::WantsLocalWork() const {
  if (local_ || !tracker_->idle()) return false;
  return phase_ == P::kVoting || phase_ == P::kCommitting ||
         phase_ == P::kAborting || phase_ == P::kOrphaned;
}

Status RelayRefit::Planned() {
  DCR_RETURN_IF_ERROR(From({P::kPlanning}, "Planned"));
  phase_ = P::kReceiving;
  return Status::OK();
}

Result<bool> RelayRefit::Chunk() {
  DCR_RETURN_IF_ERROR(From({P::kReceiving, P::kVoted}, "Chunk"));
  if (phase_ == P::kReceiving) return false;
  // After a vote, chunks are a repair round: receiving again.
  phase_ = P::kReceiving;
  voted_yes_ = false;  // the bits change: only a new vote counts
  return true;
}

void RelayRefit::Apply(const FrameBuffer& buffer,
                       std::span<const std::byte> payload) {
  if (!session_) return;
  FailpointHit fp = DCR_FAILPOINT("relay.apply_chunk");
  const bool hash = env_->signing_key != nullptr;
  if (fp.corrupt()) {
    FrameBuffer copy = CorruptedCopy(payload, fp);
    session_->Queued(*copy);
    env_->workers->Submit({copy, *copy, session_.get(), tracker_, hash});
  } else if (!fp.drop()) {
    session_->Queued(payload);
    env_->workers->Submit({buffer, payload, session_.get(), tracker_, hash});
  }
}

namespace {

// The target an END names, checked against the plan (docs/PROTOCOL.md
// §"Target digests at END"): a PLAN that left the digest to END must get
// it there, and an END must not contradict what the PLAN named.
Status CheckEndTarget(const EndMsg& end, const PlanMsg& plan) {
  if (!end.target) {
    if (!plan.target_at_end()) return Status::OK();
    return Status::InvalidArgument(
        "the PLAN left the target's digest to END, and END names none");
  }
  const Version& t = *end.target;
  if (t.step != plan.target.step) {
    return Status::InvalidArgument(
        fmt::format("END names target step {}, the PLAN step {}", t.step,
                    plan.target.step));
  }
  if (!plan.target_at_end() && t != plan.target) {
    return Status::InvalidArgument(
        fmt::format("END names target {}, the PLAN {}", t.digest.ShortHex(),
                    plan.target.digest.ShortHex()));
  }
  if (!end.target_tensor_digests.empty() &&
      VersionDigest(plan.manifest, end.target_tensor_digests) != t.digest) {
    return Status::InvalidArgument(
        fmt::format("END's {} tensor digests do not make its target digest {}",
                    end.target_tensor_digests.size(), t.digest.ShortHex()));
  }
  return Status::OK();
}

}  // namespace

Status RelayRefit::End(const EndMsg& end) {
  // A second END (after a repair round without chunks for this subtree)
  // asks for a new vote.
  DCR_RETURN_IF_ERROR(From({P::kReceiving, P::kVoted}, "End"));
  end_ = end;
  end_error_ = CheckEndTarget(end, plan_);
  if (end_error_.ok() && end.target) {
    plan_.target = *end.target;
    if (!end.target_tensor_digests.empty()) {
      plan_.target_tensor_digests = end.target_tensor_digests;
    }
    if (session_) {
      session_->LearnTarget(plan_.target, plan_.target_tensor_digests);
      // A serving store votes by its rank's bits at the target.
      const ReceiverMap* map = session_->serving();
      const ServingBits* bits =
          map == nullptr ? nullptr
                         : FindServing(end.serving_target, map->fingerprint(),
                                       map->rank());
      if (bits != nullptr) {
        session_->LearnServingTarget({bits->bits, bits->regions});
      }
    }
  }
  phase_ = P::kVoting;
  local_.reset();
  return Status::OK();
}

Status RelayRefit::Vote() {
  DCR_RETURN_IF_ERROR(From({P::kVoting}, "Vote"));
  if (local_) return Status::InvalidArgument("already voted");
  if (!tracker_->idle()) {
    return Status::InvalidArgument("applies are in flight");
  }
  NodeResult vote = own_;
  if (session_ && !end_error_.ok()) {
    vote.code = NodeCode::kRejected;
    vote.detail = std::string(end_error_.message());
    vote.chunks_applied = tracker_->applied();
  } else if (session_) {
    Status apply_error = tracker_->TakeFirstError();  // per vote
    // With the root's public key, what was applied must be what the root
    // signed, whichever relay delivered it; checked first, so a forged
    // chunk is named as such rather than as a digest mismatch.
    Status manifest = Status::OK();
    if (env_->signing_key) {
      manifest = VerifyRefitManifest(*end_, *env_->signing_key, id_, epoch_,
                                     plan_, tracker_->AppliedChunks());
    }
    if (!manifest.ok()) {
      vote.code = NodeCode::kRejected;
      vote.detail = std::string(manifest.message());
      vote.chunks_applied = tracker_->applied();
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      vote = session_->Vote(*end_, env_->hash_pool);
      const RefitSession::HashCounts hc = CountHashes();
      spdlog::debug(
          "{}: vote in {:.3f} s: hashed {} tensors in {:.3f} s ({} hashed "
          "ahead since the last vote); a yes made durable in {:.3f} s",
          env_->node,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count(),
          hc.at_vote, hc.vote_hash_seconds, hc.ahead, hc.vote_sync_seconds);
      // The bits decide: a chunk that failed (checksum, bounds) left its
      // span as it was, which the digests show, and a repair round
      // overwrites it.
      if (!apply_error.ok()) {
        spdlog::warn("{}: refused a chunk since the last vote: {}", env_->node,
                     apply_error.ToString());
        if (vote.code != NodeCode::kOk) {
          vote.detail += "; first error: " + apply_error.ToString();
        }
      }
    }
  } else if (vote.code == NodeCode::kOk) {
    vote.code = NodeCode::kStoreError;
    vote.detail = "no session";
  }
  local_ = vote;
  voted_yes_ = vote.code == NodeCode::kOk;
  spdlog::info(
      "{}: vote {} ({})", env_->node, vote.code == NodeCode::kOk ? "yes" : "no",
      vote.code == NodeCode::kOk ? "digest matches the target" : vote.detail);
  return Status::OK();
}

Status RelayRefit::Veto(NodeCode code, const std::string& detail) {
  DCR_RETURN_IF_ERROR(From({P::kVoting}, "Veto"));
  if (!local_) return Status::InvalidArgument("no vote yet");
  local_->code = code;
  local_->detail = detail;
  voted_yes_ = false;
  spdlog::warn("{}: vote no: {}", env_->node, detail);
  return Status::OK();
}

Result<NodeResult> RelayRefit::Voted() {
  DCR_RETURN_IF_ERROR(From({P::kVoting}, "Voted"));
  if (!local_) return Status::InvalidArgument("no vote yet");
  phase_ = P::kVoted;
  return *local_;
}

Status RelayRefit::Commit(const CommitMsg& commit) {
  DCR_RETURN_IF_ERROR(
      From({P::kPlanning, P::kReceiving, P::kVoting, P::kVoted}, "Commit"));
  commit_ = commit;
  phase_ = P::kCommitting;
  local_.reset();
  return Status::OK();
}

Status RelayRefit::Abort() {
  DCR_RETURN_IF_ERROR(
      From({P::kPlanning, P::kReceiving, P::kVoting, P::kVoted}, "Abort"));
  phase_ = P::kAborting;
  local_.reset();
  return Status::OK();
}

Status RelayRefit::GiveUp() {
  DCR_RETURN_IF_ERROR(
      From({P::kPlanning, P::kReceiving, P::kVoting, P::kVoted}, "GiveUp"));
  phase_ = P::kOrphaned;
  local_.reset();
  return Status::OK();
}

Status RelayRefit::Finish() {
  DCR_RETURN_IF_ERROR(
      From({P::kCommitting, P::kAborting, P::kOrphaned}, "Finish"));
  if (local_) return Status::InvalidArgument("already finished");
  if (!tracker_->idle()) {
    return Status::InvalidArgument("applies are in flight");
  }
  if (phase_ != P::kCommitting) {
    local_ = LocalFinish(false);
    return Status::OK();
  }
  const bool in_set =
      commit_ && session_ && voted_yes_ &&
      std::find(commit_->commit_set.begin(), commit_->commit_set.end(),
                env_->node) != commit_->commit_set.end();
  NodeResult done = LocalFinish(in_set);
  if (!in_set && done.code == NodeCode::kOk) {
    done.detail = "not in the commit set; base restored";
  }
  local_ = done;
  return Status::OK();
}

Result<RelayRefit::Conclusion> RelayRefit::Conclude() {
  DCR_RETURN_IF_ERROR(
      From({P::kCommitting, P::kAborting, P::kOrphaned}, "Conclude"));
  if (!local_) return Status::InvalidArgument("not finished");
  Conclusion c;
  c.local = *local_;
  switch (phase_) {
    case P::kCommitting:
      c.reply = FrameType::kCommitReply;
      c.committed =
          local_->code == NodeCode::kOk && local_->version == plan_.target;
      c.summary = c.committed
                      ? fmt::format("committed step {}", plan_.target.step)
                      : "aborted (not committed here)";
      break;
    case P::kAborting:
      c.reply = FrameType::kAbortReply;
      c.summary = "aborted by the root";
      break;
    default:
      c.summary = "aborted: parent link lost and not adopted";
      break;
  }
  phase_ = P::kEnded;
  return c;
}

Status RelayRefit::Shutdown() {
  DCR_RETURN_IF_ERROR(From({P::kPlanning, P::kReceiving, P::kVoting, P::kVoted,
                            P::kCommitting, P::kAborting, P::kOrphaned},
                           "Shutdown"));
  // Let the applies in progress finish, then restore the base bits (a
  // no-op once committed: the session is gone).
  tracker_->WaitIdle();
  LocalFinish(/*commit=*/false);
  phase_ = P::kEnded;
  return Status::OK();
}

NodeResult RelayRefit::LocalFinish(bool commit) {
  NodeResult out = own_;
  out.chunks_applied = tracker_->applied();
  if (!session_) return out;
  Status s;
  if (commit) {
    // The journal is removed once the reply is on its way (the destructor).
    s = session_->Commit(&spent_journal_);
    if (s.ok()) out.version = plan_.target;
  } else {
    s = session_->Abort(env_->decoder);
    if (s.ok()) {
      out.version = plan_.base;
      out.detail = "base restored";
    }
  }
  if (!s.ok()) {
    out.code = NodeCode::kStoreError;
    out.detail = s.ToString();
    spdlog::error("{}: {} failed: {}", env_->node,
                  commit ? "commit" : "restore", s.ToString());
  }
  CountHashes();  // what was hashed ahead of a vote that never came
  session_.reset();
  return out;
}

}  // namespace dcr
