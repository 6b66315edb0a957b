#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "dcr/topology.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

class EditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = ParseTopology(testing::kSampleYaml, "t.yaml");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    topo_ = *t;
  }
  // Expects `s` to fail with `msg` in its message and topo_ unchanged.
  void ExpectRefused(const Status& s, const std::string& msg) {
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr(msg)) << s.ToString();
    auto fresh = ParseTopology(testing::kSampleYaml, "t.yaml");
    EXPECT_EQ(topo_, *fresh);
  }
  Topology topo_;
};

TEST_F(EditTest, AddAndRemoveNode) {
  NodeSpec n{"a2",  "10.1.0.12", 17001, {StoreKind::kShm, "/w"}, {}, {},
             false, {},          {}};
  ASSERT_TRUE(AddNode(&topo_, "rollout-a", n).ok());
  ASSERT_EQ(topo_.clusters[1].nodes.size(), 3u);
  EXPECT_EQ(topo_.clusters[1].nodes[2], n);
  auto reloaded = ParseTopology(DumpTopology(topo_), "d.yaml");
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(*reloaded, topo_);
  ASSERT_TRUE(RemoveNode(&topo_, "a2").ok());
  EXPECT_EQ(topo_, *ParseTopology(testing::kSampleYaml, "t.yaml"));
}

TEST_F(EditTest, AddNodeRefusals) {
  NodeSpec n{"a2", "10.1.0.12", 17001, {}, {}, {}, false, {}, {}};
  ExpectRefused(AddNode(&topo_, "nope", n), "no cluster named 'nope'");
  NodeSpec dup = n;
  dup.name = "a0";
  ExpectRefused(AddNode(&topo_, "rollout-a", dup), "duplicate node name 'a0'");
  NodeSpec clash = n;
  clash.host = "10.1.0.10";
  ExpectRefused(AddNode(&topo_, "rollout-a", clash),
                "address 10.1.0.10:17001 is already used by node 'a0'");
  NodeSpec bad = n;
  bad.store = {StoreKind::kFile, ""};
  ExpectRefused(AddNode(&topo_, "rollout-a", bad), "a file store needs a path");
  NodeSpec badname = n;
  badname.name = "a 2";
  ExpectRefused(AddNode(&topo_, "rollout-a", badname),
                "clusters[1].nodes[2].name: name may hold only");
}

TEST_F(EditTest, RemoveNodeRefusals) {
  Status s = RemoveNode(&topo_, "zz");
  EXPECT_TRUE(s.IsNotFound());
  ASSERT_TRUE(SetValue(&topo_, "defaults.min_commit", "2").ok());
  Topology before = topo_;
  s = RemoveNode(&topo_, "a1");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("exceeds the number of relays"));
  EXPECT_EQ(topo_, before);
  ASSERT_TRUE(SetValue(&topo_, "defaults.min_commit", "all").ok());
  ASSERT_TRUE(RemoveNode(&topo_, "a1").ok());
  // The last node of a rollout cluster cannot go.
  s = RemoveNode(&topo_, "a0");
  EXPECT_THAT(std::string(s.message()), HasSubstr("has no nodes"));
}

TEST_F(EditTest, SetValueAcceptedKeys) {
  struct Case {
    const char* key;
    const char* value;
  } cases[] = {
      {"defaults.transport", "ucx"},
      {"defaults.span_elems", "65536"},
      {"defaults.fanout", "3"},
      {"defaults.window_bytes", "128MiB"},
      {"defaults.min_commit", "1"},
      {"defaults.auth_key_file", "/etc/dcr/frame.key"},
      {"defaults.tls_ca_file", "/etc/dcr/ca.pem"},
      {"defaults.tls_cert_file", "/etc/dcr/node.pem"},
      {"defaults.tls_key_file", "/etc/dcr/node.key"},
      {"defaults.signing_public_key_file", "/etc/dcr/root.pub"},
      {"defaults.apply_threads", "8"},
      {"root.signing_key_file", "/srv/dcr/root.key"},
      {"root.keep_deltas", "9"},
      {"root.host", "10.0.0.1"},
      {"root.port", "18000"},
      {"root.state_dir", "/srv/dcr"},
      {"root.baseline", "/srv/base.safetensors"},
      {"root.name", "coord"},
      {"clusters.rollout-a.fanout", "8"},
      {"clusters.rollout-a.bandwidth", "100Gbps"},
      {"clusters.rollout-a.transport", "ucx"},
      {"clusters.rollout-a.region", "eu-west"},
      {"clusters[0].region", "ap-south"},
      {"nodes.a0.port", "17100"},
      {"nodes.a0.host", "10.9.9.9"},
      {"nodes.a0.metrics_port", "9200"},
      {"nodes.a0.transport", "ucx"},
      {"nodes.a1.head", "true"},
      {"nodes.a1.store", "file:/m/a1.safetensors"},
      {"nodes.a0.store.path", "/dcr-a0"},
      {"nodes.a0.store.kind", "shm"},
      {"links[0].bandwidth", "10Gbps"},
      {"links[0].latency", "5ms"},
      {"links[0].transport", "ucx"},
  };
  for (const Case& c : cases) {
    Status s = SetValue(&topo_, c.key, c.value);
    ASSERT_TRUE(s.ok()) << c.key << "=" << c.value << ": " << s.ToString();
  }
  EXPECT_EQ(topo_.defaults.transport, TransportKind::kUcx);
  EXPECT_EQ(topo_.defaults.window_bytes, 128u << 20);
  EXPECT_EQ(topo_.defaults.auth_key_file, "/etc/dcr/frame.key");
  EXPECT_EQ(topo_.defaults.tls_cert_file, "/etc/dcr/node.pem");
  EXPECT_EQ(topo_.defaults.signing_public_key_file, "/etc/dcr/root.pub");
  EXPECT_EQ(topo_.defaults.apply_threads, 8u);
  EXPECT_EQ(topo_.root.signing_key_file, "/srv/dcr/root.key");
  EXPECT_EQ(topo_.root.keep_deltas, 9u);
  ASSERT_TRUE(SetValue(&topo_, "root.keep_deltas", "").ok());
  EXPECT_EQ(topo_.root.keep_deltas, kDefaultKeepDeltas);
  EXPECT_EQ(topo_.root.name, "coord");
  EXPECT_EQ(topo_.clusters[1].fanout, 8u);
  EXPECT_EQ(topo_.clusters[1].region, "eu-west");
  EXPECT_EQ(topo_.clusters[0].region, "ap-south");
  const NodeSpec& a0 = topo_.clusters[1].nodes[0];
  EXPECT_EQ(a0.port, 17100);
  EXPECT_EQ(a0.store, (StoreLocation{StoreKind::kShm, "/dcr-a0"}));
  EXPECT_EQ(a0.metrics_port, 9200);
  EXPECT_TRUE(topo_.clusters[1].nodes[1].head);
  EXPECT_EQ(topo_.links[0].bandwidth_bps, 10000000000ull);
  EXPECT_EQ(topo_.links[0].latency_ns, 5000000ull);
  // Empty values clear optional keys.
  ASSERT_TRUE(SetValue(&topo_, "clusters.rollout-a.fanout", "").ok());
  EXPECT_FALSE(topo_.clusters[1].fanout.has_value());
  ASSERT_TRUE(SetValue(&topo_, "nodes.a0.metrics_port", "").ok());
  EXPECT_FALSE(topo_.clusters[1].nodes[0].metrics_port.has_value());
  // Every edit round-trips through YAML.
  auto reloaded = ParseTopology(DumpTopology(topo_), "d.yaml");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(*reloaded, topo_);
  // An empty value turns frame authentication off.
  ASSERT_TRUE(SetValue(&topo_, "defaults.auth_key_file", "").ok());
  EXPECT_EQ(topo_.defaults.auth_key_file, "");
}

TEST_F(EditTest, AuthKeyFileExpandsTheEnvironment) {
  ::unsetenv("DCR_EDIT_TEST_KEYS");
  ExpectRefused(
      SetValue(&topo_, "defaults.auth_key_file", "${DCR_EDIT_TEST_KEYS}"),
      "DCR_EDIT_TEST_KEYS is not set");
  // Control characters are refused as in every other value.
  ExpectRefused(SetValue(&topo_, "defaults.auth_key_file", "/k\x01"),
                "defaults.auth_key_file: the value");
  ::setenv("DCR_EDIT_TEST_KEYS", "/run/keys", 1);
  ASSERT_TRUE(SetValue(&topo_, "defaults.auth_key_file",
                       "${DCR_EDIT_TEST_KEYS}/dcr.key")
                  .ok());
  ::unsetenv("DCR_EDIT_TEST_KEYS");
  EXPECT_EQ(topo_.defaults.auth_key_file, "/run/keys/dcr.key");
}

TEST_F(EditTest, RenamingAClusterCarriesReferences) {
  ASSERT_TRUE(SetValue(&topo_, "clusters.train.name", "trainers").ok());
  EXPECT_EQ(topo_.root.cluster, "trainers");
  EXPECT_EQ(topo_.links[0].from, "trainers");
  ASSERT_TRUE(BuildTree(topo_).ok());
}

TEST_F(EditTest, SetValueRefusals) {
  struct Case {
    const char* key;
    const char* value;
    const char* msg;
  } cases[] = {
      {"nodes.a0.port", "abc",
       "t.yaml: nodes.a0.port: expected an integer 1-65535, got 'abc'"},
      {"nodes.a1.host", "10.1.0.10", "already used by node 'a0'"},
      {"nodes.a9.port", "1", "no node named 'a9'"},
      {"nodes.a0.prot", "1", "unknown key 'prot' (did you mean 'port'?)"},
      {"clusters.rollout-a.fanout", "0", "expected an integer 1-64"},
      {"clusters.nope.fanout", "2", "no cluster named 'nope'"},
      {"clusters[7].fanout", "2", "index [7] is out of range (2 entries)"},
      {"clusters.rollout-a.bandwidth", "fast", "expected a bandwidth"},
      {"defaults.window_bytes", "-1", "expected a size"},
      {"defaults.min_commit", "3", "exceeds the number of relays"},
      {"defaults.colour", "red", "unknown key 'colour'"},
      {"defaults.auth_keyfile", "/k", "did you mean 'auth_key_file'?"},
      {"links[0].to", "nowhere", "unknown cluster 'nowhere'"},
      {"links[1].bandwidth", "1Gbps", "out of range"},
      {"links[0].latency", "soon", "expected a duration"},
      {"root.cluster", "rollout-z", "unknown cluster 'rollout-z'"},
      {"root.port", "17001", ""},  // valid: different host from a0
      {"version", "2", "unknown key; expected defaults.KEY"},
      {"nodes.a0.store", "tape:/x", "expected memory, file or shm"},
      {"nodes.a0.store.kind", "memory", "a memory store takes no path"},
      {"nodes.a1.store", "file", "a file store needs a path"},
      {"clusters.rollout-a.name", "train", "duplicate cluster name 'train'"},
  };
  for (const Case& c : cases) {
    if (std::string(c.msg).empty()) {
      Topology copy = topo_;
      EXPECT_TRUE(SetValue(&copy, c.key, c.value).ok()) << c.key;
      continue;
    }
    ExpectRefused(SetValue(&topo_, c.key, c.value), c.msg);
  }
}

}  // namespace
}  // namespace dcr
