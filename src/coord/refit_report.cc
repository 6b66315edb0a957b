#include "coord/refit_report.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "coord/state_dir.h"
#include "coord/state_json.h"

namespace dcr {
namespace {

std::map<std::string, NodeResult> ByNode(const std::vector<NodeResult>& v) {
  std::map<std::string, NodeResult> out;
  for (const NodeResult& r : v) out.emplace(r.node, r);
  return out;
}

Result<RefitOutcome> Outcome(const StateJson& f, const char* key) {
  DCR_ASSIGN_OR_RETURN(std::string name, f.String(key));
  for (RefitOutcome o : {RefitOutcome::kCommitted, RefitOutcome::kPartial,
                         RefitOutcome::kAborted, RefitOutcome::kUnfinished}) {
    if (RefitOutcomeName(o) == name) return o;
  }
  return f.Bad(key, "unknown outcome '" + name + "'");
}

Result<NodeCode> Code(const StateJson& f, const char* key) {
  DCR_ASSIGN_OR_RETURN(std::string name, f.String(key));
  for (int c = 0; c <= static_cast<int>(NodeCode::kRejected); ++c) {
    if (NodeCodeName(static_cast<NodeCode>(c)) == name) {
      return static_cast<NodeCode>(c);
    }
  }
  return f.Bad(key, "unknown node code '" + name + "'");
}

Result<NodeOutcome> NodeFromJson(const StateJson& f) {
  DCR_RETURN_IF_ERROR(f.OnlyFields({"node", "cluster", "committed", "code",
                                    "phase", "detail", "chunks_applied"}));
  NodeOutcome n;
  DCR_ASSIGN_OR_RETURN(n.node, f.String("node"));
  DCR_ASSIGN_OR_RETURN(n.cluster, f.String("cluster"));
  DCR_ASSIGN_OR_RETURN(n.committed, f.Bool("committed"));
  DCR_ASSIGN_OR_RETURN(n.code, Code(f, "code"));
  DCR_ASSIGN_OR_RETURN(n.phase, f.String("phase"));
  DCR_ASSIGN_OR_RETURN(n.detail, f.String("detail"));
  DCR_ASSIGN_OR_RETURN(n.chunks_applied, f.Uint("chunks_applied"));
  return n;
}

Result<CatchUpReport> CatchUpFromJson(const StateJson& f) {
  DCR_RETURN_IF_ERROR(f.OnlyFields(
      {"refit", "epoch", "nodes", "method", "from", "deltas", "chunks",
       "payload_bytes", "seconds", "outcome", "reason", "repaired"}));
  CatchUpReport c;
  DCR_ASSIGN_OR_RETURN(c.refit, f.Refit("refit"));
  DCR_ASSIGN_OR_RETURN(c.epoch, f.Uint("epoch"));
  DCR_ASSIGN_OR_RETURN(c.nodes, f.Strings("nodes"));
  DCR_ASSIGN_OR_RETURN(c.method, f.String("method"));
  if (c.method != "history" && c.method != "dense" && c.method != "repair" &&
      c.method != "seed") {
    return f.Bad("method", "unknown method '" + c.method + "'");
  }
  if (f.Has("repaired")) {
    DCR_ASSIGN_OR_RETURN(c.repaired, f.Refit("repaired"));
  }
  DCR_ASSIGN_OR_RETURN(c.from, f.VersionField("from"));
  DCR_ASSIGN_OR_RETURN(c.deltas, f.Uint("deltas"));
  DCR_ASSIGN_OR_RETURN(c.chunks, f.Uint("chunks"));
  DCR_ASSIGN_OR_RETURN(c.payload_bytes, f.Uint("payload_bytes"));
  DCR_ASSIGN_OR_RETURN(c.seconds, f.Number("seconds"));
  DCR_ASSIGN_OR_RETURN(c.outcome, Outcome(f, "outcome"));
  DCR_ASSIGN_OR_RETURN(c.reason, f.String("reason"));
  return c;
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
    case RefitOutcome::kUnfinished:
      return "unfinished";
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
      {"context_chunks", context_chunks},
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
        {"total", total_seconds},
        {"baseline_in_stream", baseline_in_stream_seconds},
        {"baseline_waited", baseline_waited_seconds},
        {"hashed_in_stream", hashed_in_stream_seconds},
        {"applied", applied_seconds}}},
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
    if (!c.repaired.IsZero()) {
      catch_up_json.back()["repaired"] = c.repaired.ToHex();
    }
  }
  j["catch_up"] = std::move(catch_up_json);
  if (!context_nodes.empty()) {
    j["context_nodes"] = context_nodes;
    j["plain_payload_bytes"] = plain_payload_bytes;
  }
  if (producers > 0) {
    j["producers"] = producers;
    j["trainer_step"] = trainer_step;
  }
  if (!ended_at.empty()) j["ended_at"] = ended_at;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<RefitReport> RefitReportFromJson(const nlohmann::json& j,
                                        const std::string& file) {
  StateJson f(j, file);
  DCR_RETURN_IF_ERROR(f.OnlyFields({"format",
                                    "refit",
                                    "epoch",
                                    "mode",
                                    "outcome",
                                    "reason",
                                    "base",
                                    "target",
                                    "checkpoint_bytes",
                                    "total_elements",
                                    "changed_elements",
                                    "change_rate",
                                    "chunks",
                                    "payload_bytes",
                                    "context_chunks",
                                    "context_nodes",
                                    "plain_payload_bytes",
                                    "stream_bytes",
                                    "repair_rounds",
                                    "repair_chunks",
                                    "repair_bytes",
                                    "adoptions",
                                    "resent_chunks",
                                    "resent_bytes",
                                    "resend_misses",
                                    "link_class_bytes",
                                    "seconds",
                                    "nodes",
                                    "catch_up",
                                    "producers",
                                    "trainer_step",
                                    "ended_at"}));
  DCR_RETURN_IF_ERROR(f.Format().status());
  RefitReport r;
  DCR_ASSIGN_OR_RETURN(r.refit, f.Refit("refit"));
  DCR_ASSIGN_OR_RETURN(r.epoch, f.Uint("epoch"));
  DCR_ASSIGN_OR_RETURN(r.mode, f.Mode("mode"));
  DCR_ASSIGN_OR_RETURN(r.outcome, Outcome(f, "outcome"));
  DCR_ASSIGN_OR_RETURN(r.reason, f.String("reason"));
  DCR_ASSIGN_OR_RETURN(r.base, f.VersionField("base"));
  DCR_ASSIGN_OR_RETURN(r.target, f.VersionField("target"));
  struct {
    const char* key;
    uint64_t* to;
  } counts[] = {{"checkpoint_bytes", &r.checkpoint_bytes},
                {"total_elements", &r.total_elements},
                {"changed_elements", &r.changed_elements},
                {"chunks", &r.chunks},
                {"payload_bytes", &r.payload_bytes},
                {"stream_bytes", &r.stream_bytes},
                {"repair_chunks", &r.repair_chunks},
                {"repair_bytes", &r.repair_bytes},
                {"adoptions", &r.adoptions},
                {"resent_chunks", &r.resent_chunks},
                {"resent_bytes", &r.resent_bytes},
                {"resend_misses", &r.resend_misses}};
  for (const auto& c : counts) {
    DCR_ASSIGN_OR_RETURN(*c.to, f.Uint(c.key));
  }
  // Producers' refits only.
  if (f.Has("producers")) {
    DCR_ASSIGN_OR_RETURN(uint64_t n, f.Uint("producers"));
    r.producers = static_cast<uint32_t>(n);
    DCR_ASSIGN_OR_RETURN(r.trainer_step, f.Uint("trainer_step"));
  }
  if (f.Has("ended_at")) {
    DCR_ASSIGN_OR_RETURN(r.ended_at, f.String("ended_at"));
  }
  // Written since context-coded chunks; older files lack it.
  if (f.Has("context_chunks")) {
    DCR_ASSIGN_OR_RETURN(r.context_chunks, f.Uint("context_chunks"));
  }
  // Mixed trees only.
  if (f.Has("context_nodes")) {
    DCR_ASSIGN_OR_RETURN(r.context_nodes, f.Strings("context_nodes"));
    DCR_ASSIGN_OR_RETURN(r.plain_payload_bytes, f.Uint("plain_payload_bytes"));
  }
  DCR_RETURN_IF_ERROR(f.Number("change_rate").status());
  DCR_ASSIGN_OR_RETURN(uint64_t rounds, f.Uint("repair_rounds"));
  r.repair_rounds = static_cast<int>(rounds);
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* links,
                       f.Object("link_class_bytes"));
  StateJson lf(*links, file, "link_class_bytes.");
  DCR_RETURN_IF_ERROR(lf.OnlyFields({"none", "lan", "wan"}));
  for (const auto& item : links->items()) {
    DCR_ASSIGN_OR_RETURN(r.link_class_bytes[item.key()],
                         lf.Uint(item.key().c_str()));
  }
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* seconds, f.Object("seconds"));
  StateJson sf(*seconds, file, "seconds.");
  DCR_RETURN_IF_ERROR(
      sf.OnlyFields({"prepare", "plan", "stream", "vote", "commit", "total",
                     "baseline_in_stream", "baseline_waited",
                     "hashed_in_stream", "applied"}));
  DCR_ASSIGN_OR_RETURN(r.prepare_seconds, sf.Number("prepare"));
  DCR_ASSIGN_OR_RETURN(r.plan_seconds, sf.Number("plan"));
  DCR_ASSIGN_OR_RETURN(r.stream_seconds, sf.Number("stream"));
  DCR_ASSIGN_OR_RETURN(r.vote_seconds, sf.Number("vote"));
  DCR_ASSIGN_OR_RETURN(r.commit_seconds, sf.Number("commit"));
  DCR_ASSIGN_OR_RETURN(r.total_seconds, sf.Number("total"));
  if (sf.Has("baseline_in_stream")) {  // since the baseline streams (issue 22)
    DCR_ASSIGN_OR_RETURN(r.baseline_in_stream_seconds,
                         sf.Number("baseline_in_stream"));
  }
  if (sf.Has("baseline_waited")) {  // since its last writes overlap the vote
    DCR_ASSIGN_OR_RETURN(r.baseline_waited_seconds,
                         sf.Number("baseline_waited"));
  }
  if (sf.Has("hashed_in_stream")) {  // since END names the target (issue 22)
    DCR_ASSIGN_OR_RETURN(r.hashed_in_stream_seconds,
                         sf.Number("hashed_in_stream"));
  }
  if (sf.Has("applied")) {  // since relays report delivered bytes
    DCR_ASSIGN_OR_RETURN(r.applied_seconds, sf.Number("applied"));
  }
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* nodes, f.Array("nodes"));
  for (size_t i = 0; i < nodes->size(); ++i) {
    std::string at = fmt::format("nodes[{}]", i);
    if (!(*nodes)[i].is_object()) return f.Bad(at, "not an object");
    DCR_ASSIGN_OR_RETURN(NodeOutcome n,
                         NodeFromJson(StateJson((*nodes)[i], file, at + ".")));
    r.nodes.push_back(std::move(n));
  }
  DCR_ASSIGN_OR_RETURN(const nlohmann::json* catch_up, f.Array("catch_up"));
  for (size_t i = 0; i < catch_up->size(); ++i) {
    std::string at = fmt::format("catch_up[{}]", i);
    if (!(*catch_up)[i].is_object()) return f.Bad(at, "not an object");
    DCR_ASSIGN_OR_RETURN(CatchUpReport c, CatchUpFromJson(StateJson(
                                              (*catch_up)[i], file, at + ".")));
    r.catch_up.push_back(std::move(c));
  }
  return r;
}

void SummarizeNodes(const Tree& tree, const PhaseReplies& replies,
                    const std::set<std::string>& commit_set,
                    RefitReport* report) {
  auto p = ByNode(replies.plan), v = ByNode(replies.votes),
       f = ByNode(replies.final);
  // A mixed tree's edges without context carried the base-independent
  // payload instead (the frames around it are the same).
  const uint64_t per_edge = report->stream_bytes;
  const uint64_t per_plain_edge =
      report->context_nodes.empty() ? per_edge
      : per_edge >= report->payload_bytes
          ? per_edge - report->payload_bytes + report->plain_payload_bytes
          : report->plain_payload_bytes;
  const std::set<std::string> context(report->context_nodes.begin(),
                                      report->context_nodes.end());
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
    // What a committed node adds (a serving relay: when its server moved).
    if (o.committed && o.phase.empty()) o.detail = f[n.name].detail;
    if (!o.committed && o.phase.empty() &&
        report->outcome != RefitOutcome::kAborted) {
      o.phase = "commit";
      o.detail = commit_set.count(n.name) ? "no commit reply"
                                          : "not in the commit set";
    }
    // It voted yes and COMMIT went towards it, but its answer never came
    // (its link or its parent failed, or the deadline passed first): it
    // holds the target as soon as COMMIT reached it, not a stale version.
    const bool unanswered = !f.count(n.name) ||
                            f[n.name].code == NodeCode::kTimeout ||
                            f[n.name].code == NodeCode::kUnreachable;
    if (!o.committed && o.phase == "commit" && commit_set.count(n.name) &&
        unanswered && report->outcome != RefitOutcome::kAborted) {
      if (o.code == NodeCode::kOk) o.code = NodeCode::kTimeout;
      o.detail = fmt::format(
          "{}: it voted yes and was sent COMMIT, but its reply never came "
          "({}); it holds the target once COMMIT reached it (dcr status "
          "shows its version)",
          kCommitUnconfirmed, o.detail);
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
      report->link_class_bytes[std::string(LinkClassName(n.link))] +=
          context.empty() || context.contains(n.name) ? per_edge
                                                      : per_plain_edge;
    }
  }
}

std::string ExcludedReason(const RefitReport& report) {
  std::vector<std::string> excluded, unconfirmed;
  for (const NodeOutcome& n : report.nodes) {
    if (n.committed) continue;
    std::string who = n.phase.empty()
                          ? n.node
                          : fmt::format("{} ({} at {})", n.node,
                                        NodeCodeName(n.code), n.phase);
    (n.detail.starts_with(kCommitUnconfirmed) ? unconfirmed : excluded)
        .push_back(std::move(who));
  }
  std::vector<std::string> parts;
  if (!excluded.empty()) {
    parts.push_back(
        fmt::format("excluded, now stale: {}", fmt::join(excluded, ", ")));
  }
  if (!unconfirmed.empty()) {
    parts.push_back(fmt::format(
        "{} (no reply; each holds the target once COMMIT reached it, as "
        "dcr status shows): {}",
        kCommitUnconfirmed, fmt::join(unconfirmed, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string UnfinishedReason(const std::vector<NodeResult>& final,
                             const RefitReport& report) {
  std::vector<std::string> why;
  for (const NodeResult& r : final) {
    if (r.code == NodeCode::kOk) continue;
    why.push_back(
        fmt::format("{}: {} ({})", r.node, NodeCodeName(r.code), r.detail));
    if (why.size() == 3) break;
  }
  return fmt::format(
      "no relay of the commit set answered the COMMIT{}{}: another "
      "coordinator run may have taken the refit over (its relays refuse "
      "or drop this one's frames), or the links failed. root.baseline stays "
      "at step {} (not step {}) and state_dir/current.json stays: dcr "
      "refit --resume, or the next dcr refit, finishes the commit at a new "
      "epoch",
      why.empty() ? "" : ": ", fmt::join(why, "; "), report.base.step,
      report.target.step);
}

}  // namespace dcr
