// The topology subcommands: `dcr tree` and `dcr topo validate|show|
// add-node|remove-node|set`.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "common/file.h"
#include "dcr/topology.h"

namespace dcr::cli {
namespace {

using nlohmann::ordered_json;

constexpr const char* kCommentsLost =
    "\nThe file is rewritten in normalized form (temp file + rename), only if "
    "the\nresult validates; otherwise it is left byte for byte as it was and "
    "the exit\ncode is 2. Comments and ${VAR} references are not kept "
    "(yaml-cpp cannot\npreserve them): the values they expanded to are "
    "written instead.\n";

struct Summary {
  size_t clusters = 0;
  size_t relays = 0;
  size_t links = 0;
  int depth = 0;
  size_t root_children = 0;
  uint64_t narrowest_wan_bps = 0;
};

Summary Summarize(const Topology& t, const Tree& tree) {
  Summary s;
  s.clusters = t.clusters.size();
  s.relays = t.NodeCount();
  s.links = t.links.size();
  s.depth = tree.Depth();
  s.root_children = tree.nodes[0].children.size();
  for (const TreeNode& n : tree.nodes) {
    if (n.link == LinkClass::kWan &&
        (s.narrowest_wan_bps == 0 ||
         n.link_bandwidth_bps < s.narrowest_wan_bps))
      s.narrowest_wan_bps = n.link_bandwidth_bps;
  }
  return s;
}

std::string SummaryText(const Summary& s) {
  std::string out = fmt::format(
      "{} clusters, {} relays, {} links; tree depth {}, root feeds {} "
      "head(s)",
      s.clusters, s.relays, s.links, s.depth, s.root_children);
  if (s.narrowest_wan_bps) {
    out += ", narrowest WAN link " + FormatBandwidth(s.narrowest_wan_bps);
  }
  return out;
}

ordered_json SummaryJson(const Summary& s) {
  return ordered_json{{"clusters", s.clusters},
                      {"relays", s.relays},
                      {"links", s.links},
                      {"tree_depth", s.depth},
                      {"root_children", s.root_children},
                      {"narrowest_wan_bps", s.narrowest_wan_bps}};
}

// Loads and builds; on error reports it and returns false.
bool Load(const std::string& path, Topology* t, Tree* tree, int* rc) {
  auto topo = LoadTopology(path);
  if (!topo.ok()) {
    *rc = ReportError(topo.status());
    return false;
  }
  auto built = BuildTree(*topo);
  if (!built.ok()) {
    *rc = ReportError(built.status());
    return false;
  }
  *t = std::move(*topo);
  *tree = std::move(*built);
  return true;
}

int RunTree(const std::string& path, const std::string& format) {
  Topology t;
  Tree tree;
  int rc = kExitOk;
  if (!Load(path, &t, &tree, &rc)) return rc;
  if (format == "dot") {
    std::fputs(RenderTreeDot(tree).c_str(), stdout);
  } else if (format == "json") {
    std::printf("%s\n", RenderTreeJson(tree).c_str());
  } else {
    std::fputs(RenderTreeText(tree).c_str(), stdout);
  }
  return kExitOk;
}

int RunValidate(const GlobalOptions& g, const std::string& path) {
  Topology t;
  Tree tree;
  int rc = kExitOk;
  if (!Load(path, &t, &tree, &rc)) {
    if (g.format() == OutputFormat::kJson) {
      auto err = LoadTopology(path);
      std::string msg =
          err.ok() ? "invalid tree" : std::string(err.status().message());
      std::printf("%s\n",
                  ordered_json{{"file", path}, {"valid", false}, {"error", msg}}
                      .dump(2)
                      .c_str());
    }
    return rc;
  }
  Summary s = Summarize(t, tree);
  if (g.format() == OutputFormat::kJson) {
    ordered_json j{{"file", path}, {"valid", true}};
    j["summary"] = SummaryJson(s);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s: valid: %s\n", path.c_str(), SummaryText(s).c_str());
  }
  return kExitOk;
}

int RunShow(const GlobalOptions& g, const std::string& path) {
  Topology t;
  Tree tree;
  int rc = kExitOk;
  if (!Load(path, &t, &tree, &rc)) return rc;
  Summary s = Summarize(t, tree);
  if (g.format() == OutputFormat::kJson) {
    ordered_json j{{"file", path}};
    j["topology"] = ordered_json::parse(TopologyToJson(t));
    j["summary"] = SummaryJson(s);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    // The summary is a YAML comment: the output still loads as a topology.
    std::fputs(DumpTopology(t).c_str(), stdout);
    std::printf("# %s\n", SummaryText(s).c_str());
  }
  return kExitOk;
}

// Loads `path`, applies `edit`, and rewrites the file atomically only if
// the result validates and reloads to the same topology.
template <typename Fn>
int RunEdit(const std::string& path, const std::string& what, Fn edit) {
  auto topo = LoadTopology(path);
  if (!topo.ok()) return ReportError(topo.status());
  Status s = edit(&*topo);
  if (!s.ok()) return ReportError(s);
  std::string out = DumpTopology(*topo);
  auto check = ParseTopology(out, path);
  if (!check.ok() || !(*check == *topo)) {
    return ReportError(Status::Internal(
        "the edited topology does not reload to itself; file left "
        "unchanged" +
        (check.ok() ? std::string() : ": " + check.status().ToString())));
  }
  auto original = ReadFileToString(path);
  if (original.ok() && original->find("${") != std::string::npos) {
    spdlog::warn("{}: ${{...}} references were replaced by their values", path);
  }
  Status w = WriteFileAtomic(
      path, std::as_bytes(std::span<const char>(out.data(), out.size())));
  if (!w.ok()) return ReportError(w);
  std::printf("%s: %s\n", path.c_str(), what.c_str());
  return kExitOk;
}

}  // namespace

void AddTopologyCommands(CLI::App* app, GlobalOptions* g, int* exit_code) {
  // tree
  {
    auto* cmd = app->add_subcommand(
        "tree", "Show the relay tree a topology file gives");
    auto path = std::make_shared<std::string>();
    auto format = std::make_shared<std::string>("text");
    cmd->add_option("-t,--topology", *path, "Topology YAML file")->required();
    cmd->add_option("-o,--output,--format", *format,
                    "Output: text (indented tree), dot (Graphviz) or json")
        ->check(CLI::IsMember({"text", "dot", "json"}));
    cmd->footer(
        "\nThe root feeds one head per cluster; each inter-cluster link is "
        "crossed once;\ninside a cluster relays form a k-ary tree (k = 1: a "
        "chain).\n\nExamples:\n  dcr tree --topology topology/local.yaml\n"
        "  dcr tree --topology topology/two-region.yaml --format dot | dot "
        "-Tsvg >tree.svg\n");
    cmd->callback([=] { *exit_code = RunTree(*path, *format); });
  }

  auto* topo = app->add_subcommand(
      "topo", "Validate, show and edit a topology YAML file");
  topo->require_subcommand(1);
  topo->footer(
      "\nExamples:\n  dcr topo validate topology/local.yaml\n"
      "  dcr topo set topology/local.yaml clusters.rollout-a.fanout=4\n");
  // validate
  {
    auto* cmd = topo->add_subcommand(
        "validate", "Check a topology file and that it builds a tree");
    auto path = std::make_shared<std::string>();
    cmd->add_option("FILE", *path, "Topology YAML file")->required();
    AddOutputOption(cmd, g);
    cmd->footer(
        "\nExit 0 if valid; otherwise exit 2 with the file, line and key in "
        "the error.\n\nExample:\n  dcr topo validate "
        "topology/two-region.yaml\n");
    cmd->callback([=] { *exit_code = RunValidate(*g, *path); });
  }
  // show
  {
    auto* cmd = topo->add_subcommand(
        "show", "Print the normalized topology and a summary");
    auto path = std::make_shared<std::string>();
    cmd->add_option("FILE", *path, "Topology YAML file")->required();
    AddOutputOption(cmd, g);
    cmd->footer(
        "\nText output is YAML (defaults filled in, ${VAR} expanded) with "
        "the summary\nas a trailing comment.\n\nExample:\n  dcr topo show "
        "topology/local.yaml -o json\n");
    cmd->callback([=] { *exit_code = RunShow(*g, *path); });
  }
  // add-node
  {
    auto* cmd = topo->add_subcommand("add-node", "Add a relay to a cluster");
    auto path = std::make_shared<std::string>();
    auto cluster = std::make_shared<std::string>();
    auto node = std::make_shared<NodeSpec>();
    auto store = std::make_shared<std::string>();
    auto transport = std::make_shared<std::string>();
    auto metrics = std::make_shared<uint16_t>(0);
    cmd->add_option("FILE", *path, "Topology YAML file")->required();
    cmd->add_option("--cluster", *cluster, "Cluster to add to")->required();
    cmd->add_option("--name", node->name, "Node name")->required();
    cmd->add_option("--host", node->host, "Host or IP address")->required();
    cmd->add_option("--port", node->port, "Relay port")
        ->required()
        ->check(CLI::Range(1, 65535));
    cmd->add_option("--store", *store,
                    "Store: memory, file:PATH or shm:NAME (default memory)");
    cmd->add_option("--transport", *transport, "tcp or ucx")
        ->check(CLI::IsMember({"tcp", "ucx"}));
    cmd->add_option("--metrics-port", *metrics, "Prometheus metrics port")
        ->check(CLI::Range(1, 65535));
    cmd->add_flag("--head", node->head, "Make it its cluster's head");
    cmd->footer(std::string(kCommentsLost) +
                "\nExample:\n  dcr topo add-node topology/local.yaml "
                "--cluster rollout-a --name a4 \\\n    --host 127.0.0.1 "
                "--port 17009 --store file:/tmp/dcr-local/a4.safetensors\n");
    cmd->callback([=] {
      NodeSpec n = *node;
      if (!store->empty()) {
        std::string_view s = *store;
        size_t colon = s.find(':');
        std::string kind(s.substr(0, colon));
        if (kind == "file") {
          n.store.kind = StoreKind::kFile;
        } else if (kind == "shm") {
          n.store.kind = StoreKind::kShm;
        } else if (kind != "memory") {
          *exit_code = ReportError(Status::InvalidArgument(
              "--store: expected memory, file:PATH or shm:NAME, got '" +
              *store + "'"));
          return;
        }
        if (colon != std::string_view::npos) n.store.path = s.substr(colon + 1);
      }
      if (!transport->empty()) {
        n.transport =
            *transport == "ucx" ? TransportKind::kUcx : TransportKind::kTcp;
      }
      if (*metrics != 0) n.metrics_port = *metrics;
      *exit_code =
          RunEdit(*path, "added node " + n.name + " to cluster " + *cluster,
                  [&](Topology* t) { return AddNode(t, *cluster, n); });
    });
  }
  // remove-node
  {
    auto* cmd = topo->add_subcommand("remove-node", "Remove a relay");
    auto path = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    cmd->add_option("FILE", *path, "Topology YAML file")->required();
    cmd->add_option("--name", *name, "Node to remove")->required();
    cmd->footer(std::string(kCommentsLost) +
                "\nExample:\n  dcr topo remove-node topology/local.yaml "
                "--name b3\n");
    cmd->callback([=] {
      *exit_code = RunEdit(*path, "removed node " + *name,
                           [&](Topology* t) { return RemoveNode(t, *name); });
    });
  }
  // set
  {
    auto* cmd = topo->add_subcommand(
        "set", "Set keys, in order; the file changes only if all succeed");
    auto path = std::make_shared<std::string>();
    auto assignments = std::make_shared<std::vector<std::string>>();
    cmd->add_option("FILE", *path, "Topology YAML file")->required();
    cmd->add_option("KEY=VALUE", *assignments,
                    "Assignments; an empty VALUE removes an optional key")
        ->required();
    cmd->footer(
        std::string(
            "\nKeys:\n"
            "  defaults.{transport,span_elems,fanout,window_bytes,"
            "min_commit,auth_key_file,\n"
            "            tls_ca_file,tls_cert_file,tls_key_file,"
            "signing_public_key_file,apply_threads}\n"
            "  root.{name,host,port,cluster,state_dir,baseline,"
            "signing_key_file,keep_deltas}\n"
            "  clusters.NAME.{name,region,fanout,bandwidth,transport}  (or "
            "clusters[I].KEY)\n"
            "  nodes.NAME.{name,host,port,transport,metrics_port,head,store,"
            "store.kind,store.path}\n"
            "  links[I].{from,to,bandwidth,latency,transport}\n") +
        kCommentsLost +
        "\nExamples:\n  dcr topo set topology/local.yaml "
        "clusters.rollout-a.fanout=4 defaults.window_bytes=128MiB\n"
        "  dcr topo set topology/two-region.yaml links[0].bandwidth=1Gbps "
        "nodes.a0.port=17101\n");
    cmd->callback([=] {
      std::string what;
      for (const std::string& a : *assignments) {
        if (a.find('=') == std::string::npos) {
          *exit_code = ReportError(
              Status::InvalidArgument("expected KEY=VALUE, got '" + a + "'"));
          return;
        }
        what += (what.empty() ? "set " : ", ") + a;
      }
      *exit_code = RunEdit(*path, what, [&](Topology* t) {
        // All assignments apply to one copy: the file changes only if the
        // final result is valid.
        Topology edited = *t;
        for (const std::string& a : *assignments) {
          size_t eq = a.find('=');
          DCR_RETURN_IF_ERROR(
              SetValue(&edited, a.substr(0, eq), a.substr(eq + 1)));
        }
        *t = std::move(edited);
        return Status::OK();
      });
    });
  }
}

}  // namespace dcr::cli
