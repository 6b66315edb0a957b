// What a Fanout reports to its owner: send queues and bytes (backpressure,
// progress, metrics) and the current phase's per-node results.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>

#include "protocol/fanout.h"

namespace dcr {

size_t Fanout::MaxQueuedBytes() const {
  size_t most = 0;
  for (const Child& c : children_) {
    if (!c.failed && c.link) most = std::max(most, c.link->QueuedBytes());
  }
  if (options_.objects != nullptr) {
    most = std::max(most, options_.objects->QueuedBytes());
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

std::optional<uint64_t> Fanout::Delivered(std::optional<bool> context) const {
  if (tree_.plan.heartbeat_ms == 0) return std::nullopt;
  std::optional<uint64_t> least;
  for (const Child& c : children_) {
    if (c.failed || c.superseded || !c.takes_chunks || !c.accepted) continue;
    if (context && GetsContext(c) != *context) continue;
    if (c.sent_empty_heartbeat && !c.progress) continue;       // older
    if (c.progress && !c.progress->delivered_bytes) continue;  // older
    const uint64_t v = c.progress ? *c.progress->delivered_bytes : 0;
    least = least ? std::min(*least, v) : v;
  }
  return least;
}

std::pair<size_t, size_t> Fanout::Answered() const {
  size_t answered = 0, total = 0;
  for (const Child& c : children_) {
    if (c.superseded) continue;
    total += c.sub.nodes.size();
    if (c.failed) {
      answered += c.sub.nodes.size();
    } else if (c.reply) {
      answered += std::min(c.reply->nodes.size(), c.sub.nodes.size());
    }
  }
  return {answered, total};
}

std::vector<NodeResult> Fanout::Results() const {
  std::vector<NodeResult> out;
  for (const Child& c : children_) {
    if (c.superseded) continue;
    if (c.reply && c.rejoin_of) {
      // It rejoined alone: its former children report through the nodes
      // that adopted them, whatever it says of them.
      for (const NodeResult& r : c.reply->nodes) {
        if (r.node == c.sub.nodes[0].name) out.push_back(r);
      }
      continue;
    }
    if (c.reply) {  // it answered this phase, even if its link went after
      out.insert(out.end(), c.reply->nodes.begin(), c.reply->nodes.end());
      // A node placed in its subtree after it answered: no answer yet.
      if (c.reply->nodes.size() < c.sub.nodes.size()) {
        std::set<std::string_view> named;
        for (const NodeResult& r : c.reply->nodes) named.insert(r.node);
        for (const PlanNode& n : c.sub.nodes) {
          if (named.contains(n.name)) continue;
          NodeResult r;
          r.node = n.name;
          r.code = NodeCode::kTimeout;
          r.detail = "placed under " + c.sub.nodes[0].name +
                     " after it answered; no answer yet";
          out.push_back(std::move(r));
        }
      }
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

}  // namespace dcr
