#include "protocol/fanout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <utility>

namespace dcr {
namespace {

double Secs(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// Delivers one child link's events to the owner's mailbox.
class Fanout::ChildHandler : public LinkHandler {
 public:
  ChildHandler(std::weak_ptr<Fanout> fanout, size_t child, Mailbox* mailbox)
      : fanout_(std::move(fanout)), child_(child), mailbox_(mailbox) {}

  void OnFrame(Link&, const Frame& frame, const FrameBuffer& buffer) override {
    mailbox_->Post([f = fanout_, c = child_, frame, buffer] {
      if (auto fanout = f.lock()) fanout->OnFrame(c, frame);
    });
  }
  void OnClosed(Link&, const Status& why) override {
    mailbox_->Post([f = fanout_, c = child_, why] {
      if (auto fanout = f.lock()) fanout->OnClosed(c, why);
    });
  }
  // The owner re-checks its backpressure on every wake-up.
  void OnDrained(Link&) override { mailbox_->Wake(); }

 private:
  std::weak_ptr<Fanout> fanout_;
  size_t child_;
  Mailbox* mailbox_;
};

std::shared_ptr<Fanout> Fanout::Create(Options options, PlanMsg plan) {
  return std::shared_ptr<Fanout>(
      new Fanout(std::move(options), std::move(plan)));
}

Fanout::Fanout(Options options, PlanMsg plan)
    : options_(std::move(options)),
      tree_(PlanTree::Of(std::move(plan), options_.depth == 0)),
      sender_(options_.frames,
              FrameContext{options_.header.epoch, options_.header.refit_id}),
      resend_(options_.resend_buffer_bytes.value_or(
          tree_.plan.chunk_window_bytes != 0
              ? kResendWindows * tree_.plan.chunk_window_bytes
              : kResendDefaultBytes)),
      plain_(options_.plain_nodes) {
  tree_.plan.adopt = false;
  tree_.plan.resend = false;
  for (size_t i : tree_.Children(0)) AddChild(i, false, false);
}

Fanout::~Fanout() {
  for (Child& c : children_) {
    if (c.link) c.link->Close();
  }
}

size_t Fanout::AddChild(size_t plan_index, bool adoption, bool retried,
                        std::optional<uint32_t> delegated_depth) {
  Child c;
  c.plan_index = plan_index;
  c.sub = SubPlan(tree_.plan, plan_index);
  c.sub.phase_timeout_ms = std::max<uint32_t>(
      200, static_cast<uint32_t>(tree_.plan.phase_timeout_ms *
                                 options_.child_timeout_fraction));
  c.sub.adopt = adoption || options_.resume;
  c.sub.resume = options_.resume;
  c.sub.resend = adoption && resend_.enabled();
  c.sub.sender_depth = delegated_depth.value_or(options_.depth);
  // A whole subtree takes one encoding: its relays forward what they get.
  c.context = tree_.plan.context_coded && !HoldsPlain(plan_index);
  c.sub.context_coded = c.context;
  c.adoption = adoption;
  c.retried = retried;
  c.delegated_depth = delegated_depth;
  children_.push_back(std::move(c));
  return children_.size() - 1;
}

void Fanout::NotePeak() {
  // A rejoin try counts once accepted: most find nobody.
  size_t n = static_cast<size_t>(
      std::count_if(children_.begin(), children_.end(), [](const Child& c) {
        return !c.failed && (!c.rejoin_of || c.accepted);
      }));
  peak_children_ = std::max(peak_children_, n);
}

void Fanout::RefreshSub(Child& c) {
  if (c.rejoin_of) return;  // alone: its children are ours
  c.sub.nodes = SubPlan(tree_.plan, c.plan_index).nodes;
}

bool Fanout::HoldsPlain(size_t index) const {
  if (plain_.empty()) return false;
  std::vector<size_t> stack = {index};
  while (!stack.empty()) {
    const size_t x = stack.back();
    stack.pop_back();
    if (plain_.contains(tree_.plan.nodes[x].name)) return true;
    for (size_t k : tree_.Children(x)) stack.push_back(k);
  }
  return false;
}

std::optional<size_t> Fanout::EntryOf(size_t index) const {
  for (size_t k = children_.size(); k-- > 0;) {
    const Child& c = children_[k];
    if (c.plan_index == index && !c.superseded && !c.rejoin_of) return k;
  }
  return std::nullopt;
}

void Fanout::Start(Clock::time_point deadline) {
  expected_ = FrameType::kPlanReply;
  deadline_ = deadline;
  for (size_t i = 0; i < children_.size(); ++i) Connect(i);
}

void Fanout::Connect(size_t i) {
  Child& c = children_[i];
  c.started = Clock::now();
  NotePeak();
  if (tree_.plan.heartbeat_ms != 0) {
    next_tick_ = std::min(next_tick_, c.started + heartbeat());
  }
  const PlanNode& n = c.sub.nodes[0];
  std::weak_ptr<Fanout> weak = weak_from_this();
  auto handler = std::make_shared<ChildHandler>(weak, i, options_.mailbox);
  Mailbox* mailbox = options_.mailbox;
  auto transport =
      options_.transports->Get(n.transport.empty() ? "tcp" : n.transport);
  if (!transport.ok()) {
    // This node cannot reach the child's kind of link (not built, or TLS
    // on a UCX link): the child fails like an unreachable one.
    Status why = transport.status().WithContext(
        fmt::format("transport {} to {}", n.transport, n.name));
    mailbox->Post([weak, i, why] {
      if (auto f = weak.lock()) f->OnConnected(i, why);
    });
    return;
  }
  (*transport)
      ->AsyncConnect(
          n.host, n.port, handler, options_.connect_timeout,
          [weak, i, mailbox](Result<std::shared_ptr<Link>> link) {
            mailbox->Post([weak, i, link = std::move(link)]() mutable {
              if (auto f = weak.lock()) f->OnConnected(i, std::move(link));
            });
          });
}

Status Fanout::SendTo(Child& c, FrameType type,
                      const std::vector<std::byte>& body) {
  DCR_ASSIGN_OR_RETURN(
      FrameBuffer frame,
      sender_.At(type, options_.header.sequence, body, options_.header.flags));
  c.link->Send(std::move(frame));
  return Status::OK();
}

void Fanout::OnConnected(size_t i, Result<std::shared_ptr<Link>> link) {
  Child& c = children_[i];
  if (!link.ok()) {
    // A node that cannot be reached before it took the plan (down before
    // the refit) is routed around like one that fails later: its live
    // children are adopted. A leaf has nobody to hand on.
    FailKind kind = c.adoption && !c.unplanned ? FailKind::kAdoption
                    : tree_.Children(c.plan_index).empty()
                        ? FailKind::kFinal
                        : FailKind::kUnreached;
    Fail(i, NodeCode::kUnreachable, std::string(link.status().message()), kind);
    return;
  }
  c.link = *std::move(link);
  if (c.failed || closing_) {  // timed out while connecting, or refit over
    c.link->Close();
    return;
  }
  // The owner stops feeding children while a queue is above the plan's
  // window and goes on once every queue is at or below half of it: each
  // link tells (OnDrained, a mailbox wake-up) when it falls to half after
  // being above half. Not after being above the window: a queue that
  // stayed between half and the window may be the last one holding a
  // paused owner back. (No window, 0: the owners pause on any queued byte
  // and go on at none; (1, 0) says when a queue empties.)
  const uint64_t window = tree_.plan.chunk_window_bytes;
  c.link->SetWatermarks(static_cast<size_t>(window / 2 + 1),
                        static_cast<size_t>(window / 2));
  c.last_rx = c.last_heartbeat = Clock::now();
  Status s = SendTo(c, FrameType::kHello, EncodeHello(options_.hello));
  if (s.ok()) s = SendTo(c, FrameType::kPlan, EncodePlan(c.sub));
  if (!s.ok()) Fail(i, NodeCode::kRejected, s.ToString());
}

void Fanout::OnFrame(size_t i, const Frame& frame) {
  Child& c = children_[i];
  if (c.failed) return;
  c.last_rx = Clock::now();
  const std::string& name = c.sub.nodes[0].name;
  if (frame.type() == FrameType::kHeartbeat) {
    // A relay reports its progress in it (protocol/liveness.h); a relay of
    // an older release sends it empty.
    if (frame.payload.empty()) {
      c.sent_empty_heartbeat = true;
    } else {
      if (auto p = DecodeProgress(frame.payload); p.ok()) {
        c.progress = *p;
      } else {
        spdlog::debug("{}: bad HEARTBEAT from {}: {}", options_.hello.node,
                      name, p.status().ToString());
      }
    }
    return;
  }
  if (frame.type() == FrameType::kHello) {
    auto hello = DecodeHello(frame.payload);
    if (!hello.ok() || hello->node != name) {
      Fail(i, NodeCode::kRejected,
           hello.ok()
               ? fmt::format("{}:{} answered as '{}'", c.sub.nodes[0].host,
                             c.sub.nodes[0].port, hello->node)
               : std::string(hello.status().message()));
      return;
    }
    c.greeted = true;
    return;
  }
  if (frame.type() == FrameType::kError) {
    std::string text(reinterpret_cast<const char*>(frame.payload.data()),
                     std::min<size_t>(frame.payload.size(), 512));
    if (text.find("PLAN.version: unknown message version 2") !=
        std::string::npos) {
      // docs/PROTOCOL.md §"Target digests at END": upgrade order.
      text +=
          " (a dcr-relay older than this root, which sends the target's "
          "digests at END: upgrade the relays before the root)";
    }
    Fail(i, NodeCode::kRejected, std::move(text),
         c.adoption ? FailKind::kAdoption : FailKind::kFinal);
    return;
  }
  // An adopted node answers PLAN_REPLY first, whatever the phase.
  bool acceptance = !c.accepted && frame.type() == FrameType::kPlanReply;
  if (!acceptance && (frame.type() != expected_ || c.reply)) {
    spdlog::debug("{}: ignoring {} frame from {}", options_.hello.node,
                  FrameTypeName(frame.type()), name);
    return;
  }
  auto results = DecodeResults(frame.payload);
  if (!results.ok()) {
    Fail(i, NodeCode::kRejected,
         fmt::format("bad {} from {}: {}", FrameTypeName(frame.type()), name,
                     results.status().message()));
    return;
  }
  if (acceptance) {
    c.accepted = true;
    if (c.rejoin_of) {
      spdlog::info("{}: {} rejoined the refit", options_.hello.node, name);
      children_[*c.rejoin_of].superseded = true;
      NotePeak();
    }
    c.takes_chunks = std::any_of(
        results->nodes.begin(), results->nodes.end(),
        [](const NodeResult& r) { return r.code == NodeCode::kOk; });
    if (!c.takes_chunks) c.refused = *results;
    if (c.adoption) {
      spdlog::info("{}: adopted {}", options_.hello.node, name);
    }
    // From now on it takes what it is sent.
    std::vector<FramePosition> sent = std::exchange(c.sent_unaccepted, {});
    // A node still receiving says what it took last: it gets what it
    // missed from the resend buffer first (chunks flow in these phases).
    if (results->received_through && c.takes_chunks && !c.rejoin_of &&
        resend_.enabled() &&
        (expected_ == FrameType::kPlanReply || expected_ == FrameType::kVote)) {
      Resend(c, *results->received_through, std::move(sent));
    }
    if (expected_ != FrameType::kPlanReply) {
      // Adopted in a later phase: the phase's control frame (END, COMMIT,
      // ABORT) if it went out already; its answer counts for the phase.
      if (c.refused) {
        c.reply = c.refused;
      } else if (control_) {
        c.link->Send(control_);
      }
      return;
    }
  }
  c.reply = *std::move(results);
}

void Fanout::OnClosed(size_t i, const Status& why) {
  Child& c = children_[i];
  if (c.link) bytes_sent_closed_ += c.link->stats().bytes_sent;
  if (!c.failed && !closing_) {
    Fail(i, NodeCode::kUnreachable,
         why.ok() ? "link closed" : std::string(why.message()),
         c.adoption && !c.accepted ? FailKind::kAdoption : FailKind::kLink);
  }
  c.link.reset();
}

size_t Fanout::Forward(const FrameBuffer& frame, bool chunk, bool keep,
                       const FrameBuffer& plain) {
  std::optional<FramePosition> position;
  chunks_seen_ |= chunk;
  if (chunk) {
    position = WholeFramePosition(*frame, options_.frames);
    resend_.Keep(frame, position, keep, plain);
  } else {
    control_ = frame;
  }
  size_t n = 0;
  // Children that pull from the object store get the refit's CHUNK and END
  // frames there, stored once however many pull.
  bool stored = false;
  auto store = [&] {
    // One object sequence for every puller: base-independent once any
    // puller is planned without the flag (both kinds decode those).
    if (plain && !objects_plain_ &&
        std::any_of(children_.begin(), children_.end(), [](const Child& c) {
          return c.sub.nodes[0].pulls_objects && !c.context;
        })) {
      // From the first chunk on (pullers are the root's children, planned
      // before it): every puller's subtree gets base-independent chunks.
      objects_plain_ = true;
      for (const Child& c : children_) {
        if (!c.sub.nodes[0].pulls_objects) continue;
        for (const PlanNode& node : c.sub.nodes) plain_.insert(node.name);
      }
    }
    if (!stored)
      options_.objects->Push(objects_plain_ && plain ? plain : frame);
    stored = true;
  };
  const bool end =
      !chunk && options_.objects != nullptr &&
      frame->size() >= kFrameHeaderSize && [&] {
        auto h = ParseFrameHeader(std::span<const std::byte, kFrameHeaderSize>(
                                      frame->data(), kFrameHeaderSize),
                                  options_.frames);
        return h.ok() && h->header.type == FrameType::kEnd;
      }();
  // Stored whatever the state of the pulling children's links: a head
  // that reconnects, rejoins or is re-adopted reads what it missed from
  // the store (Resend sends it nothing).
  if (options_.objects != nullptr && (chunk || end) &&
      std::any_of(children_.begin(), children_.end(), [](const Child& c) {
        return c.sub.nodes[0].pulls_objects;
      })) {
    store();
  }
  for (Child& c : children_) {
    if (c.failed || !c.link || (chunk && !c.takes_chunks)) continue;
    if (options_.objects != nullptr && c.sub.nodes[0].pulls_objects) {
      if (chunk) {
        ++n;
        continue;
      }
    }
    // An adoption not yet accepted gets the control frame when it is,
    // after the chunks it missed (OnFrame).
    if (!chunk && c.adoption && !c.accepted) continue;
    c.link->Send(plain && !GetsContext(c) ? plain : frame);
    if (position && !c.accepted) c.sent_unaccepted.push_back(*position);
    ++n;
  }
  return n;
}

size_t Fanout::Hint(const FrameBuffer& frame) {
  size_t n = 0;
  for (Child& c : children_) {
    if (c.failed || !c.link || !c.takes_chunks || (c.adoption && !c.accepted) ||
        (options_.objects != nullptr && c.sub.nodes[0].pulls_objects)) {
      continue;
    }
    c.link->Send(frame);
    ++n;
  }
  return n;
}

void Fanout::Resend(Child& c, const FramePosition& after,
                    std::vector<FramePosition> sent) {
  const std::string& name = c.sub.nodes[0].name;
  // A node that pulls from the object store reads what it missed there.
  if (options_.objects != nullptr && c.sub.nodes[0].pulls_objects) return;
  ResendBuffer::Resend r = resend_.For(after, std::move(sent), GetsContext(c));
  for (const FrameBuffer& f : r.frames) c.link->Send(f);
  resent_chunks_ += r.frames.size();
  resent_bytes_ += r.bytes;
  if (!r.frames.empty()) {
    spdlog::info("{}: resent {} chunks ({} bytes) to {} after sequence {}",
                 options_.hello.node, r.frames.size(), r.bytes, name,
                 after.sequence);
  }
  if (r.miss) {
    ++resend_misses_;
    spdlog::warn(
        "{}: {} may miss chunks the resend buffer no longer holds (through "
        "sequence {}; it took up to {}): the root's repair round resends them",
        options_.hello.node, name, r.lost_through->sequence, after.sequence);
  }
}

void Fanout::Expect(FrameType reply, Clock::time_point deadline) {
  expected_ = reply;
  deadline_ = deadline;
  // A subtree where nobody took the plan has nothing more to say (its head
  // may not even hold the refit): its refusals stand for every phase.
  for (Child& c : children_) c.reply = c.refused;
}

void Fanout::Stream() { deadline_ = Clock::time_point::max(); }

bool Fanout::Complete() const {
  bool rejoining =
      tree_.plan.heartbeat_ms != 0 && expected_ == FrameType::kVote;
  return std::all_of(children_.begin(), children_.end(), [&](const Child& c) {
    if (c.deferred) return false;  // recovered once this node is adopted
    if (rejoining && c.failed && c.split && !c.superseded &&
        c.rejoin_tries < kRejoinTries) {
      return false;  // it may still come back
    }
    return c.failed || c.reply || c.superseded;
  });
}

void Fanout::ExpireIfDue(Clock::time_point now) {
  RecoverDeferred(nullptr);  // adopting again without an Amend
  ExpireAdoptions(now);
  if (now < deadline_) return;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.failed || c.reply) continue;
    Fail(i, NodeCode::kTimeout,
         fmt::format("no {} within the phase deadline",
                     FrameTypeName(expected_)));
  }
}

Fanout::Clock::time_point Fanout::adoption_deadline() const {
  Clock::time_point next = Clock::time_point::max();
  if (closing_) return next;
  for (const Child& c : children_) {
    if (c.failed || !c.link || !c.adoption || c.accepted) continue;
    next = std::min(next, c.started + options_.connect_timeout);
  }
  return next;
}

void Fanout::ExpireAdoptions(Clock::time_point now) {
  if (closing_) return;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.failed || !c.link || !c.adoption || c.accepted) continue;
    if (now - c.started > options_.connect_timeout) {
      Fail(i, NodeCode::kTimeout,
           fmt::format("did not accept the adoption within {:.1f} s",
                       Secs(now - c.started)),
           FailKind::kAdoption);
    }
  }
}

void Fanout::Tick(Clock::time_point now) {
  if (tree_.plan.heartbeat_ms == 0 || closing_) return;
  if (now < next_tick_) return;
  auto interval = heartbeat();
  next_tick_ = now + interval / 2;
  const uint64_t window = tree_.plan.chunk_window_bytes;
  // A node whose children were adopted may come back (a restart): try
  // it again, alone, every half interval, kRejoinTries times, until the
  // decision.
  bool deciding = expected_ == FrameType::kCommitReply ||
                  expected_ == FrameType::kAbortReply;
  size_t count = children_.size();
  for (size_t i = 0; i < count; ++i) {
    Child& c = children_[i];
    if (!c.failed || !c.split || c.superseded || deciding) continue;
    if (c.rejoin_tries >= kRejoinTries || now < c.rejoin_at) continue;
    bool pending = false;
    for (const Child& o : children_) {
      pending |= o.rejoin_of == i && !o.failed && !o.superseded;
    }
    if (pending) continue;
    c.rejoin_tries += 1;
    c.rejoin_at = now + interval / 2;
    size_t k = AddChild(c.plan_index, /*adoption=*/true, /*retried=*/true);
    Child& r = children_[k];
    r.sub.nodes.resize(1);  // its children are ours now
    r.rejoin_of = i;
    Connect(k);
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.failed) continue;
    if (!c.link) {
      continue;  // connecting: the connect timeout covers it
    }
    // A child that owes its PLAN_REPLY or its decision reply may be busy
    // creating or hashing its store, or syncing it (its event thread
    // blocked for seconds on a large store): the phase deadline bounds it.
    bool owes_slow_reply = !c.reply && (expected_ == FrameType::kPlanReply ||
                                        expected_ == FrameType::kCommitReply ||
                                        expected_ == FrameType::kAbortReply);
    LivenessVerdict v = CheckLiveness(
        c.liveness, LivenessPolicy{interval, window},
        LinkObservation{now, c.last_rx, owes_slow_reply, c.link->QueuedBytes(),
                        c.link->stats().bytes_sent, c.sub.nodes[0].link_bps,
                        c.progress});
    if (v.kind == LivenessVerdict::Kind::kSlowLink) {
      spdlog::info("{}: link to {}: {}", options_.hello.node,
                   c.sub.nodes[0].name, v.why);
    }
    if (v.kind == LivenessVerdict::Kind::kSilent) {
      Fail(i, NodeCode::kTimeout, std::move(v.why),
           c.adoption && !c.accepted ? FailKind::kAdoption : FailKind::kLink);
      continue;
    }
    if (v.kind == LivenessVerdict::Kind::kSlow) {
      Fail(i, NodeCode::kTimeout, std::move(v.why), FailKind::kSlow);
      continue;
    }
    if (now - c.last_heartbeat >= interval) {
      c.last_heartbeat = now;
      if (Status s = SendTo(c, FrameType::kHeartbeat, {}); !s.ok()) {
        spdlog::warn("{}: cannot send HEARTBEAT: {}", options_.hello.node,
                     s.ToString());
      }
    }
  }
}

void Fanout::CutLinks() {
  for (Child& c : children_) {
    if (c.link) c.link->CloseAfterFlush();
  }
}

void Fanout::Close() {
  closing_ = true;
  for (Child& c : children_) {
    if (c.link) c.link->CloseAfterFlush();
  }
}

}  // namespace dcr
