#include "relay/fanout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace dcr {
namespace {

// A silent link is dead after this many heartbeat intervals; a child that
// alone holds the tree back is dropped after twice as many.
constexpr int kSilentIntervals = 4;
constexpr int kSlowIntervals = 8;
// ... if it took bytes at under 1/kSlowFraction of its link's bandwidth.
constexpr double kSlowFraction = 10;
// A failed node is tried again this many times (every half interval): a
// relay that restarts within a few heartbeats rejoins its refit. The vote
// phase waits for these tries.
constexpr int kRejoinTries = 6;

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
    : options_(std::move(options)), plan_(std::move(plan)) {
  plan_.adopt = false;
  for (size_t i = 1; i < plan_.nodes.size(); ++i) {
    if (plan_.nodes[i].parent == 0) AddChild(i, false, false);
  }
}

Fanout::~Fanout() {
  for (Child& c : children_) {
    if (c.link) c.link->Close();
  }
}

size_t Fanout::AddChild(size_t plan_index, bool adoption, bool retried) {
  Child c;
  c.plan_index = plan_index;
  c.sub = SubPlan(plan_, plan_index);
  c.sub.phase_timeout_ms = std::max<uint32_t>(
      200, static_cast<uint32_t>(plan_.phase_timeout_ms *
                                 options_.child_timeout_fraction));
  c.sub.adopt = adoption || options_.resume;
  c.sub.resume = options_.resume;
  c.sub.sender_depth = options_.depth;
  c.adoption = adoption;
  c.retried = retried;
  children_.push_back(std::move(c));
  return children_.size() - 1;
}

void Fanout::Start(Clock::time_point deadline) {
  expected_ = FrameType::kPlanReply;
  deadline_ = deadline;
  for (size_t i = 0; i < children_.size(); ++i) Connect(i);
}

void Fanout::Connect(size_t i) {
  Child& c = children_[i];
  c.started = Clock::now();
  if (plan_.heartbeat_ms != 0) {
    next_tick_ = std::min(next_tick_, c.started + heartbeat());
  }
  const PlanNode& n = c.sub.nodes[0];
  std::weak_ptr<Fanout> weak = weak_from_this();
  auto handler = std::make_shared<ChildHandler>(weak, i, options_.mailbox);
  Mailbox* mailbox = options_.mailbox;
  options_.transport->AsyncConnect(
      n.host, n.port, handler, options_.connect_timeout,
      [weak, i, mailbox](Result<std::shared_ptr<Link>> link) {
        mailbox->Post([weak, i, link = std::move(link)]() mutable {
          if (auto f = weak.lock()) f->OnConnected(i, std::move(link));
        });
      });
}

Status Fanout::SendTo(Child& c, FrameType type,
                      const std::vector<std::byte>& body) {
  FrameHeader h = options_.header;
  h.type = type;
  h.flags &= kFrameFlagsMessageMask;  // wire bits (the tag) are the encoder's
  DCR_ASSIGN_OR_RETURN(FrameBuffer frame,
                       EncodeFrame(h, body, options_.frames));
  c.link->Send(std::move(frame));
  return Status::OK();
}

void Fanout::OnConnected(size_t i, Result<std::shared_ptr<Link>> link) {
  Child& c = children_[i];
  if (!link.ok()) {
    Fail(i, NodeCode::kUnreachable, std::string(link.status().message()),
         c.adoption ? FailKind::kAdoption : FailKind::kFinal);
    return;
  }
  c.link = *std::move(link);
  if (c.failed || closing_) {  // timed out while connecting, or refit over
    c.link->Close();
    return;
  }
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
  if (frame.type() == FrameType::kHeartbeat) return;
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
    Fail(i, NodeCode::kRejected,
         std::string(reinterpret_cast<const char*>(frame.payload.data()),
                     std::min<size_t>(frame.payload.size(), 512)),
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
    }
    c.takes_chunks = std::any_of(
        results->nodes.begin(), results->nodes.end(),
        [](const NodeResult& r) { return r.code == NodeCode::kOk; });
    if (!c.takes_chunks) c.refused = *results;
    if (c.adoption) {
      spdlog::info("{}: adopted {}", options_.hello.node, name);
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

void Fanout::Fail(size_t i, NodeCode code, std::string why, FailKind kind) {
  Child& c = children_[i];
  if (c.failed) return;
  if (c.rejoin_of) {
    spdlog::debug("{}: {} did not rejoin: {}", options_.hello.node,
                  c.sub.nodes[0].name, why);
  } else {
    spdlog::warn("{}: child {} is out of the refit: {}", options_.hello.node,
                 c.sub.nodes[0].name, why);
  }
  c.failed = true;
  c.failure = code;
  c.why = std::move(why);
  if (c.link && kind == FailKind::kFinal && c.greeted) {
    // Out of the refit, but alive: tell it (ABORT), so that it restores
    // its base now instead of waiting for a decision meant for others.
    (void)SendTo(c, FrameType::kAbort, EncodeAbort(AbortMsg{c.why}));
    c.link->CloseAfterFlush();
  } else if (c.link) {
    c.link->Close();
  }
  if (c.rejoin_of) {
    // A rejoin attempt that did not work: the split entry still stands.
    c.superseded = true;
    return;
  }
  if (closing_ || !options_.adopt || kind == FailKind::kFinal) return;
  // Nothing is left to deliver to a subtree that refused the plan or
  // answered the last phase.
  if (c.refused || (c.reply && (expected_ == FrameType::kCommitReply ||
                                expected_ == FrameType::kAbortReply))) {
    return;
  }
  if (kind == FailKind::kLink && !c.retried) {
    // It may have lost only the link: connect to it again, once.
    c.superseded = true;
    size_t k = AddChild(c.plan_index, /*adoption=*/true, /*retried=*/true);
    ++adoptions_;
    Connect(k);
    return;
  }
  AdoptChildrenOf(i);
}

void Fanout::AdoptChildrenOf(size_t i) {
  Child& c = children_[i];
  c.split = true;
  if (plan_.heartbeat_ms != 0) c.rejoin_at = Clock::now() + heartbeat() / 2;
  for (size_t k = c.plan_index + 1; k < plan_.nodes.size(); ++k) {
    if (plan_.nodes[k].parent != static_cast<int32_t>(c.plan_index)) continue;
    spdlog::info("{}: adopting {}, a child of {}", options_.hello.node,
                 plan_.nodes[k].name, c.sub.nodes[0].name);
    size_t n = AddChild(k, /*adoption=*/true, /*retried=*/false);
    ++adoptions_;
    Connect(n);
  }
}

size_t Fanout::Forward(const FrameBuffer& frame, bool chunk) {
  if (!chunk) control_ = frame;
  size_t n = 0;
  for (Child& c : children_) {
    if (c.failed || !c.link || (chunk && !c.takes_chunks)) continue;
    c.link->Send(frame);
    ++n;
  }
  return n;
}

size_t Fanout::MaxQueuedBytes() const {
  size_t most = 0;
  for (const Child& c : children_) {
    if (!c.failed && c.link) most = std::max(most, c.link->QueuedBytes());
  }
  return most;
}

std::vector<std::pair<std::string, size_t>> Fanout::QueueDepths() const {
  std::vector<std::pair<std::string, size_t>> out;
  for (const Child& c : children_) {
    if (c.superseded) continue;
    out.emplace_back(c.sub.nodes[0].name,
                     !c.failed && c.link ? c.link->QueuedBytes() : 0);
  }
  return out;
}

uint64_t Fanout::BytesSent() const {
  uint64_t total = bytes_sent_closed_;
  for (const Child& c : children_) {
    if (c.link) total += c.link->stats().bytes_sent;
  }
  return total;
}

void Fanout::Expect(FrameType reply, Clock::time_point deadline) {
  expected_ = reply;
  deadline_ = deadline;
  // A subtree where nobody took the plan has nothing more to say (its head
  // may not even hold the refit): its refusals stand for every phase.
  for (Child& c : children_) c.reply = c.refused;
}

bool Fanout::Complete() const {
  bool rejoining = plan_.heartbeat_ms != 0 && expected_ == FrameType::kVote;
  return std::all_of(children_.begin(), children_.end(), [&](const Child& c) {
    if (rejoining && c.failed && c.split && !c.superseded &&
        c.rejoin_tries < kRejoinTries) {
      return false;  // it may still come back
    }
    return c.failed || c.reply || c.superseded;
  });
}

void Fanout::ExpireIfDue(Clock::time_point now) {
  if (now < deadline_) return;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.failed || c.reply) continue;
    Fail(i, NodeCode::kTimeout,
         fmt::format("no {} within the phase deadline",
                     FrameTypeName(expected_)));
  }
}

void Fanout::Tick(Clock::time_point now) {
  if (plan_.heartbeat_ms == 0 || closing_) return;
  if (now < next_tick_) return;
  auto interval = heartbeat();
  next_tick_ = now + interval / 2;
  const uint64_t window = plan_.chunk_window_bytes;
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
    if (c.adoption && !c.accepted &&
        now - c.started > options_.connect_timeout) {
      Fail(i, NodeCode::kTimeout,
           fmt::format("did not accept the adoption within {:.1f} s",
                       Secs(now - c.started)),
           FailKind::kAdoption);
      continue;
    }
    if (now - c.last_rx > kSilentIntervals * interval) {
      Fail(i, NodeCode::kTimeout,
           fmt::format("silent for {:.1f} s (heartbeat every {} ms)",
                       Secs(now - c.last_rx), plan_.heartbeat_ms),
           c.adoption && !c.accepted ? FailKind::kAdoption : FailKind::kLink);
      continue;
    }
    // Slow: it held its queue above the window (so the tree waited for
    // it) for 8 intervals, taking bytes at under a tenth of its link's
    // bandwidth in the topology (unknown bandwidth: never slow).
    size_t queued = c.link->QueuedBytes();
    uint64_t sent = c.link->stats().bytes_sent;
    uint64_t link_bps = c.sub.nodes[0].link_bps;
    if (queued > window && link_bps != 0) {
      if (!c.blocked_since) {
        c.blocked_since = now;
        c.blocked_sent = sent;
      }
      double held = Secs(now - *c.blocked_since);
      double bps = 8.0 * static_cast<double>(sent - c.blocked_sent) / held;
      if (now - *c.blocked_since > kSlowIntervals * interval &&
          bps < static_cast<double>(link_bps) / kSlowFraction) {
        Fail(i, NodeCode::kTimeout,
             fmt::format("too slow: it held the tree back for {:.1f} s, "
                         "taking {:.3g} Mbit/s on a {:.3g} Mbit/s link",
                         held, bps / 1e6, static_cast<double>(link_bps) / 1e6),
             FailKind::kSlow);
        continue;
      }
    } else if (queued <= window / 2) {
      c.blocked_since.reset();
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

std::vector<NodeResult> Fanout::Results() const {
  std::vector<NodeResult> out;
  for (const Child& c : children_) {
    if (c.superseded) continue;
    if (c.reply) {  // it answered this phase, even if its link went after
      out.insert(out.end(), c.reply->nodes.begin(), c.reply->nodes.end());
      continue;
    }
    const std::string& head = c.sub.nodes[0].name;
    // A split node's children were adopted and report for themselves.
    size_t count = c.split ? 1 : c.sub.nodes.size();
    for (size_t k = 0; k < count; ++k) {
      NodeResult r;
      r.node = c.sub.nodes[k].name;
      r.code = c.failed ? c.failure : NodeCode::kTimeout;
      r.detail =
          k == 0 ? (c.failed ? c.why : "no answer yet")
                 : fmt::format("behind {}, which is out of the refit", head);
      if (k == 0 && c.split && c.failed) {
        r.detail += "; its children were adopted";
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

size_t Fanout::live_children() const {
  return static_cast<size_t>(
      std::count_if(children_.begin(), children_.end(),
                    [](const Child& c) { return !c.failed; }));
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
