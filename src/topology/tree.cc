// BuildTree and the tree renderers.
#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcr/topology.h"

namespace dcr {

int Tree::Find(std::string_view name) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Tree::Subtree(int index) const {
  std::vector<int> out;
  if (index < 0 || static_cast<size_t>(index) >= nodes.size()) return out;
  std::vector<int> stack{index};
  while (!stack.empty()) {
    int i = stack.back();
    stack.pop_back();
    out.push_back(i);
    const auto& ch = nodes[static_cast<size_t>(i)].children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
  return out;
}

std::vector<int> Tree::PathToRoot(int index) const {
  std::vector<int> out;
  while (index >= 0 && static_cast<size_t>(index) < nodes.size()) {
    out.push_back(index);
    index = nodes[static_cast<size_t>(index)].parent;
  }
  return out;
}

int Tree::Depth() const {
  int d = 0;
  for (const TreeNode& n : nodes) d = std::max(d, n.depth);
  return d;
}

namespace {

constexpr uint32_t kMaxSizedFanout = 16;
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// The widest-path tree over clusters: for each cluster the link it is
// reached through and the bottleneck bandwidth from the root's cluster.
struct ClusterRoute {
  bool reached = false;
  int via_link = -1;
  int upstream = -1;
  uint64_t bottleneck = 0;
  uint64_t latency = 0;
  int hops = 0;
};

// Modified Dijkstra: maximize the bottleneck; ties go to lower total
// latency, then fewer hops, then the earlier link. Returns clusters in the
// order they were settled.
std::vector<int> WidestPaths(const Topology& t, int root,
                             std::vector<ClusterRoute>* routes) {
  size_t n = t.clusters.size();
  std::map<std::string, int> index;
  for (size_t i = 0; i < n; ++i) {
    index[t.clusters[i].name] = static_cast<int>(i);
  }
  std::vector<ClusterRoute>& r = *routes;
  r.assign(n, ClusterRoute{});
  std::vector<bool> done(n, false);
  r[static_cast<size_t>(root)] = {true, -1, -1, kUnbounded, 0, 0};
  std::vector<int> order;
  auto better = [](const ClusterRoute& a, const ClusterRoute& b) {
    if (!b.reached) return a.reached;
    if (!a.reached) return false;
    if (a.bottleneck != b.bottleneck) return a.bottleneck > b.bottleneck;
    if (a.latency != b.latency) return a.latency < b.latency;
    if (a.hops != b.hops) return a.hops < b.hops;
    return a.via_link < b.via_link;
  };
  while (true) {
    int u = -1;
    for (size_t i = 0; i < n; ++i) {
      if (done[i] || !r[i].reached) continue;
      if (u < 0 || better(r[i], r[static_cast<size_t>(u)])) {
        u = static_cast<int>(i);
      }
    }
    if (u < 0) break;
    done[static_cast<size_t>(u)] = true;
    order.push_back(u);
    const ClusterRoute& ru = r[static_cast<size_t>(u)];
    for (size_t li = 0; li < t.links.size(); ++li) {
      const LinkSpec& l = t.links[li];
      int a = index.at(l.from), b = index.at(l.to);
      int v = a == u ? b : b == u ? a : -1;
      if (v < 0 || done[static_cast<size_t>(v)]) continue;
      ClusterRoute cand{true,
                        static_cast<int>(li),
                        u,
                        std::min(ru.bottleneck, l.bandwidth_bps),
                        ru.latency + l.latency_ns,
                        ru.hops + 1};
      if (better(cand, r[static_cast<size_t>(v)])) {
        r[static_cast<size_t>(v)] = cand;
      }
    }
  }
  return order;
}

TreeNode MakeNode(const NodeSpec& n, const ClusterSpec& c) {
  TreeNode t;
  t.name = n.name;
  t.cluster = c.name;
  t.region = c.region;
  t.host = n.host;
  t.port = n.port;
  t.store = n.store;
  if (n.serving) {
    t.serving = n.serving;
    t.serving->layout = ServingLayoutOf(c, n);
  }
  return t;
}

}  // namespace

Result<Tree> BuildTree(const Topology& topo) {
  DCR_RETURN_IF_ERROR(ValidateTopology(topo));
  int root_cluster = -1;
  for (size_t i = 0; i < topo.clusters.size(); ++i) {
    if (topo.clusters[i].name == topo.root.cluster) {
      root_cluster = static_cast<int>(i);
    }
  }
  std::vector<ClusterRoute> routes;
  std::vector<int> order = WidestPaths(topo, root_cluster, &routes);
  if (order.size() != topo.clusters.size()) {
    return Status::Internal(
        "topology passed validation with an unreachable "
        "cluster");
  }

  Tree tree;
  const ClusterSpec& rc = topo.clusters[static_cast<size_t>(root_cluster)];
  TreeNode root;
  root.name = topo.root.name;
  root.cluster = rc.name;
  root.region = rc.region;
  root.host = topo.root.host;
  root.port = topo.root.port;
  root.transport = topo.defaults.transport;
  tree.nodes.push_back(root);
  // Head node index per cluster.
  std::vector<int> head_of(topo.clusters.size(), -1);

  auto attach = [&](TreeNode node, int parent) {
    TreeNode& p = tree.nodes[static_cast<size_t>(parent)];
    node.parent = parent;
    node.depth = p.depth + 1;
    int idx = static_cast<int>(tree.nodes.size());
    p.children.push_back(idx);
    tree.nodes.push_back(std::move(node));
    return idx;
  };

  for (int ci : order) {
    const ClusterSpec& c = topo.clusters[static_cast<size_t>(ci)];
    const ClusterRoute& route = routes[static_cast<size_t>(ci)];
    const LinkSpec* link =
        route.via_link >= 0 ? &topo.links[static_cast<size_t>(route.via_link)]
                            : nullptr;
    TreeCluster tc;
    tc.name = c.name;
    tc.region = c.region;
    tc.link = route.via_link;
    if (route.upstream >= 0) {
      tc.upstream = topo.clusters[static_cast<size_t>(route.upstream)].name;
    }
    // The stream entering the cluster: the WAN path's bottleneck, or the
    // LAN itself for the root's cluster.
    tc.stream_bps = link ? route.bottleneck : c.bandwidth_bps.value_or(0);
    uint32_t k = topo.defaults.fanout;
    if (c.fanout) {
      k = *c.fanout;
    } else if (c.bandwidth_bps && tc.stream_bps > 0) {
      uint64_t q = *c.bandwidth_bps / tc.stream_bps;
      k = static_cast<uint32_t>(std::clamp<uint64_t>(q, 1, kMaxSizedFanout));
    }
    tc.fanout = k;
    if (c.nodes.empty()) {
      tree.clusters.push_back(tc);
      continue;
    }
    // Head first, then the others in listed order.
    std::vector<const NodeSpec*> members;
    for (const NodeSpec& n : c.nodes) {
      if (n.head) members.push_back(&n);
    }
    if (members.empty()) members.push_back(&c.nodes[0]);
    for (const NodeSpec& n : c.nodes) {
      if (&n != members[0]) members.push_back(&n);
    }
    int feeder = 0;
    if (route.upstream >= 0 && route.upstream != root_cluster) {
      feeder = head_of[static_cast<size_t>(route.upstream)];
    }
    TreeNode head = MakeNode(*members[0], c);
    head.fanout = k;
    head.pulls_objects = c.source == ChunkSource::kObjstore;
    if (head.pulls_objects && feeder != 0) {
      return Status::InvalidArgument(
          topo.source + ": cluster '" + c.name +
          "' takes its chunks from the object store, but the tree feeds it "
          "from cluster '" +
          tc.upstream +
          "', not from the root: only clusters the root feeds directly can "
          "(link it to the root's cluster '" +
          topo.root.cluster + "', or give it source: relay)");
    }
    head.transport = members[0]->transport.value_or(c.transport.value_or(
        link && link->transport ? *link->transport : topo.defaults.transport));
    if (link) {
      head.link = LinkClass::kWan;
      head.link_bandwidth_bps = link->bandwidth_bps;
      head.link_latency_ns = link->latency_ns;
    } else {
      head.link = LinkClass::kLan;
      head.link_bandwidth_bps = c.bandwidth_bps.value_or(0);
    }
    std::vector<int> placed{attach(std::move(head), feeder)};
    head_of[static_cast<size_t>(ci)] = placed[0];
    tc.head = placed[0];
    // Member i (i >= 1) hangs under member (i - 1) / k: a k-ary tree
    // filled breadth-first; k = 1 is a chain.
    for (size_t i = 1; i < members.size(); ++i) {
      TreeNode tn = MakeNode(*members[i], c);
      tn.fanout = k;
      tn.transport = members[i]->transport.value_or(
          c.transport.value_or(topo.defaults.transport));
      tn.link = LinkClass::kLan;
      tn.link_bandwidth_bps = c.bandwidth_bps.value_or(0);
      placed.push_back(attach(std::move(tn), placed[(i - 1) / k]));
    }
    tree.clusters.push_back(tc);
  }
  tree.nodes[0].fanout = static_cast<uint32_t>(tree.nodes[0].children.size());
  return tree;
}

namespace {

std::string LinkLabel(const TreeNode& n) {
  std::string s(LinkClassName(n.link));
  s += " ";
  s += n.link_bandwidth_bps ? FormatBandwidth(n.link_bandwidth_bps) : "?bps";
  if (n.link_latency_ns) s += " " + FormatDuration(n.link_latency_ns);
  return s;
}

std::string StoreLabel(const std::optional<StoreLocation>& s) {
  if (!s) return "";
  std::string out(StoreKindName(s->kind));
  if (!s->path.empty()) out += ":" + s->path;
  return out;
}

void TextLine(const Tree& tree, int i, const std::string& prefix, bool last,
              bool top, std::string* out) {
  const TreeNode& n = tree.nodes[static_cast<size_t>(i)];
  std::string line = prefix;
  if (!top) line += last ? "\u2514\u2500 " : "\u251c\u2500 ";
  line += n.name + "  " + n.host + ":" + std::to_string(n.port) + "  [" +
          n.cluster + (n.region.empty() ? "" : "/" + n.region) + "]";
  if (top) {
    line += "  root";
  } else {
    line += "  <- " + LinkLabel(n) + " " +
            std::string(TransportKindName(n.transport));
    if (n.pulls_objects) line += " (control; chunks from the objstore)";
    line += "  " + StoreLabel(n.store);
    if (n.serving) {
      line += "  serving rank " + std::to_string(n.serving->rank) + " of " +
              n.serving->layout;
    }
  }
  *out += line + "\n";
  std::string child_prefix = top ? "" : prefix + (last ? "   " : "\u2502  ");
  for (size_t c = 0; c < n.children.size(); ++c) {
    TextLine(tree, n.children[c], child_prefix, c + 1 == n.children.size(),
             false, out);
  }
}

std::string DotId(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string RenderTreeText(const Tree& tree) {
  std::string out;
  if (tree.nodes.empty()) return out;
  TextLine(tree, 0, "", true, true, &out);
  return out;
}

std::string RenderTreeDot(const Tree& tree) {
  std::string out =
      "digraph dcr_tree {\n"
      "  rankdir=TB;\n"
      "  node [shape=box, fontname=\"Helvetica\"];\n"
      "  edge [fontname=\"Helvetica\", fontsize=10];\n";
  if (tree.nodes.empty()) return out + "}\n";
  for (const TreeCluster& c : tree.clusters) {
    out += "  subgraph " + DotId("cluster_" + c.name) + " {\n";
    out += "    label=" +
           DotId(c.name + (c.region.empty() ? "" : " (" + c.region + ")") +
                 (c.head >= 0 ? ", fanout " + std::to_string(c.fanout)
                              : std::string())) +
           ";\n";
    for (size_t i = 0; i < tree.nodes.size(); ++i) {
      const TreeNode& n = tree.nodes[i];
      if (n.cluster != c.name) continue;
      std::string label = n.name + "\n" + n.host + ":" + std::to_string(n.port);
      out += "    " + DotId(n.name) + " [label=" + DotId(label) +
             (i == 0 ? ", shape=doubleoctagon" : "") + "];\n";
    }
    out += "  }\n";
  }
  for (size_t i = 1; i < tree.nodes.size(); ++i) {
    const TreeNode& n = tree.nodes[i];
    const TreeNode& p = tree.nodes[static_cast<size_t>(n.parent)];
    std::string label =
        n.link_bandwidth_bps ? FormatBandwidth(n.link_bandwidth_bps) : "?";
    if (n.link_latency_ns) label += " " + FormatDuration(n.link_latency_ns);
    out +=
        "  " + DotId(p.name) + " -> " + DotId(n.name) +
        " [label=" + DotId(label) +
        (n.link == LinkClass::kWan ? ", style=bold, color=\"#c03020\"" : "") +
        (n.pulls_objects ? ", style=dashed" : "") + "];\n";
    if (n.pulls_objects) {
      out += "  objstore [shape=cylinder];\n  objstore -> " + DotId(n.name) +
             " [label=\"chunks\"];\n";
    }
  }
  return out + "}\n";
}

std::string RenderTreeJson(const Tree& tree) {
  using json = nlohmann::ordered_json;
  json nodes = json::array();
  for (size_t i = 0; i < tree.nodes.size(); ++i) {
    const TreeNode& n = tree.nodes[i];
    json store = nullptr;
    if (n.store) {
      store = json{{"kind", std::string(StoreKindName(n.store->kind))},
                   {"path", n.store->path}};
    }
    json serving = nullptr;
    if (n.serving) {
      serving = json{{"layout", n.serving->layout},
                     {"rank", n.serving->rank},
                     {"socket", n.serving->socket}};
    }
    nodes.push_back(
        json{{"index", i},
             {"name", n.name},
             {"cluster", n.cluster},
             {"region", n.region},
             {"host", n.host},
             {"port", n.port},
             {"transport", std::string(TransportKindName(n.transport))},
             {"store", store},
             {"serving", serving},
             {"parent", n.parent},
             {"children", n.children},
             {"depth", n.depth},
             {"link", std::string(LinkClassName(n.link))},
             {"link_bandwidth_bps", n.link_bandwidth_bps},
             {"link_latency_ns", n.link_latency_ns},
             {"fanout", n.fanout},
             {"pulls_objects", n.pulls_objects}});
  }
  json clusters = json::array();
  for (const TreeCluster& c : tree.clusters) {
    clusters.push_back(json{{"name", c.name},
                            {"region", c.region},
                            {"head", c.head},
                            {"upstream", c.upstream},
                            {"link", c.link},
                            {"stream_bps", c.stream_bps},
                            {"fanout", c.fanout}});
  }
  json j{{"root", tree.nodes.empty() ? "" : tree.nodes[0].name},
         {"depth", tree.Depth()},
         {"nodes", nodes},
         {"clusters", clusters}};
  return j.dump(2);
}

}  // namespace dcr
