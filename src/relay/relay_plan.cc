// Relay::Impl's PLAN handler (relay_impl.h): gathers the facts, asks
// DecidePlan (plan_decision.h) and carries out its decision: refuse, amend,
// adopt, resume, answer again, or start a refit (its session on the store,
// its fan-out to the children, its parent link).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/failpoint.h"
#include "relay/relay_impl.h"

namespace dcr {

void Relay::Impl::OnPlan(const std::shared_ptr<Link>& link,
                         const Frame& frame) {
  counters_.bytes_in += frame.bytes.size();
  auto plan = DecodePlan(frame.payload);
  if (!plan.ok()) {
    SendError(*sender_, *link, plan.status().ToString());
    link->CloseAfterFlush();
    return;
  }
  if (DCR_FAILPOINT("relay.plan").drop()) return;
  const PlanDecision d = DecidePlan(Facts(*link, frame.header, *plan));
  switch (d.outcome) {
    case PlanDecision::Outcome::kRefuse:
      return Refuse(*link, frame.header, *plan, d.code, d.detail);
    case PlanDecision::Outcome::kAmend:
      current_->fanout->Amend(*plan);
      return;
    case PlanDecision::Outcome::kDuplicate:
      return;
    case PlanDecision::Outcome::kAdopt:
      return OnAdoption(link, frame, *plan);
    case PlanDecision::Outcome::kResume:
      if (Status s = PersistEpoch(frame.header.epoch); !s.ok()) {
        return Refuse(*link, frame.header, *plan, NodeCode::kStoreError,
                      "cannot persist the coordinator epoch: " + s.ToString());
      }
      spdlog::info("{}: refit {} resumed at epoch {} (was {})", options_.name,
                   current_->refit->id().ToHex(), frame.header.epoch,
                   current_->refit->epoch());
      current_->refit->set_epoch(frame.header.epoch);
      return OnAdoption(link, frame, *plan);
    case PlanDecision::Outcome::kAnswerAgain:
      return AnswerAgain(*link, frame.header, d.raise_epoch);
    case PlanDecision::Outcome::kAccept:
      break;
  }
  if (plan->nodes[0].pulls_objects && options_.objects == nullptr) {
    return Refuse(*link, frame.header, *plan, NodeCode::kRejected,
                  "the plan has this node pull its chunks from the object "
                  "store, and it has none: start it with --topology naming "
                  "the objstore: section (its cluster has source: objstore)");
  }
  if (d.replace_orphan) ReplaceOrphan(frame.header.epoch);
  if (Status s = PersistEpoch(frame.header.epoch); !s.ok()) {
    return Refuse(*link, frame.header, *plan, NodeCode::kStoreError,
                  "cannot persist the coordinator epoch: " + s.ToString());
  }
  StartRefit(link, frame.header, *std::move(plan), d.rejoin);
}

PlanFacts Relay::Impl::Facts(const Link& link, const FrameHeader& header,
                             const PlanMsg& plan) const {
  PlanFacts f;
  f.node = options_.name;
  f.plan_senders = options_.plan_senders;
  f.max_epoch = max_epoch_;
  f.epoch_file = epoch_file_.path();
  f.refit = header.refit_id;
  f.epoch = header.epoch;
  f.sender = inbound_->PeerNode(link.id());
  f.receiver = plan.nodes[0].name;
  f.adopt = plan.adopt;
  f.resume = plan.resume;
  if (current_) {
    const RelayRefit& r = *current_->refit;
    // Only an orphan that can still give up (not deciding) is replaced.
    f.held = PlanFacts::Held{
        r.id(), r.epoch(), current_->parent->Is(link),
        current_->parent->orphaned() && r.phase() <= RefitPhase::kVoted,
        r.tracker().idle()};
  }
  if (finished_) f.ended = PlanFacts::Ended{finished_->id, finished_->epoch};
  if (store_ && store_->InProgress())
    f.unfinished = store_->InProgress()->refit;
  f.restored = restored_from_;
  return f;
}

void Relay::Impl::Refuse(Link& link, const FrameHeader& header,
                         const PlanMsg& plan, NodeCode code,
                         const std::string& detail) {
  spdlog::warn("{}: refusing the plan of refit {}: {}", options_.name,
               header.refit_id.ToHex(), detail);
  std::vector<NodeResult> out;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    NodeResult r;
    r.node = plan.nodes[i].name;
    r.code = code;
    r.detail = i == 0 ? detail
                      : fmt::format("behind {}, which refused the plan",
                                    options_.name);
    out.push_back(std::move(r));
  }
  Reply(link, FrameType::kPlanReply, header,
        EncodeResults(ResultsMsg{std::move(out)}));
}

// Our parent lost our last reply (and its link to us), or a resumed
// coordinator asks: answer again.
void Relay::Impl::AnswerAgain(Link& link, const FrameHeader& header,
                              bool raise_epoch) {
  if (raise_epoch) {
    (void)PersistEpoch(header.epoch);
    finished_->epoch = header.epoch;
  }
  spdlog::info("{}: refit {} ended here; answering {} again", options_.name,
               finished_->id.ToHex(), inbound_->PeerNode(link.id()));
  Reply(link, FrameType::kPlanReply, header, finished_->plan_reply);
  if (finished_->last_reply) {
    Reply(link, finished_->last_reply->first, header,
          finished_->last_reply->second);
  }
}

void Relay::Impl::ReplaceOrphan(uint64_t epoch) {
  RelayRefit& old = *current_->refit;
  spdlog::warn(
      "{}: refit {} (epoch {}) was replaced by a newer coordinator run "
      "(epoch {}); restoring its base and taking the new plan",
      options_.name, old.id().ToHex(), old.epoch(), epoch);
  (void)old.GiveUp();
  current_->fanout->Close();
  (void)old.Finish();
  EndRefit("aborted: replaced by a newer coordinator run", false);
}

std::optional<Digest128> Relay::Impl::ServingBase(const PlanMsg& plan) const {
  if (!serving_) return std::nullopt;
  const ServingBits* b =
      FindServing(plan.serving_base, serving_->fingerprint(), serving_->rank());
  if (b == nullptr) return std::nullopt;
  return b->bits;
}

std::unique_ptr<RefitSession> Relay::Impl::BeginSession(const RefitId& id,
                                                        const PlanMsg& plan,
                                                        bool rejoin,
                                                        NodeResult* own) {
  // A serving relay stages on the standby image, once it caught up with
  // the live one and no server reads it (a prepared refit resumes as is).
  const bool resumes_prepared = prepared_ && prepared_->refit == id;
  if (images_ && resumes_prepared && !images_->LockStandby()) {
    own->code = NodeCode::kBusy;
    own->detail = images_->why_waiting();
    return nullptr;
  }
  if (images_ && !resumes_prepared) {
    Result<bool> ready = images_->MaybeCatchUp(store_, false);
    if (!ready.ok()) {
      own->code = NodeCode::kStoreError;
      own->detail =
          "the standby image did not catch up: " + ready.status().ToString();
      return nullptr;
    }
    if (!*ready) {
      own->code = NodeCode::kBusy;
      own->detail = images_->why_waiting();
      return nullptr;
    }
  }
  const StoreSpec spec = images_ ? images_->standby_spec() : options_.store;
  bool fresh = false;  // the store is created for this refit
  if (!store_ && plan.mode == RefitMode::kFull && !plan.tensors.empty()) {
    auto manifest = Manifest::Create(plan.tensors);
    if (!manifest.ok() || manifest->digest() != plan.manifest) {
      own->code = NodeCode::kRejected;
      own->detail = "the plan's manifest does not match its digest";
      return nullptr;
    }
    if (serving_) {
      // A serving store holds the rank's shards of the plan's tensors.
      auto canonical = serving_->CanonicalManifest();
      if (!canonical.ok() || canonical->digest() != plan.manifest) {
        own->code = NodeCode::kManifestMismatch;
        own->detail = fmt::format(
            "the refit's tensors are not those of serving layout {}: {}",
            options_.serving_layout,
            canonical.ok() ? Manifest::Difference(*canonical, *manifest)
                           : canonical.status().ToString());
        return nullptr;
      }
      *manifest = serving_store_;
    }
    auto created = CreateStore(spec, *manifest);
    if (!created.ok()) {
      own->code = NodeCode::kStoreError;
      own->detail = created.status().ToString();
      return nullptr;
    }
    store_ = *std::move(created);
    fresh = true;
    spdlog::info("{}: created {} for the full refit", options_.name,
                 store_->describe());
  } else if (!store_) {
    own->code = NodeCode::kNeedsCatchUp;
    own->store.missing = true;
    own->detail =
        fmt::format("{} does not exist; the root seeds it", spec.ToString());
    return nullptr;
  }
  auto session = RefitSession::Begin(
      store_.get(), options_.name, id, plan, own,
      {.pool = hash_pool_.get(),
       .fresh_store = fresh,
       .undo_dir = options_.undo_dir.empty() ? std::nullopt
                                             : std::optional(options_.undo_dir),
       .rejoin = rejoin,
       .serving = serving_.get(),
       .serving_base = ServingBase(plan)});
  if (session && serving_) {
    if (const ServingBits* t = FindServing(
            plan.serving_target, serving_->fingerprint(), serving_->rank())) {
      session->LearnServingTarget({t->bits, t->regions});
    }
  }
  if (rejoin && session) {
    spdlog::warn(
        "{}: rejoined refit {} after a restart: the store holds a mix; "
        "only overwrites apply now, the rest comes as repairs",
        options_.name, id.ToHex());
  } else if (session && restored_from_ && *restored_from_ == id) {
    spdlog::info(
        "{}: rejoined refit {} after a restart, from its restored base",
        options_.name, id.ToHex());
  }
  if (session) {
    // The store is the session's now: what the start found is history.
    restored_from_.reset();
    prepared_.reset();
  } else if (own->store.unfinished && prepared_ &&
             prepared_->refit == *own->store.unfinished) {
    // Restarted after a yes vote, which named the target (the record may
    // not: docs/PROTOCOL.md §"Target digests at END"). With the bits
    // verified at it, only the root's decision of that refit may end it
    // (StoreCondition::prepared).
    own->store.target = prepared_->target;
    own->store.prepared = prepared_->verified;
  }
  return session;
}

void Relay::Impl::StartRefit(const std::shared_ptr<Link>& link,
                             const FrameHeader& header, PlanMsg plan,
                             bool rejoin) {
  const Clock::time_point started = Clock::now();
  if (options_.forward_window_cap != 0 &&
      (plan.chunk_window_bytes == 0 ||
       plan.chunk_window_bytes > options_.forward_window_cap)) {
    // Our children get the smaller window too: what we hold is the bound.
    plan.chunk_window_bytes = options_.forward_window_cap;
  }
  NodeResult own;
  own.node = options_.name;
  std::unique_ptr<RefitSession> session =
      BeginSession(header.refit_id, plan, rejoin, &own);
  if (!session) {
    spdlog::warn("{}: not applying refit {} ({}: {}); forwarding only",
                 options_.name, header.refit_id.ToHex(), NodeCodeName(own.code),
                 own.detail);
  }
  Fanout::Options fo;
  fo.transports = transports_.get();
  fo.mailbox = &mailbox_;
  fo.connect_timeout = options_.connect_timeout;
  fo.hello = HelloMsg{options_.name, kRoleRelay, header.epoch};
  fo.frames = options_.transport_options.frames;
  fo.header = header;
  fo.depth = plan.sender_depth + 1;
  fo.resend_buffer_bytes = options_.resend_buffer_bytes;
  Current c;
  c.started = started;
  c.repair = session && plan.mode == RefitMode::kFull && store_ &&
             store_->InProgress() &&
             store_->InProgress()->refit != header.refit_id;
  c.parent = std::make_unique<ParentLink>(
      options_.name, &*sender_, link, inbound_->GateOf(*link),
      plan.sender_depth, std::chrono::milliseconds(plan.heartbeat_ms));
  c.fanout = Fanout::Create(fo, plan);
  c.fanout->Start(Clock::now() +
                  std::chrono::milliseconds(plan.phase_timeout_ms));
  spdlog::info("{}: refit {} planned: {} step {} -> {} ({} children)",
               options_.name, header.refit_id.ToHex(),
               plan.mode == RefitMode::kFull ? "full" : "delta", plan.base.step,
               plan.target.step, c.fanout->child_count());
  c.refit = std::make_unique<RelayRefit>(&env_, header.refit_id, header.epoch,
                                         std::move(plan), std::move(own),
                                         std::move(session));
  current_.emplace(std::move(c));
  if (current_->refit->plan().nodes[0].pulls_objects) {
    StartPuller(header.refit_id);
  }
}

void Relay::Impl::OnAdoption(const std::shared_ptr<Link>& link,
                             const Frame& frame, const PlanMsg& plan) {
  Current& c = *current_;
  const RefitPhase phase = c.refit->phase();
  const std::string adopter = inbound_->PeerNode(link->id());
  std::string refusal;
  if (phase >= RefitPhase::kCommitting) {
    refusal = "the refit is ending here";
  } else if (!c.parent->orphaned() &&
             plan.sender_depth >= c.parent->parent_depth()) {
    refusal = fmt::format(
        "it has a live parent at depth {} (the adopter is at depth {})",
        c.parent->parent_depth(), plan.sender_depth);
  }
  if (!refusal.empty()) {
    spdlog::warn("{}: not adopted by {}: {}", options_.name, adopter, refusal);
    SendError(*sender_, *link,
              fmt::format("{} not adopted: {}", options_.name, refusal));
    link->CloseAfterFlush();
    return;
  }
  std::shared_ptr<Link> old = c.parent->Adopt(link, inbound_->GateOf(*link),
                                              plan.sender_depth, plan.resend);
  c.fanout->set_depth(plan.sender_depth + 1);
  c.fanout->set_adopting(true);
  if (old) old->Close();
  spdlog::info("{}: adopted by {} (depth {}) while {}", options_.name, adopter,
               plan.sender_depth, RefitPhaseName(phase));
  // The adopter may have placed orphans in our subtree.
  c.fanout->Amend(plan);
  // Tell the new parent what this subtree answered so far; a phase still
  // in progress answers it when done.
  if (phase != RefitPhase::kPlanning) {
    Reply(*link, FrameType::kPlanReply, frame.header,
          c.parent->PlanReplyFor(plan.resend, phase == RefitPhase::kReceiving));
    if (c.parent->last_reply()) {
      Reply(*link, c.parent->last_reply()->first, frame.header,
            c.parent->last_reply()->second);
    }
  }
}

}  // namespace dcr
