// Topology -> normalized YAML and JSON.
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>

#include "dcr/topology.h"
#include "topology/internal.h"

namespace dcr {
namespace {

using topology_internal::EscapeEnv;

// A free-form string (a path, a host, a region): ${...} escaped so that it
// survives a reload as text, and double-quoted where it holds a character
// that YAML or the loader's scan for brackets (yaml_doc::CheckSafe) may
// read as syntax: & or * (an anchor or an alias), a quote, # (a comment),
// or a bracket or brace (a flow collection, which a plain scalar in a
// block mapping may hold unbalanced). yaml-cpp escapes '"' and '\\' in
// it, which the scan reads.
struct Text {
  std::string s;
};
Text Esc(const std::string& s) { return Text{EscapeEnv(s)}; }
YAML::Emitter& operator<<(YAML::Emitter& e, const Text& t) {
  if (t.s.find_first_of("&*'\"#[]{}") != std::string::npos) {
    e << YAML::DoubleQuoted;
  }
  return e << t.s;
}

void EmitStore(YAML::Emitter& e, const StoreLocation& s) {
  e << YAML::Key << "store" << YAML::Value << YAML::Flow << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << std::string(StoreKindName(s.kind));
  if (!s.path.empty()) e << YAML::Key << "path" << YAML::Value << Esc(s.path);
  e << YAML::EndMap;
}

void EmitNode(YAML::Emitter& e, const NodeSpec& n) {
  e << YAML::Flow << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << n.name;
  e << YAML::Key << "host" << YAML::Value << Esc(n.host);
  e << YAML::Key << "port" << YAML::Value << n.port;
  EmitStore(e, n.store);
  if (n.serving) {
    e << YAML::Key << "serving" << YAML::Value << YAML::Flow << YAML::BeginMap;
    if (!n.serving->layout.empty()) {
      e << YAML::Key << "layout" << YAML::Value << Esc(n.serving->layout);
    }
    e << YAML::Key << "rank" << YAML::Value << n.serving->rank;
    if (!n.serving->socket.empty()) {
      e << YAML::Key << "socket" << YAML::Value << Esc(n.serving->socket);
    }
    e << YAML::EndMap;
  }
  if (n.transport) {
    e << YAML::Key << "transport" << YAML::Value
      << std::string(TransportKindName(*n.transport));
  }
  if (n.metrics_port) {
    e << YAML::Key << "metrics_port" << YAML::Value << *n.metrics_port;
  }
  if (n.head) e << YAML::Key << "head" << YAML::Value << true;
  e << YAML::EndMap;
}

}  // namespace

std::string DumpTopology(const Topology& t) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "version" << YAML::Value << t.version;

  const TopologyDefaults& d = t.defaults;
  e << YAML::Key << "defaults" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "transport" << YAML::Value
    << std::string(TransportKindName(d.transport));
  e << YAML::Key << "span_elems" << YAML::Value << d.span_elems;
  e << YAML::Key << "fanout" << YAML::Value << d.fanout;
  e << YAML::Key << "window_bytes" << YAML::Value << FormatSize(d.window_bytes);
  e << YAML::Key << "min_commit" << YAML::Value
    << (d.min_commit == 0 ? std::string("all") : std::to_string(d.min_commit));
  if (!d.auth_key_file.empty()) {
    e << YAML::Key << "auth_key_file" << YAML::Value << Esc(d.auth_key_file);
  }
  for (auto [key, value] :
       {std::pair<const char*, const std::string*>{"tls_ca_file",
                                                   &d.tls_ca_file},
        {"tls_cert_file", &d.tls_cert_file},
        {"tls_key_file", &d.tls_key_file},
        {"signing_public_key_file", &d.signing_public_key_file}}) {
    if (!value->empty()) e << YAML::Key << key << YAML::Value << Esc(*value);
  }
  if (d.apply_threads != 0) {
    e << YAML::Key << "apply_threads" << YAML::Value << d.apply_threads;
  }
  e << YAML::EndMap;

  const RootSpec& r = t.root;
  e << YAML::Key << "root" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << r.name;
  e << YAML::Key << "host" << YAML::Value << Esc(r.host);
  e << YAML::Key << "port" << YAML::Value << r.port;
  e << YAML::Key << "cluster" << YAML::Value << r.cluster;
  if (!r.state_dir.empty()) {
    e << YAML::Key << "state_dir" << YAML::Value << Esc(r.state_dir);
  }
  if (!r.baseline.empty()) {
    e << YAML::Key << "baseline" << YAML::Value << Esc(r.baseline);
  }
  if (!r.signing_key_file.empty()) {
    e << YAML::Key << "signing_key_file" << YAML::Value
      << Esc(r.signing_key_file);
  }
  if (r.keep_deltas != kDefaultKeepDeltas) {
    e << YAML::Key << "keep_deltas" << YAML::Value << r.keep_deltas;
  }
  e << YAML::EndMap;

  e << YAML::Key << "clusters" << YAML::Value << YAML::BeginSeq;
  for (const ClusterSpec& c : t.clusters) {
    e << YAML::BeginMap;
    e << YAML::Key << "name" << YAML::Value << c.name;
    if (!c.region.empty()) {
      e << YAML::Key << "region" << YAML::Value << Esc(c.region);
    }
    if (c.fanout) e << YAML::Key << "fanout" << YAML::Value << *c.fanout;
    if (c.bandwidth_bps) {
      e << YAML::Key << "bandwidth" << YAML::Value
        << FormatBandwidth(*c.bandwidth_bps);
    }
    if (c.transport) {
      e << YAML::Key << "transport" << YAML::Value
        << std::string(TransportKindName(*c.transport));
    }
    if (c.serving_layout) {
      e << YAML::Key << "serving" << YAML::Value << YAML::Flow
        << YAML::BeginMap;
      e << YAML::Key << "layout" << YAML::Value << Esc(*c.serving_layout);
      e << YAML::EndMap;
    }
    if (c.source != ChunkSource::kRelay) {
      e << YAML::Key << "source" << YAML::Value
        << std::string(ChunkSourceName(c.source));
    }
    if (!c.nodes.empty()) {
      e << YAML::Key << "nodes" << YAML::Value << YAML::BeginSeq;
      for (const NodeSpec& n : c.nodes) EmitNode(e, n);
      e << YAML::EndSeq;
    }
    e << YAML::EndMap;
  }
  e << YAML::EndSeq;

  if (!t.links.empty()) {
    e << YAML::Key << "links" << YAML::Value << YAML::BeginSeq;
    for (const LinkSpec& l : t.links) {
      e << YAML::Flow << YAML::BeginMap;
      e << YAML::Key << "from" << YAML::Value << l.from;
      e << YAML::Key << "to" << YAML::Value << l.to;
      e << YAML::Key << "bandwidth" << YAML::Value
        << FormatBandwidth(l.bandwidth_bps);
      e << YAML::Key << "latency" << YAML::Value
        << FormatDuration(l.latency_ns);
      if (l.transport) {
        e << YAML::Key << "transport" << YAML::Value
          << std::string(TransportKindName(*l.transport));
      }
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  if (t.objstore) {
    const ObjectStoreSpec& o = *t.objstore;
    e << YAML::Key << "objstore" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "kind" << YAML::Value
      << std::string(ObjectStoreKindName(o.kind));
    for (auto [key, v] :
         {std::pair{"path", &o.path}, std::pair{"endpoint", &o.endpoint},
          std::pair{"region", &o.region}, std::pair{"bucket", &o.bucket},
          std::pair{"prefix", &o.prefix},
          std::pair{"credentials_file", &o.credentials_file},
          std::pair{"profile", &o.profile}}) {
      if (!v->empty()) e << YAML::Key << key << YAML::Value << Esc(*v);
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::string TopologyToJson(const Topology& t) {
  using json = nlohmann::ordered_json;
  auto transport = [](const std::optional<TransportKind>& k) -> json {
    if (!k) return nullptr;
    return std::string(TransportKindName(*k));
  };
  const TopologyDefaults& d = t.defaults;
  json j;
  j["version"] = t.version;
  j["defaults"] =
      json{{"transport", std::string(TransportKindName(d.transport))},
           {"span_elems", d.span_elems},
           {"fanout", d.fanout},
           {"window_bytes", d.window_bytes},
           {"min_commit", d.min_commit == 0 ? json("all") : json(d.min_commit)},
           {"auth_key_file", d.auth_key_file},
           {"tls_ca_file", d.tls_ca_file},
           {"tls_cert_file", d.tls_cert_file},
           {"tls_key_file", d.tls_key_file},
           {"signing_public_key_file", d.signing_public_key_file},
           {"apply_threads", ApplyThreads(d)}};
  const RootSpec& r = t.root;
  j["root"] = json{{"name", r.name},
                   {"host", r.host},
                   {"port", r.port},
                   {"cluster", r.cluster},
                   {"state_dir", r.state_dir},
                   {"baseline", r.baseline},
                   {"signing_key_file", r.signing_key_file},
                   {"keep_deltas", r.keep_deltas}};
  json clusters = json::array();
  for (const ClusterSpec& c : t.clusters) {
    json nodes = json::array();
    for (const NodeSpec& n : c.nodes) {
      json serving = nullptr;
      if (n.serving) {
        serving = json{{"layout", n.serving->layout},
                       {"rank", n.serving->rank},
                       {"socket", n.serving->socket}};
      }
      nodes.push_back(json{
          {"name", n.name},
          {"host", n.host},
          {"port", n.port},
          {"store", json{{"kind", std::string(StoreKindName(n.store.kind))},
                         {"path", n.store.path}}},
          {"serving", serving},
          {"transport", transport(n.transport)},
          {"metrics_port",
           n.metrics_port ? json(*n.metrics_port) : json(nullptr)},
          {"head", n.head}});
    }
    clusters.push_back(
        json{{"name", c.name},
             {"region", c.region},
             {"fanout", c.fanout ? json(*c.fanout) : json(nullptr)},
             {"bandwidth_bps",
              c.bandwidth_bps ? json(*c.bandwidth_bps) : json(nullptr)},
             {"transport", transport(c.transport)},
             {"serving", c.serving_layout ? json{{"layout", *c.serving_layout}}
                                          : json(nullptr)},
             {"source", std::string(ChunkSourceName(c.source))},
             {"nodes", nodes}});
  }
  j["clusters"] = clusters;
  json links = json::array();
  for (const LinkSpec& l : t.links) {
    links.push_back(json{{"from", l.from},
                         {"to", l.to},
                         {"bandwidth_bps", l.bandwidth_bps},
                         {"latency_ns", l.latency_ns},
                         {"transport", transport(l.transport)}});
  }
  j["links"] = links;
  if (t.objstore) {
    const ObjectStoreSpec& o = *t.objstore;
    j["objstore"] = json{{"kind", std::string(ObjectStoreKindName(o.kind))},
                         {"path", o.path},
                         {"endpoint", o.endpoint},
                         {"region", o.region},
                         {"bucket", o.bucket},
                         {"prefix", o.prefix},
                         {"credentials_file", o.credentials_file},
                         {"profile", o.profile}};
  } else {
    j["objstore"] = nullptr;
  }
  return j.dump(2);
}

}  // namespace dcr
