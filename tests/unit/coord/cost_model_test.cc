// The cost model of dcr plan: its terms scale as documented, calibration
// JSON overrides the defaults and bad files are refused.
#include "coord/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace dcr {
namespace {

// root -> 2 clusters of 4 over `wan` bits/s (cluster b over `wan_b` when
// given), 10 Gbit/s inside.
Tree TwoRegion(uint64_t wan, uint64_t latency_ns = 20'000'000,
               uint64_t wan_b = 0) {
  std::string yaml = R"(version: 1
defaults: {fanout: 2}
root: {name: trainer, host: 10.0.0.1, port: 17000, cluster: train}
clusters:
  - name: train
  - name: a
    bandwidth: 10Gbps
    nodes:
      - {name: a0, host: 10.0.1.1, port: 17001}
      - {name: a1, host: 10.0.1.2, port: 17001}
      - {name: a2, host: 10.0.1.3, port: 17001}
      - {name: a3, host: 10.0.1.4, port: 17001}
  - name: b
    bandwidth: 10Gbps
    nodes:
      - {name: b0, host: 10.0.2.1, port: 17001}
      - {name: b1, host: 10.0.2.2, port: 17001}
      - {name: b2, host: 10.0.2.3, port: 17001}
      - {name: b3, host: 10.0.2.4, port: 17001}
links:
  - {from: train, to: a, bandwidth: WAN_A, latency: LATns}
  - {from: train, to: b, bandwidth: WAN_B, latency: LATns}
)";
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"WAN_A",
                                            std::to_string(wan) + "bps"},
        {"WAN_B", std::to_string(wan_b ? wan_b : wan) + "bps"},
        {"LAT", std::to_string(latency_ns)}}) {
    for (size_t at; (at = yaml.find(from)) != std::string::npos;) {
      yaml.replace(at, from.size(), to);
    }
  }
  auto topo = ParseTopology(yaml, "t.yaml");
  EXPECT_TRUE(topo.ok()) << topo.status().ToString();
  auto tree = BuildTree(*topo);
  EXPECT_TRUE(tree.ok()) << tree.status().ToString();
  return *tree;
}

TEST(CostModelTest, TransferBoundRefitScalesWithPayloadAndBandwidth) {
  CostParameters p;
  // Encoders fast enough that the stream waits on the WAN.
  for (auto& [rate, bps] : p.encode_rate) bps *= 4;
  for (auto& [rate, bps] : p.apply_rate) bps *= 4;
  const double r3 = p.payload_ratio[1].second;  // at 3%
  const double r5 = p.payload_ratio[2].second;  // at 5%
  const double tb2 = 2e12;                      // 1T parameters in BF16
  auto e = EstimateRefit(TwoRegion(3'050'000'000), tb2, 0.03, p);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->receivers, 8u);
  EXPECT_EQ(e->depth, 2);  // root -> head -> 3 (10 / 3.05 Gbit/s) below
  EXPECT_NEAR(e->path_latency_s, 0.02, 1e-9);
  EXPECT_DOUBLE_EQ(e->delta.payload_bytes, tb2 * r3);
  EXPECT_EQ(e->delta.bottleneck, "transfer");
  EXPECT_EQ(e->full.bottleneck, "transfer");
  EXPECT_NEAR(e->delta.transfer_s, tb2 * r3 / (3.05e9 / 8 * p.efficiency),
              1e-6);
  // Transfer-bound on both sides: the speedup approaches the payload
  // ratio, less the fixed costs (the vote hashes the whole store).
  EXPECT_DOUBLE_EQ(e->speedup, e->full.total_s / e->delta.total_s);
  EXPECT_DOUBLE_EQ(e->delta.total_s, e->delta.prepare_s + e->delta.control_s +
                                         e->delta.stream_s + e->delta.verify_s +
                                         e->delta.commit_s);
  // No sync rate (a shm store): a delta refit wrote root.baseline while
  // it encoded (the root's stage of the pipeline), so its commit costs
  // nothing proportional; a full refit's commit is the baseline pass.
  EXPECT_NEAR(e->delta.baseline_s, tb2 / (p.baseline_rate * p.root_cores),
              1e-9);
  EXPECT_EQ(e->delta.commit_s, 0);
  // The root hashes the target as it encodes (END names the digests):
  // nothing before PLAN, and the hash is part of the root's stage.
  EXPECT_EQ(e->delta.prepare_s, 0);
  EXPECT_NEAR(e->delta.target_hash_s, tb2 / (p.hash_rate * p.root_cores), 1e-9);
  EXPECT_NEAR(e->delta.encode_s,
              tb2 / (p.encode_rate[1].second * p.root_cores) +
                  e->delta.target_hash_s + e->delta.baseline_s,
              1e-6);
  EXPECT_DOUBLE_EQ(e->full.baseline_s, e->delta.baseline_s);
  EXPECT_DOUBLE_EQ(e->full.commit_s, e->full.baseline_s);
  // The root hashes the target at the relays' rate unless told its own.
  CostParameters root = p;
  root.root_hash_rate = 2 * p.hash_rate;
  auto faster = EstimateRefit(TwoRegion(3'050'000'000), tb2, 0.03, root);
  ASSERT_TRUE(faster.ok());
  EXPECT_NEAR(faster->delta.target_hash_s, e->delta.target_hash_s / 2, 1e-9);
  EXPECT_DOUBLE_EQ(faster->delta.verify_s, e->delta.verify_s);
  // The relays hash their 2 TB while the transfer-bound stream leaves them
  // idle: nothing is left for the vote.
  EXPECT_GT(e->delta.transfer_s - e->delta.apply_s,
            tb2 / (p.hash_rate * p.relay_cores));
  EXPECT_EQ(e->delta.verify_s, 0);
  CostParameters disk = p;
  disk.commit_sync_rate = 1e9;
  auto synced = EstimateRefit(TwoRegion(3'050'000'000), tb2, 0.03, disk);
  ASSERT_TRUE(synced.ok());
  // The relays' sync is the commit.
  EXPECT_NEAR(synced->delta.commit_s, 2000, 1e-6);
  EXPECT_NEAR(synced->delta.total_s, e->delta.total_s + 2000, 1e-6);
  // (The full refit's commit pass over root.baseline, which the delta
  // does while streaming, may put it a little above.)
  EXPECT_GT(e->speedup, 0.5 * p.full_ratio / r3);
  EXPECT_LT(e->speedup, 1.05 * p.full_ratio / r3);
  // Half the bandwidth, twice the transfer.
  auto slow = EstimateRefit(TwoRegion(1'525'000'000), tb2, 0.03, p);
  ASSERT_TRUE(slow.ok());
  EXPECT_NEAR(slow->delta.transfer_s, 2 * e->delta.transfer_s, 1e-6);
  // More change, more payload, more time; interpolation between points.
  auto more = EstimateRefit(TwoRegion(3'050'000'000), tb2, 0.04, p);
  ASSERT_TRUE(more.ok());
  EXPECT_DOUBLE_EQ(more->delta.payload_bytes, tb2 * (r3 + r5) / 2);
  EXPECT_GT(more->delta.total_s, e->delta.total_s);
  EXPECT_DOUBLE_EQ(more->full.total_s, e->full.total_s);
  // Beyond the measured points: extrapolated, never below a tenth.
  auto tiny = EstimateRefit(TwoRegion(3'050'000'000), tb2, 0.0001, p);
  ASSERT_TRUE(tiny.ok());
  EXPECT_GE(tiny->delta.payload_bytes, tb2 * 0.00069 - 1);
}

TEST(CostModelTest, FastLinksMakeTheRefitComputeBound) {
  CostParameters p;
  p.root_cores = 1;
  auto e = EstimateRefit(TwoRegion(400'000'000'000), 2e12, 0.05, p);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->delta.bottleneck, "encode");
  // The root's stage: the diff and encode, the target's hash, and
  // root.baseline's writes.
  EXPECT_NEAR(e->delta.encode_s,
              2e12 / p.encode_rate[2].second + 2e12 / p.hash_rate +
                  2e12 / p.baseline_rate,
              1e-3);
  EXPECT_GT(e->delta.stream_s, e->delta.encode_s);  // plus pipeline fill
  // One relay core: applying is the slowest stage and leaves no idle time,
  // so the hashing waits for the vote.
  CostParameters one;
  one.relay_cores = 1;
  auto busy = EstimateRefit(TwoRegion(400'000'000'000), 2e12, 0.05, one);
  ASSERT_TRUE(busy.ok());
  const double hash_s = 2e12 / one.hash_rate;
  const double idle_s = std::max({busy->delta.transfer_s, busy->delta.encode_s,
                                  busy->delta.apply_s}) -
                        busy->delta.apply_s;
  EXPECT_NEAR(busy->delta.verify_s, hash_s - idle_s, 1e-6);
  EXPECT_GT(busy->delta.verify_s, 0);
}

TEST(CostModelTest, ProducersTakeTheRootsPassOverTheModel) {
  // Fast links: the root's stage bounds a canonical refit.
  CostParameters canonical = CostParameters::BaseIndependent();
  canonical.root_cores = 8;
  CostParameters producers = canonical;
  producers.producers = 64;
  producers.producer_cores = 4;
  const Tree tree = TwoRegion(400'000'000'000);
  auto c = EstimateRefit(tree, 2e12, 0.03, canonical);
  auto p = EstimateRefit(tree, 2e12, 0.03, producers);
  ASSERT_TRUE(c.ok() && p.ok());
  const double encode = producers.encode_rate[1].second;
  const double apply = producers.apply_rate[1].second;
  const double cores = 64.0 * 4;
  // The ranks diff, encode and hash their shards over their cores; the
  // root only applies the parts to root.baseline.
  EXPECT_NEAR(p->delta.producers_s,
              2e12 / (encode * cores) + 2e12 / (producers.hash_rate * cores),
              1e-6);
  EXPECT_NEAR(p->delta.baseline_s, 2e12 / (apply * 8), 1e-6);
  EXPECT_NEAR(p->delta.encode_s,
              std::max(p->delta.producers_s, p->delta.baseline_s), 1e-9);
  EXPECT_LT(p->delta.encode_s, c->delta.encode_s / 4);
  EXPECT_LT(p->delta.total_s, c->delta.total_s);
  // Same payload, same transfer; a full refit is untouched.
  EXPECT_EQ(p->delta.payload_bytes, c->delta.payload_bytes);
  EXPECT_EQ(p->full.total_s, c->full.total_s);
  EXPECT_EQ(c->delta.producers_s, 0);
}

TEST(CostModelTest, ProducersRefitsCarryTheContextCodedPayload) {
  // Context-coded parameters: the ranks' parts are base-independent (their
  // rate is producer_encode_rate), and the root codes the changed spans
  // again in context beside its apply; the tree gets the canonical refit's
  // context-coded payload.
  CostParameters canonical;
  canonical.root_cores = 32;
  CostParameters producers = canonical;
  producers.producers = 64;
  producers.producer_cores = 4;
  const Tree tree = TwoRegion(3'050'000'000);
  auto c = EstimateRefit(tree, 2e12, 0.03, canonical);
  auto p = EstimateRefit(tree, 2e12, 0.03, producers);
  ASSERT_TRUE(c.ok() && p.ok());
  EXPECT_EQ(p->delta.payload_bytes, c->delta.payload_bytes);
  const double cores = 64.0 * 4;
  EXPECT_NEAR(p->delta.producers_s,
              2e12 / (producers.producer_encode_rate[1].second * cores) +
                  2e12 / (producers.hash_rate * cores),
              1e-6);
  EXPECT_NEAR(p->delta.recode_s, 2e12 / (producers.encode_rate[1].second * 32),
              1e-6);
  // root.baseline applies the base-independent copies.
  EXPECT_NEAR(
      p->delta.baseline_s,
      2e12 / (CostParameters::BaseIndependent().apply_rate[1].second * 32),
      1e-6);
  EXPECT_NEAR(
      p->delta.encode_s,
      std::max(p->delta.producers_s, p->delta.baseline_s + p->delta.recode_s),
      1e-9);
  // Without the root's diff, hash of the target and baseline pass.
  EXPECT_LT(p->delta.encode_s, c->delta.encode_s);
  // Base-independent parameters: no recode.
  CostParameters plain = CostParameters::BaseIndependent();
  plain.producers = 64;
  auto q = EstimateRefit(tree, 2e12, 0.03, plain);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->delta.recode_s, 0);
  EXPECT_GT(q->delta.payload_bytes, p->delta.payload_bytes);
  // A mixed tree without a history: a canonical root pays a plain encode
  // for the base-independent subtrees; a producers' root wrote the copy in
  // its recode already.
  const Tree mixed_tree = TwoRegion(100'000'000'000, 20'000'000, 3'050'000'000);
  const CostParameters independent = CostParameters::BaseIndependent();
  for (bool takes_a : {false, true}) {
    auto m = EstimateSubtreeCoding(mixed_tree, {takes_a, !takes_a}, 2e12, 0.03,
                                   producers, independent,
                                   /*history_records=*/false);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_NEAR(m->encode_s,
                std::max(m->producers_s, m->baseline_s + m->recode_s), 1e-9);
  }
  // dcr refit --context auto decides a producers' refit with its own
  // model: the predictions are these refits'.
  auto choice = ChooseContextPerSubtree(tree, {false, false}, 2e12, 0.03, 32,
                                        producers.relay_cores, true, 64, 4);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  EXPECT_TRUE(choice->any());
  EXPECT_DOUBLE_EQ(choice->with_s, p->delta.total_s);
  EXPECT_DOUBLE_EQ(choice->without_s, q->delta.total_s);
  // A calibration sets the ranks' rate.
  auto cal = CostParameters::FromJson(
      R"({"producer_encode_rate": [[0.01, 1e9], [0.05, 1e9]]})", "cal.json");
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  EXPECT_EQ(cal->producer_encode_rate.size(), 2u);
}

TEST(CostModelTest, ContextCodingWhereTheLinkIsSlowerThanTheCores) {
  const double tb2 = 2e12;
  // A link ten times the paper's, 32 root cores: the relays' decode bounds
  // the context-coded refit; base-independent chunks are faster. (On the
  // paper's link itself context coding has been faster since the codec's
  // speed-ups of 2026-12-02.)
  auto fast = ChooseContextCoding(TwoRegion(30'500'000'000), tb2, 0.03, 32, 16);
  ASSERT_TRUE(fast.ok()) << fast.status().ToString();
  EXPECT_FALSE(fast->context);
  EXPECT_GT(fast->with_s, fast->without_s);
  // The paper's link: the smaller payload wins.
  auto slow = ChooseContextCoding(TwoRegion(3'050'000'000), tb2, 0.03, 32, 16);
  ASSERT_TRUE(slow.ok());
  EXPECT_TRUE(slow->context);
  EXPECT_LT(slow->with_s, slow->without_s);
}

// The index among the root's children of the one heading `name`.
size_t ChildIndex(const Tree& tree, std::string_view name) {
  const auto& children = tree.nodes[0].children;
  auto it = std::find(children.begin(), children.end(), tree.Find(name));
  EXPECT_NE(it, children.end()) << name;
  return static_cast<size_t>(it - children.begin());
}

TEST(CostModelTest, PerSubtreeWithoutPlainChildrenIsChooseContextCoding) {
  const double tb2 = 2e12;
  for (uint64_t wan : {3'050'000'000ull, 30'500'000'000ull}) {
    const Tree tree = TwoRegion(wan);
    auto whole = ChooseContextCoding(tree, tb2, 0.03, 32, 16);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    for (bool history : {true, false}) {
      auto c = ChooseContextPerSubtree(tree, {false, false}, tb2, 0.03, 32, 16,
                                       history);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(c->children, tree.nodes[0].children);
      EXPECT_EQ(c->context, std::vector<bool>(2, whole->context)) << wan;
      EXPECT_EQ(c->any(), whole->context);
      EXPECT_NEAR(c->without_s, whole->without_s, 1e-9 * whole->without_s);
      // The chosen plan's time: context's where it wins, else none's.
      const double chosen = whole->context ? whole->with_s : whole->without_s;
      EXPECT_NEAR(c->with_s, chosen, 1e-9 * chosen) << wan;
    }
  }
  // The paper's link: context wins, and the per-subtree plan is the
  // whole-tree context-coded refit term for term.
  const Tree tree = TwoRegion(3'050'000'000);
  CostParameters p;
  auto e = EstimateRefit(tree, tb2, 0.03, p);
  auto c =
      ChooseContextPerSubtree(tree, {false, false}, tb2, 0.03, 32, 16, false);
  ASSERT_TRUE(e.ok() && c.ok());
  EXPECT_TRUE(c->any());
  EXPECT_NEAR(c->mixed.encode_s, e->delta.encode_s, 1e-9);
  EXPECT_NEAR(c->mixed.transfer_s, e->delta.transfer_s, 1e-9);
  EXPECT_NEAR(c->mixed.apply_s, e->delta.apply_s, 1e-9);
  EXPECT_NEAR(c->mixed.total_s, e->delta.total_s, 1e-9);
}

// Cluster a holds serving nodes, on a fast link; b is canonical, over the
// paper's WAN.
TEST(CostModelTest, ContextGoesToTheSlowCanonicalSubtreeOnly) {
  const double tb2 = 2e12;
  const Tree tree = TwoRegion(100'000'000'000, 20'000'000, 3'050'000'000);
  const size_t a = ChildIndex(tree, "a0"), b = ChildIndex(tree, "b0");
  std::vector<bool> plain(2, false);
  plain[a] = true;
  auto c = ChooseContextPerSubtree(tree, plain, tb2, 0.03, 32, 16, true);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->context[a]);
  EXPECT_TRUE(c->context[b]);
  EXPECT_TRUE(c->any());
  EXPECT_LT(c->with_s, c->without_s);
  EXPECT_DOUBLE_EQ(c->with_s, c->mixed.total_s);
  // b's context-coded payload over the WAN paces the stream, not a's
  // larger base-independent one over its fast link.
  CostParameters context;
  const CostParameters independent = CostParameters::BaseIndependent();
  EXPECT_NEAR(
      c->mixed.transfer_s,
      tb2 * context.payload_ratio[1].second / (3.05e9 / 8 * context.efficiency),
      1e-6);
  EXPECT_DOUBLE_EQ(c->mixed.payload_bytes,
                   tb2 * independent.payload_ratio[1].second);
  // The relays of b decode context-coded chunks: the slower apply.
  EXPECT_NEAR(c->mixed.apply_s,
              tb2 / (context.apply_rate[1].second * context.relay_cores), 1e-6);
  // Unforced, a's fast link would not gain from context on its own, but
  // b paces the stream either way: a tie, and the plan with one encoding
  // for all wins it (ChooseContextCoding's).
  auto free =
      ChooseContextPerSubtree(tree, {false, false}, tb2, 0.03, 32, 16, true);
  ASSERT_TRUE(free.ok());
  EXPECT_TRUE(free->context[a]);
  EXPECT_TRUE(free->context[b]);
  EXPECT_DOUBLE_EQ(free->with_s, c->with_s);
}

// What `dcr plan` predicts for a tree with serving nodes: the plan with
// context wherever a subtree may take it, ChooseContextPerSubtree's terms;
// with no child on context, the base-independent refit's; with every child
// on it, the whole-tree context-coded refit's.
TEST(CostModelTest, EstimateSubtreeCodingIsThePlanItNames) {
  const double tb2 = 2e12;
  const Tree tree = TwoRegion(100'000'000'000, 20'000'000, 3'050'000'000);
  const size_t a = ChildIndex(tree, "a0"), b = ChildIndex(tree, "b0");
  std::vector<bool> plain(2, false);
  plain[a] = true;
  std::vector<bool> takes(2, false);
  takes[b] = true;
  CostParameters context;
  const CostParameters independent = CostParameters::BaseIndependent();
  auto mixed =
      EstimateSubtreeCoding(tree, takes, tb2, 0.03, context, independent, true);
  auto c = ChooseContextPerSubtree(tree, plain, tb2, 0.03, context.root_cores,
                                   context.relay_cores, true);
  ASSERT_TRUE(mixed.ok() && c.ok()) << mixed.status().ToString();
  ASSERT_TRUE(c->context[b]);
  EXPECT_DOUBLE_EQ(mixed->total_s, c->mixed.total_s);
  EXPECT_DOUBLE_EQ(mixed->transfer_s, c->mixed.transfer_s);
  EXPECT_DOUBLE_EQ(mixed->payload_bytes, c->mixed.payload_bytes);

  auto none = EstimateSubtreeCoding(tree, {false, false}, tb2, 0.03, context,
                                    independent, true);
  auto plain_refit = EstimateRefit(tree, tb2, 0.03, independent);
  ASSERT_TRUE(none.ok() && plain_refit.ok());
  EXPECT_DOUBLE_EQ(none->total_s, plain_refit->delta.total_s);
  EXPECT_DOUBLE_EQ(none->payload_bytes, plain_refit->delta.payload_bytes);

  auto all = EstimateSubtreeCoding(tree, {true, true}, tb2, 0.03, context,
                                   independent, true);
  auto context_refit = EstimateRefit(tree, tb2, 0.03, context);
  ASSERT_TRUE(all.ok() && context_refit.ok());
  EXPECT_NEAR(all->total_s, context_refit->delta.total_s,
              1e-9 * context_refit->delta.total_s);

  // Each encoding's own parameters count: relays that apply
  // base-independent chunks 4x slower make the mixed plan apply-bound.
  CostParameters slow = independent;
  for (auto& [rate, bps] : slow.apply_rate) bps /= 4;
  auto slower =
      EstimateSubtreeCoding(tree, takes, tb2, 0.03, context, slow, true);
  ASSERT_TRUE(slower.ok());
  EXPECT_GT(slower->apply_s, mixed->apply_s);
  // A topology without bandwidths needs default_bps, as EstimateRefit.
  Tree bare = tree;
  for (TreeCluster& cluster : bare.clusters) cluster.stream_bps = 0;
  EXPECT_FALSE(
      EstimateSubtreeCoding(bare, takes, tb2, 0.03, context, independent, true)
          .ok());
  EXPECT_TRUE(EstimateSubtreeCoding(bare, takes, tb2, 0.03, context,
                                    independent, true, 10'000'000'000)
                  .ok());
  // One flag per root child.
  EXPECT_TRUE(
      EstimateSubtreeCoding(tree, {true}, tb2, 0.03, context, independent, true)
          .status()
          .IsInvalidArgument());
}

TEST(CostModelTest, AnEncodeBoundRootGivesContextToNobody) {
  const double tb2 = 2e12;
  // Fast links: every subtree's relays decode base-independent chunks
  // faster, and the transfer is short either way.
  auto fast = ChooseContextPerSubtree(TwoRegion(400'000'000'000),
                                      {false, false}, tb2, 0.01, 1, 16, true);
  ASSERT_TRUE(fast.ok()) << fast.status().ToString();
  EXPECT_FALSE(fast->any());
  EXPECT_EQ(fast->with_s, fast->without_s);
  EXPECT_GT(fast->mixed.total_s, fast->without_s);  // evaluated, not taken
  // b's slow link alone would gain from the smaller payload, but one root
  // core runs the slower context encoder: the root bounds the stream.
  const Tree tree = TwoRegion(400'000'000'000, 20'000'000, 1'000'000'000);
  const size_t a = ChildIndex(tree, "a0");
  std::vector<bool> plain(2, false);
  plain[a] = true;
  auto slow = ChooseContextPerSubtree(tree, plain, tb2, 0.01, 1, 16, true);
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  EXPECT_FALSE(slow->any());
  EXPECT_EQ(slow->with_s, slow->without_s);
  EXPECT_EQ(slow->mixed.bottleneck, "encode");
  EXPECT_GT(slow->mixed.total_s, slow->without_s);
  // With 32 cores the same plan is taken.
  auto cores = ChooseContextPerSubtree(tree, plain, tb2, 0.01, 32, 16, true);
  ASSERT_TRUE(cores.ok());
  EXPECT_TRUE(cores->context[1 - a]);
}

// Links of different speeds and no serving nodes: making a's subtree
// base-independent would gain nothing (b's WAN paces the stream) and, with
// no history to write the copy for, cost the encoder a pass. Every child
// takes context, as ChooseContextCoding says (review of 25b9843: the
// per-child choice alone took a mixed plan 22% slower).
TEST(CostModelTest, WithoutServingNodesUnevenLinksKeepOneEncoding) {
  const double tb2 = 2e12;
  const Tree tree = TwoRegion(10'000'000'000, 20'000'000, 3'050'000'000);
  for (bool records : {false, true}) {
    auto c = ChooseContextPerSubtree(tree, {false, false}, tb2, 0.03, 32, 16,
                                     records);
    auto whole = ChooseContextCoding(tree, tb2, 0.03, 32, 16);
    ASSERT_TRUE(c.ok() && whole.ok());
    EXPECT_TRUE(whole->context);
    EXPECT_EQ(c->context, (std::vector<bool>{true, true})) << records;
    EXPECT_NEAR(c->with_s, whole->with_s, 1e-9 * whole->with_s) << records;
  }
}

// The paper's link with relays that apply on dcr-relay's default 2
// threads: decoding 2 TB of context-coded chunks takes longer than the
// WAN carries the larger base-independent payload, so auto turns context
// off; with 16 threads it pays.
TEST(CostModelTest, RelaysWithFewApplyThreadsTakeBaseIndependentChunks) {
  const double tb2 = 2e12;
  const Tree tree = TwoRegion(3'050'000'000);
  auto sixteen = ChooseContextCoding(tree, tb2, 0.03, 32, 16);
  auto two = ChooseContextCoding(tree, tb2, 0.03, 32, 2);
  ASSERT_TRUE(sixteen.ok() && two.ok());
  EXPECT_TRUE(sixteen->context);
  EXPECT_FALSE(two->context);
  // Context-coded apply at 2.97 GB/s per core on 2 cores: 337 s.
  EXPECT_GT(two->with_s, 330);
  EXPECT_LT(two->without_s, two->with_s);
  auto per =
      ChooseContextPerSubtree(tree, {false, false}, tb2, 0.03, 32, 2, true);
  ASSERT_TRUE(per.ok());
  EXPECT_FALSE(per->any());
}

TEST(CostModelTest, AnUnrecordedBaseIndependentCopyCostsTheEncoder) {
  const double tb2 = 2e12;
  const Tree tree = TwoRegion(100'000'000'000, 20'000'000, 3'050'000'000);
  std::vector<bool> plain(2, false);
  plain[ChildIndex(tree, "a0")] = true;
  auto recorded = ChooseContextPerSubtree(tree, plain, tb2, 0.03, 8, 16, true);
  auto extra = ChooseContextPerSubtree(tree, plain, tb2, 0.03, 8, 16, false);
  ASSERT_TRUE(recorded.ok() && extra.ok());
  ASSERT_GT(recorded->mixed.encode_s, 0);
  const double copy_s =
      tb2 / (CostParameters::BaseIndependent().encode_rate[1].second * 8);
  EXPECT_NEAR(extra->mixed.encode_s - recorded->mixed.encode_s, copy_s, 1e-6);
  EXPECT_GT(extra->mixed.total_s, recorded->mixed.total_s);
  EXPECT_DOUBLE_EQ(extra->without_s, recorded->without_s);
  // Every child context-coded: no base-independent copy to write.
  auto all = ChooseContextPerSubtree(TwoRegion(3'050'000'000), {false, false},
                                     tb2, 0.03, 8, 16, false);
  auto all_recorded = ChooseContextPerSubtree(
      TwoRegion(3'050'000'000), {false, false}, tb2, 0.03, 8, 16, true);
  ASSERT_TRUE(all.ok() && all_recorded.ok());
  EXPECT_DOUBLE_EQ(all->mixed.encode_s, all_recorded->mixed.encode_s);
}

TEST(CostModelTest, BadInputsAreRefused) {
  CostParameters p;
  Tree t = TwoRegion(1'000'000'000);
  EXPECT_TRUE(EstimateRefit(t, 0, 0.03, p).status().IsInvalidArgument());
  EXPECT_TRUE(EstimateRefit(t, 1e9, 0, p).status().IsInvalidArgument());
  EXPECT_TRUE(EstimateRefit(t, 1e9, 1.5, p).status().IsInvalidArgument());
  Tree empty;
  empty.nodes.resize(1);
  EXPECT_TRUE(EstimateRefit(empty, 1e9, 0.03, p).status().IsInvalidArgument());
  // One plain flag per root child.
  for (const std::vector<bool>& plain :
       {std::vector<bool>{}, std::vector<bool>{true},
        std::vector<bool>{false, false, true}}) {
    EXPECT_TRUE(ChooseContextPerSubtree(t, plain, 1e9, 0.03, 8, 16, true)
                    .status()
                    .IsInvalidArgument())
        << plain.size();
  }
  EXPECT_TRUE(ChooseContextPerSubtree(t, {false, false}, 0, 0.03, 8, 16, true)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ChooseContextPerSubtree(t, {false, false}, 1e9, 2, 8, 16, true)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ChooseContextPerSubtree(empty, {}, 1e9, 0.03, 8, 16, true)
                  .status()
                  .IsInvalidArgument());
}

TEST(CostModelTest, CalibrationJsonOverridesAndIsChecked) {
  auto c = CostParameters::FromJson(
      R"({"payload_ratio": [[0.05, 0.03], [0.01, 0.01]], "efficiency": 0.5,
          "relay_cores": 4, "hop_overhead_s": 0, "note": "lab",
          "commit_sync_rate": 0, "baseline_rate": 5e9})",
      "cal.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->source, "cal.json");
  ASSERT_EQ(c->payload_ratio.size(), 2u);
  EXPECT_EQ(c->payload_ratio[0].first, 0.01);  // sorted
  EXPECT_EQ(c->efficiency, 0.5);
  EXPECT_EQ(c->relay_cores, 4u);
  EXPECT_EQ(c->hop_overhead_s, 0);
  EXPECT_EQ(c->baseline_rate, 5e9);
  EXPECT_EQ(c->full_ratio, CostParameters().full_ratio);  // untouched
  for (const char* bad :
       {"[]", "{", R"({"efficiency": 1.5})", R"({"efficiency": 0})",
        R"({"payload_ratio": []})", R"({"payload_ratio": [[0.01]]})",
        R"({"payload_ratio": [[0.01, 0.1], [0.01, 0.2]]})",
        R"({"hash_rate": "fast"})", R"({"relay_cores": 0})",
        R"({"root_cores": 2.5})", R"({"efficency": 0.9})",
        R"({"baseline_rate": 0})"}) {
    auto r = CostParameters::FromJson(bad, "cal.json");
    EXPECT_TRUE(r.status().IsInvalidArgument()) << bad;
    EXPECT_NE(r.status().message().find("cal.json"), std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace dcr
