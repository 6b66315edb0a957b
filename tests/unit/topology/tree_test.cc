#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "dcr/topology.h"
#include "testing/temp_dir.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One cluster "c" holding the root and `n` relays, with fanout `k`.
Topology OneCluster(int n, std::optional<uint32_t> k) {
  Topology t;
  t.root = {"root", "h", 1, "c", "", "", "", kDefaultKeepDeltas, {}};
  ClusterSpec c;
  c.name = "c";
  c.fanout = k;
  for (int i = 0; i < n; ++i) {
    NodeSpec s;
    s.name = "n" + std::to_string(i);
    s.host = "h";
    s.port = static_cast<uint16_t>(100 + i);
    c.nodes.push_back(s);
  }
  t.clusters.push_back(c);
  return t;
}

std::vector<std::string> Names(const Tree& tree, const std::vector<int>& idx) {
  std::vector<std::string> out;
  for (int i : idx) out.push_back(tree.nodes[static_cast<size_t>(i)].name);
  return out;
}

TEST(TreeTest, OnlyClustersTheRootFeedsPullFromTheObjectStore) {
  // root cluster a -> b -> c: b may pull, c (fed by b's head) may not.
  Topology t;
  t.root = {"root", "h", 1, "a", "", "", "", kDefaultKeepDeltas, {}};
  uint16_t port = 100;
  for (const char* name : {"a", "b", "c"}) {
    ClusterSpec c;
    c.name = name;
    for (int i = 0; i < 2; ++i) {
      NodeSpec s;
      s.name = std::string(name) + std::to_string(i);
      s.host = "h";
      s.port = port++;
      c.nodes.push_back(s);
    }
    t.clusters.push_back(c);
  }
  t.links = {{"a", "b", 1000000, 0, std::nullopt, {}},
             {"b", "c", 1000000, 0, std::nullopt, {}}};
  t.objstore = ObjectStoreSpec{};
  t.objstore->path = "/shared";
  t.clusters[1].source = ChunkSource::kObjstore;
  auto tree = BuildTree(t);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  for (const TreeNode& n : tree->nodes) {
    EXPECT_EQ(n.pulls_objects, n.name == "b0") << n.name;
  }
  EXPECT_THAT(RenderTreeText(*tree), HasSubstr("chunks from the objstore"));
  EXPECT_THAT(RenderTreeDot(*tree), HasSubstr("objstore -> \"b0\""));
  t.clusters[2].source = ChunkSource::kObjstore;
  EXPECT_THAT(BuildTree(t).status().message(),
              HasSubstr("feeds it from cluster 'b', not from the root"));
}

TEST(TreeTest, FanoutOneIsAChain) {
  auto tree = BuildTree(OneCluster(5, 1u));
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  ASSERT_EQ(tree->nodes.size(), 6u);
  for (size_t i = 1; i < tree->nodes.size(); ++i) {
    EXPECT_EQ(tree->nodes[i].parent, static_cast<int>(i) - 1);
    EXPECT_EQ(tree->nodes[i].depth, static_cast<int>(i));
    EXPECT_EQ(tree->nodes[i].link, LinkClass::kLan);
  }
  EXPECT_EQ(tree->Depth(), 5);
  EXPECT_THAT(Names(*tree, tree->PathToRoot(tree->Find("n4"))),
              ElementsAre("n4", "n3", "n2", "n1", "n0", "root"));
}

TEST(TreeTest, KaryBreadthFirstInListedOrder) {
  auto tree = BuildTree(OneCluster(7, 2u));
  ASSERT_TRUE(tree.ok());
  // n0 is the head; n1, n2 under it; n3, n4 under n1; n5, n6 under n2.
  auto parent = [&](const char* n) {
    return tree
        ->nodes[static_cast<size_t>(
            tree->nodes[static_cast<size_t>(tree->Find(n))].parent)]
        .name;
  };
  EXPECT_EQ(parent("n0"), "root");
  EXPECT_EQ(parent("n1"), "n0");
  EXPECT_EQ(parent("n2"), "n0");
  EXPECT_EQ(parent("n3"), "n1");
  EXPECT_EQ(parent("n4"), "n1");
  EXPECT_EQ(parent("n5"), "n2");
  EXPECT_EQ(parent("n6"), "n2");
  EXPECT_THAT(Names(*tree, tree->Subtree(tree->Find("n1"))),
              ElementsAre("n1", "n3", "n4"));
  EXPECT_EQ(tree->Find("nope"), -1);
  EXPECT_TRUE(tree->Subtree(99).empty());
}

TEST(TreeTest, HeadFlagAndDefaultsFanout) {
  Topology t = OneCluster(4, std::nullopt);
  t.defaults.fanout = 3;
  t.clusters[0].nodes[2].head = true;
  auto tree = BuildTree(t);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->nodes[0].children.size(), 1u);
  const TreeNode& head =
      tree->nodes[static_cast<size_t>(tree->nodes[0].children[0])];
  EXPECT_EQ(head.name, "n2");
  EXPECT_EQ(head.fanout, 3u);
  EXPECT_EQ(head.children.size(), 3u);
  EXPECT_THAT(Names(*tree, head.children), ElementsAre("n0", "n1", "n3"));
}

TEST(TreeTest, FanoutSizedFromBandwidth) {
  auto t = ParseTopology(testing::kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  t->clusters[1].fanout.reset();
  // 25Gbps per node / 3Gbps stream = 8.
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->clusters[1].fanout, 8u);
  EXPECT_EQ(tree->clusters[1].stream_bps, 3000000000ull);
  // Clamped to 16.
  t->links[0].bandwidth_bps = 1000000;
  tree = BuildTree(*t);
  EXPECT_EQ(tree->clusters[1].fanout, 16u);
  // And to 1: a slower LAN than the stream gives a chain.
  t->links[0].bandwidth_bps = 100000000000ull;
  tree = BuildTree(*t);
  EXPECT_EQ(tree->clusters[1].fanout, 1u);
  // Without a bandwidth: defaults.fanout.
  t->clusters[1].bandwidth_bps.reset();
  tree = BuildTree(*t);
  EXPECT_EQ(tree->clusters[1].fanout, 2u);
}

TEST(TreeTest, SampleTreeFields) {
  auto t = ParseTopology(testing::kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok());
  ASSERT_EQ(tree->nodes.size(), 3u);
  const TreeNode& root = tree->nodes[0];
  EXPECT_EQ(root.name, "trainer");
  EXPECT_EQ(root.parent, -1);
  EXPECT_EQ(root.link, LinkClass::kNone);
  EXPECT_FALSE(root.store.has_value());
  const TreeNode& a0 = tree->nodes[1];
  EXPECT_EQ(a0.name, "a0");
  EXPECT_EQ(a0.cluster, "rollout-a");
  EXPECT_EQ(a0.region, "us-west");
  EXPECT_EQ(a0.link, LinkClass::kWan);
  EXPECT_EQ(a0.link_bandwidth_bps, 3000000000ull);
  EXPECT_EQ(a0.link_latency_ns, 70000000ull);
  EXPECT_EQ(a0.fanout, 4u);
  EXPECT_EQ(a0.depth, 1);
  EXPECT_EQ(a0.store,
            (StoreLocation{StoreKind::kFile, "/models/policy.safetensors"}));
  const TreeNode& a1 = tree->nodes[2];
  EXPECT_EQ(a1.parent, 1);
  EXPECT_EQ(a1.link, LinkClass::kLan);
  EXPECT_EQ(a1.link_bandwidth_bps, 25000000000ull);
  EXPECT_EQ(tree->clusters[0].head, -1);  // train has no relays
  EXPECT_EQ(tree->clusters[1].upstream, "train");
}

TEST(TreeTest, TransportPrecedence) {
  auto t = ParseTopology(testing::kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  t->clusters[1].transport.reset();
  t->links[0].transport = TransportKind::kUcx;
  auto tree = BuildTree(*t);
  EXPECT_EQ(tree->nodes[1].transport, TransportKind::kUcx);  // link
  EXPECT_EQ(tree->nodes[2].transport, TransportKind::kTcp);  // LAN: defaults
  t->defaults.transport = TransportKind::kUcx;
  t->links[0].transport = TransportKind::kTcp;
  tree = BuildTree(*t);
  EXPECT_EQ(tree->nodes[1].transport, TransportKind::kTcp);
  EXPECT_EQ(tree->nodes[2].transport, TransportKind::kUcx);
  t->clusters[1].transport = TransportKind::kTcp;
  t->clusters[1].nodes[1].transport = TransportKind::kUcx;
  tree = BuildTree(*t);
  EXPECT_EQ(tree->nodes[1].transport, TransportKind::kTcp);  // cluster
  EXPECT_EQ(tree->nodes[2].transport, TransportKind::kUcx);  // node
}

TEST(TreeTest, WidestPathAndRelayedClusters) {
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/two-region.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok());
  // Both rollout heads hang off the root: the direct 200Mbit/s links beat
  // the path through rollout-a (bottleneck 100Mbit/s).
  EXPECT_THAT(Names(*tree, tree->nodes[0].children), ElementsAre("a0", "b0"));
  EXPECT_EQ(tree->clusters[1].fanout, 10u);
  // Make the cross link wide and the direct link to b narrow: b is now fed
  // by a's head.
  t->links[1].bandwidth_bps = 50000000;
  t->links[2].bandwidth_bps = 1000000000;
  tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok());
  EXPECT_THAT(Names(*tree, tree->nodes[0].children), ElementsAre("a0"));
  int b0 = tree->Find("b0");
  EXPECT_EQ(tree->nodes[static_cast<size_t>(
                            tree->nodes[static_cast<size_t>(b0)].parent)]
                .name,
            "a0");
  EXPECT_EQ(tree->nodes[static_cast<size_t>(b0)].link, LinkClass::kWan);
  EXPECT_EQ(tree->nodes[static_cast<size_t>(b0)].link_bandwidth_bps,
            1000000000ull);
  const TreeCluster& b = tree->clusters.back();
  EXPECT_EQ(b.name, "rollout-b");
  EXPECT_EQ(b.upstream, "rollout-a");
  EXPECT_EQ(b.stream_bps, 200000000ull);  // bottleneck of train->a->b
}

TEST(TreeTest, RootClusterNodesHangOffTheRootOverLan) {
  auto t = ParseTopology(testing::kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  NodeSpec t0{"t0", "10.0.0.2", 17001, {}, {}, {}, false, {}, {}};
  NodeSpec t1{"t1", "10.0.0.3", 17001, {}, {}, {}, false, {}, {}};
  t->clusters[0].nodes = {t0, t1};
  t->clusters[0].bandwidth_bps = 100000000000ull;
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_THAT(Names(*tree, tree->nodes[0].children), ElementsAre("t0", "a0"));
  EXPECT_EQ(tree->nodes[1].link, LinkClass::kLan);
  // The root's cluster is sized against its own bandwidth: a chain.
  EXPECT_EQ(tree->clusters[0].fanout, 1u);
  EXPECT_EQ(tree->nodes[static_cast<size_t>(tree->Find("t1"))].parent, 1);
}

TEST(TreeTest, InvalidTopologyIsRefused) {
  Topology t = OneCluster(2, 2u);
  t.root.cluster = "nope";
  EXPECT_TRUE(BuildTree(t).status().IsInvalidArgument());
}

// Properties over many random topologies.
TEST(TreeTest, RandomTopologyProperties) {
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 2000; ++iter) {
    Topology t = testing::RandomTopology(rng);
    auto built = BuildTree(t);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    const Tree& tree = *built;
    SCOPED_TRACE(DumpTopology(t));
    // Every node exactly once, the root at 0.
    ASSERT_EQ(tree.nodes.size(), t.NodeCount() + 1);
    EXPECT_EQ(tree.nodes[0].name, t.root.name);
    EXPECT_EQ(tree.nodes[0].parent, -1);
    std::set<std::string> names;
    for (const TreeNode& n : tree.nodes) names.insert(n.name);
    EXPECT_EQ(names.size(), tree.nodes.size());
    for (const ClusterSpec& c : t.clusters) {
      for (const NodeSpec& n : c.nodes) EXPECT_EQ(names.count(n.name), 1u);
    }
    // Parent links are consistent, parents come first, all reach the root.
    size_t edges = 0;
    for (size_t i = 1; i < tree.nodes.size(); ++i) {
      const TreeNode& n = tree.nodes[i];
      ASSERT_GE(n.parent, 0);
      ASSERT_LT(n.parent, static_cast<int>(i));
      const TreeNode& p = tree.nodes[static_cast<size_t>(n.parent)];
      EXPECT_EQ(
          std::count(p.children.begin(), p.children.end(), static_cast<int>(i)),
          1);
      EXPECT_EQ(n.depth, p.depth + 1);
      EXPECT_EQ(tree.PathToRoot(static_cast<int>(i)).back(), 0);
      edges += p.children.size() > 0 ? 1 : 0;
    }
    EXPECT_EQ(tree.Subtree(0).size(), tree.nodes.size());
    // Each WAN link crossed at most once: one cross-cluster edge per
    // non-root cluster, all WAN, and each into that cluster's head.
    size_t cross = 0;
    std::map<std::string, int> entries;
    for (size_t i = 1; i < tree.nodes.size(); ++i) {
      const TreeNode& n = tree.nodes[i];
      const TreeNode& p = tree.nodes[static_cast<size_t>(n.parent)];
      if (n.cluster != p.cluster) {
        ++cross;
        ++entries[n.cluster];
        EXPECT_EQ(n.link, LinkClass::kWan);
      } else {
        EXPECT_EQ(n.link, LinkClass::kLan);
      }
    }
    EXPECT_EQ(cross, t.clusters.size() - 1);
    for (const auto& [cluster, count] : entries) EXPECT_EQ(count, 1);
    // Root: one child per cluster it feeds directly, each a distinct head.
    std::set<std::string> root_child_clusters;
    for (int c : tree.nodes[0].children) {
      root_child_clusters.insert(tree.nodes[static_cast<size_t>(c)].cluster);
    }
    EXPECT_EQ(root_child_clusters.size(), tree.nodes[0].children.size());
    for (const TreeCluster& c : tree.clusters) {
      if (c.head < 0) continue;
      const TreeNode& head = tree.nodes[static_cast<size_t>(c.head)];
      bool root_fed = c.upstream.empty() || c.upstream == t.root.cluster;
      EXPECT_EQ(head.parent == 0, root_fed) << c.name;
      if (!root_fed) {
        EXPECT_EQ(tree.nodes[static_cast<size_t>(head.parent)].cluster,
                  c.upstream);
      }
      // Fanout respected inside the cluster; fanout 1 is a chain.
      for (int i : tree.Subtree(c.head)) {
        const TreeNode& n = tree.nodes[static_cast<size_t>(i)];
        if (n.cluster != c.name) continue;
        size_t same = 0;
        for (int ch : n.children) {
          same += tree.nodes[static_cast<size_t>(ch)].cluster == c.name;
        }
        EXPECT_LE(same, c.fanout);
        EXPECT_EQ(n.fanout, c.fanout);
      }
      const ClusterSpec* spec = t.FindCluster(c.name);
      if (spec->fanout) {
        EXPECT_EQ(c.fanout, *spec->fanout);
      }
      EXPECT_GE(c.fanout, 1u);
      EXPECT_LE(c.fanout, 64u);
      if (c.fanout == 1) {
        int cluster_depth = 0;
        for (int i : tree.Subtree(c.head)) {
          const TreeNode& n = tree.nodes[static_cast<size_t>(i)];
          if (n.cluster == c.name) {
            cluster_depth = std::max(cluster_depth, n.depth - head.depth);
          }
        }
        EXPECT_EQ(static_cast<size_t>(cluster_depth), spec->nodes.size() - 1);
      }
    }
    (void)edges;
  }
}

TEST(TreeTest, TextRendering) {
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/two-region.yaml");
  ASSERT_TRUE(t.ok());
  auto tree = BuildTree(*t);
  std::string text = RenderTreeText(*tree);
  EXPECT_THAT(text,
              HasSubstr("trainer  10.0.0.10:17000  [train/us-east]  root"));
  EXPECT_THAT(text, HasSubstr("a0  10.1.0.10:17001  [rollout-a/us-west]  <- "
                              "wan 200Mbps 70ms tcp  file:/models/"));
  EXPECT_THAT(text, HasSubstr("b1  10.2.0.11:17001  [rollout-b/us-west]  <- "
                              "lan 2Gbps tcp  shm:/dcr-policy"));
  // One line per node.
  EXPECT_EQ(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')),
            tree->nodes.size());
}

TEST(TreeTest, JsonRendering) {
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/two-region.yaml");
  ASSERT_TRUE(t.ok());
  auto tree = BuildTree(*t);
  auto j = nlohmann::json::parse(RenderTreeJson(*tree));
  ASSERT_EQ(j["nodes"].size(), tree->nodes.size());
  EXPECT_EQ(j["root"], "trainer");
  EXPECT_EQ(j["nodes"][0]["parent"], -1);
  EXPECT_EQ(j["nodes"][1]["link"], "wan");
  EXPECT_EQ(j["nodes"][1]["link_bandwidth_bps"], 200000000);
  EXPECT_EQ(j["nodes"][1]["store"]["kind"], "file");
  EXPECT_EQ(j["clusters"].size(), 3u);
  for (size_t i = 1; i < tree->nodes.size(); ++i) {
    EXPECT_EQ(j["nodes"][i]["parent"], tree->nodes[i].parent);
    EXPECT_EQ(j["nodes"][i]["name"], tree->nodes[i].name);
  }
}

TEST(TreeTest, DotRendering) {
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/two-region.yaml");
  ASSERT_TRUE(t.ok());
  auto tree = BuildTree(*t);
  std::string dot = RenderTreeDot(*tree);
  EXPECT_THAT(dot, ::testing::StartsWith("digraph dcr_tree {\n"));
  for (const char* c : {"train", "rollout-a", "rollout-b"}) {
    EXPECT_THAT(dot,
                HasSubstr(std::string("subgraph \"cluster_") + c + "\" {"));
  }
  EXPECT_THAT(dot, HasSubstr("\"trainer\" -> \"a0\" [label=\"200Mbps 70ms\""));
  EXPECT_THAT(dot, HasSubstr("\"a0\" -> \"a1\" [label=\"2Gbps\"]"));
  // Loose syntax: balanced braces and quotes, one edge per non-root node.
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'),
            std::count(dot.begin(), dot.end(), '}'));
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '"') % 2, 0);
  size_t edges = 0;
  for (size_t at = dot.find("->"); at != std::string::npos;
       at = dot.find("->", at + 2)) {
    ++edges;
  }
  EXPECT_EQ(edges, tree->nodes.size() - 1);
  // Graphviz itself, where installed.
  if (std::system("command -v dot >/dev/null 2>&1") == 0) {
    testing::TempDir dir;
    std::ofstream(dir.Path("t.dot")) << dot;
    std::string cmd = "dot -Tsvg " + dir.Path("t.dot") + " -o " +
                      dir.Path("t.svg") + " 2>" + dir.Path("err");
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  } else {
    GTEST_LOG_(INFO) << "graphviz (dot) not installed; checked syntax only";
  }
}

}  // namespace
}  // namespace dcr
