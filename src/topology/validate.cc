// ValidateTopology: the checks that span more than one key.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/printable.h"
#include "dcr/topology.h"
#include "topology/internal.h"

namespace dcr {

const ClusterSpec* Topology::FindCluster(std::string_view name) const {
  for (const ClusterSpec& c : clusters) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const NodeSpec* Topology::FindNode(std::string_view name) const {
  for (const ClusterSpec& c : clusters) {
    for (const NodeSpec& n : c.nodes) {
      if (n.name == name) return &n;
    }
  }
  return nullptr;
}

size_t Topology::NodeCount() const {
  size_t n = 0;
  for (const ClusterSpec& c : clusters) n += c.nodes.size();
  return n;
}

std::string ServingLayoutOf(const ClusterSpec& cluster, const NodeSpec& node) {
  if (!node.serving) return "";
  if (!node.serving->layout.empty()) return node.serving->layout;
  return cluster.serving_layout.value_or("");
}

namespace {

using topology_internal::CheckHost;
using topology_internal::CheckName;

std::string AtLine(int line) {
  return line > 0 ? " (line " + std::to_string(line) + ")" : "";
}

class Validator {
 public:
  explicit Validator(const Topology& t) : t_(t) {}

  Status Run() {
    DCR_RETURN_IF_ERROR(Root());
    DCR_RETURN_IF_ERROR(Objstore());
    DCR_RETURN_IF_ERROR(Clusters());
    DCR_RETURN_IF_ERROR(Links());
    DCR_RETURN_IF_ERROR(Reachable());
    return Defaults();
  }

 private:
  Status Err(int line, const std::string& path, const std::string& msg) const {
    return topology_internal::Error(t_.source, line, path, msg);
  }

  // Claims `host:port` for `who`; an error if another endpoint has it.
  Status Endpoint(const std::string& host, uint16_t port,
                  const std::string& who, int line, const std::string& path) {
    std::string ep = host + ":" + std::to_string(port);
    auto [it, fresh] = endpoints_.emplace(ep, who);
    if (!fresh) {
      return Err(line, path,
                 "address " + ep + " is already used by " + it->second);
    }
    return Status::OK();
  }

  Status Root() {
    const RootSpec& r = t_.root;
    int line = r.loc.line;
    if (std::string why = CheckName(r.name); !why.empty()) {
      return Err(line, "root.name", "name " + why);
    }
    if (std::string why = CheckHost(r.host); !why.empty()) {
      return Err(line, "root.host", "host " + why);
    }
    if (r.port == 0) return Err(line, "root.port", "port must be 1-65535");
    for (auto [key, value] : {std::pair{"root.state_dir", &r.state_dir},
                              std::pair{"root.baseline", &r.baseline}}) {
      if (std::string why = topology_internal::CheckText(*value);
          !why.empty()) {
        return Err(line, key, "the value " + why);
      }
    }
    if (t_.FindCluster(r.cluster) == nullptr) {
      return Err(line, "root.cluster",
                 "unknown cluster '" + r.cluster + "'" + KnownClusters());
    }
    names_.emplace(r.name, "the root's name");
    return Endpoint(r.host, r.port, "root '" + r.name + "'" + AtLine(line),
                    line, "root.port");
  }

  std::string KnownClusters() const {
    std::string out;
    for (const ClusterSpec& c : t_.clusters) {
      out += (out.empty() ? " (clusters: " : ", ") + c.name;
    }
    return out.empty() ? out : out + ")";
  }

  Status Clusters() {
    if (t_.clusters.empty()) {
      return Err(0, "clusters", "expected at least one cluster");
    }
    std::map<std::string, int> cluster_lines;
    // Store paths per host: two relays on one host must not share a file
    // or a shared-memory object.
    std::map<std::string, std::string> stores;
    for (size_t ci = 0; ci < t_.clusters.size(); ++ci) {
      const ClusterSpec& c = t_.clusters[ci];
      std::string cp = "clusters[" + std::to_string(ci) + "]";
      int cline = c.loc.line;
      if (std::string why = topology_internal::CheckText(c.region);
          !why.empty()) {
        return Err(cline, cp + ".region", "the value " + why);
      }
      if (std::string why = CheckName(c.name); !why.empty()) {
        return Err(cline, cp + ".name", "name " + why);
      }
      auto [it, fresh] = cluster_lines.emplace(c.name, cline);
      if (!fresh) {
        return Err(cline, cp + ".name",
                   "duplicate cluster name '" + c.name + "'" +
                       (it->second > 0 ? " (first defined at line " +
                                             std::to_string(it->second) + ")"
                                       : ""));
      }
      if (c.fanout && (*c.fanout < 1 || *c.fanout > 64)) {
        return Err(cline, cp + ".fanout", "fanout must be 1-64");
      }
      if (c.bandwidth_bps && *c.bandwidth_bps == 0) {
        return Err(cline, cp + ".bandwidth", "bandwidth must be positive");
      }
      if (c.nodes.empty() && c.name != t_.root.cluster) {
        return Err(cline, cp + ".nodes",
                   "cluster '" + c.name + "' has no nodes");
      }
      if (c.serving_layout) {
        DCR_RETURN_IF_ERROR(
            LayoutPath(*c.serving_layout, cline, cp + ".serving.layout"));
      }
      int heads = 0;
      bool serves = false;
      for (size_t ni = 0; ni < c.nodes.size(); ++ni) {
        const NodeSpec& n = c.nodes[ni];
        std::string np = cp + ".nodes[" + std::to_string(ni) + "]";
        DCR_RETURN_IF_ERROR(Node(n, np, &stores));
        DCR_RETURN_IF_ERROR(Serving(c, n, np));
        serves = serves || n.serving.has_value();
        if (n.head && ++heads > 1) {
          return Err(n.loc.line, np + ".head",
                     "cluster '" + c.name + "' has more than one head");
        }
      }
      if (c.source == ChunkSource::kObjstore) {
        if (!t_.objstore) {
          return Err(cline, cp + ".source",
                     "cluster '" + c.name +
                         "' takes its chunks from the object store, but the "
                         "topology has no objstore: section (kind: dir with "
                         "a path, or kind: s3 with an endpoint and a bucket)");
        }
        if (c.name == t_.root.cluster) {
          return Err(cline, cp + ".source",
                     "the root's own cluster is fed by the root directly; "
                     "source: objstore is for clusters behind a WAN link");
        }
      }
      if (c.serving_layout && !serves) {
        return Err(cline, cp + ".serving",
                   "cluster '" + c.name +
                       "' has a serving layout but none of its nodes serves "
                       "(add serving: {rank: N} to each node that serves)");
      }
    }
    if (t_.NodeCount() == 0) {
      return Err(0, "clusters", "the topology has no relay nodes");
    }
    return Status::OK();
  }

  Status Objstore() {
    if (!t_.objstore) return Status::OK();
    const ObjectStoreSpec& o = *t_.objstore;
    const int line = o.loc.line;
    auto text = [&](const std::string& v, const char* key) -> Status {
      if (std::string why = topology_internal::CheckText(v); !why.empty()) {
        return Err(line, std::string("objstore.") + key, "the value " + why);
      }
      return Status::OK();
    };
    for (auto [v, key] :
         {std::pair{&o.path, "path"}, std::pair{&o.endpoint, "endpoint"},
          std::pair{&o.region, "region"}, std::pair{&o.bucket, "bucket"},
          std::pair{&o.prefix, "prefix"},
          std::pair{&o.credentials_file, "credentials_file"},
          std::pair{&o.profile, "profile"}}) {
      DCR_RETURN_IF_ERROR(text(*v, key));
    }
    if (o.kind == ObjectStoreKind::kDir) {
      if (o.path.empty()) {
        return Err(line, "objstore.path",
                   "an objstore of kind dir needs a path (a directory every "
                   "root and cluster head mounts)");
      }
      if (!o.endpoint.empty() || !o.bucket.empty() || !o.prefix.empty() ||
          !o.region.empty() || !o.credentials_file.empty() ||
          !o.profile.empty()) {
        return Err(line, "objstore",
                   "endpoint, region, bucket, prefix, credentials_file and "
                   "profile are for kind s3; kind dir takes a path");
      }
      return Status::OK();
    }
    if (!o.path.empty()) {
      return Err(line, "objstore.path",
                 "kind s3 takes an endpoint and a bucket, not a path");
    }
    if (o.endpoint.rfind("http://", 0) != 0 &&
        o.endpoint.rfind("https://", 0) != 0) {
      return Err(line, "objstore.endpoint",
                 "expected an http:// or https:// URL (e.g. "
                 "https://s3.us-east-1.amazonaws.com), got '" +
                     o.endpoint + "'");
    }
    if (o.bucket.empty()) {
      return Err(line, "objstore.bucket", "kind s3 needs a bucket");
    }
    if (!o.prefix.empty() && o.prefix.back() != '/') {
      return Err(line, "objstore.prefix",
                 "a key prefix ends in '/' (e.g. '" + o.prefix + "/')");
    }
    return Status::OK();
  }

  // A serving layout path: non-empty text.
  Status LayoutPath(const std::string& layout, int line,
                    const std::string& path) const {
    if (layout.empty()) {
      return Err(line, path, "expected the path of a layout file, got ''");
    }
    if (std::string why = topology_internal::CheckText(layout); !why.empty()) {
      return Err(line, path, "the value " + why);
    }
    return Status::OK();
  }

  // The serving rank of node `n` of cluster `c`, if it serves.
  Status Serving(const ClusterSpec& c, const NodeSpec& n,
                 const std::string& np) const {
    if (!n.serving) return Status::OK();
    const ServingSpec& s = *n.serving;
    int line = s.loc.line > 0 ? s.loc.line : n.loc.line;
    std::string sp = np + ".serving";
    if (!s.layout.empty()) {
      DCR_RETURN_IF_ERROR(LayoutPath(s.layout, line, sp + ".layout"));
    } else if (ServingLayoutOf(c, n).empty()) {
      return Err(line, sp,
                 "missing key 'layout' (give it here or in the cluster's "
                 "serving: {layout: PATH})");
    }
    if (s.rank > kMaxServingRank) {
      return Err(line, sp + ".rank",
                 "expected an integer 0-" + std::to_string(kMaxServingRank) +
                     ", got '" + std::to_string(s.rank) + "'");
    }
    return Status::OK();
  }

  Status Node(const NodeSpec& n, const std::string& np,
              std::map<std::string, std::string>* stores) {
    int line = n.loc.line;
    if (std::string why = CheckName(n.name); !why.empty()) {
      return Err(line, np + ".name", "name " + why);
    }
    if (std::string why = CheckHost(n.host); !why.empty()) {
      return Err(line, np + ".host", "host " + why);
    }
    if (n.port == 0) return Err(line, np + ".port", "port must be 1-65535");
    if (std::string why = topology_internal::CheckText(n.store.path);
        !why.empty()) {
      return Err(line, np + ".store.path", "the value " + why);
    }
    std::string who = "node '" + n.name + "'" + AtLine(line);
    auto [it, fresh] = names_.emplace(
        n.name, line > 0 ? "first defined at line " + std::to_string(line)
                         : "defined before");
    if (!fresh) {
      return Err(line, np + ".name",
                 "duplicate node name '" + n.name + "' (" + it->second + ")");
    }
    DCR_RETURN_IF_ERROR(Endpoint(n.host, n.port, who, line, np + ".port"));
    if (n.metrics_port) {
      if (*n.metrics_port == 0) {
        return Err(line, np + ".metrics_port", "port must be 1-65535");
      }
      DCR_RETURN_IF_ERROR(Endpoint(n.host, *n.metrics_port, who + " (metrics)",
                                   line, np + ".metrics_port"));
    }
    const StoreLocation& s = n.store;
    if (n.serving && !n.serving->socket.empty() && s.kind != StoreKind::kShm) {
      return Err(line, np + ".serving.socket",
                 "a serving process maps the relay's store: give the node a "
                 "shm store (store: {kind: shm, path: NAME})");
    }
    if (s.kind == StoreKind::kMemory) {
      if (!s.path.empty()) {
        return Err(line, np + ".store.path", "a memory store takes no path");
      }
      return Status::OK();
    }
    if (s.path.empty()) {
      return Err(
          line, np + ".store.path",
          "a " + std::string(StoreKindName(s.kind)) + " store needs a path");
    }
    if (s.kind == StoreKind::kShm) {
      std::string_view name = s.path;
      if (name[0] == '/') name.remove_prefix(1);
      if (name.empty() || name.size() > 254 ||
          name.find('/') != std::string_view::npos) {
        return Err(line, np + ".store.path",
                   "a shm store path is a shared-memory object name like "
                   "/dcr-a0 (one '/' at most, at the start), got '" +
                       Abbreviated(s.path) + "'");
      }
    }
    std::string key =
        n.host + " " + std::string(StoreKindName(s.kind)) + ":" + s.path;
    auto [sit, sfresh] = stores->emplace(key, who);
    if (!sfresh) {
      return Err(line, np + ".store.path",
                 "store " + std::string(StoreKindName(s.kind)) + ":" +
                     Abbreviated(s.path) + " on " + n.host +
                     " is already used by " + sit->second);
    }
    return Status::OK();
  }

  Status Links() {
    std::set<std::pair<std::string, std::string>> pairs;
    for (size_t i = 0; i < t_.links.size(); ++i) {
      const LinkSpec& l = t_.links[i];
      std::string lp = "links[" + std::to_string(i) + "]";
      int line = l.loc.line;
      for (const auto& [end, key] :
           {std::pair{&l.from, ".from"}, std::pair{&l.to, ".to"}}) {
        if (t_.FindCluster(*end) == nullptr) {
          return Err(line, lp + key,
                     "unknown cluster '" + *end + "'" + KnownClusters());
        }
      }
      if (l.from == l.to) {
        return Err(
            line, lp,
            "a link joins two different clusters, got '" + l.from + "' twice");
      }
      if (l.bandwidth_bps == 0) {
        return Err(line, lp + ".bandwidth", "bandwidth must be positive");
      }
      auto key = std::minmax(l.from, l.to);
      if (!pairs.emplace(key.first, key.second).second) {
        return Err(line, lp,
                   "duplicate link between '" + l.from + "' and '" + l.to +
                       "' (links are undirected)");
      }
    }
    return Status::OK();
  }

  Status Reachable() {
    std::set<std::string> seen{t_.root.cluster};
    bool grew = true;
    while (grew) {
      grew = false;
      for (const LinkSpec& l : t_.links) {
        bool a = seen.count(l.from) > 0, b = seen.count(l.to) > 0;
        if (a != b) {
          seen.insert(a ? l.to : l.from);
          grew = true;
        }
      }
    }
    for (size_t i = 0; i < t_.clusters.size(); ++i) {
      const ClusterSpec& c = t_.clusters[i];
      if (seen.count(c.name) == 0) {
        return Err(c.loc.line, "clusters[" + std::to_string(i) + "]",
                   "cluster '" + c.name +
                       "' is unreachable from the root's cluster '" +
                       t_.root.cluster + "' (add a link)");
      }
    }
    return Status::OK();
  }

  Status Defaults() {
    const TopologyDefaults& d = t_.defaults;
    if (d.fanout < 1 || d.fanout > 64) {
      return Err(0, "defaults.fanout", "fanout must be 1-64");
    }
    if (d.span_elems == 0) {
      return Err(0, "defaults.span_elems", "span_elems must be positive");
    }
    if (d.window_bytes == 0) {
      return Err(0, "defaults.window_bytes", "window must be positive");
    }
    if (d.apply_threads > kMaxApplyThreads) {
      return Err(0, "defaults.apply_threads",
                 "apply_threads must be 1-" + std::to_string(kMaxApplyThreads));
    }
    for (auto [key, value] :
         {std::pair<const char*, const std::string*>{"defaults.auth_key_file",
                                                     &d.auth_key_file},
          {"defaults.tls_ca_file", &d.tls_ca_file},
          {"defaults.tls_cert_file", &d.tls_cert_file},
          {"defaults.tls_key_file", &d.tls_key_file},
          {"defaults.signing_public_key_file", &d.signing_public_key_file},
          {"root.signing_key_file", &t_.root.signing_key_file}}) {
      if (std::string why = topology_internal::CheckText(*value);
          !why.empty()) {
        return Err(0, key, "the value " + why);
      }
    }

    if (d.min_commit > t_.NodeCount()) {
      return Err(0, "defaults.min_commit",
                 "min_commit " + std::to_string(d.min_commit) +
                     " exceeds the number of relays (" +
                     std::to_string(t_.NodeCount()) + ")");
    }
    return Status::OK();
  }

  const Topology& t_;
  std::map<std::string, std::string> endpoints_;  // host:port -> who
  std::map<std::string, std::string> names_;      // node name -> who
};

}  // namespace

Status ValidateTopology(const Topology& topo) {
  if (topo.version != kTopologyVersion) {
    return topology_internal::Error(
        topo.source, 0, "version",
        "unsupported topology version " + std::to_string(topo.version));
  }
  return Validator(topo).Run();
}

}  // namespace dcr
