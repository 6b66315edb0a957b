// dcr plan: the predicted time of a delta refit and of a full-checkpoint
// refit through a topology's tree (src/coord/cost_model.h, docs/SCALE.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "common/bytes.h"
#include "common/file.h"
#include "coord/cost_model.h"
#include "dcr/topology.h"

namespace dcr::cli {
namespace {

struct PlanArgs {
  std::string topology;
  std::string model_bytes;
  std::string params;
  std::string change_rate;
  std::string calibration;
  bool no_context = false;
  std::string bandwidth;
  std::string wan;
  std::string lan;
  uint32_t root_cores = 0;
  uint32_t relay_cores = 0;
  uint32_t producers = 0;
  uint32_t producer_cores = 4;
};

// "0.03", "3%" -> 0.03.
Result<double> ParseRate(const std::string& s) {
  std::string t = s;
  bool pct = !t.empty() && t.back() == '%';
  if (pct) t.pop_back();
  try {
    size_t used = 0;
    double v = std::stod(t, &used);
    if (used == t.size() && v > 0) {
      v = pct ? v / 100 : v;
      if (v <= 1) return v;
    }
  } catch (...) {
  }
  return Status::InvalidArgument(fmt::format(
      "--change-rate '{}': give the fraction of elements that change, e.g. "
      "0.03 or 3%",
      s));
}

std::string Secs(double s) {
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  if (s >= 120) return fmt::format("{:.1f} min", s / 60);
  if (s >= 10) return fmt::format("{:.0f} s", s);
  return fmt::format("{:.2f} s", s);
}

nlohmann::json EstimateJson(const RefitEstimate& e) {
  return {{"payload_bytes", e.payload_bytes}, {"transfer_s", e.transfer_s},
          {"encode_s", e.encode_s},           {"apply_s", e.apply_s},
          {"stream_s", e.stream_s},           {"prepare_s", e.prepare_s},
          {"target_hash_s", e.target_hash_s}, {"verify_s", e.verify_s},
          {"baseline_s", e.baseline_s},       {"commit_s", e.commit_s},
          {"producers_s", e.producers_s},     {"recode_s", e.recode_s},
          {"control_s", e.control_s},         {"total_s", e.total_s},
          {"bottleneck", e.bottleneck}};
}

int RunPlan(const PlanArgs& a, const GlobalOptions& g) {
  auto topo = LoadTopology(a.topology);
  if (!topo.ok()) return ReportError(topo.status());
  // What-if overrides: every link between clusters, every cluster inside.
  for (auto [flag, value] :
       {std::pair{"--wan", &a.wan}, std::pair{"--lan", &a.lan}}) {
    if (value->empty()) continue;
    auto bps = ParseBandwidth(*value);
    if (!bps.ok() || *bps == 0) {
      return ReportError(Status::InvalidArgument(
          fmt::format("{} '{}': give a bandwidth, e.g. 10Gbps or 400Mbit/s",
                      flag, *value)));
    }
    if (std::string_view(flag) == "--wan") {
      for (LinkSpec& l : topo->links) l.bandwidth_bps = *bps;
    } else {
      for (ClusterSpec& c : topo->clusters) c.bandwidth_bps = *bps;
    }
  }
  auto tree = BuildTree(*topo);
  if (!tree.ok()) return ReportError(tree.status());
  double bytes = 0;
  if (!a.model_bytes.empty() == !a.params.empty()) {
    return ReportError(Status::InvalidArgument(
        "give the model's size: --model-bytes (e.g. 2TB) or --params (e.g. "
        "1T, BF16: 2 bytes each)"));
  }
  if (!a.model_bytes.empty()) {
    auto b = ParseSize(a.model_bytes);
    if (!b.ok() || *b == 0) {
      return ReportError(Status::InvalidArgument(fmt::format(
          "--model-bytes '{}': give a size, e.g. 60GB or 2TB", a.model_bytes)));
    }
    bytes = static_cast<double>(*b);
  } else {
    // Parameter counts use decimal suffixes: 30B, 235B, 1T.
    std::string t = a.params;
    double scale = 1;
    if (!t.empty()) {
      switch (t.back()) {
        case 'K':
          scale = 1e3;
          break;
        case 'M':
          scale = 1e6;
          break;
        case 'B':
        case 'G':
          scale = 1e9;
          break;
        case 'T':
          scale = 1e12;
          break;
        default:
          break;
      }
      if (scale != 1) t.pop_back();
    }
    try {
      size_t used = 0;
      double n = std::stod(t, &used);
      if (used != t.size() || !(n > 0)) throw std::invalid_argument(t);
      bytes = 2 * n * scale;
    } catch (...) {
      return ReportError(Status::InvalidArgument(fmt::format(
          "--params '{}': give a parameter count, e.g. 30B, 235B or 1T",
          a.params)));
    }
  }
  auto rate = ParseRate(a.change_rate);
  if (!rate.ok()) return ReportError(rate.status());
  // One encoding's parameters: `base` with the topology's apply threads
  // (a calibration file or --relay-cores may say otherwise; without them,
  // the projection's 16 cores), the calibration and the flags over it.
  std::string calibration_text;
  if (!a.calibration.empty()) {
    auto text = ReadFileToString(a.calibration);
    if (!text.ok()) return ReportError(text.status());
    calibration_text = std::move(*text);
  }
  auto params = [&](CostParameters base) -> Result<CostParameters> {
    if (topo->defaults.apply_threads != 0) {
      base.relay_cores = topo->defaults.apply_threads;
    }
    if (!a.calibration.empty()) {
      DCR_ASSIGN_OR_RETURN(base, CostParameters::FromJson(calibration_text,
                                                          a.calibration, base));
    }
    if (a.root_cores) base.root_cores = a.root_cores;
    if (a.relay_cores) base.relay_cores = a.relay_cores;
    base.producers = a.producers;
    base.producer_cores = a.producer_cores;
    return base;
  };
  // (A producers' refit too: its ranks send base-independent parts, and
  // the root codes the changed spans again in context.)
  auto p = params(a.no_context ? CostParameters::BaseIndependent()
                               : CostParameters());
  if (!p.ok()) return ReportError(p.status());
  uint64_t default_bps = 0;
  if (!a.bandwidth.empty()) {
    auto bps = ParseBandwidth(a.bandwidth);
    if (!bps.ok()) return ReportError(bps.status());
    default_bps = *bps;
  }
  auto e = EstimateRefit(*tree, bytes, *rate, *p, default_bps);
  if (!e.ok()) return ReportError(e.status().WithContext(topo->source));
  // A serving rank holds parts of spans, nothing to decode a context-coded
  // chunk against: as `dcr refit` does, a root child whose subtree holds
  // one takes base-independent chunks, and the others context-coded ones.
  // (--no-context: every subtree base-independent.)
  std::vector<std::string> context_heads, plain_heads;
  const bool context = !a.no_context;
  std::vector<bool> takes;
  for (int child : tree->nodes[0].children) {
    const std::vector<int> sub = tree->Subtree(child);
    const bool serving = std::any_of(sub.begin(), sub.end(), [&](int k) {
      return tree->nodes[static_cast<size_t>(k)].serving;
    });
    takes.push_back(context && !serving);
    (takes.back() ? context_heads : plain_heads)
        .push_back(tree->nodes[static_cast<size_t>(child)].name);
  }
  if (context && !plain_heads.empty()) {
    auto independent = params(CostParameters::BaseIndependent());
    if (!independent.ok()) return ReportError(independent.status());
    // A calibration measures the refit it ran, context-coded by default:
    // the base-independent subtrees keep their own encoding's built-in
    // payload, encode and apply figures.
    const CostParameters builtin = CostParameters::BaseIndependent();
    independent->payload_ratio = builtin.payload_ratio;
    independent->encode_rate = builtin.encode_rate;
    independent->apply_rate = builtin.apply_rate;
    auto mixed =
        EstimateSubtreeCoding(*tree, takes, bytes, *rate, *p, *independent,
                              topo->root.keep_deltas > 0, default_bps);
    if (!mixed.ok()) {
      return ReportError(mixed.status().WithContext(topo->source));
    }
    e->delta = *mixed;
    e->speedup = e->full.total_s / e->delta.total_s;
  }
  if (g.format() == OutputFormat::kJson) {
    nlohmann::json j = {{"topology", topo->source},
                        {"model_bytes", e->model_bytes},
                        {"change_rate", e->change_rate},
                        {"receivers", e->receivers},
                        {"depth", e->depth},
                        {"bottleneck_bps", e->bottleneck_bps},
                        {"bottleneck_cluster", e->bottleneck_cluster},
                        {"path_latency_s", e->path_latency_s},
                        {"calibration", p->source},
                        {"root_cores", p->root_cores},
                        {"relay_cores", p->relay_cores},
                        {"producers", p->producers},
                        {"producer_cores", p->producer_cores},
                        {"context_subtrees", context_heads},
                        {"base_independent_subtrees", plain_heads},
                        {"delta", EstimateJson(e->delta)},
                        {"full", EstimateJson(e->full)},
                        {"speedup", e->speedup}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf(
      "%s: %zu receivers, depth %d, slowest path %s into %s (latency %.1f "
      "ms)\n",
      topo->source.c_str(), e->receivers, e->depth,
      fmt::format("{:.3g} Gbit/s", e->bottleneck_bps / 1e9).c_str(),
      e->bottleneck_cluster.c_str(), e->path_latency_s * 1e3);
  std::printf("model %s, %.2f%% of elements change; calibration: %s\n",
              HumanBytes(static_cast<uint64_t>(bytes)).c_str(), *rate * 100,
              p->source.c_str());
  if (p->producers > 0) {
    const std::string recode =
        e->delta.recode_s > 0
            ? fmt::format(" and codes the changed spans in context ({})",
                          Secs(e->delta.recode_s))
            : std::string();
    std::printf(
        "delta from %u producers x %u cores (they diff and hash their "
        "shards: %s); the root applies the parts to root.baseline (%s)%s\n",
        p->producers, p->producer_cores, Secs(e->delta.producers_s).c_str(),
        Secs(e->delta.baseline_s).c_str(), recode.c_str());
  }
  if (context && !plain_heads.empty()) {
    const std::string rest =
        context_heads.empty()
            ? std::string("no subtree takes context-coded chunks")
            : fmt::format("context-coded for {}",
                          fmt::join(context_heads, ", "));
    std::printf(
        "delta: base-independent chunks for the subtrees of %s (serving "
        "ranks below: they hold parts of spans); %s\n",
        fmt::format("{}", fmt::join(plain_heads, ", ")).c_str(), rest.c_str());
  }
  std::printf("\n");
  std::printf("%-6s %10s %10s %10s %10s %10s %10s %10s  %s\n", "refit",
              "payload", "transfer", "encode", "apply", "verify", "commit",
              "total", "bound by");
  for (auto [name, r] : {std::pair{"delta", &e->delta}, {"full", &e->full}}) {
    std::printf("%-6s %10s %10s %10s %10s %10s %10s %10s  %s\n", name,
                HumanBytes(static_cast<uint64_t>(r->payload_bytes)).c_str(),
                Secs(r->transfer_s).c_str(), Secs(r->encode_s).c_str(),
                Secs(r->apply_s).c_str(), Secs(r->verify_s).c_str(),
                Secs(r->commit_s).c_str(), Secs(r->total_s).c_str(),
                r->bottleneck.c_str());
  }
  std::printf("\ndelta refit predicted %.1fx faster than the full checkpoint\n",
              e->speedup);
  return kExitOk;
}

}  // namespace

void AddPlanCommand(CLI::App* app, GlobalOptions* g, int* exit_code) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = app->add_subcommand(
      "plan", "Predict a refit's time through a topology (cost model)");
  cmd->add_option("-t,--topology", a->topology, "Topology YAML file")
      ->required();
  cmd->add_option("--model-bytes", a->model_bytes,
                  "Checkpoint size, e.g. 60GB or 2TB");
  cmd->add_option("--params", a->params,
                  "Or the parameter count (BF16), e.g. 30B, 235B, 1T");
  cmd->add_option("--change-rate", a->change_rate,
                  "Fraction of elements whose bits change per step, e.g. "
                  "0.03 or 3%")
      ->required();
  cmd->add_flag("--no-context", a->no_context,
                "Predict a refit with `dcr refit --no-context`: "
                "base-independent chunks (larger payload, faster encode and "
                "apply) instead of the default context-coded ones");
  cmd->add_option("--calibration", a->calibration,
                  "JSON with measured model parameters (docs/SCALE.md; "
                  "bench/refit_e2e writes one); default: built-in figures");
  cmd->add_option("--bandwidth", a->bandwidth,
                  "Bandwidth of links the topology gives none, e.g. 10Gbps");
  cmd->add_option("--wan", a->wan,
                  "What if: every link between clusters has this bandwidth");
  cmd->add_option("--lan", a->lan,
                  "What if: every node inside a cluster has this bandwidth");
  cmd->add_option("--root-cores", a->root_cores,
                  "Encoder cores at the root (default 32)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--relay-cores", a->relay_cores,
                  "Apply and hash cores per relay (default: the topology's "
                  "defaults.apply_threads, else 16)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--producers", a->producers,
                  "Predict a producers' refit (dcr refit --producers): this "
                  "many trainer ranks diff and hash their own shards; the "
                  "root applies the parts to root.baseline and (unless "
                  "--no-context) codes the changed spans in context")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--producer-cores", a->producer_cores,
                  "With --producers: cores each rank's host gives dcr "
                  "(default 4)")
      ->check(CLI::Range(1, 4096));
  AddOutputOption(cmd, g);
  cmd->footer(
      "\nThe model (docs/SCALE.md): the delta's payload is the model size "
      "times a payload\nratio measured per change rate; it streams at the "
      "slowest path's bandwidth\nwhile the root encodes and relays apply "
      "(and hash what the stream has passed,\nfor the vote). The root hashes "
      "the target\nand writes the changed "
      "spans into root.baseline as it encodes them (both in\nthe encode "
      "column; END names the target's digests). The full refit sends\n"
      "zstd-compressed dense spans through the same tree and writes "
      "root.baseline\nafter the decision (its commit column). A subtree of "
      "the root that holds\nserving ranks takes base-independent chunks, as "
      "dcr refit sends them; the\nothers context-coded ones (not with "
      "--no-context).\n\n"
      "Examples:\n"
      "  dcr plan --topology topology/two-region.yaml --params 1T "
      "--change-rate 3%\n"
      "  dcr plan --topology topology/two-region.yaml --model-bytes 60GB "
      "--change-rate 0.01 -o json\n"
      "  dcr plan --topology topology/two-region.yaml --params 1T "
      "--change-rate 3% --wan 3Gbps --lan 100Gbps\n\nExit codes: 0 a "
      "prediction, 2 usage "
      "or configuration error.\n");
  cmd->callback([=] { *exit_code = RunPlan(*a, *g); });
}

}  // namespace dcr::cli
