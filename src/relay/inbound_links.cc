#include "relay/inbound_links.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace dcr {

void SendReply(FrameSender& sender, Link& link, FrameType type,
               const FrameHeader& about, std::span<const std::byte> payload,
               const std::string& node) {
  auto frame = sender.Reply(type, about, payload);
  if (!frame.ok()) {
    spdlog::error("{}: cannot encode {}: {}", node, FrameTypeName(type),
                  frame.status().ToString());
    return;
  }
  link.Send(*frame);
}

void SendError(FrameSender& sender, Link& link, const std::string& message) {
  auto frame = sender.Next(
      FrameType::kError,
      std::as_bytes(std::span<const char>(message.data(), message.size())));
  if (frame.ok()) link.Send(*frame);
}

// Every callback runs on the listening transport's event thread; gates_
// needs no lock.
class InboundLinks::Handler_ : public LinkHandler {
 public:
  explicit Handler_(InboundLinks* links) : links_(links) {}
  void OnOpen(Link& link) override {
    const size_t most = links_->options_.max_links;
    if (most != 0 && gates_.size() >= most) {
      uint64_t n = ++*links_->counters_.refused;
      if ((n & (n - 1)) == 0) {  // the 1st, 2nd, 4th, ... time
        spdlog::warn(
            "{}: closing a connection from {}: {} links are open, the most "
            "its memory limit allows ({} refused so far)",
            links_->options_.node, link.peer(), most, n);
      }
      link.Close();
      return;
    }
    auto gate = std::make_shared<ReadGate>(link.weak_from_this(),
                                           links_->options_.quota_bytes);
    gates_.emplace(link.id(), gate);
    links_->mailbox_->Post(
        [links = links_, l = link.shared_from_this(), gate = std::move(gate)] {
          Inbound& in = links->inbound_[l->id()];
          in.link = l;
          in.gate = gate;
        });
  }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    auto it = gates_.find(link.id());
    if (it == gates_.end()) return;  // refused in OnOpen
    const uint64_t bytes = frame.bytes.size();
    if (it->second->Queued(bytes)) ++*links_->counters_.pauses;
    links_->mailbox_->Post([links = links_, l = link.shared_from_this(), frame,
                            buffer, gate = it->second, bytes] {
      links->OnFrame(l, frame, buffer);
      gate->Handled(bytes);
    });
  }
  void OnClosed(Link& link, const Status& why) override {
    if (gates_.erase(link.id()) == 0) return;  // refused in OnOpen
    links_->mailbox_->Post(
        [links = links_, id = link.id(), why] { links->OnClosed(id, why); });
  }

 private:
  InboundLinks* links_;
  std::map<uint64_t, std::shared_ptr<ReadGate>> gates_;
};

InboundLinks::InboundLinks(Options options, Mailbox* mailbox,
                           FrameSender* sender, Counters counters,
                           FrameFn on_frame, ClosedFn on_closed)
    : options_(std::move(options)),
      mailbox_(mailbox),
      sender_(sender),
      counters_(counters),
      on_frame_(std::move(on_frame)),
      on_closed_(std::move(on_closed)) {}

std::shared_ptr<LinkHandler> InboundLinks::Handler() {
  return std::make_shared<Handler_>(this);
}

std::shared_ptr<ReadGate> InboundLinks::GateOf(Link& link) {
  Inbound& in = inbound_[link.id()];
  if (!in.gate) in.gate = std::make_shared<ReadGate>(link.weak_from_this(), 0);
  return in.gate;
}

std::string InboundLinks::PeerNode(uint64_t link_id) const {
  auto it = inbound_.find(link_id);
  return it == inbound_.end() ? std::string() : it->second.hello.node;
}

bool InboundLinks::Allowed(Link& link) {
  if (options_.peer_addresses.empty()) return true;
  std::string host = link.peer();
  if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (std::find(options_.peer_addresses.begin(), options_.peer_addresses.end(),
                host) != options_.peer_addresses.end()) {
    return true;
  }
  spdlog::warn("{}: refusing a connection from {}: not a host of the topology",
               options_.node, link.peer());
  SendError(*sender_, link,
            fmt::format("{} takes connections only from the topology's "
                        "hosts; {} is not one",
                        options_.node, host));
  link.CloseAfterFlush();
  return false;
}

void InboundLinks::OnFrame(const std::shared_ptr<Link>& link,
                           const Frame& frame, const FrameBuffer& buffer) {
  Inbound& in = inbound_[link->id()];
  in.link = link;
  if (in.greeted) return on_frame_(link, frame, buffer);
  if (!Allowed(*link)) return;
  if (frame.type() != FrameType::kHello) {
    SendError(*sender_, *link, "the first frame must be HELLO");
    link->CloseAfterFlush();
    return;
  }
  auto hello = DecodeHello(frame.payload);
  if (!hello.ok()) {
    SendError(*sender_, *link, hello.status().ToString());
    link->CloseAfterFlush();
    return;
  }
  in.greeted = true;
  in.hello = *hello;
  HelloMsg mine{options_.node, kRoleRelay, epoch_};
  SendReply(*sender_, *link, FrameType::kHello, frame.header, EncodeHello(mine),
            options_.node);
}

void InboundLinks::OnClosed(uint64_t link_id, const Status& why) {
  inbound_.erase(link_id);
  on_closed_(link_id, why);
}

}  // namespace dcr
