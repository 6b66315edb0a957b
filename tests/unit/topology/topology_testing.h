// Shared fixtures of the topology tests: a small valid YAML text and a
// generator of random valid topologies.
#ifndef DCR_TESTS_UNIT_TOPOLOGY_TOPOLOGY_TESTING_H_
#define DCR_TESTS_UNIT_TOPOLOGY_TOPOLOGY_TESTING_H_

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "dcr/topology.h"

namespace dcr::testing {

// The message ParseTopology gives for `text` (read as "t.yaml"), which must
// be InvalidArgument; "<parsed>" when it parses.
inline std::string TopologyErrorOf(const std::string& text) {
  auto t = ParseTopology(text, "t.yaml");
  if (t.ok()) return "<parsed>";
  EXPECT_TRUE(t.status().IsInvalidArgument()) << t.status().ToString();
  return std::string(t.status().message());
}

// Line numbers matter: error tests point at them.
inline constexpr const char* kSampleYaml =
    "version: 1\n"  // 1
    "defaults: {transport: tcp, span_elems: 1048576, fanout: 2, "
    "window_bytes: 64MiB, min_commit: all}\n"  // 2
    "root: {name: trainer, host: 127.0.0.1, port: 17000, cluster: train, "
    "state_dir: /var/lib/dcr, baseline: /path/base.safetensors}\n"  // 3
    "clusters:\n"                                                   // 4
    "  - name: train\n"                                             // 5
    "    region: us-east\n"                                         // 6
    "  - name: rollout-a\n"                                         // 7
    "    region: us-west\n"                                         // 8
    "    fanout: 4\n"                                               // 9
    "    bandwidth: 25Gbps\n"                                       // 10
    "    transport: tcp\n"                                          // 11
    "    nodes:\n"                                                  // 12
    "      - {name: a0, host: 10.1.0.10, port: 17001, store: {kind: file, "
    "path: /models/policy.safetensors}, metrics_port: 9101}\n"  // 13
    "      - {name: a1, host: 10.1.0.11, port: 17001}\n"        // 14
    "links:\n"                                                  // 15
    "  - {from: train, to: rollout-a, bandwidth: 3Gbps, latency: 70ms}\n";  // 16

// A random valid topology: 1-7 clusters joined by a random connected set of
// links, 0-3 nodes in the root's cluster, 1-12 in the others, random
// fanouts, bandwidths, heads and transports, sometimes a key file, and
// some clusters whose nodes serve ranks of a layout.
inline Topology RandomTopology(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  Topology t;
  t.source = "random";
  t.defaults.fanout = static_cast<uint32_t>(pick(1, 5));
  t.root = {"root", "10.0.0.1",         17000, "c0", "", "",
            "",     kDefaultKeepDeltas, {}};
  int clusters = pick(1, 7);
  int port = 18000;
  for (int c = 0; c < clusters; ++c) {
    ClusterSpec cs;
    cs.name = "c" + std::to_string(c);
    cs.region = "r" + std::to_string(pick(0, 2));
    if (pick(0, 2) == 0) cs.fanout = static_cast<uint32_t>(pick(1, 6));
    if (pick(0, 1) == 0) {
      cs.bandwidth_bps =
          uint64_t{100000000} * static_cast<uint64_t>(pick(1, 400));
    }
    if (pick(0, 4) == 0) cs.transport = TransportKind::kUcx;
    int nodes = c == 0 ? pick(0, 3) : pick(1, 12);
    if (clusters == 1 && nodes == 0) nodes = 1;
    int head = pick(0, 2) == 0 && nodes > 0 ? pick(0, nodes - 1) : -1;
    for (int n = 0; n < nodes; ++n) {
      NodeSpec ns;
      ns.name = cs.name + "n" + std::to_string(n);
      ns.host = "10.0." + std::to_string(c) + "." + std::to_string(n + 2);
      ns.port = static_cast<uint16_t>(port++);
      if (pick(0, 2) == 0) {
        ns.store = {StoreKind::kFile, "/m/" + ns.name + ".safetensors"};
      }
      if (pick(0, 5) == 0) ns.transport = TransportKind::kTcp;
      if (pick(0, 3) == 0) ns.metrics_port = static_cast<uint16_t>(port++);
      ns.head = n == head;
      cs.nodes.push_back(ns);
    }
    t.clusters.push_back(cs);
  }
  // A random spanning tree, then a few extra links.
  auto bw = [&] {
    return uint64_t{10000000} * static_cast<uint64_t>(pick(1, 300));
  };
  for (int c = 1; c < clusters; ++c) {
    int to = pick(0, c - 1);
    LinkSpec l{"c" + std::to_string(to),
               "c" + std::to_string(c),
               bw(),
               static_cast<uint64_t>(pick(0, 100)) * 1000000,
               std::nullopt,
               {}};
    if (pick(0, 1)) std::swap(l.from, l.to);
    t.links.push_back(l);
  }
  for (int extra = pick(0, clusters); extra > 0; --extra) {
    int a = pick(0, clusters - 1), b = pick(0, clusters - 1);
    if (a == b) continue;
    bool dup = false;
    for (const LinkSpec& l : t.links) {
      std::string x = "c" + std::to_string(a), y = "c" + std::to_string(b);
      dup = dup || (l.from == x && l.to == y) || (l.from == y && l.to == x);
    }
    if (dup) continue;
    LinkSpec l{"c" + std::to_string(a),
               "c" + std::to_string(b),
               bw(),
               static_cast<uint64_t>(pick(0, 100)) * 1000000,
               std::nullopt,
               {}};
    if (pick(0, 3) == 0) l.transport = TransportKind::kUcx;
    t.links.push_back(l);
  }
  if (pick(0, 2) == 0) t.defaults.auth_key_file = "/etc/dcr/frame.key";
  if (pick(0, 2) == 0)
    t.defaults.apply_threads = static_cast<uint32_t>(pick(1, 64));
  // Sometimes an object store (no cluster pulls from it: which clusters
  // the root feeds directly depends on the tree).
  if (pick(0, 3) == 0) {
    ObjectStoreSpec o;
    if (pick(0, 1) == 0) {
      o.path = "/mnt/shared/dcr";
    } else {
      o.kind = ObjectStoreKind::kS3;
      o.endpoint = "http://10.9.0.1:9000";
      o.bucket = "refits";
      if (pick(0, 1) == 0) o.prefix = "dcr/";
      if (pick(0, 1) == 0) o.credentials_file = "/etc/dcr/s3.ini";
    }
    t.objstore = o;
  }
  // Serving clusters: the layout given by the cluster (sometimes overridden
  // by a node) or by each node; the first node always serves.
  for (ClusterSpec& cs : t.clusters) {
    if (cs.nodes.empty() || pick(0, 3) != 0) continue;
    bool by_cluster = pick(0, 1) == 0;
    if (by_cluster) cs.serving_layout = "layouts/" + cs.name + "-serve.yaml";
    for (size_t n = 0; n < cs.nodes.size(); ++n) {
      if (n > 0 && pick(0, 3) == 0) continue;
      ServingSpec s;
      s.rank = static_cast<uint32_t>(n);
      if (!by_cluster || pick(0, 4) == 0) s.layout = "/l/" + cs.name + ".yaml";
      cs.nodes[n].serving = s;
    }
  }
  return t;
}

}  // namespace dcr::testing

#endif  // DCR_TESTS_UNIT_TOPOLOGY_TOPOLOGY_TESTING_H_
