// The topology written back out: Dump and ToJson round trips, and the
// shipped examples under topology/ (parse_test.cc is the parser).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

#include "dcr/topology.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using testing::kSampleYaml;

TEST(ParseTest, DumpReloadsEqual) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  std::string dumped = DumpTopology(*t);
  auto again = ParseTopology(dumped, "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << dumped;
  EXPECT_EQ(*again, *t);
  EXPECT_EQ(DumpTopology(*again), dumped);
}

TEST(ParseTest, DumpKeepsAwkwardStrings) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  for (const char* s :
       {"null", "~", "true", "${HOME}", "$$", "a: b", "#x", "- y", "'q'",
        "\"dq\"", "1e3", "[x]", "{y}", " lead", "trail ", "tab\there",
        "new\nline", "\xc3\xa9t\xc3\xa9", "*alias", "&anchor", "!tag", "%", "@",
        "`", "|", ">", "?", "$",
        // & or * after '-', ':' or ',' inside a plain scalar:
        // the loader's safety check refuses them unquoted
        // (found by fuzz_topology in a store path).
        "dcr-&local", "a:*b", "x,&y", "[&z]",
        // So are quotes and # there: in a flow map (a store path) they
        // hid the closing '}' from it (found by fuzz_topology).
        "dcr-'local", "a:'b", "-'a", "dcr-\"x", "a-\"b, {c", "a-#b", "a:#b",
        "x,#y", "it's \"q\"",
        // A string holding both quotes was single-quoted, and the check
        // did not read its '' (found by fuzz_topology); nor did it read
        // \" in a double-quoted one. An unbalanced bracket in a plain
        // scalar of a block mapping (the root's paths) was written bare.
        "a'b &c\"", "x \" &y", "\\\"", "\\", "a]b", "x}y", "{", "[[",
        "new\nline \" &q"}) {
    Topology copy = *t;
    copy.clusters[1].region = s;
    copy.root.baseline = std::string("/p/") + s;
    copy.clusters[1].nodes[0].store.path = std::string("/p/") + s;
    auto again = ParseTopology(DumpTopology(copy), "dump.yaml");
    ASSERT_TRUE(again.ok()) << s << ": " << again.status().ToString() << "\n"
                            << DumpTopology(copy);
    EXPECT_EQ(again->clusters[1].region, s);
    EXPECT_EQ(again->root.baseline, std::string("/p/") + s);
    EXPECT_EQ(again->clusters[1].nodes[0].store.path, std::string("/p/") + s);
  }
}

TEST(ParseTest, RandomTopologiesRoundTrip) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    Topology t = testing::RandomTopology(rng);
    ASSERT_TRUE(ValidateTopology(t).ok()) << ValidateTopology(t).ToString();
    std::string dumped = DumpTopology(t);
    auto again = ParseTopology(dumped, "dump.yaml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << dumped;
    EXPECT_EQ(*again, t) << dumped;
  }
}

TEST(ParseTest, JsonHasEveryCluster) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  std::string j = TopologyToJson(*t);
  EXPECT_THAT(j, HasSubstr("\"rollout-a\""));
  EXPECT_THAT(j, HasSubstr("\"bandwidth_bps\": 3000000000"));
}

// Every example in topology/ loads, validates and builds a tree.
TEST(ParseTest, ShippedExamplesValidate) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(DCR_TOPOLOGY_DIR)) {
    if (e.path().extension() != ".yaml") continue;
    ++files;
    auto t = LoadTopology(e.path().string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto tree = BuildTree(*t);
    ASSERT_TRUE(tree.ok()) << tree.status().ToString();
    EXPECT_EQ(tree->nodes.size(), t->NodeCount() + 1) << e.path();
  }
  EXPECT_GE(files, 2);
}

TEST(ParseTest, LocalExample) {
  ::unsetenv("DCR_LOCAL_DIR");
  auto t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/local.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->NodeCount(), 8u);
  EXPECT_EQ(t->root.port, 17000);
  EXPECT_EQ(t->FindNode("a0")->store.path, "/tmp/dcr-local/a0.safetensors");
  for (const ClusterSpec& c : t->clusters) {
    for (const NodeSpec& n : c.nodes) {
      EXPECT_EQ(n.host, "127.0.0.1");
      EXPECT_GE(n.port, 17001);
      EXPECT_LE(n.port, 17008);
    }
  }
  ::setenv("DCR_LOCAL_DIR", "/scratch/x", 1);
  t = LoadTopology(std::string(DCR_TOPOLOGY_DIR) + "/local.yaml");
  ::unsetenv("DCR_LOCAL_DIR");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->FindNode("b3")->store.path, "/scratch/x/b3.safetensors");
}

}  // namespace
}  // namespace dcr
