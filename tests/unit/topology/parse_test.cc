#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dcr/topology.h"
#include "testing/temp_dir.h"
#include "unit/topology/topology_testing.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using testing::kSampleYaml;
using ::testing::StartsWith;
using testing::TopologyErrorOf;

// kSampleYaml with the first occurrence of `from` replaced by `to`.
std::string Edited(const std::string& from, const std::string& to) {
  std::string s = kSampleYaml;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ParseTest, Sample) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->version, 1);
  EXPECT_EQ(t->defaults.transport, TransportKind::kTcp);
  EXPECT_EQ(t->defaults.span_elems, 1048576u);
  EXPECT_EQ(t->defaults.fanout, 2u);
  EXPECT_EQ(t->defaults.window_bytes, 64u << 20);
  EXPECT_EQ(t->defaults.min_commit, 0u);
  EXPECT_EQ(t->root.name, "trainer");
  EXPECT_EQ(t->root.port, 17000);
  EXPECT_EQ(t->root.cluster, "train");
  EXPECT_EQ(t->root.state_dir, "/var/lib/dcr");
  EXPECT_EQ(t->root.baseline, "/path/base.safetensors");
  ASSERT_EQ(t->clusters.size(), 2u);
  const ClusterSpec& a = t->clusters[1];
  EXPECT_EQ(a.name, "rollout-a");
  EXPECT_EQ(a.region, "us-west");
  EXPECT_EQ(a.fanout, 4u);
  EXPECT_EQ(a.bandwidth_bps, 25000000000ull);
  EXPECT_EQ(a.transport, TransportKind::kTcp);
  ASSERT_EQ(a.nodes.size(), 2u);
  EXPECT_EQ(a.nodes[0].name, "a0");
  EXPECT_EQ(a.nodes[0].host, "10.1.0.10");
  EXPECT_EQ(a.nodes[0].port, 17001);
  EXPECT_EQ(a.nodes[0].store.kind, StoreKind::kFile);
  EXPECT_EQ(a.nodes[0].store.path, "/models/policy.safetensors");
  EXPECT_EQ(a.nodes[0].metrics_port, 9101);
  EXPECT_EQ(a.nodes[0].loc.line, 13);
  EXPECT_EQ(a.nodes[1].store.kind, StoreKind::kMemory);
  EXPECT_FALSE(a.nodes[1].metrics_port.has_value());
  ASSERT_EQ(t->links.size(), 1u);
  EXPECT_EQ(t->links[0].bandwidth_bps, 3000000000ull);
  EXPECT_EQ(t->links[0].latency_ns, 70000000ull);
  EXPECT_EQ(t->FindNode("a1"), &a.nodes[1]);
  EXPECT_EQ(t->FindCluster("train"), &t->clusters[0]);
  EXPECT_EQ(t->NodeCount(), 2u);
}

TEST(ParseTest, OptionalKeysAndOverrides) {
  auto t = ParseTopology(
      "version: 1\n"
      "root: {name: r, host: h, port: 1, cluster: c}\n"
      "clusters:\n"
      "  - name: c\n"
      "    nodes:\n"
      "      - {name: n0, host: h, port: 2, transport: ucx, head: true}\n"
      "      - {name: n1, host: h, port: 3, store: {kind: shm, path: /w}}\n"
      "      - name: n2\n"
      "        host: h\n"
      "        port: \"4\"\n"
      "        head: false\n",
      "o.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->defaults, TopologyDefaults{});
  EXPECT_TRUE(t->links.empty());
  const auto& n = t->clusters[0].nodes;
  EXPECT_EQ(n[0].transport, TransportKind::kUcx);
  EXPECT_TRUE(n[0].head);
  EXPECT_EQ(n[1].store, (StoreLocation{StoreKind::kShm, "/w"}));
  EXPECT_EQ(n[2].port, 4);
  EXPECT_FALSE(n[2].head);
}

TEST(ParseTest, MinCommitInteger) {
  auto t = ParseTopology(Edited("min_commit: all", "min_commit: 2"), "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->defaults.min_commit, 2u);
}

TEST(ParseTest, KeepDeltas) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->root.keep_deltas, kDefaultKeepDeltas);
  EXPECT_THAT(DumpTopology(*t), ::testing::Not(HasSubstr("keep_deltas")));
  auto k = ParseTopology(
      Edited("cluster: train, ", "cluster: train, keep_deltas: 0, "), "t.yaml");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->root.keep_deltas, 0u);
  auto again = ParseTopology(DumpTopology(*k), "dump.yaml");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->root.keep_deltas, 0u);
  auto bad = ParseTopology(
      Edited("cluster: train, ", "cluster: train, keep_deltas: 5000, "),
      "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("root.keep_deltas"));
}

// defaults.apply_threads: the relays' apply threads, read by dcr-relay and
// by the root's cost model; not written back when not given.
TEST(ParseTest, ApplyThreads) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->defaults.apply_threads, 0u);
  EXPECT_EQ(ApplyThreads(t->defaults), kDefaultApplyThreads);
  EXPECT_THAT(DumpTopology(*t), ::testing::Not(HasSubstr("apply_threads")));
  auto k = ParseTopology(
      Edited("min_commit: all}", "min_commit: all, apply_threads: 12}"),
      "t.yaml");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(ApplyThreads(k->defaults), 12u);
  auto again = ParseTopology(DumpTopology(*k), "dump.yaml");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->defaults.apply_threads, 12u);
  EXPECT_EQ(TopologyErrorOf(Edited("min_commit: all}",
                                   "min_commit: all, apply_threads: 0}")),
            "t.yaml:2: defaults.apply_threads: expected an integer 1-256, "
            "got '0'");
  EXPECT_THAT(TopologyErrorOf(Edited("min_commit: all}",
                                     "min_commit: all, apply_threads: 257}")),
              HasSubstr("defaults.apply_threads"));
  // A topology built in code is checked the same way.
  Topology big = *k;
  big.defaults.apply_threads = 300;
  EXPECT_THAT(std::string(ValidateTopology(big).message()),
              HasSubstr("apply_threads must be 1-256"));
}

TEST(ParseTest, AuthKeyFile) {
  auto t = ParseTopology(kSampleYaml, "t.yaml");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->defaults.auth_key_file, "");  // not given: no authentication
  EXPECT_THAT(DumpTopology(*t), ::testing::Not(HasSubstr("auth_key_file")));
  EXPECT_THAT(TopologyToJson(*t), HasSubstr("\"auth_key_file\": \"\""));

  ::setenv("DCR_TOPO_TEST_KEYS", "/etc/dcr", 1);
  ::unsetenv("DCR_TOPO_TEST_NOPE");
  t = ParseTopology(
      Edited("min_commit: all}",
             "min_commit: all, auth_key_file: \"${DCR_TOPO_TEST_KEYS}/k\"}"),
      "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->defaults.auth_key_file, "/etc/dcr/k");
  std::string dumped = DumpTopology(*t);
  EXPECT_THAT(dumped, HasSubstr("auth_key_file: /etc/dcr/k"));
  auto again = ParseTopology(dumped, "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << dumped;
  EXPECT_EQ(*again, *t);
  EXPECT_THAT(TopologyToJson(*t),
              HasSubstr("\"auth_key_file\": \"/etc/dcr/k\""));
  // Keys differ: two topologies with different key files are not equal.
  Topology other = *t;
  other.defaults.auth_key_file = "/etc/dcr/other";
  EXPECT_NE(other, *t);

  // An unset variable with an empty default turns authentication off.
  t = ParseTopology(
      Edited("min_commit: all}",
             "min_commit: all, auth_key_file: \"${DCR_TOPO_TEST_NOPE:-}\"}"),
      "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->defaults.auth_key_file, "");
  EXPECT_EQ(TopologyErrorOf(Edited("min_commit: all}",
                                   "min_commit: all, auth_key_file: "
                                   "\"${DCR_TOPO_TEST_NOPE}\"}")),
            "t.yaml:2: defaults.auth_key_file: environment variable "
            "DCR_TOPO_TEST_NOPE is not set (write ${DCR_TOPO_TEST_NOPE:-"
            "default} to give a default)");
  EXPECT_EQ(TopologyErrorOf(Edited("min_commit: all}",
                                   "min_commit: all, auth_key_file: [a, b]}")),
            "t.yaml:2: defaults.auth_key_file: expected a value, got a list");
  EXPECT_EQ(TopologyErrorOf(Edited("min_commit: all}",
                                   "min_commit: all, auth_keyfile: /k}")),
            "t.yaml:2: defaults.auth_keyfile: unknown key (did you mean "
            "'auth_key_file'?)");
}

TEST(ParseTest, EnvironmentExpansion) {
  ::setenv("DCR_TOPO_TEST_MODELS", "/srv/models", 1);
  ::unsetenv("DCR_TOPO_TEST_NOPE");
  auto t =
      ParseTopology(Edited("path: /models/policy.safetensors",
                           "path: \"${DCR_TOPO_TEST_MODELS}/p.safetensors\""),
                    "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->clusters[1].nodes[0].store.path, "/srv/models/p.safetensors");
  t = ParseTopology(
      Edited("port: 17000", "port: \"${DCR_TOPO_TEST_NOPE:-17010}\""),
      "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->root.port, 17010);
  EXPECT_EQ(TopologyErrorOf(Edited("state_dir: /var/lib/dcr",
                                   "state_dir: \"${DCR_TOPO_TEST_NOPE}\"")),
            "t.yaml:3: root.state_dir: environment variable "
            "DCR_TOPO_TEST_NOPE is not set (write ${DCR_TOPO_TEST_NOPE:-"
            "default} to give a default)");
}

TEST(ParseTest, ErrorsNameFileLineAndKey) {
  struct Case {
    std::string text;
    std::string want;
  } cases[] = {
      {Edited("port: 17001}", "port: abc}"),
       "t.yaml:14: clusters[1].nodes[1].port: expected an integer 1-65535, "
       "got 'abc'"},
      {Edited("port: 17001}", "port: 70000}"),
       "t.yaml:14: clusters[1].nodes[1].port: expected an integer 1-65535, "
       "got '70000'"},
      {Edited("    fanout: 4", "    fanot: 4"),
       "t.yaml:9: clusters[1].fanot: unknown key (did you mean 'fanout'?)"},
      {Edited("    fanout: 4", "    colour: 4"),
       "t.yaml:9: clusters[1].colour: unknown key (known keys: name, region, "
       "fanout, bandwidth, transport, serving, source, nodes)"},
      {Edited("version: 1", "version: 2"),
       "t.yaml:1: version: unsupported topology version 2 (this dcr reads "
       "version 1)"},
      {Edited("bandwidth: 25Gbps", "bandwidth: 25Gbpz"),
       "t.yaml:10: clusters[1].bandwidth: expected a bandwidth like 25Gbps, "
       "200Mbit/s or 100MB/s, got '25Gbpz'"},
      {Edited("latency: 70ms", "latency: 70"),
       "t.yaml:16: links[0].latency: expected a duration like 70ms, 1s, "
       "10min or 250us, got '70'"},
      {Edited("window_bytes: 64MiB", "window_bytes: lots"),
       "t.yaml:2: defaults.window_bytes: expected a size like 64MiB, 1GB or "
       "4096 (bytes), got 'lots'"},
      {Edited("transport: tcp\n    nodes", "transport: udp\n    nodes"),
       "t.yaml:11: clusters[1].transport: expected tcp or ucx, got 'udp'"},
      {Edited("kind: file", "kind: disk"),
       "t.yaml:13: clusters[1].nodes[0].store.kind: expected memory, file or "
       "shm, got 'disk'"},
      {Edited("min_commit: all", "min_commit: 0"),
       "t.yaml:2: defaults.min_commit: expected \"all\" or an integer >= 1, "
       "got '0'"},
      {Edited("min_commit: all", "min_commit: 3"),
       "t.yaml: defaults.min_commit: min_commit 3 exceeds the number of "
       "relays (2)"},
      {Edited("{name: a1, host: 10.1.0.11, port: 17001}",
              "{name: a1, port: 17001}"),
       "t.yaml:14: clusters[1].nodes[1]: missing required key 'host'"},
      {Edited("name: a1", "name: a0"),
       "t.yaml:14: clusters[1].nodes[1].name: duplicate node name 'a0' "
       "(first defined at line 13)"},
      {Edited("name: a1", "name: trainer"),
       "t.yaml:14: clusters[1].nodes[1].name: duplicate node name 'trainer' "
       "(the root's name)"},
      {Edited("name: rollout-a", "name: train"),
       "t.yaml:7: clusters[1].name: duplicate cluster name 'train' (first "
       "defined at line 5)"},
      {Edited("host: 10.1.0.11", "host: 10.1.0.10"),
       "t.yaml:14: clusters[1].nodes[1].port: address 10.1.0.10:17001 is "
       "already used by node 'a0' (line 13)"},
      {Edited("host: 10.1.0.11, port: 17001", "host: 127.0.0.1, port: 17000"),
       "t.yaml:14: clusters[1].nodes[1].port: address 127.0.0.1:17000 is "
       "already used by root 'trainer' (line 3)"},
      {Edited("port: 17001}", "port: 17001, metrics_port: 17001}"),
       "t.yaml:14: clusters[1].nodes[1].metrics_port: address "
       "10.1.0.11:17001 is already used by node 'a1' (line 14)"},
      {Edited("to: rollout-a", "to: rollout-z"),
       "t.yaml:16: links[0].to: unknown cluster 'rollout-z' (clusters: "
       "train, rollout-a)"},
      {Edited("links:\n  - {from: train, to: rollout-a, bandwidth: 3Gbps, "
              "latency: 70ms}\n",
              "links: []\n"),
       "t.yaml:7: clusters[1]: cluster 'rollout-a' is unreachable from the "
       "root's cluster 'train' (add a link)"},
      {Edited("cluster: train", "cluster: gpu"),
       "t.yaml:3: root.cluster: unknown cluster 'gpu' (clusters: train, "
       "rollout-a)"},
      {Edited("to: rollout-a", "to: train"),
       "t.yaml:16: links[0]: a link joins two different clusters, got "
       "'train' twice"},
      {Edited("path: /models/policy.safetensors", "path: \"\""),
       "t.yaml:13: clusters[1].nodes[0].store.path: a file store needs a "
       "path"},
      {Edited("name: a1", "name: a/1"),
       "t.yaml:14: clusters[1].nodes[1].name: name may hold only letters, "
       "digits, '-' and '_', got 'a/1'"},
      {Edited("region: us-west", "region: [us, west]"),
       "t.yaml:8: clusters[1].region: expected a value, got a list"},
      {Edited("    fanout: 4", "    fanout: 4\n    fanout: 5"),
       "t.yaml:10: clusters[1].fanout: duplicate key (first given at line "
       "9)"},
      {Edited("    fanout: 4", "    fanout: 0"),
       "t.yaml:9: clusters[1].fanout: expected an integer 1-64, got '0'"},
      {Edited("version: 1\n", ""), "t.yaml:1: missing required key 'version'"},
      {"- just\n- a list\n", "t.yaml:1: expected a map, got a list"},
      {"", "t.yaml: the file is empty"},
      {Edited("bandwidth: 3Gbps", "bandwidth: 0Gbps"),
       "t.yaml:16: links[0].bandwidth: bandwidth must be positive, got "
       "'0Gbps'"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(TopologyErrorOf(c.text), c.want) << c.text;
  }
}

TEST(ParseTest, MoreErrors) {
  // Syntax errors carry yaml-cpp's line.
  EXPECT_THAT(
      TopologyErrorOf(Edited("  - name: train\n", "  - name: [train\n")),
      StartsWith("t.yaml:"));
  EXPECT_THAT(
      TopologyErrorOf(Edited("  - name: train\n", "  - name: [train\n")),
      HasSubstr("opens a '[' or '{' that is never closed"));
  EXPECT_THAT(
      TopologyErrorOf(Edited("  - name: train\n", "  - name: [train]]\n")),
      HasSubstr("']' closes nothing"));
  EXPECT_THAT(
      TopologyErrorOf(Edited("  - name: train\n", "  - name: {a: b: c}\n")),
      HasSubstr("YAML syntax error"));
  EXPECT_THAT(TopologyErrorOf(std::string(kSampleYaml) + "---\nversion: 1\n"),
              HasSubstr("expected one YAML document, got 2"));
  // Two heads in one cluster.
  std::string two_heads =
      Edited("{name: a1, host: 10.1.0.11, port: 17001}",
             "{name: a1, host: 10.1.0.11, port: 17001, head: true}");
  two_heads.replace(two_heads.find("port: 17001, store"),
                    std::string("port: 17001, store").size(),
                    "port: 17001, head: true, store");
  EXPECT_EQ(TopologyErrorOf(two_heads),
            "t.yaml:14: clusters[1].nodes[1].head: cluster 'rollout-a' has "
            "more than one head");
  // A non-root cluster without nodes.
  EXPECT_EQ(TopologyErrorOf(Edited("  - name: train\n",
                                   "  - name: train\n  - name: empty\n")),
            "t.yaml:6: clusters[1].nodes: cluster 'empty' has no nodes");
  // Duplicate store file on one host.
  EXPECT_EQ(TopologyErrorOf(
                Edited("{name: a1, host: 10.1.0.11, port: 17001}",
                       "{name: a1, host: 10.1.0.10, port: 17002, store: "
                       "{kind: file, path: /models/policy.safetensors}}")),
            "t.yaml:14: clusters[1].nodes[1].store.path: store "
            "file:/models/policy.safetensors on 10.1.0.10 is already used by "
            "node 'a0' (line 13)");
}

TEST(ParseTest, ObjectStoreSourceRoundTripsAndIsChecked) {
  const std::string s3 =
      Edited("    transport: tcp\n",
             "    transport: tcp\n    source: objstore\n") +
      "objstore:\n  kind: s3\n  endpoint: https://s3.eu-west-1.amazonaws.com\n"
      "  region: eu-west-1\n  bucket: rl-refits\n  prefix: dcr/prod/\n"
      "  credentials_file: /etc/dcr/s3.ini\n  profile: ci\n";
  auto t = ParseTopology(s3, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->clusters[1].source, ChunkSource::kObjstore);
  EXPECT_EQ(t->clusters[0].source, ChunkSource::kRelay);
  ASSERT_TRUE(t->objstore.has_value());
  EXPECT_EQ(t->objstore->kind, ObjectStoreKind::kS3);
  EXPECT_EQ(t->objstore->bucket, "rl-refits");
  EXPECT_EQ(t->objstore->profile, "ci");
  auto again = ParseTopology(DumpTopology(*t), "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *t);
  auto j = nlohmann::json::parse(TopologyToJson(*t));
  EXPECT_EQ(j["objstore"]["kind"], "s3");
  EXPECT_EQ(j["clusters"][1]["source"], "objstore");
  auto tree = BuildTree(*t);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_TRUE(tree->nodes[static_cast<size_t>(tree->Find("a0"))].pulls_objects);
  EXPECT_FALSE(
      tree->nodes[static_cast<size_t>(tree->Find("a1"))].pulls_objects);

  const std::string dir = Edited("    transport: tcp\n",
                                 "    transport: tcp\n    source: objstore\n") +
                          "objstore: {kind: dir, path: /mnt/shared/dcr}\n";
  t = ParseTopology(dir, "t.yaml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->objstore->path, "/mnt/shared/dcr");

  // Errors name the key and say what to write.
  EXPECT_EQ(
      TopologyErrorOf(Edited("    transport: tcp\n",
                             "    transport: tcp\n    source: objstore\n")),
      "t.yaml:7: clusters[1].source: cluster 'rollout-a' takes its "
      "chunks from the object store, but the topology has no objstore: "
      "section (kind: dir with a path, or kind: s3 with an endpoint and "
      "a bucket)");
  EXPECT_THAT(
      TopologyErrorOf(Edited("    transport: tcp\n",
                             "    transport: tcp\n    source: bucket\n")),
      HasSubstr("clusters[1].source: expected relay or objstore"));
  EXPECT_THAT(
      TopologyErrorOf(std::string(kSampleYaml) + "objstore: {kind: dir}\n"),
      HasSubstr("objstore.path: an objstore of kind dir needs a path"));
  EXPECT_THAT(TopologyErrorOf(std::string(kSampleYaml) +
                              "objstore: {kind: dir, path: /x, bucket: b}\n"),
              HasSubstr("are for kind s3"));
  EXPECT_THAT(
      TopologyErrorOf(std::string(kSampleYaml) +
                      "objstore: {kind: s3, endpoint: s3.amazonaws.com, "
                      "bucket: b}\n"),
      HasSubstr("objstore.endpoint: expected an http:// or https://"));
  EXPECT_THAT(
      TopologyErrorOf(std::string(kSampleYaml) +
                      "objstore: {kind: s3, endpoint: http://h:9000}\n"),
      HasSubstr("objstore.bucket: kind s3 needs a bucket"));
  EXPECT_THAT(
      TopologyErrorOf(std::string(kSampleYaml) +
                      "objstore: {kind: s3, endpoint: http://h, bucket: b, "
                      "prefix: dcr}\n"),
      HasSubstr("objstore.prefix: a key prefix ends in '/'"));
  EXPECT_THAT(
      TopologyErrorOf(std::string(kSampleYaml) +
                      "objstore: {kind: s3, endpoint: http://h, bucket: b, "
                      "secret_key: x}\n"),
      HasSubstr("objstore.secret_key: unknown key"));
  EXPECT_THAT(TopologyErrorOf(Edited("  - name: train\n    region: us-east\n",
                                     "  - name: train\n    region: us-east\n"
                                     "    source: objstore\n") +
                              "objstore: {kind: dir, path: /x}\n"),
              HasSubstr("the root's own cluster is fed by the root directly"));
}

TEST(ParseTest, LoadFileAndMissingFile) {
  testing::TempDir dir;
  std::string path = dir.Path("t.yaml");
  std::ofstream(path) << kSampleYaml;
  auto t = LoadTopology(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->source, path);
  auto missing = LoadTopology(dir.Path("missing.yaml"));
  EXPECT_TRUE(missing.status().IsNotFound());
  std::ofstream(path) << Edited("port: 17000", "port: x");
  auto bad = LoadTopology(path);
  EXPECT_THAT(std::string(bad.status().message()),
              StartsWith(path + ":3: root.port: expected an integer"));
}

TEST(ParseTest, DeepNestingIsRefusedBeforeYamlCppRecursesIntoIt) {
  // A hostile file of nested flow collections would exhaust yaml-cpp's
  // stack; it is refused with a line number instead.
  std::string deep = "version: 1\nroot: " + std::string(100000, '[');
  auto r = ParseTopology(deep, "deep.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deep.yaml:2"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("nested"), std::string::npos);
  std::string indented = "version: 1\n" + std::string(5000, ' ') + "x: 1\n";
  EXPECT_FALSE(ParseTopology(indented, "indent.yaml").ok());
  // NUL and invalid UTF-8 never reach yaml-cpp (it looped forever on a
  // 19-byte input found by fuzz_topology).
  std::string hang(",# #\0\0\0\0\0\x01\x8d\x81rootoon", 19);
  auto h = ParseTopology(hang, "hang.yaml");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("hang.yaml:1"), std::string::npos)
      << h.status().message();
  // Nor does an unclosed flow collection (another yaml-cpp loop).
  auto u = ParseTopology("version: 1\n  , {froays on this mm: train, tol\n",
                         "unclosed.yaml");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("unclosed.yaml:2: this line opens"),
            std::string::npos)
      << u.status().message();
  // Aliases could expand exponentially: refused, naming the line.
  std::string laughs =
      "version: 1\na: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a]\n";
  auto l = ParseTopology(laughs, "laughs.yaml");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("laughs.yaml:2"), std::string::npos)
      << l.status().message();
  EXPECT_NE(l.status().message().find("aliases"), std::string::npos);
  // A quoted value may start with & or *, and a path may contain them.
  std::string yaml = kSampleYaml;
  size_t at = yaml.find("region: ");
  ASSERT_NE(at, std::string::npos);
  yaml.insert(at + 8, "\"*star&\" #");
  auto ok = ParseTopology(yaml, "quoted-star.yaml");
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  // Brackets inside quotes and comments do not count.
  std::string quoted = "# " + std::string(100, '[') + "\nversion: '" +
                       std::string(100, '[') + "'\n";
  auto q = ParseTopology(quoted, "quoted.yaml");
  ASSERT_FALSE(q.ok());  // not a valid topology, but not for nesting
  EXPECT_EQ(q.status().message().find("nested"), std::string::npos);
}

TEST(ParseTest, TextValuesMustBeUtf8WithoutControlCharacters) {
  // Invalid UTF-8 in a path did not survive a dump and reload (found by
  // fuzz_topology), and JSON output cannot carry it; nor do control
  // characters other than tab and newline belong in a topology.
  std::ifstream in(std::string(DCR_TOPOLOGY_DIR) + "/local.yaml");
  std::string base((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  for (std::string bad :
       {std::string("\"/tmp/a\\x01b\""), std::string("/tmp/\xff\xfe"),
        std::string("/tmp/\xc0\xaf")}) {
    std::string yaml = base;
    size_t at = yaml.find("state_dir: ");
    ASSERT_NE(at, std::string::npos);
    size_t end = yaml.find('\n', at);
    yaml.replace(at, end - at, "state_dir: " + bad);
    auto r = ParseTopology(yaml, "bad.yaml");
    ASSERT_FALSE(r.ok()) << bad;
    // Raw bytes are refused as a line, a YAML escape as the value.
    EXPECT_NE(r.status().message().find("bad.yaml:17"), std::string::npos)
        << r.status().message();
  }
  Topology t = *ParseTopology(base, "local.yaml");
  EXPECT_FALSE(SetValue(&t, "root.baseline", "/tmp/\x01x").ok());
  // UTF-8 text is fine.
  std::string yaml = base;
  size_t at = yaml.find("region: local");
  yaml.replace(at, 13, "region: \"Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac\"");
  EXPECT_TRUE(ParseTopology(yaml, "utf8.yaml").ok());
}

// A value from the environment can be of any length: an error quotes at
// most its first 80 bytes and says how long it was (a 100 KB variable
// echoed whole buried the message).
TEST(ParseTest, ErrorsAbbreviateLongValues) {
  const std::string big(102400, 'x');
  ::setenv("DCR_TOPO_TEST_BIG", big.c_str(), 1);
  const std::string use = "\"${DCR_TOPO_TEST_BIG}\"";
  const std::string with_big_dup =
      std::string(kSampleYaml) +
      "  - name: rollout-b\n"
      "    region: us-west\n"
      "    nodes:\n"
      "      - {name: b0, host: 10.1.0.20, port: 17001, store: {kind: file, "
      "path: " +
      use +
      "}}\n"
      "      - {name: b1, host: 10.1.0.20, port: 17002, store: {kind: file, "
      "path: " +
      use + "}}\n";
  std::string dup = with_big_dup;
  // The sample's links list ends the file; move it after the new cluster.
  const std::string links =
      "links:\n"
      "  - {from: train, to: rollout-a, bandwidth: 3Gbps, latency: 70ms}\n";
  dup.erase(dup.find(links), links.size());
  dup += links + "  - {from: train, to: rollout-b, bandwidth: 3Gbps}\n";
  const std::string texts[] = {
      Edited("port: 17001}", "port: " + use + "}"),
      Edited("bandwidth: 25Gbps", "bandwidth: " + use),
      Edited("latency: 70ms", "latency: " + use),
      Edited("window_bytes: 64MiB", "window_bytes: " + use),
      Edited("fanout: 4", "fanout: " + use),
      Edited("transport: tcp\n", "transport: " + use + "\n"),
      Edited("min_commit: all", "min_commit: " + use),
      Edited("kind: file", "kind: " + use),
      Edited("host: 10.1.0.11", "host: \"h${DCR_TOPO_TEST_BIG}\""),
      Edited("path: /models/policy.safetensors",
             "path: \"/${DCR_TOPO_TEST_BIG}\""),
      Edited("{kind: file, path: /models/policy.safetensors}",
             "{kind: shm, path: \"/a/${DCR_TOPO_TEST_BIG}\"}"),
      // An unterminated ${ quotes the text around it.
      Edited("state_dir: /var/lib/dcr",
             "state_dir: \"${DCR_TOPO_TEST_NOPE:-" + big + "\""),
      dup,
  };
  ::unsetenv("DCR_TOPO_TEST_NOPE");
  for (size_t i = 0; i < std::size(texts); ++i) {
    auto t = ParseTopology(texts[i], "t.yaml");
    if (i == 9) {  // a long file path is valid
      EXPECT_TRUE(t.ok()) << t.status().ToString().substr(0, 300);
      continue;
    }
    ASSERT_FALSE(t.ok()) << i;
    const std::string msg(t.status().message());
    EXPECT_LT(msg.size(), 400u) << i << ": " << msg.substr(0, 400);
    if (i == 8) continue;  // "host is longer than 253 characters"
    EXPECT_THAT(msg, HasSubstr("... (102")) << i << ": " << msg.substr(0, 400);
  }
  ::unsetenv("DCR_TOPO_TEST_BIG");
}

}  // namespace
}  // namespace dcr
