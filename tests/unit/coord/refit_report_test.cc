// The refit report: its JSON keys and values, the per-node summary of the
// phases' replies (first failing phase, commit set, confirmation), the
// link-class bytes, the reason of a partial commit (stale or unconfirmed)
// and of an unfinished one.
#include "coord/refit_report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dcr {
namespace {

// root -> head (wan) -> {a, b} (lan).
Tree SmallTree() {
  Tree t;
  auto add = [&](const std::string& name, int parent, LinkClass link) {
    TreeNode n;
    n.name = name;
    n.cluster = parent < 0 ? "" : "c1";
    n.parent = parent;
    n.link = link;
    if (parent >= 0) t.nodes[parent].children.push_back(int(t.nodes.size()));
    t.nodes.push_back(n);
  };
  add("root", -1, LinkClass::kNone);
  add("head", 0, LinkClass::kWan);
  add("a", 1, LinkClass::kLan);
  add("b", 1, LinkClass::kLan);
  return t;
}

NodeResult R(const std::string& node, NodeCode code, Version v = {},
             std::string detail = "") {
  NodeResult r;
  r.node = node;
  r.code = code;
  r.version = v;
  r.detail = std::move(detail);
  r.chunks_applied = 7;
  return r;
}

const Version kTarget{2, Digest128{3, 4}};

TEST(RefitReportTest, JsonCarriesEveryField) {
  RefitReport r;
  r.epoch = 5;
  r.mode = RefitMode::kFull;
  r.outcome = RefitOutcome::kCommitted;
  r.base = Version{1, Digest128{1, 2}};
  r.target = kTarget;
  r.total_elements = 200;
  r.changed_elements = 50;
  r.chunks = 9;
  r.link_class_bytes["wan"] = 100;
  r.total_seconds = 1.5;
  r.nodes.push_back(
      NodeOutcome{"a", "c1", false, NodeCode::kTimeout, "vote", "late", 3});
  CatchUpReport c;
  c.nodes = {"b"};
  c.method = "history";
  c.deltas = 2;
  c.outcome = RefitOutcome::kCommitted;
  r.catch_up.push_back(c);
  auto j = nlohmann::json::parse(r.ToJson());
  EXPECT_EQ(j["epoch"], 5);
  EXPECT_EQ(j["mode"], "full");
  EXPECT_EQ(j["outcome"], "committed");
  EXPECT_EQ(j["base"]["step"], 1);
  EXPECT_EQ(j["target"]["digest"], kTarget.digest.ToHex());
  EXPECT_DOUBLE_EQ(j["change_rate"].get<double>(), 0.25);
  EXPECT_EQ(j["chunks"], 9);
  EXPECT_EQ(j["link_class_bytes"]["wan"], 100);
  EXPECT_DOUBLE_EQ(j["seconds"]["total"].get<double>(), 1.5);
  ASSERT_EQ(j["nodes"].size(), 1u);
  EXPECT_EQ(j["nodes"][0]["code"], "timeout");
  EXPECT_EQ(j["nodes"][0]["phase"], "vote");
  EXPECT_EQ(j["nodes"][0]["chunks_applied"], 3);
  ASSERT_EQ(j["catch_up"].size(), 1u);
  EXPECT_EQ(j["catch_up"][0]["method"], "history");
  EXPECT_EQ(j["catch_up"][0]["deltas"], 2);
  EXPECT_EQ(j["catch_up"][0]["nodes"][0], "b");
  // No elements: a change rate of 0, not a division by zero.
  EXPECT_EQ(nlohmann::json::parse(RefitReport().ToJson())["change_rate"], 0.0);
}

TEST(RefitReportTest, OutcomeNames) {
  EXPECT_EQ(RefitOutcomeName(RefitOutcome::kCommitted), "committed");
  EXPECT_EQ(RefitOutcomeName(RefitOutcome::kPartial), "committed-partial");
  EXPECT_EQ(RefitOutcomeName(RefitOutcome::kAborted), "aborted");
  EXPECT_EQ(RefitOutcomeName(RefitOutcome::kUnfinished), "unfinished");
}

TEST(RefitReportTest, SummaryNamesTheFirstFailingPhase) {
  RefitReport r;
  r.target = kTarget;
  r.outcome = RefitOutcome::kPartial;
  r.stream_bytes = 1000;
  PhaseReplies p;
  p.plan = {R("head", NodeCode::kOk), R("a", NodeCode::kOk),
            R("b", NodeCode::kBusy, {}, "another refit")};
  p.votes = {R("head", NodeCode::kOk, kTarget),
             R("a", NodeCode::kDigestMismatch, {}, "bits differ")};
  p.final = {R("head", NodeCode::kOk, kTarget)};
  SummarizeNodes(SmallTree(), p, {"head"}, &r);
  ASSERT_EQ(r.nodes.size(), 3u);
  EXPECT_EQ(r.nodes[0].node, "head");
  EXPECT_TRUE(r.nodes[0].committed);
  EXPECT_EQ(r.nodes[0].chunks_applied, 7u);
  EXPECT_FALSE(r.nodes[1].committed);
  EXPECT_EQ(r.nodes[1].phase, "vote");
  EXPECT_EQ(r.nodes[1].code, NodeCode::kDigestMismatch);
  EXPECT_EQ(r.nodes[1].detail, "bits differ");
  EXPECT_EQ(r.nodes[2].phase, "plan");
  EXPECT_EQ(r.nodes[2].code, NodeCode::kBusy);
  // The stream crossed the WAN edge to head and the LAN edge to a (which
  // took the plan), not the edge to b.
  EXPECT_EQ(r.link_class_bytes["wan"], 1000u);
  EXPECT_EQ(r.link_class_bytes["lan"], 1000u);
  EXPECT_EQ(ExcludedReason(r),
            "excluded, now stale: a (digest mismatch at vote), b (busy at "
            "plan)");
}

TEST(RefitReportTest, SummaryOfACommitWithoutReplies) {
  RefitReport r;
  r.target = kTarget;
  r.outcome = RefitOutcome::kPartial;
  PhaseReplies p;
  p.plan = {R("head", NodeCode::kOk), R("a", NodeCode::kOk),
            R("b", NodeCode::kOk)};
  p.votes = {R("head", NodeCode::kOk, kTarget), R("a", NodeCode::kOk, kTarget),
             R("b", NodeCode::kOk, kTarget)};
  // b voted yes but never confirmed; a confirmed another version.
  p.final = {R("head", NodeCode::kOk, kTarget),
             R("a", NodeCode::kOk, Version{9, Digest128{9, 9}})};
  SummarizeNodes(SmallTree(), p, {"head", "a", "b"}, &r);
  EXPECT_TRUE(r.nodes[0].committed);
  EXPECT_FALSE(r.nodes[1].committed);
  EXPECT_EQ(r.nodes[1].phase, "commit");
  EXPECT_EQ(r.nodes[1].detail, "no commit reply");
  // b voted yes and was sent COMMIT: unconfirmed, not stale.
  EXPECT_FALSE(r.nodes[2].committed);
  EXPECT_EQ(r.nodes[2].phase, "commit");
  EXPECT_EQ(r.nodes[2].code, NodeCode::kTimeout);
  EXPECT_TRUE(r.nodes[2].detail.starts_with(std::string(kCommitUnconfirmed) +
                                            ": it voted yes"))
      << r.nodes[2].detail;
  EXPECT_NE(r.nodes[2].detail.find("(no commit reply)"), std::string::npos);
}

// A relay that committed but whose COMMIT_REPLY was lost (its parent timed
// it out, or lost the link) is unconfirmed; one that refused the COMMIT
// (a stale epoch) or failed to persist it is excluded, as before.
TEST(RefitReportTest, ALostCommitReplyIsUnconfirmedNotStale) {
  RefitReport r;
  r.target = kTarget;
  r.outcome = RefitOutcome::kPartial;
  PhaseReplies p;
  p.plan = {R("head", NodeCode::kOk), R("a", NodeCode::kOk),
            R("b", NodeCode::kOk)};
  p.votes = {R("head", NodeCode::kOk, kTarget), R("a", NodeCode::kOk, kTarget),
             R("b", NodeCode::kOk, kTarget)};
  p.final = {R("head", NodeCode::kOk, kTarget),
             R("a", NodeCode::kTimeout, {}, "no COMMIT_REPLY in time"),
             R("b", NodeCode::kStoreError, {}, "disk full")};
  SummarizeNodes(SmallTree(), p, {"head", "a", "b"}, &r);
  EXPECT_EQ(r.nodes[1].code, NodeCode::kTimeout);
  EXPECT_TRUE(r.nodes[1].detail.starts_with(kCommitUnconfirmed));
  EXPECT_NE(r.nodes[1].detail.find("no COMMIT_REPLY in time"),
            std::string::npos);
  EXPECT_EQ(r.nodes[2].detail, "disk full");
  EXPECT_EQ(ExcludedReason(r),
            "excluded, now stale: b (store error at commit); commit "
            "unconfirmed (no reply; each holds the target once COMMIT reached "
            "it, as dcr status shows): a (timeout at commit)");
  // Unreachable at commit (its parent lost it) is unconfirmed too.
  p.final[1] = R("a", NodeCode::kUnreachable, {}, "link lost");
  r.nodes.clear();
  SummarizeNodes(SmallTree(), p, {"head", "a", "b"}, &r);
  EXPECT_TRUE(r.nodes[1].detail.starts_with(kCommitUnconfirmed));
  // Not in the commit set: excluded, whatever it answered.
  r.nodes.clear();
  SummarizeNodes(SmallTree(), p, {"head", "b"}, &r);
  EXPECT_FALSE(r.nodes[1].detail.starts_with(kCommitUnconfirmed));
}

TEST(RefitReportTest, UnfinishedSaysWhyAndWhatFinishesIt) {
  RefitReport r;
  r.base = Version{1, Digest128{1, 2}};
  r.target = kTarget;
  r.outcome = RefitOutcome::kUnfinished;
  std::string why = UnfinishedReason(
      {R("head", NodeCode::kRejected, {}, "stale coordinator epoch 4")}, r);
  EXPECT_NE(why.find("no relay of the commit set answered the COMMIT: head: "
                     "rejected (stale coordinator epoch 4)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("root.baseline stays at step 1"), std::string::npos);
  EXPECT_NE(why.find("dcr refit --resume"), std::string::npos);
  // The outcome survives last-refit.json.
  r.reason = why;
  auto back = RefitReportFromJson(nlohmann::json::parse(r.ToJson()), "f");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->outcome, RefitOutcome::kUnfinished);
  EXPECT_EQ(back->reason, why);
}

// A mixed tree: the nodes with context-coded chunks and the payload the
// others got survive last-refit.json (a report without them reads as
// before), and each edge counts the bytes of its own encoding.
TEST(RefitReportTest, AMixedTreeCountsEachEdgesEncoding) {
  // root -> head (wan) -> {a, b} (lan), plus root -> s (wan) with the
  // base-independent chunks.
  Tree t = SmallTree();
  TreeNode s;
  s.name = "s";
  s.cluster = "c2";
  s.parent = 0;
  s.link = LinkClass::kWan;
  t.nodes[0].children.push_back(static_cast<int>(t.nodes.size()));
  t.nodes.push_back(s);
  RefitReport r;
  r.target = kTarget;
  r.outcome = RefitOutcome::kCommitted;
  r.stream_bytes = 1000;  // frames on a context-coded edge
  r.payload_bytes = 700;
  r.plain_payload_bytes = 900;
  r.context_nodes = {"head", "a", "b"};
  PhaseReplies p;
  for (const char* n : {"head", "a", "b", "s"}) {
    p.plan.push_back(R(n, NodeCode::kOk));
    p.votes.push_back(R(n, NodeCode::kOk, kTarget));
    p.final.push_back(R(n, NodeCode::kOk, kTarget));
  }
  SummarizeNodes(t, p, {"head", "a", "b", "s"}, &r);
  EXPECT_EQ(r.link_class_bytes["wan"], 1000u + 1200u);
  EXPECT_EQ(r.link_class_bytes["lan"], 2000u);
  auto j = nlohmann::json::parse(r.ToJson());
  EXPECT_EQ(j["plain_payload_bytes"], 900);
  EXPECT_EQ(j["context_nodes"].size(), 3u);
  auto back = RefitReportFromJson(j, "f");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->context_nodes, r.context_nodes);
  EXPECT_EQ(back->plain_payload_bytes, 900u);
  // Not mixed: neither key is written, and a file without them reads.
  RefitReport plain;
  auto k = nlohmann::json::parse(plain.ToJson());
  EXPECT_FALSE(k.contains("context_nodes"));
  EXPECT_FALSE(k.contains("plain_payload_bytes"));
  auto back2 = RefitReportFromJson(k, "f");
  ASSERT_TRUE(back2.ok()) << back2.status().ToString();
  EXPECT_TRUE(back2->context_nodes.empty());
}

TEST(RefitReportTest, AnAbortBlamesTheAbortPhaseOnly) {
  RefitReport r;
  r.target = kTarget;
  r.outcome = RefitOutcome::kAborted;
  PhaseReplies p;
  p.plan = {R("head", NodeCode::kOk), R("a", NodeCode::kOk),
            R("b", NodeCode::kOk)};
  p.final = {R("head", NodeCode::kOk), R("a", NodeCode::kStoreError)};
  SummarizeNodes(SmallTree(), p, {}, &r);
  EXPECT_EQ(r.nodes[0].phase, "");
  EXPECT_EQ(r.nodes[1].phase, "abort");
  EXPECT_EQ(r.nodes[1].code, NodeCode::kStoreError);
  // Aborted: a node without a failure is not "not in the commit set".
  EXPECT_EQ(r.nodes[2].phase, "");
  for (const NodeOutcome& n : r.nodes) EXPECT_FALSE(n.committed);
}

}  // namespace
}  // namespace dcr
