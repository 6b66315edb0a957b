#include "coord/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

namespace dcr {
namespace {

// Linear interpolation over ascending points, extrapolated from the
// nearest two (clamped at a tenth of the nearest point's value, so a rate
// never reaches zero).
double Interpolate(const std::vector<std::pair<double, double>>& pts,
                   double x) {
  if (pts.size() == 1) return pts[0].second;
  size_t i = 1;
  while (i + 1 < pts.size() && x > pts[i].first) ++i;
  auto [x0, y0] = pts[i - 1];
  auto [x1, y1] = pts[i];
  double y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
  double nearest = x < x0 ? y0 : x > x1 ? y1 : std::min(y0, y1);
  return std::max(y, nearest / 10);
}

Status ReadPoints(const nlohmann::json& j, const char* key,
                  std::vector<std::pair<double, double>>* out) {
  if (!j.contains(key)) return Status::OK();
  const auto& v = j[key];
  std::vector<std::pair<double, double>> pts;
  if (!v.is_array() || v.empty()) {
    return Status::InvalidArgument(
        fmt::format("{}: a non-empty list of [change rate, value] pairs", key));
  }
  for (const auto& p : v) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() ||
        !p[1].is_number() || p[0].get<double>() <= 0 ||
        p[1].get<double>() <= 0) {
      return Status::InvalidArgument(fmt::format(
          "{}: each entry is [change rate, value], both positive", key));
    }
    pts.emplace_back(p[0].get<double>(), p[1].get<double>());
  }
  std::sort(pts.begin(), pts.end());
  for (size_t i = 1; i < pts.size(); ++i) {
    if (pts[i].first == pts[i - 1].first) {
      return Status::InvalidArgument(
          fmt::format("{}: change rate {} given twice", key, pts[i].first));
    }
  }
  *out = std::move(pts);
  return Status::OK();
}

Status CheckInputs(const Tree& tree, double model_bytes, double change_rate) {
  if (!(model_bytes > 0)) {
    return Status::InvalidArgument("the model size must be positive");
  }
  if (!(change_rate > 0 && change_rate <= 1)) {
    return Status::InvalidArgument(
        "the change rate must be above 0 and at most 1 (e.g. 0.03 for 3%)");
  }
  if (tree.nodes.size() < 2) {
    return Status::InvalidArgument("the topology has no relays");
  }
  return Status::OK();
}

// The paths into the nodes `in` marks (the whole tree, or one root child's
// subtree): the slowest path from the root into a cluster whose head is
// among them paces a stream to them (each cluster's stream_bps is the
// bottleneck of the path into it); the deepest of them, with the latency of
// its path, fills the pipeline. bps 0 when no cluster's head is marked.
struct PathShape {
  uint64_t bps = 0;
  std::string cluster;  // the slowest path's
  int depth = 0;
  double latency_s = 0;
};

Result<PathShape> ShapeOf(const Tree& tree, const std::vector<bool>& in,
                          uint64_t default_bps) {
  PathShape s;
  for (const TreeCluster& c : tree.clusters) {
    if (c.head < 0 || static_cast<size_t>(c.head) >= in.size() ||
        !in[static_cast<size_t>(c.head)]) {
      continue;
    }
    uint64_t bps = c.stream_bps ? c.stream_bps : default_bps;
    if (bps == 0) {
      return Status::InvalidArgument(fmt::format(
          "cluster {}: the topology gives no bandwidth on its path from the "
          "root; add bandwidth to its link (or pass --bandwidth)",
          c.name));
    }
    if (s.bps == 0 || bps < s.bps) {
      s.bps = bps;
      s.cluster = c.name;
    }
  }
  for (size_t i = 1; i < tree.nodes.size() && i < in.size(); ++i) {
    if (!in[i]) continue;
    double latency = 0;
    int depth = 0;
    for (int n = static_cast<int>(i); n > 0;
         n = tree.nodes[static_cast<size_t>(n)].parent) {
      latency += tree.nodes[static_cast<size_t>(n)].link_latency_ns * 1e-9;
      ++depth;
    }
    if (depth > s.depth || (depth == s.depth && latency > s.latency_s)) {
      s.depth = depth;
      s.latency_s = latency;
    }
  }
  return s;
}

// The stages a path and a relay add to the stream: sending `payload` down a
// path of `bps`, and decoding and applying the model at `apply_rate`.
double TransferSeconds(double payload, uint64_t bps, const CostParameters& p) {
  return payload / (static_cast<double>(bps) / 8 * p.efficiency);
}
double ApplySeconds(double model_bytes, double apply_rate,
                    const CostParameters& p) {
  return model_bytes / (apply_rate * p.relay_cores);
}

// The root's stage: encode (with the target's hash and, `baseline_in_stream`
// (a delta refit), root.baseline's writes), or a producers' refit's.
// `baseline_in_stream`: the root writes root.baseline as it encodes (a
// delta refit), not after the decision (a full one).
RefitEstimate RootStage(double model_bytes, double change_rate,
                        double encode_rate, double apply_rate,
                        const CostParameters& p, bool baseline_in_stream) {
  RefitEstimate e;
  e.baseline_s = model_bytes / (p.baseline_rate * p.root_cores);
  const double root_hash_rate =
      p.root_hash_rate > 0 ? p.root_hash_rate : p.hash_rate;
  e.target_hash_s = model_bytes / (root_hash_rate * p.root_cores);
  e.encode_s = model_bytes / (encode_rate * p.root_cores) + e.target_hash_s +
               (baseline_in_stream ? e.baseline_s : 0);
  if (p.producers > 0 && baseline_in_stream) {
    // The ranks diff and hash their shards; the root applies the merged
    // parts to root.baseline beside them (coord/producer_feed.h), and codes
    // the changed spans again in context where the chunks are.
    const double cores = static_cast<double>(p.producers) * p.producer_cores;
    e.target_hash_s = model_bytes / (root_hash_rate * cores);
    // root.baseline takes base-independent chunks either way (the
    // context-coded ones' copies): the built-in base-independent apply
    // rate where these parameters are the context-coded ones.
    const double plain_apply =
        p.context_coded
            ? Interpolate(CostParameters::BaseIndependent().apply_rate,
                          change_rate)
            : apply_rate;
    e.baseline_s = model_bytes / (plain_apply * p.root_cores);
    e.recode_s =
        p.context_coded ? model_bytes / (encode_rate * p.root_cores) : 0;
    e.producers_s =
        model_bytes /
            (Interpolate(p.producer_encode_rate, change_rate) * cores) +
        e.target_hash_s;
    e.encode_s = std::max(e.producers_s, e.baseline_s + e.recode_s);
  }
  return e;
}

// The terms that follow from the stages (`e`'s transfer, encode and apply)
// and the whole tree's `shape`: stream, verify, commit, control, total.
void Finish(const PlanEstimate& shape, const CostParameters& p,
            bool baseline_in_stream, RefitEstimate* e) {
  double slowest = std::max({e->transfer_s, e->encode_s, e->apply_s});
  e->bottleneck = slowest == e->transfer_s ? "transfer"
                  : slowest == e->encode_s ? "encode"
                                           : "apply";
  double hops = shape.depth * p.hop_overhead_s + shape.path_latency_s;
  e->stream_s = slowest + hops;
  e->prepare_s = 0;
  // Relays hash each tensor once the stream has moved past it
  // (session/refit_session.h, "Hashing ahead"), in the time applying leaves
  // their cores idle; what does not fit there is the vote's tail.
  const double hash_s = shape.model_bytes / (p.hash_rate * p.relay_cores);
  e->verify_s = std::max(0.0, hash_s - std::max(0.0, slowest - e->apply_s));
  e->commit_s = std::max(
      p.commit_sync_rate > 0 ? shape.model_bytes / p.commit_sync_rate : 0,
      baseline_in_stream ? 0 : e->baseline_s);
  e->control_s = 3 * 2 * hops + p.fixed_overhead_s;
  e->total_s =
      e->prepare_s + e->control_s + e->stream_s + e->verify_s + e->commit_s;
}

RefitEstimate Estimate(double payload, double encode_rate, double apply_rate,
                       uint64_t bottleneck_bps, const PlanEstimate& shape,
                       const CostParameters& p, bool baseline_in_stream) {
  RefitEstimate e = RootStage(shape.model_bytes, shape.change_rate, encode_rate,
                              apply_rate, p, baseline_in_stream);
  e.payload_bytes = payload;
  e.transfer_s = TransferSeconds(payload, bottleneck_bps, p);
  e.apply_s = ApplySeconds(shape.model_bytes, apply_rate, p);
  Finish(shape, p, baseline_in_stream, &e);
  return e;
}

// What ChooseContextPerSubtree and EstimateSubtreeCoding share: each
// encoding's payload and apply time (index 0: base-independent chunks, 1:
// context-coded), each root child's transfer in both over its own paths,
// and the all-base-independent refit, whose shape paces the others.
struct SubtreeModel {
  double payload[2] = {0, 0};
  double apply[2] = {0, 0};
  std::vector<std::array<double, 2>> transfer;  // per root child
  PlanEstimate without;
};

// `flags` (one per root child, in `tree.nodes[0].children` order) is only
// checked for its size.
Result<SubtreeModel> ModelSubtrees(const Tree& tree,
                                   const std::vector<bool>& flags,
                                   double model_bytes, double change_rate,
                                   const CostParameters& context,
                                   const CostParameters& independent,
                                   uint64_t default_bps) {
  DCR_RETURN_IF_ERROR(CheckInputs(tree, model_bytes, change_rate));
  const std::vector<int>& children = tree.nodes[0].children;
  if (flags.size() != children.size()) {
    return Status::InvalidArgument(fmt::format(
        "{} flags for the root's {} children", flags.size(), children.size()));
  }
  SubtreeModel m;
  DCR_ASSIGN_OR_RETURN(m.without, EstimateRefit(tree, model_bytes, change_rate,
                                                independent, default_bps));
  m.payload[0] =
      model_bytes * Interpolate(independent.payload_ratio, change_rate);
  m.payload[1] = model_bytes * Interpolate(context.payload_ratio, change_rate);
  m.apply[0] = ApplySeconds(model_bytes,
                            Interpolate(independent.apply_rate, change_rate),
                            independent);
  m.apply[1] = ApplySeconds(
      model_bytes, Interpolate(context.apply_rate, change_rate), context);
  m.transfer.resize(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    std::vector<bool> in(tree.nodes.size(), false);
    for (int n : tree.Subtree(children[i])) in[static_cast<size_t>(n)] = true;
    DCR_ASSIGN_OR_RETURN(PathShape shape, ShapeOf(tree, in, default_bps));
    if (shape.bps == 0) {
      return Status::InvalidArgument(fmt::format(
          "root child {}: no cluster with a known bandwidth below it",
          tree.nodes[static_cast<size_t>(children[i])].name));
    }
    m.transfer[i] = {TransferSeconds(m.payload[0], shape.bps, independent),
                     TransferSeconds(m.payload[1], shape.bps, context)};
  }
  return m;
}

// The refit with `takes` (per root child: context-coded chunks; at least
// one): one context encoder for the whole stream, whose base-independent
// copy costs a plain encoder's pass unless the history records it anyway;
// one window paces every child.
RefitEstimate EstimateTakes(const SubtreeModel& m,
                            const std::vector<bool>& takes, double model_bytes,
                            double change_rate, const CostParameters& context,
                            const CostParameters& independent,
                            bool history_records) {
  RefitEstimate e = RootStage(
      model_bytes, change_rate, Interpolate(context.encode_rate, change_rate),
      Interpolate(context.apply_rate, change_rate), context,
      /*baseline_in_stream=*/true);
  bool any_independent = false;
  for (size_t i = 0; i < takes.size(); ++i) {
    const size_t v = takes[i] ? 1 : 0;
    any_independent = any_independent || !takes[i];
    e.payload_bytes = std::max(e.payload_bytes, m.payload[v]);
    e.transfer_s = std::max(e.transfer_s, m.transfer[i][v]);
    e.apply_s = std::max(e.apply_s, m.apply[v]);
  }
  // (A producers' root writes the copy in every recode: within recode_s.)
  if (any_independent && !history_records && context.producers == 0) {
    e.encode_s +=
        model_bytes / (Interpolate(independent.encode_rate, change_rate) *
                       independent.root_cores);
  }
  Finish(m.without, context, /*baseline_in_stream=*/true, &e);
  return e;
}

}  // namespace

Result<ContextChoice> ChooseContextCoding(const Tree& tree, double model_bytes,
                                          double change_rate,
                                          uint32_t root_cores,
                                          uint32_t relay_cores) {
  CostParameters context;
  CostParameters plain = CostParameters::BaseIndependent();
  context.root_cores = plain.root_cores = std::max<uint32_t>(root_cores, 1);
  context.relay_cores = plain.relay_cores = std::max<uint32_t>(relay_cores, 1);
  DCR_ASSIGN_OR_RETURN(PlanEstimate with,
                       EstimateRefit(tree, model_bytes, change_rate, context));
  DCR_ASSIGN_OR_RETURN(PlanEstimate without,
                       EstimateRefit(tree, model_bytes, change_rate, plain));
  ContextChoice c;
  c.with_s = with.delta.total_s;
  c.without_s = without.delta.total_s;
  c.context = c.with_s < c.without_s;
  return c;
}

bool SubtreeContextChoice::any() const {
  return std::find(context.begin(), context.end(), true) != context.end();
}

Result<SubtreeContextChoice> ChooseContextPerSubtree(
    const Tree& tree, const std::vector<bool>& plain, double model_bytes,
    double change_rate, uint32_t root_cores, uint32_t relay_cores,
    bool history_records, uint32_t producers, uint32_t producer_cores) {
  CostParameters context;
  CostParameters independent = CostParameters::BaseIndependent();
  context.root_cores = independent.root_cores =
      std::max<uint32_t>(root_cores, 1);
  context.relay_cores = independent.relay_cores =
      std::max<uint32_t>(relay_cores, 1);
  context.producers = independent.producers = producers;
  context.producer_cores = independent.producer_cores =
      std::max<uint32_t>(producer_cores, 1);
  DCR_ASSIGN_OR_RETURN(SubtreeModel m,
                       ModelSubtrees(tree, plain, model_bytes, change_rate,
                                     context, independent, /*default_bps=*/0));
  const std::vector<int>& children = tree.nodes[0].children;
  SubtreeContextChoice choice;
  choice.children = children;
  choice.context.assign(children.size(), false);
  choice.without_s = choice.with_s = m.without.delta.total_s;
  // Two candidates beside `without`: every eligible child on context (what
  // a tree without serving nodes gets: ChooseContextCoding's plan), and
  // each eligible child on context where its own stages gain (a child
  // bound by a slow relay may apply base-independent chunks faster). On a
  // tie the plan with fewer base-independent children wins: two encodings
  // cost root memory, resend coverage and signed-manifest room.
  std::vector<bool> all(children.size()), greedy(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    all[i] = !plain[i];
    greedy[i] = !plain[i] && std::max(m.transfer[i][1], m.apply[1]) <
                                 std::max(m.transfer[i][0], m.apply[0]);
  }
  for (const std::vector<bool>* takes : {&all, &greedy}) {
    if (std::none_of(takes->begin(), takes->end(), [](bool b) { return b; })) {
      continue;
    }
    RefitEstimate e = EstimateTakes(m, *takes, model_bytes, change_rate,
                                    context, independent, history_records);
    if (!choice.any() ? e.total_s < choice.without_s
                      : e.total_s < choice.with_s) {
      choice.context = *takes;
      choice.with_s = e.total_s;
      choice.mixed = e;
    } else if (!choice.any() && choice.mixed.total_s == 0) {
      choice.mixed = e;  // the best plan with context, not taken
    }
  }
  return choice;
}

Result<RefitEstimate> EstimateSubtreeCoding(
    const Tree& tree, const std::vector<bool>& takes, double model_bytes,
    double change_rate, const CostParameters& context,
    const CostParameters& independent, bool history_records,
    uint64_t default_bps) {
  DCR_ASSIGN_OR_RETURN(SubtreeModel m,
                       ModelSubtrees(tree, takes, model_bytes, change_rate,
                                     context, independent, default_bps));
  if (std::none_of(takes.begin(), takes.end(), [](bool b) { return b; })) {
    return m.without.delta;
  }
  return EstimateTakes(m, takes, model_bytes, change_rate, context, independent,
                       history_records);
}

CostParameters CostParameters::BaseIndependent() {
  CostParameters p;
  p.payload_ratio = {{0.01, 0.00690}, {0.03, 0.01803}, {0.05, 0.02834}};
  p.encode_rate = {{0.01, 6.09e9}, {0.03, 3.37e9}, {0.05, 2.27e9}};
  p.apply_rate = {{0.01, 12.94e9}, {0.03, 6.14e9}, {0.05, 4.20e9}};
  p.context_coded = false;
  p.source = "built-in, base-independent chunks";
  return p;
}

Result<CostParameters> CostParameters::FromJson(const std::string& text,
                                                const std::string& source) {
  return FromJson(text, source, CostParameters());
}

Result<CostParameters> CostParameters::FromJson(const std::string& text,
                                                const std::string& source,
                                                CostParameters defaults) {
  CostParameters p = std::move(defaults);
  p.source = source;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(source + ": not a JSON object");
  }
  static constexpr std::string_view kKnown[] = {"payload_ratio",
                                                "encode_rate",
                                                "apply_rate",
                                                "full_ratio",
                                                "full_encode_rate",
                                                "full_apply_rate",
                                                "hash_rate",
                                                "root_hash_rate",
                                                "baseline_rate",
                                                "efficiency",
                                                "hop_overhead_s",
                                                "fixed_overhead_s",
                                                "commit_sync_rate",
                                                "root_cores",
                                                "relay_cores",
                                                "producer_encode_rate",
                                                "note"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) ==
        std::end(kKnown)) {
      return Status::InvalidArgument(
          fmt::format("{}: unknown field '{}' (known: {})", source, key,
                      fmt::join(kKnown, ", ")));
    }
  }
  auto err = [&](const Status& s) {
    return Status::InvalidArgument(source + ": " + std::string(s.message()));
  };
  for (auto [key, out] : {std::pair{"payload_ratio", &p.payload_ratio},
                          {"encode_rate", &p.encode_rate},
                          {"apply_rate", &p.apply_rate},
                          {"producer_encode_rate", &p.producer_encode_rate}}) {
    if (Status s = ReadPoints(j, key, out); !s.ok()) return err(s);
  }
  for (auto [key, out] : {std::pair{"full_ratio", &p.full_ratio},
                          {"full_encode_rate", &p.full_encode_rate},
                          {"full_apply_rate", &p.full_apply_rate},
                          {"hash_rate", &p.hash_rate},
                          {"baseline_rate", &p.baseline_rate},
                          {"root_hash_rate", &p.root_hash_rate},
                          {"efficiency", &p.efficiency},
                          {"hop_overhead_s", &p.hop_overhead_s},
                          {"fixed_overhead_s", &p.fixed_overhead_s},
                          {"commit_sync_rate", &p.commit_sync_rate}}) {
    if (!j.contains(key)) continue;
    const auto& v = j[key];
    bool may_be_zero = std::string_view(key).ends_with("_s") ||
                       std::string_view(key) == "commit_sync_rate" ||
                       std::string_view(key) == "root_hash_rate";
    if (!v.is_number() || v.get<double>() < 0 ||
        (!may_be_zero && v.get<double>() == 0)) {
      return Status::InvalidArgument(
          fmt::format("{}: {} must be a {} number", source, key,
                      may_be_zero ? "non-negative" : "positive"));
    }
    *out = v.get<double>();
  }
  if (p.efficiency > 1) {
    return Status::InvalidArgument(source + ": efficiency is at most 1");
  }
  for (auto [key, out] : {std::pair{"root_cores", &p.root_cores},
                          {"relay_cores", &p.relay_cores}}) {
    if (!j.contains(key)) continue;
    const auto& v = j[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 ||
        v.get<uint64_t>() > 4096) {
      return Status::InvalidArgument(fmt::format(
          "{}: {} must be a whole number from 1 to 4096", source, key));
    }
    *out = v.get<uint32_t>();
  }
  return p;
}

Result<PlanEstimate> EstimateRefit(const Tree& tree, double model_bytes,
                                   double change_rate, const CostParameters& p,
                                   uint64_t default_bps) {
  DCR_RETURN_IF_ERROR(CheckInputs(tree, model_bytes, change_rate));
  PlanEstimate e;
  e.model_bytes = model_bytes;
  e.change_rate = change_rate;
  e.receivers = tree.nodes.size() - 1;
  DCR_ASSIGN_OR_RETURN(
      PathShape shape,
      ShapeOf(tree, std::vector<bool>(tree.nodes.size(), true), default_bps));
  e.bottleneck_bps = shape.bps;
  e.bottleneck_cluster = shape.cluster;
  e.depth = shape.depth;
  e.path_latency_s = shape.latency_s;
  e.delta = Estimate(model_bytes * Interpolate(p.payload_ratio, change_rate),
                     Interpolate(p.encode_rate, change_rate),
                     Interpolate(p.apply_rate, change_rate), shape.bps, e, p,
                     /*baseline_in_stream=*/true);
  e.full = Estimate(model_bytes * p.full_ratio, p.full_encode_rate,
                    p.full_apply_rate, shape.bps, e, p,
                    /*baseline_in_stream=*/false);
  e.speedup = e.full.total_s / e.delta.total_s;
  return e;
}

}  // namespace dcr
