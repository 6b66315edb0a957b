// The refit cost model behind `dcr plan` and docs/SCALE.md: predicted time
// of a delta refit and of a full-checkpoint refit of a model of a given
// size and change rate through a topology's tree.
//
// Model (docs/SCALE.md has the derivation and its check against measured
// runs):
//   payload        = model_bytes * payload_ratio(change rate)
//   full payload   = model_bytes * full_ratio        (zstd dense overwrite)
//   transfer       = payload / (bottleneck path bandwidth * efficiency)
//   encode         = model_bytes / (encode rate(change rate) * root cores)
//                    + hash (the root hashes the target for its digests as
//                    it encodes it; END names them, coord/target_digests.h)
//   hash           = model_bytes / (root hash rate * root cores)
//   apply          = model_bytes / (apply rate(change rate) * relay cores)
//   stream         = max(transfer, encode, apply)
//                    + depth * (hop latency + hop overhead)   (pipeline fill)
//   prepare        = 0: nothing proportional before PLAN (opening the
//                    files and the state is in the fixed overhead)
//   verify         = model_bytes / (hash rate * relay cores)  (every vote
//                    hashes the whole store)
//   baseline       = model_bytes / (baseline rate * root cores)  (the
//                    root writes the spans the refit changed into
//                    root.baseline; at 1% or more of BF16 elements
//                    changed, every span). A delta refit does it while it
//                    streams, on the encoder's cores (encode + baseline is
//                    the root's stage of the pipeline; coord/
//                    baseline_stream.h); a full refit after the decision,
//                    with a hash of the baseline, within commit
//   commit         = max(model_bytes / commit sync rate, full: baseline)
//                    (a file store syncs its dirty pages, nearly every
//                    page; no sync for shm/tmpfs stores or background
//                    write-back)
//   control        = 3 round trips (PLAN, END/VOTE, COMMIT) of the deepest
//                    path + fixed overhead
//   total          = prepare + control + stream + verify + commit
// A producers' refit (producers > 0; dcr/producer.h) has no root pass over
// the model: the ranks diff and hash their own shards, and the root
// applies the merged parts to root.baseline and, where the chunks are
// context-coded, codes each changed span again in context:
//   encode         = max(model_bytes / (producer encode rate * producer
//                        cores) + model_bytes / (root hash rate * producer
//                        cores), baseline + recode)
//   baseline       = model_bytes / (base-independent apply rate(change
//                    rate) * root cores) (it applies the plain copies)
//   recode         = context-coded: model_bytes / (encode rate(change
//                    rate) * root cores) (a canonical root's encode, diff
//                    included: an upper bound); else 0
// with producer cores = producers * cores each (their parts are
// base-independent whatever the tree takes: producer_encode_rate).
// A full refit has the same terms with the full payload, no diff (encode is
// a zstd pass, full_encode rate) and a dense apply (copy rate).
// Context coding per root child subtree (ChooseContextPerSubtree): the root
// encodes one stream and sends each root child c, for each chunk, either the
// context-coded frame or the base-independent one (variant v_c; a subtree
// that holds serving nodes takes base-independent frames only):
//   transfer_c     = payload(v_c) / (bottleneck bandwidth of the paths into
//                    the clusters headed in c's subtree * efficiency)
//   apply_c        = model_bytes / (apply rate(v_c) * relay cores)
//   v_c            = two candidates: context for every child that may
//                    take it, and context for those whose own
//                    max(transfer_c, apply_c) is lower with it; the
//                    faster is taken (on a tie, the one with fewer
//                    base-independent children)
//   encode         = the context-coded encode above (it writes the
//                    base-independent copy as well when some child takes
//                    it) + model_bytes / (base-independent encode rate *
//                    root cores) for that copy unless the history records
//                    it anyway (or a producers' root recodes: it writes
//                    the copy first every time)
//   stream         = max(encode, max_c transfer_c, max_c apply_c)
//                    + pipeline fill (one window paces every child)
//   verify, commit, control as above; the plan is taken when its total is
//   below that of an all-base-independent refit.
//
// Thread safety: pure functions.
#ifndef DCR_COORD_COST_MODEL_H_
#define DCR_COORD_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcr/status.h"
#include "dcr/topology.h"

namespace dcr {

// Rates are bytes of checkpoint per second per core; ratios are bytes of
// payload per byte of checkpoint. Defaults: measured on the development
// machines (bench/results/codec.json, refit.json; docs/SCALE.md).
struct CostParameters {
  // (change rate, payload ratio) points, ascending; interpolated linearly
  // and extrapolated from the nearest two.
  // Context-coded chunks (codec.h kContext), the default of delta refits.
  std::vector<std::pair<double, double>> payload_ratio = {
      {0.01, 0.00526}, {0.03, 0.01378}, {0.05, 0.02189}};
  // (change rate, bytes/s per core) for diff + encode at the root.
  std::vector<std::pair<double, double>> encode_rate = {
      {0.01, 2.39e9}, {0.03, 1.61e9}, {0.05, 1.15e9}};
  // (change rate, bytes/s per core) for decode + apply at a relay.
  std::vector<std::pair<double, double>> apply_rate = {
      {0.01, 4.16e9}, {0.03, 2.97e9}, {0.05, 2.45e9}};
  double full_ratio = 0.669;         // --full payload / checkpoint (BF16)
  double full_encode_rate = 0.24e9;  // zstd-1 of dense spans, per core
  double full_apply_rate = 0.67e9;   // decompress + copy, per core
  double hash_rate = 3.4e9;          // store digest at the vote, per core
  // The root's hash of the target (in its encoding pass), per core; 0:
  // hash_rate.
  double root_hash_rate = 0;
  // The root's pass over root.baseline at commit (write the changed spans,
  // hash every span), per core.
  double baseline_rate = 3.0e9;
  double efficiency = 0.93;  // achieved / nominal link bandwidth
  // Bytes/s a relay's store syncs at commit; 0: no sync (shm or tmpfs
  // stores, or file stores with dcr-relay --data-sync background, the
  // default: the write-back follows the commit).
  double commit_sync_rate = 0;
  double hop_overhead_s = 0.002;   // per hop, beyond the link latency
  double fixed_overhead_s = 0.05;  // connect, hello, durable decision
  uint32_t root_cores = 32;        // encoder threads at the root
  uint32_t relay_cores = 16;       // apply and hash threads per relay
  // Producers' refits: trainer ranks streaming their shards' changes, and
  // the cores each gives dcr (0 producers: the root reads a checkpoint).
  uint32_t producers = 0;
  uint32_t producer_cores = 4;
  // (change rate, bytes/s per core) for a rank's diff + encode of its
  // base-independent parts.
  std::vector<std::pair<double, double>> producer_encode_rate = {
      {0.01, 6.09e9}, {0.03, 3.37e9}, {0.05, 2.27e9}};
  // Whether these parameters are for context-coded chunks (the defaults)
  // or base-independent ones (BaseIndependent()).
  bool context_coded = true;
  std::string source = "built-in";  // where the numbers come from

  // Reads a calibration JSON ({"payload_ratio": [[rate, ratio], ...],
  // "efficiency": 0.9, ...}; any subset of the fields above, same names,
  // and "note" for free text) over the defaults. InvalidArgument names the
  // field that is wrong or unknown.
  static Result<CostParameters> FromJson(const std::string& text,
                                         const std::string& source);
  // The same, over `defaults` instead of the built-in defaults.
  static Result<CostParameters> FromJson(const std::string& text,
                                         const std::string& source,
                                         CostParameters defaults);
  // The defaults for base-independent chunks only (`dcr refit
  // --no-context`): larger payloads, faster encode and apply (measured in
  // the same bench/codec_figures.py run as the defaults).
  static CostParameters BaseIndependent();
};

struct RefitEstimate {
  double payload_bytes = 0;
  double transfer_s = 0;
  double encode_s = 0;
  double apply_s = 0;
  double stream_s = 0;   // max(transfer, encode, apply) + pipeline fill
  double prepare_s = 0;  // before PLAN: nothing proportional to the model
  // The root's hash of the target: within encode_s (hashed as it streams).
  double target_hash_s = 0;
  // The relays' hashing for the vote that the stream could not hide:
  // max(0, store hash - (stream body - apply)).
  double verify_s = 0;
  // The root's baseline pass: within encode_s for a delta refit (written
  // while streaming), within commit_s for a full one.
  double baseline_s = 0;
  // A producers' refit: the ranks' diff, encode and hash (within encode_s),
  // and the root's coding of the changed spans in context (with
  // baseline_s, the root's stage).
  double producers_s = 0;
  double recode_s = 0;
  double commit_s = 0;
  double control_s = 0;
  double total_s = 0;
  std::string bottleneck;  // "transfer", "encode" or "apply"
};

struct PlanEstimate {
  double model_bytes = 0;
  double change_rate = 0;
  uint64_t bottleneck_bps = 0;  // slowest path from the root (bits/s)
  std::string bottleneck_cluster;
  int depth = 0;              // deepest relay
  double path_latency_s = 0;  // of the deepest path
  size_t receivers = 0;
  RefitEstimate delta;
  RefitEstimate full;
  double speedup = 0;  // full / delta
};

// Predicts both refits through `tree` (BuildTree). InvalidArgument when the
// tree has no relays, a path's bandwidth is unknown and `default_bps` is 0,
// or the inputs are out of range (model_bytes > 0, 0 < change_rate <= 1).
// `default_bps` stands for links without a bandwidth in the topology.
Result<PlanEstimate> EstimateRefit(const Tree& tree, double model_bytes,
                                   double change_rate, const CostParameters& p,
                                   uint64_t default_bps = 0);

// Whether a delta refit through `tree` is predicted faster with
// context-coded chunks (the defaults) than with base-independent ones
// (CostParameters::BaseIndependent()), both with `root_cores` encoder
// threads and `relay_cores` apply threads per relay. Fills the two predictions
// when asked. An error from either estimate (e.g. a path without a bandwidth)
// is returned.
struct ContextChoice {
  bool context = false;
  double with_s = 0;     // predicted refit time, context-coded
  double without_s = 0;  // base-independent
};
Result<ContextChoice> ChooseContextCoding(const Tree& tree, double model_bytes,
                                          double change_rate,
                                          uint32_t root_cores,
                                          uint32_t relay_cores);

// Context coding decided per child of the root, for a tree in which some
// root children's subtrees must take base-independent chunks (they hold
// serving nodes): one context encoder at the root feeds context-coded
// frames to the children that gain from them and base-independent ones to
// the others (the Model above). `plain` has one flag per root child, in
// `tree.nodes[0].children` order: true when its subtree must take
// base-independent chunks. `history_records`: the history keeps the
// base-independent copy anyway, so writing it costs the encoder nothing
// more. The defaults and BaseIndependent() parameters, with `root_cores`
// encoder threads and `relay_cores` apply threads per relay. With no child
// forced plain and every subtree's choice the same, the result is
// ChooseContextCoding's. InvalidArgument for `plain` of the wrong size, a root
// child without a cluster of known bandwidth below it, or EstimateRefit's.
struct SubtreeContextChoice {
  std::vector<int> children;  // the root's, tree.nodes[0].children order
  std::vector<bool> context;  // per child: takes context-coded chunks
  // Predicted refit time of the chosen plan: the mixed plan if any child
  // takes context, else without_s.
  double with_s = 0;
  double without_s = 0;  // every child base-independent
  // The terms of the plan taken (payload_bytes: the larger frame a child
  // is sent); when no plan with context is taken, of the best one
  // evaluated; all zero when no child may take context.
  RefitEstimate mixed;

  // True iff some child takes context-coded chunks.
  bool any() const;
};
// `producers` > 0: a producers' refit's (CostParameters::producers, with
// `producer_cores` each): its root stage is the apply of the parts plus,
// with context, their recoding, not a canonical root's encode.
Result<SubtreeContextChoice> ChooseContextPerSubtree(
    const Tree& tree, const std::vector<bool>& plain, double model_bytes,
    double change_rate, uint32_t root_cores, uint32_t relay_cores,
    bool history_records, uint32_t producers = 0, uint32_t producer_cores = 4);

// A delta refit through `tree` in which root child i (`tree.nodes[0]
// .children` order) takes context-coded chunks iff takes[i], the others
// base-independent ones: the per-subtree model above with each encoding's
// parameters (`context`, `independent`; their own cores). What `dcr refit
// --context on` streams when serving ranks keep some subtrees off context,
// and `dcr plan` predicts. With no child on context, EstimateRefit's delta
// with `independent`. InvalidArgument as ChooseContextPerSubtree's, or for
// a path without a bandwidth when `default_bps` is 0.
Result<RefitEstimate> EstimateSubtreeCoding(
    const Tree& tree, const std::vector<bool>& takes, double model_bytes,
    double change_rate, const CostParameters& context,
    const CostParameters& independent, bool history_records,
    uint64_t default_bps = 0);

}  // namespace dcr

#endif  // DCR_COORD_COST_MODEL_H_
