// The relay topology: the YAML schema as plain structs, its loader,
// validator, editor and dumper, and the relay tree built from it.
//
// Everything here is a pure function of its arguments (no sockets, no
// global state). The schema is documented key by key in topology/README.md.
// Errors are InvalidArgument statuses whose message names the source file,
// the 1-based line where it is known, and the key path, e.g.
//   "topology/local.yaml:12: clusters[1].nodes[0].port: expected an integer
//    1-65535, got 'abc'"
//
// Thread safety: the types are values; the functions touch only their
// arguments (LoadTopology reads the file and the environment).
#ifndef DCR_TOPOLOGY_H_
#define DCR_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/status.h"

namespace dcr {

// The one schema version this build reads and writes.
inline constexpr int kTopologyVersion = 1;

enum class TransportKind : uint8_t { kTcp, kUcx };
enum class StoreKind : uint8_t { kMemory, kFile, kShm };

// "tcp" / "ucx"; "memory" / "file" / "shm".
std::string_view TransportKindName(TransportKind k);
std::string_view StoreKindName(StoreKind k);

// Where a spec was written, for error messages. Compares equal to every
// other SourceLine: two topologies that say the same thing are equal
// wherever they were read from.
struct SourceLine {
  int line = 0;  // 1-based; 0 when unknown (built in code or by an edit)
  friend bool operator==(const SourceLine&, const SourceLine&) { return true; }
};

// Where a relay keeps its weights. `path` is the file for kFile, the POSIX
// shared-memory object name for kShm, and empty for kMemory.
struct StoreLocation {
  StoreKind kind = StoreKind::kMemory;
  std::string path;
  bool operator==(const StoreLocation&) const = default;
};

// The largest serving rank (2^31 - 1: engines count ranks in an int32).
inline constexpr uint32_t kMaxServingRank = 0x7fffffff;

// One rank of a serving engine's layout (docs/PLACEMENT.md §"Serving
// relays"): the node's store holds that rank's shards.
struct ServingSpec {
  std::string layout;  // empty at a node: the cluster's
  uint32_t rank = 0;
  SourceLine loc;
  // The Unix socket a serving process attaches to (include/dcr/serving.h);
  // empty: none. Needs a shm store.
  std::string socket = {};
  bool operator==(const ServingSpec&) const = default;
};

// One relay (a `dcr-relay` process).
struct NodeSpec {
  std::string name;
  std::string host;
  uint16_t port = 0;
  StoreLocation store;
  std::optional<TransportKind> transport;
  std::optional<uint16_t> metrics_port;
  bool head = false;  // receives for its cluster (default: first listed)
  std::optional<ServingSpec> serving;  // nullopt: the canonical checkpoint
  SourceLine loc;
  bool operator==(const NodeSpec&) const = default;
};

// Where a cluster's head gets the refit's chunks: over the tree link from
// its parent (the default), or from the topology's object store, while
// the control messages (PLAN, END's vote, COMMIT) still use the link
// (docs/PROTOCOL.md §"Chunks through an object store").
enum class ChunkSource : uint8_t { kRelay, kObjstore };
std::string_view ChunkSourceName(ChunkSource s);  // "relay" / "objstore"

struct ClusterSpec {
  std::string name;
  std::string region;                     // empty: not given
  std::optional<uint32_t> fanout;         // 1-64; else sized from bandwidth
  std::optional<uint64_t> bandwidth_bps;  // per-node link inside the cluster
  std::optional<TransportKind> transport;
  // The layout of the nodes that serve and name none of their own.
  std::optional<std::string> serving_layout;
  ChunkSource source = ChunkSource::kRelay;
  std::vector<NodeSpec> nodes;
  SourceLine loc;
  bool operator==(const ClusterSpec&) const = default;
};

// The serving layout path of `node` of `cluster`: its own, else its
// cluster's; empty if it does not serve.
std::string ServingLayoutOf(const ClusterSpec& cluster, const NodeSpec& node);

// An inter-cluster link. Links are undirected: from/to only name the ends;
// the tree orients them away from the root's cluster.
struct LinkSpec {
  std::string from;
  std::string to;
  uint64_t bandwidth_bps = 0;
  uint64_t latency_ns = 0;
  std::optional<TransportKind> transport;
  SourceLine loc;
  bool operator==(const LinkSpec&) const = default;
};

inline constexpr uint32_t kDefaultKeepDeltas = 4;

// The coordinator (`dcr refit`) beside the trainer.
struct RootSpec {
  std::string name;
  std::string host;
  uint16_t port = 0;
  std::string cluster;
  std::string state_dir;  // empty: not given
  std::string baseline;   // empty: not given
  // The root's Ed25519 private key (PEM), read by `dcr refit` only; it goes
  // with defaults.signing_public_key_file.
  std::string signing_key_file;
  // How many committed deltas state_dir/history keeps for catch-up of
  // relays that are versions behind (0: none; they get dense copies).
  uint32_t keep_deltas = kDefaultKeepDeltas;
  SourceLine loc;
  bool operator==(const RootSpec&) const = default;
};

struct TopologyDefaults {
  TransportKind transport = TransportKind::kTcp;
  uint64_t span_elems = 1048576;
  uint32_t fanout = 2;
  uint64_t window_bytes = 64ull << 20;
  uint32_t min_commit = 0;  // 0: "all" relays must vote yes
  // The key file of HMAC-SHA256 frame authentication, read by the root and
  // every relay (format: src/wire/hmac_authenticator.h); empty: frames are
  // not authenticated.
  std::string auth_key_file;
  // TLS on TCP links (all three, or none): the CA that signs every node's
  // certificate, and this host's certificate chain and private key (PEM).
  // Both ends present a certificate and verify the other's.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // The root's Ed25519 public key (PEM): relays check the signed refit
  // manifest against it before voting. Empty: refits are not signed.
  std::string signing_public_key_file;
  // Threads each relay applies chunks and hashes its store with (dcr-relay
  // --apply-threads overrides it; each also reserves 8 MiB of the relay's
  // memory limit), and what `dcr refit --context auto` and `dcr plan`
  // take for a relay's cores. 0: not given: relays and auto take
  // kDefaultApplyThreads (see ApplyThreads), `dcr plan` its projection's
  // 16 cores. At most kMaxApplyThreads.
  uint32_t apply_threads = 0;
  bool operator==(const TopologyDefaults&) const = default;
};

// dcr-relay's apply threads when neither the topology nor --apply-threads
// gives any.
inline constexpr uint32_t kDefaultApplyThreads = 2;
inline constexpr uint32_t kMaxApplyThreads = 256;
// A relay's apply threads as the topology gives them.
inline uint32_t ApplyThreads(const TopologyDefaults& d) {
  return d.apply_threads != 0 ? d.apply_threads : kDefaultApplyThreads;
}

// The object store that clusters with `source: objstore` pull chunks from
// (include/dcr/objstore.h). Credentials are never in the topology: the
// environment's AWS_* variables, or the file credentials_file names.
enum class ObjectStoreKind : uint8_t { kDir, kS3 };
std::string_view ObjectStoreKindName(ObjectStoreKind k);  // "dir" / "s3"
struct ObjectStoreSpec {
  ObjectStoreKind kind = ObjectStoreKind::kDir;
  std::string path;  // kDir: the directory (a shared filesystem)
  // kS3:
  std::string endpoint;  // http(s)://host[:port]
  std::string region;    // empty: us-east-1
  std::string bucket;
  std::string prefix;  // empty or ending in '/'
  std::string credentials_file;
  std::string profile;  // empty: default
  SourceLine loc;
  bool operator==(const ObjectStoreSpec&) const = default;
};

struct Topology {
  int version = kTopologyVersion;
  TopologyDefaults defaults;
  RootSpec root;
  std::vector<ClusterSpec> clusters;
  std::vector<LinkSpec> links;
  std::optional<ObjectStoreSpec> objstore;
  // Name used in error messages (the file path); not part of equality.
  std::string source;

  bool operator==(const Topology& o) const {
    return version == o.version && defaults == o.defaults && root == o.root &&
           clusters == o.clusters && links == o.links && objstore == o.objstore;
  }

  // The cluster / node named `name`, or nullptr.
  const ClusterSpec* FindCluster(std::string_view name) const;
  const NodeSpec* FindNode(std::string_view name) const;
  size_t NodeCount() const;  // relays, the root not counted
};

// Reads and parses the YAML file at `path` (the path names the source in
// errors). A missing file is NotFound; everything else InvalidArgument.
Result<Topology> LoadTopology(const std::string& path);
// Parses YAML `text`; `source_name` prefixes error messages. String values
// expand ${VAR} and ${VAR:-default} from the environment ("$$" is "$").
// The result has passed ValidateTopology.
Result<Topology> ParseTopology(std::string_view text,
                               std::string_view source_name);
// Checks everything that spans more than one key: unique names and
// host:port pairs, references, heads, stores, serving layouts and ranks,
// reachability of every cluster from the root's cluster, min_commit.
Status ValidateTopology(const Topology& topo);
// Normalized YAML (comments are not kept) that ParseTopology reads back to
// an equal Topology.
std::string DumpTopology(const Topology& topo);
// The topology as a JSON document (same keys; numbers in base units:
// bandwidth_bps, latency_ns, window_bytes).
std::string TopologyToJson(const Topology& topo);

// Edits. Each applies to a copy, validates it and, only if it is valid,
// replaces *topo; on error *topo is untouched.
//
// Adds `node` at the end of cluster `cluster`.
Status AddNode(Topology* topo, std::string_view cluster, const NodeSpec& node);
// Removes the relay named `name` (NotFound if there is none).
Status RemoveNode(Topology* topo, std::string_view name);
// Sets one key to `value`, written as in the YAML. Accepted keys:
//   defaults.{transport,span_elems,fanout,window_bytes,min_commit,
//             auth_key_file,tls_ca_file,tls_cert_file,tls_key_file,
//             signing_public_key_file}
//   root.{name,host,port,cluster,state_dir,baseline,signing_key_file,
//        keep_deltas}
//   clusters.<name>.{name,region,fanout,bandwidth,transport}
//   clusters[<i>].<same keys>
//   nodes.<name>.{name,host,port,transport,metrics_port,head,store,
//                 store.kind,store.path}        (store as KIND or KIND:PATH)
//   links[<i>].{from,to,bandwidth,latency,transport}
// An empty value removes an optional key (fanout, bandwidth, transport,
// region, metrics_port, state_dir, baseline and the key and certificate
// files; keep_deltas goes back to its default). Renaming a
// cluster renames its references (root.cluster, links).
Status SetValue(Topology* topo, std::string_view key, std::string_view value);

// Units. Bandwidth: bits/s ("25Gbps", "200Mbps", "3Gbit/s", "1.5Gb/s") or
// bytes/s ("100MB/s", "1GiB/s"; x8); a plain number is bits/s; decimal
// prefixes are powers of 1000. Size: "64MiB", "1GB", "4096" (bytes).
// Duration: "70ms", "1s", "250us", "10ns" ("0" alone needs no unit).
Result<uint64_t> ParseBandwidth(std::string_view s);
Result<uint64_t> ParseSize(std::string_view s);
Result<uint64_t> ParseDurationNs(std::string_view s);
// Exact renderings that the parsers read back to the same value, in the
// largest unit that divides the value ("3Gbps", "2500Mbps", "64MiB", "70ms").
std::string FormatBandwidth(uint64_t bps);
std::string FormatSize(uint64_t bytes);
std::string FormatDuration(uint64_t ns);
// Expands ${VAR} and ${VAR:-default}; "$$" is a literal "$". An unset VAR
// without a default is an error.
Result<std::string> ExpandEnv(std::string_view s);

// ---------------------------------------------------------------------------
// The relay tree.

enum class LinkClass : uint8_t { kNone, kLan, kWan };  // kNone: the root
std::string_view LinkClassName(LinkClass c);           // "none"|"lan"|"wan"

struct TreeNode {
  std::string name;
  std::string cluster;
  std::string region;
  std::string host;
  uint16_t port = 0;
  TransportKind transport = TransportKind::kTcp;  // of the link into it
  std::optional<StoreLocation> store;             // nullopt for the root
  int parent = -1;                                // -1 for the root
  std::vector<int> children;
  int depth = 0;
  LinkClass link = LinkClass::kNone;  // class of the link from the parent
  uint64_t link_bandwidth_bps = 0;    // 0: not given in the topology
  uint64_t link_latency_ns = 0;
  uint32_t fanout = 0;  // k used in its cluster; the root: its child count
  // The rank it serves, if any, its layout resolved (ServingLayoutOf).
  std::optional<ServingSpec> serving;
  // The head of a `source: objstore` cluster: it pulls the chunks from the
  // object store; its link from the root carries the control messages.
  bool pulls_objects = false;
};

struct TreeCluster {
  std::string name;
  std::string region;
  int head = -1;            // node index; -1 for a root cluster without relays
  std::string upstream;     // cluster it is fed from; empty for the root's
  int link = -1;            // index in Topology::links of the WAN link into it
  uint64_t stream_bps = 0;  // bottleneck bandwidth of the path from the root
  uint32_t fanout = 0;
};

// Node 0 is the root; a parent always precedes its children.
struct Tree {
  std::vector<TreeNode> nodes;
  std::vector<TreeCluster> clusters;  // in the order they were reached

  // Index of the node named `name`, or -1.
  int Find(std::string_view name) const;
  // `index` and everything below it, parents before children.
  std::vector<int> Subtree(int index) const;
  // `index`, its parent, ..., 0.
  std::vector<int> PathToRoot(int index) const;
  int Depth() const;  // the largest node depth
};

// Builds the tree (after ValidateTopology):
//  - clusters are joined along `links` by a widest-path spanning tree rooted
//    at the root's cluster (ties: lower latency, fewer hops, earlier link),
//    so each chunk crosses each used inter-cluster link once;
//  - the root feeds the head of its own cluster (LAN) and of every cluster
//    linked directly to it (WAN); a cluster reached through another is fed
//    by that cluster's head;
//  - the head is the node with `head: true`, else the first listed; the
//    others fill a k-ary tree under it breadth-first in listed order, with
//    k = cluster fanout, else floor(cluster bandwidth / stream bandwidth)
//    clamped to [1, 16] (stream: the bottleneck of the WAN path into the
//    cluster, or the cluster bandwidth for the root's cluster), else
//    defaults.fanout;
//  - transport: node > cluster > link (WAN edges) > defaults.
Result<Tree> BuildTree(const Topology& topo);

// An indented tree with link labels, one node per line.
std::string RenderTreeText(const Tree& tree);
// Graphviz: one `subgraph cluster_<name>` per cluster, edges labelled with
// bandwidth (and latency where given).
std::string RenderTreeDot(const Tree& tree);
// {"nodes": [...], "clusters": [...]} with every TreeNode field.
std::string RenderTreeJson(const Tree& tree);

}  // namespace dcr

#endif  // DCR_TOPOLOGY_H_
