// YAML -> Topology. Every yaml-cpp exception stops here and becomes an
// InvalidArgument status naming the file, line and key path.
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"
#include "dcr/topology.h"
#include "topology/internal.h"

namespace dcr {
namespace {

using topology_internal::Error;
using topology_internal::kDefaultsKeys;
using topology_internal::kRootKeys;

constexpr std::string_view kTopKeys[] = {"version",  "defaults", "root",
                                         "clusters", "links",    "objstore"};
constexpr std::string_view kClusterKeys[] = {
    "name",      "region",  "fanout", "bandwidth",
    "transport", "serving", "source", "nodes"};
constexpr std::string_view kObjstoreKeys[] = {
    "kind",   "path",   "endpoint",         "region",
    "bucket", "prefix", "credentials_file", "profile"};
constexpr std::string_view kNodeKeys[] = {
    "name",    "host",      "port",         "store",
    "serving", "transport", "metrics_port", "head"};
constexpr std::string_view kStoreKeys[] = {"kind", "path"};
constexpr std::string_view kServingKeys[] = {"layout", "rank", "socket"};
constexpr std::string_view kClusterServingKeys[] = {"layout"};
constexpr std::string_view kLinkKeys[] = {"from", "to", "bandwidth", "latency",
                                          "transport"};

// Largest topology file read, a guard against feeding it the wrong file.
constexpr size_t kMaxTopologyBytes = 16u << 20;

using yaml_doc::Field;
using yaml_doc::Fields;
using yaml_doc::TypeName;

class Parser : private yaml_doc::Reader {
 public:
  explicit Parser(std::string_view source)
      : Reader(source.empty() ? "<topology>" : source), source_(source) {}

  Result<Topology> Parse(std::string_view text);

 private:
  // A scalar value, ${VAR}-expanded.
  Result<std::string> Str(const Field& f, const std::string& path) const;
  // A scalar parsed by `parse`; its error message is located.
  template <typename Fn>
  auto Value(const Field& f, const std::string& path, Fn parse) const
      -> decltype(parse(std::string_view())) {
    auto s = Str(f, path);
    if (!s.ok()) return s.status();
    auto v = parse(std::string_view(*s));
    if (!v.ok()) return Err(f.line, path, v.status().message());
    return v;
  }
  Status Name(const Field& f, const std::string& path, std::string* out) const;
  Status Host(const Field& f, const std::string& path, std::string* out) const;
  // A serving layout's path: any non-empty text.
  Status LayoutPath(const Field& f, const std::string& path,
                    std::string* out) const;
  Status ParseServing(const Field& f, const std::string& path,
                      ServingSpec* s) const;
  Status ParseClusterServing(const Field& f, const std::string& path,
                             ClusterSpec* c) const;
  Status ParseDefaults(const Field& f, TopologyDefaults* d) const;
  Status ParseRoot(const Field& f, RootSpec* r) const;
  Status ParseObjstore(const Field& f, ObjectStoreSpec* o) const;
  Status ParseCluster(const YAML::Node& n, int line, const std::string& path,
                      ClusterSpec* c) const;
  Status ParseNode(const YAML::Node& n, int line, const std::string& path,
                   NodeSpec* node) const;
  Status ParseLink(const YAML::Node& n, int line, const std::string& path,
                   LinkSpec* l) const;

  std::string source_;
};

Result<std::string> Parser::Str(const Field& f, const std::string& path) const {
  if (!f.value.IsScalar()) {
    return Err(f.line, path,
               std::string("expected a value, got ") + TypeName(f.value));
  }
  auto s = ExpandEnv(f.value.Scalar());
  if (!s.ok()) return Err(f.line, path, s.status().message());
  if (std::string why = topology_internal::CheckText(*s); !why.empty()) {
    return Err(f.line, path, "the value " + why);
  }
  return s;
}

Status Parser::Name(const Field& f, const std::string& path,
                    std::string* out) const {
  DCR_ASSIGN_OR_RETURN(*out, Str(f, path));
  std::string why = topology_internal::CheckName(*out);
  if (!why.empty()) return Err(f.line, path, "name " + why);
  return Status::OK();
}

Status Parser::Host(const Field& f, const std::string& path,
                    std::string* out) const {
  DCR_ASSIGN_OR_RETURN(*out, Str(f, path));
  std::string why = topology_internal::CheckHost(*out);
  if (!why.empty()) return Err(f.line, path, "host " + why);
  return Status::OK();
}

Status Parser::LayoutPath(const Field& f, const std::string& path,
                          std::string* out) const {
  DCR_ASSIGN_OR_RETURN(*out, Str(f, path));
  if (out->empty()) {
    return Err(f.line, path, "expected the path of a layout file, got ''");
  }
  return Status::OK();
}

Status Parser::ParseServing(const Field& f, const std::string& path,
                            ServingSpec* s) const {
  DCR_ASSIGN_OR_RETURN(Fields sf, Map(f.value, f.line, path, kServingKeys));
  s->loc.line = sf.line;
  DCR_RETURN_IF_ERROR(Required(sf, path, "rank"));
  for (const Field& x : sf.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "layout") {
      DCR_RETURN_IF_ERROR(LayoutPath(x, p, &s->layout));
    } else if (x.key == "socket") {
      DCR_ASSIGN_OR_RETURN(s->socket, Str(x, p));
      // sockaddr_un's sun_path holds 107 bytes and a NUL.
      if (s->socket.empty() || s->socket.size() > 107) {
        return Err(x.line, p,
                   "expected a Unix socket path of 1 to 107 bytes, got " +
                       std::to_string(s->socket.size()));
      }
    } else {
      DCR_ASSIGN_OR_RETURN(uint64_t rank, Value(x, p, [](std::string_view v) {
                             return topology_internal::ParseUint(
                                 v, 0, kMaxServingRank);
                           }));
      s->rank = static_cast<uint32_t>(rank);
    }
  }
  return Status::OK();
}

Status Parser::ParseClusterServing(const Field& f, const std::string& path,
                                   ClusterSpec* c) const {
  // A rank here is a likely mistake worth more than "unknown key".
  if (f.value.IsMap()) {
    for (const auto& kv : f.value) {
      if (kv.first.IsScalar() && kv.first.Scalar() == "rank") {
        return Err(LineOf(kv.first, f.line), path + ".rank",
                   "a rank is per node: give serving: {rank: N} on each node "
                   "that serves");
      }
    }
  }
  DCR_ASSIGN_OR_RETURN(Fields sf,
                       Map(f.value, f.line, path, kClusterServingKeys));
  DCR_RETURN_IF_ERROR(Required(sf, path, "layout"));
  std::string layout;
  DCR_RETURN_IF_ERROR(LayoutPath(*sf.Get("layout"), path + ".layout", &layout));
  c->serving_layout = std::move(layout);
  return Status::OK();
}

Status Parser::ParseDefaults(const Field& df, TopologyDefaults* d) const {
  const std::string path = "defaults";
  if (df.value.IsNull()) return Status::OK();
  DCR_ASSIGN_OR_RETURN(Fields f, Map(df.value, df.line, path, kDefaultsKeys));
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "transport") {
      DCR_ASSIGN_OR_RETURN(d->transport,
                           Value(x, p, topology_internal::ParseTransport));
    } else if (x.key == "span_elems") {
      DCR_ASSIGN_OR_RETURN(d->span_elems, Value(x, p, [](std::string_view s) {
                             return topology_internal::ParseUint(s, 1,
                                                                 1ull << 32);
                           }));
    } else if (x.key == "fanout") {
      DCR_ASSIGN_OR_RETURN(uint64_t k, Value(x, p, [](std::string_view s) {
                             return topology_internal::ParseUint(s, 1, 64);
                           }));
      d->fanout = static_cast<uint32_t>(k);
    } else if (x.key == "window_bytes") {
      DCR_ASSIGN_OR_RETURN(d->window_bytes, Value(x, p, ParseSize));
      if (d->window_bytes == 0) {
        return Err(x.line, p, "window must be at least 1 byte");
      }
    } else if (x.key == "min_commit") {
      DCR_ASSIGN_OR_RETURN(d->min_commit,
                           Value(x, p, topology_internal::ParseMinCommit));
    } else if (x.key == "auth_key_file") {
      // Empty (e.g. "${DCR_KEY:-}" with DCR_KEY unset): no authentication.
      DCR_ASSIGN_OR_RETURN(d->auth_key_file, Str(x, p));
    } else if (x.key == "tls_ca_file") {
      DCR_ASSIGN_OR_RETURN(d->tls_ca_file, Str(x, p));
    } else if (x.key == "tls_cert_file") {
      DCR_ASSIGN_OR_RETURN(d->tls_cert_file, Str(x, p));
    } else if (x.key == "tls_key_file") {
      DCR_ASSIGN_OR_RETURN(d->tls_key_file, Str(x, p));
    } else if (x.key == "signing_public_key_file") {
      DCR_ASSIGN_OR_RETURN(d->signing_public_key_file, Str(x, p));
    } else if (x.key == "apply_threads") {
      DCR_ASSIGN_OR_RETURN(d->apply_threads,
                           Value(x, p, topology_internal::ParseApplyThreads));
    }
  }
  return Status::OK();
}

Status Parser::ParseRoot(const Field& rf, RootSpec* r) const {
  const std::string path = "root";
  DCR_ASSIGN_OR_RETURN(Fields f, Map(rf.value, rf.line, path, kRootKeys));
  r->loc.line = f.line;
  for (std::string_view k : {"name", "host", "port", "cluster"}) {
    DCR_RETURN_IF_ERROR(Required(f, path, k));
  }
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "name") {
      DCR_RETURN_IF_ERROR(Name(x, p, &r->name));
    } else if (x.key == "host") {
      DCR_RETURN_IF_ERROR(Host(x, p, &r->host));
    } else if (x.key == "port") {
      DCR_ASSIGN_OR_RETURN(r->port, Value(x, p, topology_internal::ParsePort));
    } else if (x.key == "cluster") {
      DCR_RETURN_IF_ERROR(Name(x, p, &r->cluster));
    } else if (x.key == "state_dir") {
      DCR_ASSIGN_OR_RETURN(r->state_dir, Str(x, p));
    } else if (x.key == "baseline") {
      DCR_ASSIGN_OR_RETURN(r->baseline, Str(x, p));
    } else if (x.key == "signing_key_file") {
      DCR_ASSIGN_OR_RETURN(r->signing_key_file, Str(x, p));
    } else if (x.key == "keep_deltas") {
      DCR_ASSIGN_OR_RETURN(uint64_t k, Value(x, p, [](std::string_view s) {
                             return topology_internal::ParseUint(s, 0, 1024);
                           }));
      r->keep_deltas = static_cast<uint32_t>(k);
    }
  }
  return Status::OK();
}

Status Parser::ParseObjstore(const Field& of, ObjectStoreSpec* o) const {
  const std::string path = "objstore";
  DCR_ASSIGN_OR_RETURN(Fields f, Map(of.value, of.line, path, kObjstoreKeys));
  o->loc.line = f.line;
  DCR_RETURN_IF_ERROR(Required(f, path, "kind"));
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "kind") {
      DCR_ASSIGN_OR_RETURN(
          o->kind, Value(x, p, topology_internal::ParseObjectStoreKind));
    } else if (x.key == "path") {
      DCR_ASSIGN_OR_RETURN(o->path, Str(x, p));
    } else if (x.key == "endpoint") {
      DCR_ASSIGN_OR_RETURN(o->endpoint, Str(x, p));
    } else if (x.key == "region") {
      DCR_ASSIGN_OR_RETURN(o->region, Str(x, p));
    } else if (x.key == "bucket") {
      DCR_ASSIGN_OR_RETURN(o->bucket, Str(x, p));
    } else if (x.key == "prefix") {
      DCR_ASSIGN_OR_RETURN(o->prefix, Str(x, p));
    } else if (x.key == "credentials_file") {
      DCR_ASSIGN_OR_RETURN(o->credentials_file, Str(x, p));
    } else if (x.key == "profile") {
      DCR_ASSIGN_OR_RETURN(o->profile, Str(x, p));
    }
  }
  return Status::OK();
}

Status Parser::ParseNode(const YAML::Node& n, int line, const std::string& path,
                         NodeSpec* node) const {
  DCR_ASSIGN_OR_RETURN(Fields f, Map(n, line, path, kNodeKeys));
  int socket_line = f.line;
  node->loc.line = f.line;
  for (std::string_view k : {"name", "host", "port"}) {
    DCR_RETURN_IF_ERROR(Required(f, path, k));
  }
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "name") {
      DCR_RETURN_IF_ERROR(Name(x, p, &node->name));
    } else if (x.key == "host") {
      DCR_RETURN_IF_ERROR(Host(x, p, &node->host));
    } else if (x.key == "port") {
      DCR_ASSIGN_OR_RETURN(node->port,
                           Value(x, p, topology_internal::ParsePort));
    } else if (x.key == "metrics_port") {
      DCR_ASSIGN_OR_RETURN(node->metrics_port,
                           Value(x, p, topology_internal::ParsePort));
    } else if (x.key == "transport") {
      DCR_ASSIGN_OR_RETURN(node->transport,
                           Value(x, p, topology_internal::ParseTransport));
    } else if (x.key == "head") {
      DCR_ASSIGN_OR_RETURN(node->head,
                           Value(x, p, topology_internal::ParseBool));
    } else if (x.key == "serving") {
      ServingSpec serving;
      DCR_RETURN_IF_ERROR(ParseServing(x, p, &serving));
      node->serving = std::move(serving);
      socket_line = x.line;
    } else if (x.key == "store") {
      DCR_ASSIGN_OR_RETURN(Fields sf, Map(x.value, x.line, p, kStoreKeys));
      DCR_RETURN_IF_ERROR(Required(sf, p, "kind"));
      for (const Field& s : sf.all()) {
        std::string sp = p + "." + s.key;
        if (s.key == "kind") {
          DCR_ASSIGN_OR_RETURN(node->store.kind,
                               Value(s, sp, topology_internal::ParseStoreKind));
        } else {
          DCR_ASSIGN_OR_RETURN(node->store.path, Str(s, sp));
        }
      }
      // Location-specific store checks; ValidateTopology repeats them
      // without a line for edited topologies.
      const Field* pf = sf.Get("path");
      int pline = pf ? pf->line : sf.line;
      if (node->store.kind == StoreKind::kMemory && pf != nullptr) {
        return Err(pline, p + ".path", "a memory store takes no path");
      }
      if (node->store.kind != StoreKind::kMemory && node->store.path.empty()) {
        return Err(pline, p + ".path",
                   "a " + std::string(StoreKindName(node->store.kind)) +
                       " store needs a path");
      }
    }
  }
  if (node->serving && !node->serving->socket.empty() &&
      node->store.kind != StoreKind::kShm) {
    return Err(socket_line, path + ".serving.socket",
               "a serving process maps the relay's store: give the node a shm "
               "store (store: {kind: shm, path: NAME})");
  }
  return Status::OK();
}

Status Parser::ParseCluster(const YAML::Node& n, int line,
                            const std::string& path, ClusterSpec* c) const {
  DCR_ASSIGN_OR_RETURN(Fields f, Map(n, line, path, kClusterKeys));
  c->loc.line = f.line;
  DCR_RETURN_IF_ERROR(Required(f, path, "name"));
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "name") {
      DCR_RETURN_IF_ERROR(Name(x, p, &c->name));
    } else if (x.key == "region") {
      DCR_ASSIGN_OR_RETURN(c->region, Str(x, p));
    } else if (x.key == "fanout") {
      DCR_ASSIGN_OR_RETURN(uint64_t k, Value(x, p, [](std::string_view s) {
                             return topology_internal::ParseUint(s, 1, 64);
                           }));
      c->fanout = static_cast<uint32_t>(k);
    } else if (x.key == "bandwidth") {
      DCR_ASSIGN_OR_RETURN(c->bandwidth_bps, Value(x, p, ParseBandwidth));
    } else if (x.key == "transport") {
      DCR_ASSIGN_OR_RETURN(c->transport,
                           Value(x, p, topology_internal::ParseTransport));
    } else if (x.key == "serving") {
      DCR_RETURN_IF_ERROR(ParseClusterServing(x, p, c));
    } else if (x.key == "source") {
      DCR_ASSIGN_OR_RETURN(c->source,
                           Value(x, p, topology_internal::ParseChunkSource));
    } else if (x.key == "nodes") {
      DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> list, List(x, p));
      for (size_t i = 0; i < list.size(); ++i) {
        NodeSpec node;
        DCR_RETURN_IF_ERROR(ParseNode(
            list[i], x.line, p + "[" + std::to_string(i) + "]", &node));
        c->nodes.push_back(std::move(node));
      }
    }
  }
  // Serving checks that need the whole cluster, located at their keys;
  // ValidateTopology repeats them for topologies built in code.
  bool serves = false;
  for (size_t i = 0; i < c->nodes.size(); ++i) {
    const NodeSpec& node = c->nodes[i];
    if (!node.serving) continue;
    serves = true;
    if (ServingLayoutOf(*c, node).empty()) {
      return Err(node.serving->loc.line,
                 path + ".nodes[" + std::to_string(i) + "].serving",
                 "missing key 'layout' (give it here or in the cluster's "
                 "serving: {layout: PATH})");
    }
  }
  if (c->serving_layout && !serves) {
    return Err(f.Get("serving")->line, path + ".serving",
               "cluster '" + c->name +
                   "' has a serving layout but none of its nodes serves (add "
                   "serving: {rank: N} to each node that serves)");
  }
  return Status::OK();
}

Status Parser::ParseLink(const YAML::Node& n, int line, const std::string& path,
                         LinkSpec* l) const {
  DCR_ASSIGN_OR_RETURN(Fields f, Map(n, line, path, kLinkKeys));
  l->loc.line = f.line;
  for (std::string_view k : {"from", "to", "bandwidth"}) {
    DCR_RETURN_IF_ERROR(Required(f, path, k));
  }
  for (const Field& x : f.all()) {
    std::string p = path + "." + x.key;
    if (x.key == "from") {
      DCR_RETURN_IF_ERROR(Name(x, p, &l->from));
    } else if (x.key == "to") {
      DCR_RETURN_IF_ERROR(Name(x, p, &l->to));
    } else if (x.key == "bandwidth") {
      DCR_ASSIGN_OR_RETURN(l->bandwidth_bps, Value(x, p, ParseBandwidth));
    } else if (x.key == "latency") {
      DCR_ASSIGN_OR_RETURN(l->latency_ns, Value(x, p, ParseDurationNs));
    } else if (x.key == "transport") {
      DCR_ASSIGN_OR_RETURN(l->transport,
                           Value(x, p, topology_internal::ParseTransport));
    }
  }
  return Status::OK();
}

Result<Topology> Parser::Parse(std::string_view text) {
  // One document. yaml-cpp 0.7's LoadAll can loop forever on malformed
  // input (jbeder/yaml-cpp#1040, fixed upstream after 0.7), so count the
  // documents by their markers and load only the first.
  int docs = yaml_doc::CountDocuments(text);
  if (docs > 1) {
    return Err(0, "",
               "expected one YAML document, got " + std::to_string(docs));
  }
  YAML::Node doc = YAML::Load(std::string(text));
  if (!doc.IsDefined() || doc.IsNull()) {
    return Err(0, "",
               docs == 0 ? "the file is empty"
                         : "expected a map of topology keys (version, root, "
                           "clusters, ...), got no value");
  }
  Topology t;
  t.source = source_;
  DCR_ASSIGN_OR_RETURN(Fields f, Map(doc, 1, "", kTopKeys));
  for (std::string_view k : {"version", "root", "clusters"}) {
    DCR_RETURN_IF_ERROR(Required(f, "", k));
  }
  // The version first: a newer schema fails on it, not on a new key.
  const Field* vf = f.Get("version");
  DCR_ASSIGN_OR_RETURN(uint64_t version,
                       Value(*vf, "version", [](std::string_view s) {
                         return topology_internal::ParseUint(s, 0, 1000000);
                       }));
  if (version != static_cast<uint64_t>(kTopologyVersion)) {
    return Err(vf->line, "version",
               "unsupported topology version " + std::to_string(version) +
                   " (this dcr reads version " +
                   std::to_string(kTopologyVersion) + ")");
  }
  if (const Field* d = f.Get("defaults")) {
    DCR_RETURN_IF_ERROR(ParseDefaults(*d, &t.defaults));
  }
  DCR_RETURN_IF_ERROR(ParseRoot(*f.Get("root"), &t.root));
  const Field* cf = f.Get("clusters");
  DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> clusters, List(*cf, "clusters"));
  if (clusters.empty()) {
    return Err(cf->line, "clusters", "expected at least one cluster");
  }
  for (size_t i = 0; i < clusters.size(); ++i) {
    ClusterSpec c;
    DCR_RETURN_IF_ERROR(ParseCluster(
        clusters[i], cf->line, "clusters[" + std::to_string(i) + "]", &c));
    t.clusters.push_back(std::move(c));
  }
  if (const Field* of = f.Get("objstore")) {
    t.objstore.emplace();
    DCR_RETURN_IF_ERROR(ParseObjstore(*of, &*t.objstore));
  }
  if (const Field* lf = f.Get("links")) {
    DCR_ASSIGN_OR_RETURN(std::vector<YAML::Node> links, List(*lf, "links"));
    for (size_t i = 0; i < links.size(); ++i) {
      LinkSpec l;
      DCR_RETURN_IF_ERROR(ParseLink(links[i], lf->line,
                                    "links[" + std::to_string(i) + "]", &l));
      t.links.push_back(std::move(l));
    }
  }
  DCR_RETURN_IF_ERROR(ValidateTopology(t));
  return t;
}

}  // namespace

Result<Topology> ParseTopology(std::string_view text,
                               std::string_view source_name) {
  std::string_view shown = source_name.empty() ? "<topology>" : source_name;
  DCR_RETURN_IF_ERROR(yaml_doc::CheckSafe(text, shown, "topology"));
  return yaml_doc::Guarded(shown,
                           [&] { return Parser(source_name).Parse(text); });
}

Result<Topology> LoadTopology(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound("topology file '" + path + "' does not exist");
  }
  if (std::filesystem::file_size(path, ec) > kMaxTopologyBytes && !ec) {
    return Status::InvalidArgument("topology file '" + path +
                                   "' is larger than 16 MiB");
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return Status::InvalidArgument(text.status().message());
  return ParseTopology(*text, path);
}

}  // namespace dcr
