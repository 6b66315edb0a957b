// Edits: AddNode, RemoveNode, SetValue. Each works on a copy and commits
// it only when the copy validates.
#include <string>
#include <utility>

#include "common/printable.h"
#include "dcr/topology.h"
#include "topology/internal.h"

namespace dcr {
namespace {

using topology_internal::ClosestKey;
using topology_internal::JoinKeys;
using topology_internal::kDefaultsKeys;
using topology_internal::kRootKeys;

using Keys = std::span<const std::string_view>;

constexpr std::string_view kClusterKeys[] = {"name", "region", "fanout",
                                             "bandwidth", "transport"};
constexpr std::string_view kNodeKeys[] = {
    "name", "host",  "port",       "metrics_port", "transport",
    "head", "store", "store.kind", "store.path"};
constexpr std::string_view kLinkKeys[] = {"from", "to", "bandwidth", "latency",
                                          "transport"};

Status Commit(Topology* topo, Topology edited) {
  DCR_RETURN_IF_ERROR(ValidateTopology(edited));
  *topo = std::move(edited);
  return Status::OK();
}

Status KeyError(const Topology& t, std::string_view key, std::string_view msg) {
  return topology_internal::Error(t.source, 0, key, msg);
}

Status UnknownField(const Topology& t, std::string_view key,
                    std::string_view field, Keys known) {
  std::string msg = "unknown key '" + Abbreviated(field) + "'";
  std::string near = ClosestKey(field, known);
  msg += near.empty() ? " (known keys: " + JoinKeys(known) + ")"
                      : " (did you mean '" + near + "'?)";
  return KeyError(t, key, msg);
}

// Parses `value` with `parse` into *out, locating errors at `key`.
template <typename T, typename Fn>
Status Assign(const Topology& t, std::string_view key, std::string_view value,
              Fn parse, T* out) {
  auto v = parse(value);
  if (!v.ok()) return KeyError(t, key, v.status().message());
  *out = std::move(*v);
  return Status::OK();
}

// Like Assign, but an empty value resets *out.
template <typename T, typename Fn>
Status AssignOptional(const Topology& t, std::string_view key,
                      std::string_view value, Fn parse, std::optional<T>* out) {
  if (value.empty()) {
    out->reset();
    return Status::OK();
  }
  T v{};
  DCR_RETURN_IF_ERROR(Assign(t, key, value, parse, &v));
  *out = v;
  return Status::OK();
}

Result<std::string> Text(std::string_view s) { return std::string(s); }
Result<uint32_t> KeepDeltas(std::string_view s) {
  DCR_ASSIGN_OR_RETURN(uint64_t v, topology_internal::ParseUint(s, 0, 1024));
  return static_cast<uint32_t>(v);
}

Result<uint32_t> Fanout(std::string_view s) {
  DCR_ASSIGN_OR_RETURN(uint64_t v, topology_internal::ParseUint(s, 1, 64));
  return static_cast<uint32_t>(v);
}
Result<uint64_t> SpanElems(std::string_view s) {
  return topology_internal::ParseUint(s, 1, 1ull << 32);
}

// Parses "name.rest" or "[i].rest" after a list key; sets *sel to the name
// or index text and *rest to what follows the dot.
bool SplitSelector(std::string_view s, bool* indexed, std::string_view* sel,
                   std::string_view* rest) {
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() ||
        s[close + 1] != '.') {
      return false;
    }
    *indexed = true;
    *sel = s.substr(1, close - 1);
    *rest = s.substr(close + 2);
    return true;
  }
  if (s.empty() || s[0] != '.') return false;
  s.remove_prefix(1);
  size_t dot = s.find('.');
  if (dot == std::string_view::npos) return false;
  *indexed = false;
  *sel = s.substr(0, dot);
  *rest = s.substr(dot + 1);
  return true;
}

Status SetDefaults(Topology* t, std::string_view key, std::string_view field,
                   std::string_view v) {
  TopologyDefaults& d = t->defaults;
  if (field == "transport") {
    return Assign(*t, key, v, topology_internal::ParseTransport, &d.transport);
  }
  if (field == "span_elems")
    return Assign(*t, key, v, SpanElems, &d.span_elems);
  if (field == "fanout") return Assign(*t, key, v, Fanout, &d.fanout);
  if (field == "window_bytes") {
    return Assign(*t, key, v, ParseSize, &d.window_bytes);
  }
  if (field == "min_commit") {
    return Assign(*t, key, v, topology_internal::ParseMinCommit, &d.min_commit);
  }
  if (field == "apply_threads") {
    return Assign(*t, key, v, topology_internal::ParseApplyThreads,
                  &d.apply_threads);
  }
  if (field == "auth_key_file") {
    return Assign(*t, key, v, Text, &d.auth_key_file);
  }
  if (field == "tls_ca_file") return Assign(*t, key, v, Text, &d.tls_ca_file);
  if (field == "tls_cert_file") {
    return Assign(*t, key, v, Text, &d.tls_cert_file);
  }
  if (field == "tls_key_file") {
    return Assign(*t, key, v, Text, &d.tls_key_file);
  }
  if (field == "signing_public_key_file") {
    return Assign(*t, key, v, Text, &d.signing_public_key_file);
  }
  return UnknownField(*t, key, field, kDefaultsKeys);
}

Status SetRoot(Topology* t, std::string_view key, std::string_view field,
               std::string_view v) {
  RootSpec& r = t->root;
  if (field == "name") return Assign(*t, key, v, Text, &r.name);
  if (field == "host") return Assign(*t, key, v, Text, &r.host);
  if (field == "port") {
    return Assign(*t, key, v, topology_internal::ParsePort, &r.port);
  }
  if (field == "cluster") return Assign(*t, key, v, Text, &r.cluster);
  if (field == "state_dir") return Assign(*t, key, v, Text, &r.state_dir);
  if (field == "baseline") return Assign(*t, key, v, Text, &r.baseline);
  if (field == "signing_key_file") {
    return Assign(*t, key, v, Text, &r.signing_key_file);
  }
  if (field == "keep_deltas") {
    if (v.empty()) {
      r.keep_deltas = kDefaultKeepDeltas;
      return Status::OK();
    }
    return Assign(*t, key, v, KeepDeltas, &r.keep_deltas);
  }
  return UnknownField(*t, key, field, kRootKeys);
}

Status SetCluster(Topology* t, ClusterSpec* c, std::string_view key,
                  std::string_view field, std::string_view v) {
  if (field == "name") {
    std::string old = c->name;
    std::string name(v);
    // A rename carries its references along.
    if (t->root.cluster == old) t->root.cluster = name;
    for (LinkSpec& l : t->links) {
      if (l.from == old) l.from = name;
      if (l.to == old) l.to = name;
    }
    c->name = name;
    return Status::OK();
  }
  if (field == "region") return Assign(*t, key, v, Text, &c->region);
  if (field == "fanout") return AssignOptional(*t, key, v, Fanout, &c->fanout);
  if (field == "bandwidth") {
    return AssignOptional(*t, key, v, ParseBandwidth, &c->bandwidth_bps);
  }
  if (field == "transport") {
    return AssignOptional(*t, key, v, topology_internal::ParseTransport,
                          &c->transport);
  }
  return UnknownField(*t, key, field, kClusterKeys);
}

Status SetNode(Topology* t, NodeSpec* n, std::string_view key,
               std::string_view field, std::string_view v) {
  if (field == "name") return Assign(*t, key, v, Text, &n->name);
  if (field == "host") return Assign(*t, key, v, Text, &n->host);
  if (field == "port") {
    return Assign(*t, key, v, topology_internal::ParsePort, &n->port);
  }
  if (field == "metrics_port") {
    return AssignOptional(*t, key, v, topology_internal::ParsePort,
                          &n->metrics_port);
  }
  if (field == "transport") {
    return AssignOptional(*t, key, v, topology_internal::ParseTransport,
                          &n->transport);
  }
  if (field == "head") {
    return Assign(*t, key, v, topology_internal::ParseBool, &n->head);
  }
  if (field == "store") {
    return Assign(*t, key, v, topology_internal::ParseStoreSpec, &n->store);
  }
  if (field == "store.kind") {
    return Assign(*t, key, v, topology_internal::ParseStoreKind,
                  &n->store.kind);
  }
  if (field == "store.path") return Assign(*t, key, v, Text, &n->store.path);
  return UnknownField(*t, key, field, kNodeKeys);
}

Status SetLink(Topology* t, LinkSpec* l, std::string_view key,
               std::string_view field, std::string_view v) {
  if (field == "from") return Assign(*t, key, v, Text, &l->from);
  if (field == "to") return Assign(*t, key, v, Text, &l->to);
  if (field == "bandwidth") {
    return Assign(*t, key, v, ParseBandwidth, &l->bandwidth_bps);
  }
  if (field == "latency") {
    return Assign(*t, key, v, ParseDurationNs, &l->latency_ns);
  }
  if (field == "transport") {
    return AssignOptional(*t, key, v, topology_internal::ParseTransport,
                          &l->transport);
  }
  return UnknownField(*t, key, field, kLinkKeys);
}

Result<size_t> Index(const Topology& t, std::string_view key,
                     std::string_view sel, size_t size) {
  auto i = topology_internal::ParseUint(sel, 0, 1u << 30);
  if (!i.ok() || *i >= size) {
    return KeyError(t, key,
                    "index [" + std::string(sel) + "] is out of range (" +
                        std::to_string(size) + " entries)");
  }
  return static_cast<size_t>(*i);
}

Status Set(Topology* t, std::string_view key, std::string_view v) {
  auto starts = [&](std::string_view p) {
    return key.substr(0, p.size()) == p;
  };
  if (starts("defaults.")) {
    return SetDefaults(t, key, key.substr(9), v);
  }
  if (starts("root.")) return SetRoot(t, key, key.substr(5), v);
  bool indexed = false;
  std::string_view sel, field;
  if (starts("clusters") &&
      SplitSelector(key.substr(8), &indexed, &sel, &field)) {
    ClusterSpec* c = nullptr;
    if (indexed) {
      DCR_ASSIGN_OR_RETURN(size_t i, Index(*t, key, sel, t->clusters.size()));
      c = &t->clusters[i];
    } else {
      for (ClusterSpec& x : t->clusters) {
        if (x.name == sel) c = &x;
      }
      if (c == nullptr) {
        return KeyError(*t, key, "no cluster named '" + Abbreviated(sel) + "'");
      }
    }
    return SetCluster(t, c, key, field, v);
  }
  if (starts("nodes") && SplitSelector(key.substr(5), &indexed, &sel, &field) &&
      !indexed) {
    for (ClusterSpec& c : t->clusters) {
      for (NodeSpec& n : c.nodes) {
        if (n.name == sel) return SetNode(t, &n, key, field, v);
      }
    }
    return KeyError(*t, key, "no node named '" + Abbreviated(sel) + "'");
  }
  if (starts("links") && SplitSelector(key.substr(5), &indexed, &sel, &field) &&
      indexed) {
    DCR_ASSIGN_OR_RETURN(size_t i, Index(*t, key, sel, t->links.size()));
    return SetLink(t, &t->links[i], key, field, v);
  }
  return KeyError(
      *t, key,
      "unknown key; expected defaults.KEY, root.KEY, clusters.NAME.KEY, "
      "clusters[I].KEY, nodes.NAME.KEY or links[I].KEY");
}

}  // namespace

Status AddNode(Topology* topo, std::string_view cluster, const NodeSpec& node) {
  Topology edited = *topo;
  for (ClusterSpec& c : edited.clusters) {
    if (c.name == cluster) {
      NodeSpec n = node;
      n.loc = SourceLine{};
      if (n.serving) n.serving->loc = SourceLine{};
      c.nodes.push_back(std::move(n));
      return Commit(topo, std::move(edited));
    }
  }
  return topology_internal::Error(
      topo->source, 0, "", "no cluster named '" + Abbreviated(cluster) + "'");
}

Status RemoveNode(Topology* topo, std::string_view name) {
  Topology edited = *topo;
  for (ClusterSpec& c : edited.clusters) {
    for (size_t i = 0; i < c.nodes.size(); ++i) {
      if (c.nodes[i].name == name) {
        c.nodes.erase(c.nodes.begin() + static_cast<ptrdiff_t>(i));
        return Commit(topo, std::move(edited));
      }
    }
  }
  return Status::NotFound(topo->source + ": no node named '" +
                          Abbreviated(name) + "'");
}

Status SetValue(Topology* topo, std::string_view key, std::string_view value) {
  auto expanded = ExpandEnv(value);
  if (!expanded.ok()) {
    return KeyError(*topo, key, expanded.status().message());
  }
  Topology edited = *topo;
  DCR_RETURN_IF_ERROR(Set(&edited, key, *expanded));
  return Commit(topo, std::move(edited));
}

}  // namespace dcr
