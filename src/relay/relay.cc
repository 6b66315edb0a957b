#include "relay/relay.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/failpoint.h"
#include "relay/chunk_forward.h"
#include "relay/relay_impl.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// Between refits the loop wakes this often to publish Stats: the store's
// background write-back (store_unsynced) ends without an event.
constexpr auto kStatsInterval = std::chrono::milliseconds(200);

}  // namespace

void Relay::Impl::Run() {
  while (!stopping_) {
    loop_turn_.store(Clock::now().time_since_epoch().count(),
                     std::memory_order_relaxed);
    (void)DCR_FAILPOINT("relay.loop");
    mailbox_.RunUntil(NextDeadline(Clock::now()));
    if (current_) OnTimers(Clock::now());
    inbound_->Sweep(Clock::now());
    Advance();
    if (images_) images_->Tick();
    if (images_ && !current_ && images_->CatchUpDue()) CatchUpStandby();
    PublishStats();
  }
  // Shutdown: let the applies of a refit in progress finish, then restore
  // the base bits.
  if (current_) {
    (void)current_->refit->Shutdown();
    EndRefit("aborted: the relay stopped", false);
  }
  PublishStats();
}

Clock::time_point Relay::Impl::NextDeadline(Clock::time_point now) const {
  Clock::time_point next = now + kStatsInterval;
  if (images_) next = std::min(next, images_->NextDeadline());
  if (!current_) return next;
  const Current& c = *current_;
  // A phase deadline already acted on (ExpireIfDue failed the late
  // children) is not waited for again, nor the heartbeat tick of a closed
  // Fanout (Tick no longer moves it).
  for (Clock::time_point t : {c.fanout->deadline(), c.fanout->next_tick()}) {
    if (t > timers_ran_) next = std::min(next, t);
  }
  next = std::min(next, c.parent->NextHeartbeat());
  if (c.parent->orphaned() && c.refit->phase() <= RefitPhase::kVoted) {
    next = std::min(next, c.parent->orphan_deadline());
  }
  // An adoption not accepted within the connect timeout (ExpireIfDue fails
  // it); strictly later than its start, so it is never acted on early.
  if (Clock::time_point t = c.fanout->adoption_deadline();
      t != Clock::time_point::max()) {
    next = std::min(next, t + std::chrono::milliseconds(1));
  }
  // No timer while paused: reading from the parent resumes (MaybeResume)
  // on the events that lower what paused it, a child's queue falling to
  // half the window (Fanout wakes the mailbox) and an apply completion.
  return next;
}

void Relay::Impl::OnTimers(Clock::time_point now) {
  Current& c = *current_;
  // The loop runs the timers at least every half heartbeat interval; a
  // longer gap means this relay did not run (a stopped process, a blocked
  // thread). On waking, the timers may run before the link events that
  // came meanwhile: silence measured across the gap is our own, not our
  // peers'. Its events (a closed link, an adoption) decide instead.
  const auto interval = std::chrono::milliseconds(c.refit->plan().heartbeat_ms);
  if (interval.count() != 0 && timers_ran_ > c.started &&
      now - timers_ran_ > interval) {
    const Clock::duration gap = now - timers_ran_;
    spdlog::info("{}: did not run for {:.1f} s; not counting it as silence",
                 options_.name, std::chrono::duration<double>(gap).count());
    c.parent->Stalled(gap);
    c.fanout->Stalled(gap);
  }
  timers_ran_ = now;
  c.fanout->ExpireIfDue(now);
  if (c.parent->orphaned() && now >= c.parent->orphan_deadline() &&
      c.refit->GiveUp().ok()) {
    spdlog::warn("{}: no new parent for refit {}; restoring the base",
                 options_.name, c.refit->id().ToHex());
    c.fanout->Close();
  }
  SampleProgress();
  if (auto why =
          c.parent->Heartbeat(About(), now, [&] { return ProgressReport(); })) {
    c.parent->Close();
    Orphan(*why);
  }
  c.fanout->Tick(now);
}

// Takes every transition the events so far enable: an apply completion,
// the children's replies, a phase's own result.
void Relay::Impl::Advance() {
  while (current_) {
    Current& c = *current_;
    RelayRefit& r = *c.refit;
    counters_.chunks_applied = r.tracker().applied();
    if (r.WantsLocalWork()) {
      const bool voting = r.phase() == RefitPhase::kVoting;
      Status s = voting ? r.Vote() : r.Finish();
      if (s.ok() && voting && !c.pull_failed.empty()) {
        // Each round's vote: this head could not read the store.
        s = r.Veto(NodeCode::kRejected,
                   fmt::format("cannot read the chunks from the object "
                               "store {}: {}",
                               options_.objects->describe(), c.pull_failed));
      }
      if (!s.ok()) spdlog::error("{}: {}", options_.name, s.ToString());
      if (r.committed_here()) FlipServing();
      continue;
    }
    switch (r.phase()) {
      case RefitPhase::kPlanning:
        if (!c.fanout->Complete()) return;
        AnswerUp(FrameType::kPlanReply, r.own());
        (void)r.Planned();
        if (c.puller) c.puller->Pause(false);
        c.fanout->Stream();
        continue;
      case RefitPhase::kReceiving:
        MaybeResume();
        return;
      case RefitPhase::kVoting:
        MaybeResume();
        // The serving gate first: its prepare goes out while the
        // children vote.
        if (r.local_done() && ServingVoteGate(r) && c.fanout->Complete()) {
          Result<NodeResult> vote = r.Voted();
          if (vote.ok() && !DCR_FAILPOINT("relay.vote").drop()) {
            // The subtree's last delivered bytes first, so that the root's
            // progress has them with the votes (the same link, in order).
            c.parent->SendProgress(About(), ProgressReport());
            AnswerUp(FrameType::kVote, *vote);
          }
        }
        return;
      case RefitPhase::kVoted:
      case RefitPhase::kEnded:
        return;
      case RefitPhase::kCommitting:
      case RefitPhase::kAborting:
      case RefitPhase::kOrphaned:
        // A committed node answers once its serving process moved (or
        // the deadline passed): the report then says it runs on the
        // target.
        if (r.local_done() &&
            (r.phase() == RefitPhase::kOrphaned || c.fanout->Complete()) &&
            !(images_ && c.flipped && images_->AwaitingMove())) {
          Conclude();
        }
        return;
    }
  }
}

void Relay::Impl::Stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    mailbox_.Wake();
    if (actor_.joinable()) actor_.join();
    if (transports_) transports_->Stop();
    mailbox_.Close();
    workers_.reset();
    if (store_) spdlog::info("{}: stopped", options_.name);
  });
}

void Relay::Impl::Reply(Link& link, FrameType type, const FrameHeader& about,
                        std::span<const std::byte> payload) {
  SendReply(*sender_, link, type, about, payload, options_.name);
}

FrameHeader Relay::Impl::About() const {
  FrameHeader about;
  about.epoch = current_->refit->epoch();
  about.refit_id = current_->refit->id();
  return about;
}

void Relay::Impl::OnFrame(const std::shared_ptr<Link>& link, const Frame& frame,
                          const FrameBuffer& buffer) {
  const bool from_parent = current_ && current_->parent->Is(*link);
  if (from_parent) current_->parent->Received();
  switch (frame.type()) {
    case FrameType::kStatusRequest:
      return AnswerStatus(*link, frame);
    case FrameType::kPlan:
      return OnPlan(link, frame);
    case FrameType::kHeartbeat:
      return;
    default:
      break;
  }
  if (AnswerEnded(*link, frame)) return;
  if (!from_parent || frame.header.refit_id != current_->refit->id() ||
      frame.header.epoch < current_->refit->epoch()) {
    if (frame.type() == FrameType::kChunk) counters_.chunks_dropped += 1;
    spdlog::debug("{}: dropping {} outside its refit", options_.name,
                  FrameTypeName(frame.type()));
    return;
  }
  if (frame.header.epoch > current_->refit->epoch()) {
    // Forwarded from a resumed coordinator (dcr refit --resume).
    if (!PersistEpoch(frame.header.epoch).ok()) return;
    current_->refit->set_epoch(frame.header.epoch);
  }
  if (frame.type() == FrameType::kEnd && current_->puller &&
      current_->pull_failed.empty()) {
    // The object store carries this refit's END, after its chunks; this
    // one serves if the pull fails before that END is read.
    spdlog::debug("{}: END on the link; taking the one in the object store",
                  options_.name);
    current_->link_end = buffer;
    return;
  }
  counters_.bytes_in += buffer->size();
  OnRefitFrame(frame, buffer);
}

void Relay::Impl::AnswerStatus(Link& link, const Frame& frame) {
  NodeResult r;
  r.node = options_.name;
  if (store_) {
    if (auto c = store_->committed()) r.version = *c;
    // A refit the store records as begun, other than the one running here
    // (one left by a crash): the bits are a mix, no version. A refit
    // running over it is its repair (coord/repair.h).
    // The version served is the live image's; the standby may lag.
    if (images_ && images_->live()) r.version = images_->live()->version;
    if (auto busy = store_->InProgress();
        busy && (!current_ || busy->refit != current_->refit->id())) {
      r.store.unfinished = busy->refit;
      r.store.base = busy->base;
      r.store.target = busy->target;
      r.store.repairing = current_.has_value();
      r.store.prepared =
          prepared_ && prepared_->refit == busy->refit && prepared_->verified;
      // Its yes vote named the target (the record may not yet).
      if (prepared_ && prepared_->refit == busy->refit) {
        r.store.target = prepared_->target;
      }
    }
  } else if (images_ && images_->live()) {
    r.version = images_->live()->version;  // the standby is made at catch-up
  } else {
    r.code = NodeCode::kNeedsCatchUp;
  }
  r.chunks_applied = last_chunks_applied_;
  const RelayStats published = board_.Get();
  r.detail = published.state;
  if (!published.last_result.empty()) {
    r.detail += "; last refit " + published.last_result;
  }
  if (const auto& sv = published.serving) {
    r.detail += fmt::format(
        "; serving process {}, image {} live{}, last pause {:.1f} ms",
        sv->attached ? (sv->gpu ? "attached (GPU buffers)" : "attached")
                     : "not attached",
        sv->live_image, sv->caught_up ? "" : " (standby catching up)",
        sv->last_pause_seconds * 1e3);
  }
  Reply(link, FrameType::kStatusReply, frame.header,
        EncodeResults(ResultsMsg{{r}}));
}

// A resumed coordinator (or a parent that reconnected) decides a refit that
// already ended here: tell it how it ended.
bool Relay::Impl::AnswerEnded(Link& link, const Frame& frame) {
  if (current_ || !finished_ || frame.header.refit_id != finished_->id ||
      frame.header.epoch < finished_->epoch ||
      (frame.type() != FrameType::kCommit &&
       frame.type() != FrameType::kAbort)) {
    return false;
  }
  FrameType want = frame.type() == FrameType::kCommit ? FrameType::kCommitReply
                                                      : FrameType::kAbortReply;
  if (finished_->last_reply && finished_->last_reply->first == want) {
    Reply(link, want, frame.header, finished_->last_reply->second);
    return true;
  }
  NodeResult r;
  r.node = options_.name;
  if (store_) {
    if (auto c = store_->committed()) r.version = *c;
  }
  if (images_ && images_->live()) r.version = images_->live()->version;
  r.detail = "the refit had already ended here";
  if (const RelayStats published = board_.Get();
      !published.last_result.empty()) {
    r.detail += ": " + published.last_result;
  }
  Reply(link, want, frame.header, EncodeResults(ResultsMsg{{r}}));
  return true;
}

void Relay::Impl::OnRefitFrame(const Frame& frame, const FrameBuffer& buffer) {
  Current& c = *current_;
  RelayRefit& r = *c.refit;
  auto deadline = [&] {
    return Clock::now() + std::chrono::milliseconds(r.plan().phase_timeout_ms);
  };
  switch (frame.type()) {
    case FrameType::kChunk:
      return OnChunk(frame, buffer);
    case FrameType::kStreamMark:
      return OnStreamMark(frame, buffer);
    case FrameType::kEnd: {
      auto end = DecodeEnd(frame.payload);
      Status s = end.ok() ? r.End(*end) : end.status();
      if (!s.ok()) {
        spdlog::warn("{}: bad END: {}", options_.name,
                     end.ok() ? "out of order" : s.ToString());
        return;
      }
      c.fanout->Forward(buffer);
      c.fanout->Expect(FrameType::kVote, deadline());
      return;
    }
    case FrameType::kCommit: {
      auto commit = DecodeCommit(frame.payload);
      if (!commit.ok()) {
        spdlog::warn("{}: bad COMMIT: {}", options_.name,
                     commit.status().ToString());
        return;
      }
      if (DCR_FAILPOINT("relay.commit").drop()) return;
      if (Status s = r.Commit(*commit); !s.ok()) {
        spdlog::warn("{}: {}", options_.name, s.ToString());
        return;
      }
      c.commit_at = Clock::now();
      c.fanout->Forward(buffer);
      c.fanout->Expect(FrameType::kCommitReply, deadline());
      return;
    }
    case FrameType::kAbort: {
      if (DCR_FAILPOINT("relay.abort").drop()) return;
      if (Status s = r.Abort(); !s.ok()) {
        spdlog::warn("{}: {}", options_.name, s.ToString());
        return;
      }
      c.fanout->Forward(buffer);
      c.fanout->Expect(FrameType::kAbortReply, deadline());
      return;
    }
    default:
      spdlog::debug("{}: ignoring {}", options_.name,
                    FrameTypeName(frame.type()));
  }
}

void Relay::Impl::OnClosed(uint64_t link_id, const Status& why) {
  if (!current_ || current_->parent->link_id() != link_id) return;
  const RefitPhase p = current_->refit->phase();
  if (p == RefitPhase::kCommitting || p == RefitPhase::kAborting ||
      p == RefitPhase::kOrphaned) {
    return;  // finish what the parent asked; no one to answer
  }
  Orphan(why.ok() ? "closed" : why.ToString());
}

void Relay::Impl::MaybePause() {
  Current& c = *current_;
  if (c.fanout->MaxQueuedBytes() > c.refit->plan().chunk_window_bytes ||
      c.refit->tracker().backlog_bytes() > options_.apply_window_bytes) {
    c.parent->Pause();
    if (c.puller) c.puller->Pause(true);
  }
  SampleProgress();
}

void Relay::Impl::MaybeResume() {
  Current& c = *current_;
  if (c.parent->paused() &&
      c.fanout->MaxQueuedBytes() <= c.refit->plan().chunk_window_bytes / 2 &&
      c.refit->tracker().backlog_bytes() <= options_.apply_window_bytes / 2) {
    c.parent->Resume();
  }
  if (c.puller &&
      c.fanout->MaxQueuedBytes() <= c.refit->plan().chunk_window_bytes / 2 &&
      c.refit->tracker().backlog_bytes() <= options_.apply_window_bytes / 2) {
    c.puller->Pause(false);
  }
  SampleProgress();
}

void Relay::Impl::AnswerUp(FrameType type, const NodeResult& own) {
  Current& c = *current_;
  std::vector<NodeResult> results{own};
  std::vector<NodeResult> children = c.fanout->Results();
  results.insert(results.end(), children.begin(), children.end());
  const RefitPhase p = c.refit->phase();
  c.parent->Answer(type, About(), EncodeResults(ResultsMsg{std::move(results)}),
                   p == RefitPhase::kPlanning || p == RefitPhase::kReceiving);
}

void Relay::Impl::Orphan(const std::string& why) {
  Current& c = *current_;
  // Having voted, we keep the base served and wait for the decision: the
  // coordinator may have died after its decision (dcr refit --resume).
  const bool prepared = c.refit->phase() == RefitPhase::kVoted;
  auto wait = prepared
                  ? options_.prepared_wait
                  : std::chrono::milliseconds(c.refit->plan().phase_timeout_ms);
  if (!c.parent->Orphan(Clock::now() + wait)) return;
  c.fanout->set_adopting(false);
  spdlog::warn(
      "{}: parent link lost during refit {} ({}); {} for up to {:.0f} s, "
      "then restoring the base",
      options_.name, c.refit->id().ToHex(), why,
      prepared ? "voted: waiting for the decision or a new parent"
               : "waiting to be adopted by another parent",
      std::chrono::duration<double>(wait).count());
}

void Relay::Impl::Conclude() {
  Result<RelayRefit::Conclusion> done = current_->refit->Conclude();
  if (!done.ok()) return;
  if (images_ && current_->flipped) {
    if (std::string moved = images_->MoveSummary(); !moved.empty()) {
      done->local.detail += (done->local.detail.empty() ? "" : "; ") + moved;
    }
  }
  if (done->reply != FrameType::kError) AnswerUp(done->reply, done->local);
  EndRefit(done->summary, done->committed);
}

void Relay::Impl::EndRefit(const std::string& result, bool committed) {
  Current& c = *current_;
  const RelayRefit& r = *c.refit;
  finished_ = Finished{r.id(), r.epoch(), c.parent->plan_reply(),
                       c.parent->last_reply()};
  double seconds =
      std::chrono::duration<double>(Clock::now() - c.started).count();
  last_chunks_applied_ = r.tracker().applied();
  counters_.chunks_dropped += r.tracker().duplicates();  // Stats() added them
  counters_.CloseRefit(*c.fanout);
  c.fanout->Close();
  (committed ? counters_.refits_committed : counters_.refits_aborted) += 1;
  if (committed && c.repair) counters_.repairs_by_root += 1;
  spdlog::info("{}: refit {} {} in {:.3f} s ({} chunks applied)", options_.name,
               r.id().ToHex(), result, seconds, r.tracker().applied());
  board_.EndRefit(seconds, fmt::format("{} {}", r.id().ToHex(), result));
  if (images_ && committed) {
    FlipServing();
  } else if (images_) {
    images_->Aborted(r.id());
  }
  if (hook_ && committed) {
    // The version served: the live image's with a serving process (store_
    // is then the standby), else the store's record.
    CommitHook::Commit commit{
        .version = r.plan().target, .refit = r.id(), .image = ""};
    if (images_ && images_->live()) {
      commit.version = images_->live()->version;
      commit.image =
          fmt::format("shm:{}.{}", options_.store.path, images_->live()->image);
    } else if (store_) {
      commit.version = store_->committed().value_or(commit.version);
    }
    hook_->Committed(std::move(commit));
  }
  current_.reset();
  // Give the refit's buffers back to the system: a relay idles between
  // refits, and glibc keeps freed arenas otherwise.
#if !defined(__SANITIZE_ADDRESS__) && !defined(DCR_SANITIZED)
  ::malloc_trim(0);  // glibc's; under ASan malloc is not glibc's (crashes)
#endif
}

void Relay::Impl::FlipServing() {
  Current& c = *current_;
  if (!images_ || c.flipped) return;
  c.flipped = true;
  // The pause starts at COMMIT.
  Status s =
      images_->Flip(store_, c.refit->id(), c.commit_at.value_or(Clock::now()));
  if (!s.ok()) {
    spdlog::error("{}: committed, but the live image did not change: {}",
                  options_.name, s.ToString());
  }
}

bool Relay::Impl::ServingVoteGate(RelayRefit& r) {
  if (!images_ || !r.voted_yes()) return true;
  switch (images_->ReadyToVote(r.id(), r.plan().target.step)) {
    case ServingImages::Gate::kReady:
      return true;
    case ServingImages::Gate::kWait:
      return false;
    case ServingImages::Gate::kTimedOut:
      (void)r.Veto(NodeCode::kTimeout,
                   fmt::format("the serving process did not answer the pause "
                               "request within {} ms (busy or hung); it "
                               "stays on the committed version",
                               options_.serving_deadline.count()));
      return true;
  }
  return true;
}

void Relay::Impl::CatchUpStandby() {
  Result<bool> done = images_->MaybeCatchUp(store_, prepared_.has_value());
  if (!done.ok()) {
    spdlog::error("{}: the standby image did not catch up: {}", options_.name,
                  done.status().ToString());
  }
}

void Relay::Impl::PublishStats() {
  RelayStats s = counters_.Snapshot(
      store_.get(), current_ ? current_->fanout.get() : nullptr);
  if (current_) {
    s.state = RefitPhaseName(current_->refit->phase());
    s.apply_backlog_bytes = current_->refit->tracker().backlog_bytes();
    s.chunks_dropped += current_->refit->tracker().duplicates();
  } else {
    s.state = store_ || (images_ && images_->live()) ? "idle" : "no store";
  }
  if (hook_) s.on_commit = hook_->stats();
  if (images_) {
    s.serving = images_->stats();
    // The version served is the live image's; the standby may lag.
    if (images_->live()) s.committed = images_->live()->version;
  }
  board_.Publish(std::move(s), current_.has_value());
}

Result<std::unique_ptr<Relay>> Relay::Start(RelayOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  DCR_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() { Stop(); }
uint16_t Relay::port() const { return impl_->port(); }
RelayStats Relay::Stats() const { return impl_->Stats(); }
std::chrono::steady_clock::duration Relay::SinceLoopTurn() const {
  return impl_->SinceLoopTurn();
}
void Relay::Stop() { impl_->Stop(); }

}  // namespace dcr
