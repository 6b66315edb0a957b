// Fanout (fanout.h): what happens when a child fails: its retries, and
// the re-parenting of its children (adoptions, amendments of the plan).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "protocol/fanout.h"

namespace dcr {

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
  if (closing_ || kind == FailKind::kFinal) return;
  // Nothing is left to deliver to a subtree that refused the plan or
  // answered the last phase.
  if (c.refused || (c.reply && (expected_ == FrameType::kCommitReply ||
                                expected_ == FrameType::kAbortReply))) {
    return;
  }
  if (!options_.adopt) {
    // This node is an orphan: its own link may be what failed (a stopped
    // process wakes to every link silent). Recover once adopted.
    c.deferred = kind;
    return;
  }
  Recover(i, kind);
}

void Fanout::RecoverDeferred(const PlanMsg* adopter) {
  if (!options_.adopt || closing_) return;
  for (size_t i = 0; i < children_.size(); ++i) {
    std::optional<FailKind> kind = std::exchange(children_[i].deferred, {});
    if (!kind) continue;
    const std::string& name = children_[i].sub.nodes[0].name;
    if (adopter &&
        std::none_of(adopter->nodes.begin(), adopter->nodes.end(),
                     [&](const PlanNode& n) { return n.name == name; })) {
      spdlog::info("{}: adopted without {} (its adopter took it)",
                   options_.hello.node, name);
      continue;
    }
    spdlog::info("{}: adopted again; recovering {}, which failed meanwhile",
                 options_.hello.node, name);
    Recover(i, *kind);
  }
}

void Fanout::Stalled(Clock::duration gap) {
  const Clock::time_point now = Clock::now();
  for (Child& c : children_) {
    if (!c.failed) c.last_rx = std::min(now, c.last_rx + gap);
  }
}

void Fanout::Recover(size_t i, FailKind kind) {
  Child& c = children_[i];
  if (kind == FailKind::kLink && !c.retried) {
    // It may have lost only the link: connect to it again, once.
    c.superseded = true;
    size_t k = AddChild(c.plan_index, /*adoption=*/true, /*retried=*/true,
                        c.delegated_depth);
    ++adoptions_;
    Connect(k);
    return;
  }
  const bool unreached = kind == FailKind::kUnreached;
  AdoptChildrenOf(i, unreached);
  // Never reached: nothing of the refit to rejoin (it takes the next one).
  if (unreached) c.rejoin_tries = kRejoinTries;
}

void Fanout::AdoptChildrenOf(size_t i, bool unplanned) {
  Child& c = children_[i];
  c.split = true;
  if (tree_.plan.heartbeat_ms != 0) {
    c.rejoin_at = Clock::now() + heartbeat() / 2;
  }
  const std::string failed = c.sub.nodes[0].name;
  // Within capacity while chunks stream: chunks went out, so the owner's
  // plan phase is over (no PLAN_REPLY is pending that a placed node would
  // be missing from), and END did not (nobody voted).
  std::vector<size_t> orphans = tree_.Children(c.plan_index);
  bool streaming = chunks_seen_ && expected_ == FrameType::kPlanReply;
  size_t live = live_children(), cap = tree_.Capacity(0);
  size_t free = !streaming ? orphans.size() : cap > live ? cap - live : 0;
  std::vector<size_t> roots;
  for (const Child& e : children_) {
    // Not under a subtree that refused the plan: it takes no chunks.
    if (!e.failed && !e.superseded && !e.rejoin_of && e.takes_chunks) {
      roots.push_back(e.plan_index);
    }
  }
  // A mixed tree: an orphan goes only under a subtree of its own encoding,
  // so every subtree keeps one (see Options::plain_nodes). A subtree
  // planned without context-coded chunks cannot decode them, nor its new
  // parent's resends of them; and one that takes them has relays whose
  // resend buffers hold them, which a node placed below later could not
  // decode either.
  auto label = [this](size_t index) {
    return plain_.contains(tree_.plan.nodes[index].name);
  };
  std::function<bool(size_t, size_t)> may_host;
  if (tree_.plan.context_coded && !plain_.empty()) {
    may_host = [&](size_t orphan, size_t root) {
      return label(orphan) == label(root);
    };
  }
  OrphanPlacement placement =
      PlaceOrphans(tree_, orphans, free, roots, may_host);
  for (const auto& [moved, host] : placement.placed) {
    spdlog::info("{}: placing {}, a child of {}, under {} (fanout {})",
                 options_.hello.node, tree_.plan.nodes[moved].name, failed,
                 tree_.plan.nodes[host].name, tree_.Capacity(host));
    ++adoptions_;
  }
  for (size_t o : placement.adopt) {
    spdlog::info("{}: adopting {}, a child of {}", options_.hello.node,
                 tree_.plan.nodes[o].name, failed);
    size_t n = AddChild(o, /*adoption=*/true, /*retried=*/false);
    children_[n].unplanned = unplanned;
    ++adoptions_;
    Connect(n);
  }
  // A live child whose subtree took an orphan learns it from a PLAN on its
  // link (one just adopted has it in its adoption PLAN).
  std::vector<size_t> told;
  for (const auto& [moved, host] : placement.placed) {
    std::optional<size_t> e =
        tree_.NearestEntry(host, [this](size_t x) { return EntryOf(x); });
    if (!e || std::find(told.begin(), told.end(), *e) != told.end()) continue;
    told.push_back(*e);
    SendAmendment(children_[*e], options_.depth);
  }
}

void Fanout::SendAmendment(Child& c, uint32_t depth) {
  RefreshSub(c);
  if (c.failed || !c.link) return;  // OnConnected sends the new sub-plan
  PlanMsg m = c.sub;
  m.adopt = true;
  m.resend = false;
  m.sender_depth = depth;
  if (Status s = SendTo(c, FrameType::kPlan, EncodePlan(m)); !s.ok()) {
    spdlog::warn("{}: cannot send {} its new subtree: {}", options_.hello.node,
                 c.sub.nodes[0].name, s.ToString());
  }
}

void Fanout::Amend(const PlanMsg& plan) {
  RecoverDeferred(&plan);
  std::vector<size_t> told;
  for (size_t t : MergePlan(tree_, plan)) {
    size_t host = static_cast<size_t>(tree_.plan.nodes[t].parent);
    std::optional<size_t> e =
        tree_.NearestEntry(host, [this](size_t x) { return EntryOf(x); });
    const Child* c = e ? &children_[*e] : nullptr;
    if (host == 0 || !c || !c->takes_chunks ||
        (c->failed && c->split && c->plan_index == host)) {
      spdlog::info("{}: adopting {}, placed here by an ancestor",
                   options_.hello.node, tree_.plan.nodes[t].name);
      size_t k =
          AddChild(t, /*adoption=*/true, /*retried=*/false, plan.sender_depth);
      Connect(k);
    } else if (std::find(told.begin(), told.end(), *e) == told.end()) {
      told.push_back(*e);
      SendAmendment(children_[*e], plan.sender_depth);
    }
  }
}

}  // namespace dcr
