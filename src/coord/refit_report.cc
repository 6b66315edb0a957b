#include "coord/refit_report.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "coord/state_dir.h"

namespace dcr {
namespace {

std::map<std::string, NodeResult> ByNode(const std::vector<NodeResult>& v) {
  std::map<std::string, NodeResult> out;
  for (const NodeResult& r : v) out.emplace(r.node, r);
  return out;
}

}  // namespace

std::string_view RefitOutcomeName(RefitOutcome o) {
  switch (o) {
    case RefitOutcome::kCommitted:
      return "committed";
    case RefitOutcome::kPartial:
      return "committed-partial";
    case RefitOutcome::kAborted:
      return "aborted";
  }
  return "?";
}

std::string RefitReport::ToJson() const {
  nlohmann::json nodes_json = nlohmann::json::array();
  for (const NodeOutcome& n : nodes) {
    nodes_json.push_back({{"node", n.node},
                          {"cluster", n.cluster},
                          {"committed", n.committed},
                          {"code", std::string(NodeCodeName(n.code))},
                          {"phase", n.phase},
                          {"detail", n.detail},
                          {"chunks_applied", n.chunks_applied}});
  }
  nlohmann::json j = {
      {"refit", refit.ToHex()},
      {"epoch", epoch},
      {"mode", mode == RefitMode::kFull ? "full" : "delta"},
      {"outcome", std::string(RefitOutcomeName(outcome))},
      {"reason", reason},
      {"base", VersionJson(base)},
      {"target", VersionJson(target)},
      {"checkpoint_bytes", checkpoint_bytes},
      {"total_elements", total_elements},
      {"changed_elements", changed_elements},
      {"change_rate",
       total_elements ? double(changed_elements) / total_elements : 0.0},
      {"chunks", chunks},
      {"payload_bytes", payload_bytes},
      {"stream_bytes", stream_bytes},
      {"repair_rounds", repair_rounds},
      {"repair_chunks", repair_chunks},
      {"repair_bytes", repair_bytes},
      {"adoptions", adoptions},
      {"resent_chunks", resent_chunks},
      {"resent_bytes", resent_bytes},
      {"resend_misses", resend_misses},
      {"link_class_bytes", link_class_bytes},
      {"seconds",
       {{"prepare", prepare_seconds},
        {"plan", plan_seconds},
        {"stream", stream_seconds},
        {"vote", vote_seconds},
        {"commit", commit_seconds},
        {"total", total_seconds}}},
      {"nodes", nodes_json}};
  nlohmann::json catch_up_json = nlohmann::json::array();
  for (const CatchUpReport& c : catch_up) {
    catch_up_json.push_back(
        {{"refit", c.refit.ToHex()},
         {"epoch", c.epoch},
         {"nodes", c.nodes},
         {"method", c.method},
         {"from", VersionJson(c.from)},
         {"deltas", c.deltas},
         {"chunks", c.chunks},
         {"payload_bytes", c.payload_bytes},
         {"seconds", c.seconds},
         {"outcome", std::string(RefitOutcomeName(c.outcome))},
         {"reason", c.reason}});
  }
  j["catch_up"] = std::move(catch_up_json);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void SummarizeNodes(const Tree& tree, const PhaseReplies& replies,
                    const std::set<std::string>& commit_set,
                    RefitReport* report) {
  auto p = ByNode(replies.plan), v = ByNode(replies.votes),
       f = ByNode(replies.final);
  const uint64_t per_edge = report->stream_bytes;
  for (size_t i = 1; i < tree.nodes.size(); ++i) {
    const TreeNode& n = tree.nodes[i];
    NodeOutcome o;
    o.node = n.name;
    o.cluster = n.cluster;
    o.committed = commit_set.count(n.name) && f.count(n.name) &&
                  f[n.name].code == NodeCode::kOk &&
                  f[n.name].version == report->target;
    auto first_failure = [&](std::map<std::string, NodeResult>& m,
                             const char* phase) {
      if (!o.phase.empty()) return;
      auto it = m.find(n.name);
      if (it == m.end()) return;
      if (it->second.code != NodeCode::kOk) {
        o.code = it->second.code;
        o.phase = phase;
        o.detail = it->second.detail;
      }
    };
    first_failure(p, "plan");
    first_failure(v, "vote");
    first_failure(
        f, report->outcome == RefitOutcome::kAborted ? "abort" : "commit");
    if (f.count(n.name)) o.chunks_applied = f[n.name].chunks_applied;
    if (!o.committed && o.phase.empty() &&
        report->outcome != RefitOutcome::kAborted) {
      o.phase = "commit";
      o.detail = commit_set.count(n.name) ? "no commit reply"
                                          : "not in the commit set";
    }
    report->nodes.push_back(std::move(o));
    // The stream crossed this node's link if a node of its subtree took
    // the plan (a parent sends chunks only towards such subtrees).
    bool carried = false;
    for (int k : tree.Subtree(static_cast<int>(i))) {
      auto it = p.find(tree.nodes[k].name);
      carried |= it != p.end() && it->second.code == NodeCode::kOk;
    }
    if (carried) {
      report->link_class_bytes[std::string(LinkClassName(n.link))] += per_edge;
    }
  }
}

std::string ExcludedReason(const RefitReport& report) {
  std::vector<std::string> excluded;
  for (const NodeOutcome& n : report.nodes) {
    if (n.committed) continue;
    excluded.push_back(n.phase.empty()
                           ? n.node
                           : fmt::format("{} ({} at {})", n.node,
                                         NodeCodeName(n.code), n.phase));
  }
  return fmt::format("excluded, now stale: {}", fmt::join(excluded, ", "));
}

}  // namespace dcr
