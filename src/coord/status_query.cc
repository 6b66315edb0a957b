// `dcr status` (QueryStatus, coord/coordinator.h): a HELLO and a
// STATUS_REQUEST to every relay, in parallel, over the kind of link into
// each; the first STATUS_REPLY, ERROR or close answers for that relay.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>

#include "coord/coordinator.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "transport/transport_set.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

class StatusHandler : public LinkHandler {
 public:
  StatusHandler(Mailbox* mailbox, NodeStatus* out, bool* done)
      : mailbox_(mailbox), out_(out), done_(done) {}
  void OnFrame(Link&, const Frame& frame, const FrameBuffer& buffer) override {
    if (frame.type() != FrameType::kStatusReply &&
        frame.type() != FrameType::kError) {
      return;
    }
    mailbox_->Post([out_ = out_, done_ = done_, frame, buffer] {
      if (*done_) return;
      *done_ = true;
      if (frame.type() == FrameType::kError) {
        out_->error =
            std::string(reinterpret_cast<const char*>(frame.payload.data()),
                        frame.payload.size());
        return;
      }
      auto r = DecodeResults(frame.payload);
      if (!r.ok() || r->nodes.empty()) {
        out_->error = r.ok() ? "empty STATUS_REPLY" : r.status().ToString();
        return;
      }
      const NodeResult& n = r->nodes[0];
      out_->reachable = true;
      out_->code = n.code;
      if (n.version.step != 0 || n.version.digest != Digest128()) {
        out_->committed = n.version;
      }
      out_->detail = n.detail;
      out_->store = n.store;
      if (n.node != out_->node) {
        out_->error = fmt::format("answered as '{}'", n.node);
      }
    });
  }
  void OnClosed(Link&, const Status& why) override {
    mailbox_->Post([out_ = out_, done_ = done_, why] {
      if (*done_) return;
      *done_ = true;
      out_->error = why.ok() ? "closed" : std::string(why.message());
    });
  }

 private:
  Mailbox* mailbox_;
  NodeStatus* out_;
  bool* done_;
};

}  // namespace

std::string_view NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kCurrent:
      return "current";
    case NodeState::kStale:
      return "stale";
    case NodeState::kEmpty:
      return "empty";
    case NodeState::kUnfinished:
      return "unfinished";
    case NodeState::kRepairing:
      return "repairing";
    case NodeState::kUnreachable:
      return "unreachable";
  }
  return "unknown";
}

NodeState StateOf(const NodeStatus& node,
                  const std::optional<Version>& baseline) {
  if (!node.reachable) return NodeState::kUnreachable;
  if (node.store.unfinished) {
    return node.store.repairing ? NodeState::kRepairing
                                : NodeState::kUnfinished;
  }
  if (!node.committed) return NodeState::kEmpty;
  if (baseline && *node.committed != *baseline) return NodeState::kStale;
  return NodeState::kCurrent;
}

bool ServingReady(NodeState state) {
  return state == NodeState::kCurrent || state == NodeState::kStale;
}

std::string DescribeUnfinished(const StoreCondition& u) {
  return fmt::format(
      "holds a mix of step {} and step {} (refit {}){}", u.base.step,
      u.target.step, u.unfinished ? u.unfinished->ToHex().substr(0, 12) : "?",
      u.repairing ? "; the root is repairing it"
      : u.prepared
          ? "; it voted yes before a crash, bits verified at the target"
          : "");
}

std::vector<NodeStatus> QueryStatus(const Topology& topology,
                                    std::chrono::milliseconds timeout,
                                    const std::string& transport_kind,
                                    const TransportOptions& options) {
  std::vector<NodeStatus> out;
  for (const ClusterSpec& c : topology.clusters) {
    for (const NodeSpec& n : c.nodes) {
      NodeStatus s;
      s.node = n.name;
      s.cluster = c.name;
      s.address = fmt::format("{}:{}", n.host, n.port);
      out.push_back(std::move(s));
    }
  }
  // The kind of the link into each relay, as a refit's parent uses it.
  auto tree = BuildTree(topology);
  auto kind_of = [&](const NodeSpec& n) -> std::string {
    if (!transport_kind.empty()) return transport_kind;
    int k = tree.ok() ? tree->Find(n.name) : -1;
    return std::string(
        TransportKindName(k > 0 ? tree->nodes[static_cast<size_t>(k)].transport
                                : topology.defaults.transport));
  };
  TransportSet transports(options, transport_kind);
  Mailbox mailbox;
  // deque: stable addresses for the handlers.
  std::deque<bool> done(out.size(), false);
  std::vector<std::shared_ptr<Link>> links(out.size());
  auto deadline = Clock::now() + timeout;
  size_t i = 0;
  for (const ClusterSpec& c : topology.clusters) {
    for (const NodeSpec& n : c.nodes) {
      auto handler =
          std::make_shared<StatusHandler>(&mailbox, &out[i], &done[i]);
      auto transport = transports.Get(kind_of(n));
      if (!transport.ok()) {
        done[i] = true;
        out[i].error = transport.status().ToString();
        ++i;
        continue;
      }
      (*transport)
          ->AsyncConnect(n.host, n.port, handler, timeout,
                         [&mailbox, &out, &done, &links, &options,
                          i](Result<std::shared_ptr<Link>> l) {
                           mailbox.Post([&, i, l = std::move(l)] {
                             if (!l.ok()) {
                               done[i] = true;
                               out[i].error = std::string(l.status().message());
                               return;
                             }
                             links[i] = *l;
                             FrameSender sender(options.frames);
                             auto hello = sender.Next(
                                 FrameType::kHello,
                                 EncodeHello(HelloMsg{"", kRoleClient, 0}));
                             auto req =
                                 sender.Next(FrameType::kStatusRequest, {});
                             if (hello.ok() && req.ok()) {
                               links[i]->Send(*hello);
                               links[i]->Send(*req);
                             }
                           });
                         });
      ++i;
    }
  }
  while (Clock::now() < deadline &&
         !std::all_of(done.begin(), done.end(), [](bool d) { return d; })) {
    mailbox.RunUntil(deadline);  // every answer and failure is posted
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (!done[k]) out[k].error = "no answer within the timeout";
  }
  transports.Stop();
  mailbox.Close();
  return out;
}

}  // namespace dcr
