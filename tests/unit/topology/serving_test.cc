// The `serving` keys: a node that keeps one rank of a serving layout, and
// a cluster's default layout for its serving nodes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "dcr/topology.h"
#include "testing/temp_dir.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using testing::TopologyErrorOf;

// Line numbers matter: error tests point at them.
constexpr const char* kServingYaml =
    "version: 1\n"                                                // 1
    "root: {name: r, host: h, port: 1, cluster: c}\n"             // 2
    "clusters:\n"                                                 // 3
    "  - name: c\n"                                               // 4
    "    serving: {layout: layouts/tp2.yaml}\n"                   // 5
    "    nodes:\n"                                                // 6
    "      - {name: s0, host: h, port: 2, serving: {rank: 0}}\n"  // 7
    "      - {name: s1, host: h, port: 3, serving: {rank: 1, "
    "layout: /srv/other.yaml}}\n"              // 8
    "      - {name: n2, host: h, port: 4}\n";  // 9

// kServingYaml with the first occurrence of `from` replaced by `to`.
std::string ServingEdited(const std::string& from, const std::string& to) {
  std::string s = kServingYaml;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// kServingYaml without each of `parts` (their first occurrences).
std::string Removed(std::initializer_list<std::string> parts) {
  std::string s = kServingYaml;
  for (const std::string& p : parts) {
    size_t at = s.find(p);
    EXPECT_NE(at, std::string::npos) << p;
    if (at != std::string::npos) s.erase(at, p.size());
  }
  return s;
}

TEST(ServingTest, ClusterLayoutIsTheDefault) {
  auto t = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const ClusterSpec& c = t->clusters[0];
  EXPECT_EQ(c.serving_layout, "layouts/tp2.yaml");
  ASSERT_TRUE(c.nodes[0].serving.has_value());
  EXPECT_EQ(c.nodes[0].serving->layout, "");
  EXPECT_EQ(c.nodes[0].serving->rank, 0u);
  EXPECT_EQ(c.nodes[0].serving->loc.line, 7);
  EXPECT_EQ(ServingLayoutOf(c, c.nodes[0]), "layouts/tp2.yaml");
  ASSERT_TRUE(c.nodes[1].serving.has_value());
  EXPECT_EQ(c.nodes[1].serving->rank, 1u);
  EXPECT_EQ(ServingLayoutOf(c, c.nodes[1]), "/srv/other.yaml");
  EXPECT_FALSE(c.nodes[2].serving.has_value());
  EXPECT_EQ(ServingLayoutOf(c, c.nodes[2]), "");
}

TEST(ServingTest, NodeLayouts) {
  ::setenv("DCR_SERVING_TEST_DIR", "/srv/layouts", 1);
  auto t = ParseTopology(
      "version: 1\n"
      "root: {name: r, host: h, port: 1, cluster: c}\n"
      "clusters:\n"
      "  - name: c\n"
      "    nodes:\n"
      "      - name: s0\n"
      "        host: h\n"
      "        port: 2\n"
      "        serving:\n"
      "          layout: \"${DCR_SERVING_TEST_DIR}/tp2.yaml\"\n"
      "          rank: \"2147483647\"\n"
      "      - {name: s1, host: h, port: 3, serving: {layout: tp2.yaml, "
      "rank: 1}}\n",
      "n.yaml");
  ::unsetenv("DCR_SERVING_TEST_DIR");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const ClusterSpec& c = t->clusters[0];
  EXPECT_FALSE(c.serving_layout.has_value());
  EXPECT_EQ(c.nodes[0].serving,
            (ServingSpec{"/srv/layouts/tp2.yaml", kMaxServingRank, {}}));
  EXPECT_EQ(c.nodes[0].serving->loc.line, 10);
  // A relative path is kept as written.
  EXPECT_EQ(ServingLayoutOf(c, c.nodes[1]), "tp2.yaml");
  EXPECT_EQ(c.nodes[1].serving->rank, 1u);
}

TEST(ServingTest, ErrorsNameFileLineAndKey) {
  ::unsetenv("DCR_SERVING_TEST_NOPE");
  const std::string rank_msg =
      "t.yaml:7: clusters[0].nodes[0].serving.rank: expected an integer "
      "0-2147483647, got ";
  struct Case {
    std::string text;
    std::string want;
  } cases[] = {
      {ServingEdited("{rank: 0}", "{rank: 0, lyout: x.yaml}"),
       "t.yaml:7: clusters[0].nodes[0].serving.lyout: unknown key (did you "
       "mean 'layout'?)"},
      {ServingEdited("{rank: 0}", "{rank: 0, store: x}"),
       "t.yaml:7: clusters[0].nodes[0].serving.store: unknown key (known "
       "keys: layout, rank, socket)"},
      {ServingEdited("{rank: 0}", "{rank: 0, rank: 1}"),
       "t.yaml:7: clusters[0].nodes[0].serving.rank: duplicate key (first "
       "given at line 7)"},
      {ServingEdited("{layout: layouts/tp2.yaml}",
                     "{layout: layouts/tp2.yaml, colour: red}"),
       "t.yaml:5: clusters[0].serving.colour: unknown key (known keys: "
       "layout)"},
      {ServingEdited("{layout: layouts/tp2.yaml}",
                     "{layout: layouts/tp2.yaml, rank: 0}"),
       "t.yaml:5: clusters[0].serving.rank: a rank is per node: give "
       "serving: {rank: N} on each node that serves"},
      {ServingEdited("serving: {rank: 0}", "serving: 3"),
       "t.yaml:7: clusters[0].nodes[0].serving: expected a map, got a "
       "scalar"},
      {ServingEdited("serving: {rank: 0}", "serving: null"),
       "t.yaml:7: clusters[0].nodes[0].serving: expected a map, got "
       "nothing"},
      {ServingEdited("{layout: layouts/tp2.yaml}", "[layouts/tp2.yaml]"),
       "t.yaml:5: clusters[0].serving: expected a map, got a list"},
      {ServingEdited("{layout: layouts/tp2.yaml}", "{}"),
       "t.yaml:5: clusters[0].serving: missing required key 'layout'"},
      {ServingEdited("{layout: layouts/tp2.yaml}", "{layout: \"\"}"),
       "t.yaml:5: clusters[0].serving.layout: expected the path of a layout "
       "file, got ''"},
      {ServingEdited("{layout: layouts/tp2.yaml}", "{layout: {a: b}}"),
       "t.yaml:5: clusters[0].serving.layout: expected a value, got a map"},
      {ServingEdited("{rank: 0}", "{rank: 0, layout: [a, b]}"),
       "t.yaml:7: clusters[0].nodes[0].serving.layout: expected a value, got "
       "a list"},
      {ServingEdited("{rank: 0}", "{rank: 0, layout: \"\"}"),
       "t.yaml:7: clusters[0].nodes[0].serving.layout: expected the path of "
       "a layout file, got ''"},
      {ServingEdited("{rank: 0}",
                     "{rank: 0, layout: \"${DCR_SERVING_TEST_NOPE}\"}"),
       "t.yaml:7: clusters[0].nodes[0].serving.layout: environment variable "
       "DCR_SERVING_TEST_NOPE is not set (write ${DCR_SERVING_TEST_NOPE:-"
       "default} to give a default)"},
      {ServingEdited("{rank: 0}", "{layout: x.yaml}"),
       "t.yaml:7: clusters[0].nodes[0].serving: missing required key "
       "'rank'"},
      {ServingEdited("{rank: 0}", "{rank: -1}"), rank_msg + "'-1'"},
      {ServingEdited("{rank: 0}", "{rank: 2147483648}"),
       rank_msg + "'2147483648'"},
      {ServingEdited("{rank: 0}", "{rank: 99999999999999999999999}"),
       rank_msg + "'99999999999999999999999'"},
      {ServingEdited("{rank: 0}", "{rank: 1.5}"), rank_msg + "'1.5'"},
      {ServingEdited("{rank: 0}", "{rank: 1e3}"), rank_msg + "'1e3'"},
      {ServingEdited("{rank: 0}", "{rank: zero}"), rank_msg + "'zero'"},
      {ServingEdited("{rank: 0}", "{rank: [0]}"),
       "t.yaml:7: clusters[0].nodes[0].serving.rank: expected a value, got a "
       "list"},
      // No layout at the node or the cluster.
      {Removed({"    serving: {layout: layouts/tp2.yaml}\n"}),
       "t.yaml:6: clusters[0].nodes[0].serving: missing key 'layout' (give "
       "it here or in the cluster's serving: {layout: PATH})"},
      // A cluster layout that no node uses.
      {Removed({", serving: {rank: 0}",
                ", serving: {rank: 1, layout: /srv/other.yaml}"}),
       "t.yaml:5: clusters[0].serving: cluster 'c' has a serving layout but "
       "none of its nodes serves (add serving: {rank: N} to each node that "
       "serves)"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(TopologyErrorOf(c.text), c.want) << c.text;
  }
}

// Topologies built in code or edited get the parser's checks from
// ValidateTopology.
TEST(ServingTest, ValidateChecksBuiltTopologies) {
  auto parsed = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  Topology base = *parsed;
  for (ClusterSpec& c : base.clusters) {
    c.loc = {};
    for (NodeSpec& n : c.nodes) {
      n.loc = {};
      if (n.serving) n.serving->loc = {};
    }
  }
  ASSERT_TRUE(ValidateTopology(base).ok());
  auto error_of = [](const Topology& t) {
    Status s = ValidateTopology(t);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    return std::string(s.message());
  };

  Topology t = base;
  t.clusters[0].serving_layout.reset();
  EXPECT_EQ(error_of(t),
            "t.yaml: clusters[0].nodes[0].serving: missing key 'layout' (give "
            "it here or in the cluster's serving: {layout: PATH})");
  t.clusters[0].nodes[0].serving->layout = "own.yaml";
  EXPECT_TRUE(ValidateTopology(t).ok());

  t = base;
  t.clusters[0].serving_layout = "";
  EXPECT_EQ(error_of(t),
            "t.yaml: clusters[0].serving.layout: expected the path of a "
            "layout file, got ''");

  t = base;
  t.clusters[0].nodes[0].serving.reset();
  t.clusters[0].nodes[1].serving.reset();
  EXPECT_EQ(error_of(t),
            "t.yaml: clusters[0].serving: cluster 'c' has a serving layout "
            "but none of its nodes serves (add serving: {rank: N} to each "
            "node that serves)");

  t = base;
  t.clusters[0].nodes[1].serving->rank = kMaxServingRank + 1;
  EXPECT_EQ(error_of(t),
            "t.yaml: clusters[0].nodes[1].serving.rank: expected an integer "
            "0-2147483647, got '2147483648'");

  t = base;
  t.clusters[0].nodes[1].serving->layout = "/srv/\x01.yaml";
  EXPECT_THAT(error_of(t),
              HasSubstr("clusters[0].nodes[1].serving.layout: the value"));

  // The line is the serving key's where it is known.
  t = *parsed;
  t.clusters[0].serving_layout.reset();
  EXPECT_THAT(error_of(t),
              HasSubstr("t.yaml:7: clusters[0].nodes[0].serving:"));
}

TEST(ServingTest, DumpLoadsBackEqual) {
  auto t = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::string dumped = DumpTopology(*t);
  EXPECT_THAT(dumped, HasSubstr("serving: {layout: layouts/tp2.yaml}"));
  EXPECT_THAT(dumped, HasSubstr("serving: {rank: 0}"));
  EXPECT_THAT(dumped, HasSubstr("serving: {layout: /srv/other.yaml, rank: 1}"));
  testing::TempDir dir;
  std::string path = dir.Path("dump.yaml");
  std::ofstream(path) << dumped;
  auto again = LoadTopology(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << dumped;
  EXPECT_EQ(*again, *t);
  EXPECT_EQ(DumpTopology(*again), dumped);

  // The rank and the layouts are part of equality.
  Topology other = *t;
  other.clusters[0].nodes[0].serving->rank = 5;
  EXPECT_NE(other, *t);
  other = *t;
  other.clusters[0].serving_layout = "layouts/tp4.yaml";
  EXPECT_NE(other, *t);

  // Awkward paths survive too.
  for (const char* s :
       {"${HOME}/l.yaml", "a: b", "&x", "*y", "dcr-&l.yaml", "'q'", " lead",
        "null", "7", "dcr-'l", "a-\"b, {c", "a-#b", "tab\there", "new\nline"}) {
    Topology copy = *t;
    copy.clusters[0].serving_layout = s;
    copy.clusters[0].nodes[1].serving->layout = std::string("/p/") + s;
    auto back = ParseTopology(DumpTopology(copy), "dump.yaml");
    ASSERT_TRUE(back.ok()) << s << ": " << back.status().ToString() << "\n"
                           << DumpTopology(copy);
    EXPECT_EQ(*back, copy) << s;
  }
}

TEST(ServingTest, SocketNeedsAShmStore) {
  const std::string shm = ServingEdited(
      "{name: s0, host: h, port: 2, serving: {rank: 0}}",
      "{name: s0, host: h, port: 2, store: {kind: shm, path: /s0}, "
      "serving: {rank: 0, socket: /run/dcr/s0.sock}}");
  auto t = ParseTopology(shm, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->clusters[0].nodes[0].serving->socket, "/run/dcr/s0.sock");
  const std::string dumped = DumpTopology(*t);
  EXPECT_THAT(dumped,
              HasSubstr("serving: {rank: 0, socket: /run/dcr/s0.sock}"));
  auto back = ParseTopology(dumped, "dump.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *t);
  auto j = nlohmann::json::parse(TopologyToJson(*t));
  EXPECT_EQ(j["clusters"][0]["nodes"][0]["serving"]["socket"],
            "/run/dcr/s0.sock");

  EXPECT_EQ(TopologyErrorOf(
                ServingEdited("{rank: 0}", "{rank: 0, socket: /run/s0.sock}")),
            "t.yaml:7: clusters[0].nodes[0].serving.socket: a serving process "
            "maps the relay's store: give the node a shm store (store: {kind: "
            "shm, path: NAME})");
  EXPECT_THAT(
      TopologyErrorOf(ServingEdited(
          "{rank: 0}", "{rank: 0, socket: /" + std::string(120, 'x') + "}")),
      HasSubstr("t.yaml:7: clusters[0].nodes[0].serving.socket: "
                "expected a Unix socket path of 1 to 107 bytes, got "
                "121"));
  // An edit that takes the shm store away is caught too.
  Topology edited = *t;
  edited.clusters[0].nodes[0].store = {};
  EXPECT_THAT(ValidateTopology(edited).message(),
              HasSubstr("clusters[0].nodes[0].serving.socket: a serving "
                        "process maps the relay's store"));
}

TEST(ServingTest, Json) {
  auto t = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  auto j = nlohmann::json::parse(TopologyToJson(*t));
  const auto& c = j["clusters"][0];
  EXPECT_EQ(c["serving"]["layout"], "layouts/tp2.yaml");
  EXPECT_EQ(c["nodes"][0]["serving"]["layout"], "");
  EXPECT_EQ(c["nodes"][0]["serving"]["rank"], 0);
  EXPECT_EQ(c["nodes"][1]["serving"]["layout"], "/srv/other.yaml");
  EXPECT_TRUE(c["nodes"][2]["serving"].is_null());
  auto plain = ParseTopology(testing::kSampleYaml, "t.yaml");
  ASSERT_TRUE(plain.ok());
  j = nlohmann::json::parse(TopologyToJson(*plain));
  EXPECT_TRUE(j["clusters"][1]["serving"].is_null());
}

TEST(ServingTest, Edits) {
  auto parsed = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(parsed.ok());
  Topology t = *parsed;
  // An added node takes the cluster's layout; its lines are forgotten.
  NodeSpec n;
  n.name = "s3";
  n.host = "h";
  n.port = 5;
  n.serving = ServingSpec{"", 3, SourceLine{42}};
  ASSERT_TRUE(AddNode(&t, "c", n).ok());
  const NodeSpec& added = t.clusters[0].nodes.back();
  EXPECT_EQ(added.serving->rank, 3u);
  EXPECT_EQ(added.serving->loc.line, 0);
  EXPECT_EQ(ServingLayoutOf(t.clusters[0], added), "layouts/tp2.yaml");
  auto reloaded = ParseTopology(DumpTopology(t), "d.yaml");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(*reloaded, t);

  // Renames and other keys keep a node's serving.
  ASSERT_TRUE(SetValue(&t, "nodes.s0.name", "t0").ok());
  ASSERT_TRUE(SetValue(&t, "nodes.t0.port", "12").ok());
  EXPECT_EQ(t.clusters[0].nodes[0].serving->rank, 0u);

  // A cluster without a layout: the node must bring its own.
  Topology sample = *ParseTopology(testing::kSampleYaml, "t.yaml");
  NodeSpec a2{"a2", "10.1.0.12", 17001, {}, {}, {}, false, ServingSpec{}, {}};
  Status s = AddNode(&sample, "rollout-a", a2);
  EXPECT_EQ(s.message(),
            "t.yaml: clusters[1].nodes[2].serving: missing key 'layout' (give "
            "it here or in the cluster's serving: {layout: PATH})");
  EXPECT_EQ(sample, *ParseTopology(testing::kSampleYaml, "t.yaml"));
  a2.serving->layout = "layouts/tp2.yaml";
  ASSERT_TRUE(AddNode(&sample, "rollout-a", a2).ok());

  // The last serving node of a cluster with a layout cannot go while the
  // cluster keeps its layout.
  t = *parsed;
  ASSERT_TRUE(RemoveNode(&t, "s1").ok());
  Topology before = t;
  s = RemoveNode(&t, "s0");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("clusters[0].serving: cluster 'c' has a serving "
                        "layout but none of its nodes serves"));
  EXPECT_EQ(t, before);
}

TEST(ServingTest, TreeNodesCarryTheResolvedLayout) {
  auto t = ParseTopology(kServingYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_FALSE(tree->nodes[0].serving.has_value());  // the root
  const TreeNode& s0 = tree->nodes[static_cast<size_t>(tree->Find("s0"))];
  ASSERT_TRUE(s0.serving.has_value());
  EXPECT_EQ(s0.serving->layout, "layouts/tp2.yaml");
  EXPECT_EQ(s0.serving->rank, 0u);
  const TreeNode& s1 = tree->nodes[static_cast<size_t>(tree->Find("s1"))];
  EXPECT_EQ(s1.serving, (ServingSpec{"/srv/other.yaml", 1, {}}));
  EXPECT_FALSE(
      tree->nodes[static_cast<size_t>(tree->Find("n2"))].serving.has_value());

  std::string text = RenderTreeText(*tree);
  EXPECT_THAT(text, HasSubstr("memory  serving rank 0 of layouts/tp2.yaml\n"));
  EXPECT_THAT(text, HasSubstr("serving rank 1 of /srv/other.yaml\n"));
  auto j = nlohmann::json::parse(RenderTreeJson(*tree));
  const auto& js0 = j["nodes"][static_cast<size_t>(tree->Find("s0"))];
  EXPECT_EQ(js0["serving"]["layout"], "layouts/tp2.yaml");
  EXPECT_EQ(js0["serving"]["rank"], 0);
  EXPECT_TRUE(j["nodes"][0]["serving"].is_null());
}

// topology/serve-local.yaml: ranks 0 and 1 of the shipped tp 2 serving
// layout, beside local.yaml without sharing a port with it.
TEST(ServingTest, ServeLocalExample) {
  ::unsetenv("DCR_LOCAL_DIR");
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/serve-local.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const ClusterSpec* serve = t->FindCluster("serve");
  ASSERT_NE(serve, nullptr);
  ASSERT_EQ(serve->nodes.size(), 2u);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const NodeSpec& n = serve->nodes[rank];
    ASSERT_TRUE(n.serving.has_value()) << n.name;
    EXPECT_EQ(n.serving->rank, rank);
    EXPECT_EQ(ServingLayoutOf(*serve, n), "layouts/traingen-serve-tp2.yaml");
    EXPECT_EQ(n.store.kind, StoreKind::kFile);
  }
  // The layout path is relative to the repository root.
  EXPECT_TRUE(std::filesystem::exists(std::string(DCR_TOPOLOGY_DIR) +
                                      "/../layouts/traingen-serve-tp2.yaml"));
  for (const ClusterSpec& c : t->clusters) {
    if (&c == serve) continue;
    for (const NodeSpec& n : c.nodes) EXPECT_FALSE(n.serving) << n.name;
  }
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_EQ(tree->nodes[static_cast<size_t>(tree->Find("s1"))].serving->layout,
            "layouts/traingen-serve-tp2.yaml");

  auto local = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/local.yaml");
  ASSERT_TRUE(local.ok());
  std::set<uint16_t> ports{local->root.port};
  for (const ClusterSpec& c : local->clusters) {
    for (const NodeSpec& n : c.nodes) ports.insert(n.port);
  }
  EXPECT_EQ(ports.count(t->root.port), 0u);
  for (const ClusterSpec& c : t->clusters) {
    for (const NodeSpec& n : c.nodes) {
      EXPECT_EQ(ports.count(n.port), 0u) << n.name;
    }
  }
}

}  // namespace
}  // namespace dcr
