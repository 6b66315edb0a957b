#include "relay/fanout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace dcr {

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
  for (size_t i = 1; i < plan_.nodes.size(); ++i) {
    if (plan_.nodes[i].parent != 0) continue;
    Child c;
    c.plan_index = i;
    c.sub = SubPlan(plan_, i);
    c.sub.phase_timeout_ms = std::max<uint32_t>(
        200, static_cast<uint32_t>(plan_.phase_timeout_ms *
                                   options_.child_timeout_fraction));
    children_.push_back(std::move(c));
  }
}

Fanout::~Fanout() {
  for (Child& c : children_) {
    if (c.link) c.link->Close();
  }
}

void Fanout::Start(Clock::time_point deadline) {
  expected_ = FrameType::kPlanReply;
  deadline_ = deadline;
  std::weak_ptr<Fanout> weak = weak_from_this();
  for (size_t i = 0; i < children_.size(); ++i) {
    const PlanNode& n = children_[i].sub.nodes[0];
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
    Fail(i, NodeCode::kUnreachable, std::string(link.status().message()));
    return;
  }
  c.link = *std::move(link);
  if (c.failed || closing_) {  // timed out while connecting, or refit over
    c.link->Close();
    return;
  }
  Status s = SendTo(c, FrameType::kHello, EncodeHello(options_.hello));
  if (s.ok()) s = SendTo(c, FrameType::kPlan, EncodePlan(c.sub));
  if (!s.ok()) Fail(i, NodeCode::kRejected, s.ToString());
}

void Fanout::OnFrame(size_t i, const Frame& frame) {
  Child& c = children_[i];
  if (c.failed) return;
  const std::string& name = c.sub.nodes[0].name;
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
                     std::min<size_t>(frame.payload.size(), 512)));
    return;
  }
  if (frame.type() != expected_ || c.reply) {
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
  if (expected_ == FrameType::kPlanReply) {
    c.takes_chunks = std::any_of(
        results->nodes.begin(), results->nodes.end(),
        [](const NodeResult& r) { return r.code == NodeCode::kOk; });
  }
  c.reply = *std::move(results);
}

void Fanout::OnClosed(size_t i, const Status& why) {
  Child& c = children_[i];
  if (c.link) bytes_sent_closed_ += c.link->stats().bytes_sent;
  if (!c.failed && !closing_) {
    Fail(i, NodeCode::kUnreachable,
         why.ok() ? "link closed" : std::string(why.message()));
  }
  c.link.reset();
}

void Fanout::Fail(size_t i, NodeCode code, std::string why) {
  Child& c = children_[i];
  if (c.failed) return;
  spdlog::warn("{}: child {} is out of the refit: {}", options_.hello.node,
               c.sub.nodes[0].name, why);
  c.failed = true;
  c.failure = code;
  c.why = std::move(why);
  if (c.link) c.link->Close();
}

size_t Fanout::Forward(const FrameBuffer& frame, bool chunk) {
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
  for (Child& c : children_) c.reply.reset();
}

bool Fanout::Complete() const {
  return std::all_of(children_.begin(), children_.end(),
                     [](const Child& c) { return c.failed || c.reply; });
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

std::vector<NodeResult> Fanout::Results() const {
  std::vector<NodeResult> out;
  for (const Child& c : children_) {
    if (c.reply) {  // it answered this phase, even if its link went after
      out.insert(out.end(), c.reply->nodes.begin(), c.reply->nodes.end());
      continue;
    }
    const std::string& head = c.sub.nodes[0].name;
    for (size_t k = 0; k < c.sub.nodes.size(); ++k) {
      NodeResult r;
      r.node = c.sub.nodes[k].name;
      r.code = c.failed ? c.failure : NodeCode::kTimeout;
      r.detail =
          k == 0 ? (c.failed ? c.why : "no answer yet")
                 : fmt::format("behind {}, which is out of the refit", head);
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

void Fanout::Close() {
  closing_ = true;
  for (Child& c : children_) {
    if (c.link) c.link->CloseAfterFlush();
  }
}

}  // namespace dcr
