#include "coord/refit_setup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "coord/cost_model.h"
#include "coord/root_tree.h"
#include "dcr/producer.h"

namespace dcr {
namespace {

RefitId NewRefitId() {
  std::random_device rd;
  RefitId id;
  for (size_t i = 0; i < id.bytes.size(); i += 4) {
    uint32_t v = rd();
    for (size_t k = 0; k < 4; ++k) id.bytes[i + k] = uint8_t(v >> (8 * k));
  }
  return id;
}

// The tree of the topology or, with options.only_nodes, a star of the root
// feeding each named relay directly (with a full refit, or a catch-up
// from the history: `from_history`).
Result<Tree> RefitTree(const RefitOptions& options, bool from_history) {
  const Topology& topo = options.topology;
  DCR_ASSIGN_OR_RETURN(Tree tree, BuildTree(topo));
  if (options.only_nodes.empty()) return tree;
  if (options.mode != RefitMode::kFull && !from_history) {
    return Status::InvalidArgument(
        "refitting named nodes needs a full refit (--full)");
  }
  Tree star;
  star.nodes.push_back(tree.nodes[0]);
  star.nodes[0].children.clear();
  for (const std::string& name : options.only_nodes) {
    int i = tree.Find(name);
    if (i <= 0) {
      std::vector<std::string> names;
      for (size_t k = 1; k < tree.nodes.size(); ++k) {
        names.push_back(tree.nodes[k].name);
      }
      return Status::InvalidArgument(
          fmt::format("{}: no relay named '{}' (relays: {})", topo.source, name,
                      fmt::join(names, ", ")));
    }
    if (star.Find(name) >= 0) continue;
    TreeNode n = tree.nodes[static_cast<size_t>(i)];
    n.parent = 0;
    n.children.clear();
    n.depth = 1;
    star.nodes[0].children.push_back(static_cast<int>(star.nodes.size()));
    star.nodes.push_back(std::move(n));
  }
  return star;
}

// A kept root.baseline's write-back waits this long after a commit (a
// relay's default, dcr-relay --write-back-delay).
constexpr std::chrono::milliseconds kKeptWriteBackDelay{30000};

// Opens root.baseline into setup (nothing when none is configured). With
// `strict`, a baseline that cannot be opened is an error, but for a
// missing one before a full refit (it seeds it); without, it is left
// closed.
Status OpenBaseline(const RefitOptions& options, bool strict,
                    RefitSetup* setup) {
  const Topology& topo = options.topology;
  if (topo.root.baseline.empty()) return Status::OK();
  setup->baseline_spec.kind = StoreSpec::Kind::kFile;
  setup->baseline_spec.path = topo.root.baseline;
  setup->baseline_spec.data_sync = options.baseline_data_sync;
  KeptBaseline* kept = options.kept_baseline.get();
  // Only a single safetensors file: an index or a directory maps files the
  // inode check would not see. (Stat before the open: a file replaced in
  // between is only opened again next time.)
  struct stat st {};
  const bool keepable =
      kept != nullptr && !topo.root.baseline.ends_with(".json") &&
      ::stat(topo.root.baseline.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (keepable) {
    setup->baseline_spec.write_back_delay = kKeptWriteBackDelay;
    if (kept->store && kept->device == st.st_dev && kept->inode == st.st_ino) {
      auto on_disk = ReadVersionRecord(DefaultRecordPath(setup->baseline_spec));
      if (on_disk.ok() && *on_disk && **on_disk == kept->store->record()) {
        setup->baseline = kept->store;
        return Status::OK();
      }
    }
  }
  if (kept != nullptr) kept->store.reset();  // opened afresh, or not kept
  auto store = OpenStore(setup->baseline_spec);
  if (store.ok()) {
    setup->baseline = *std::move(store);
    // This process may end with the refit: the next one settles the
    // write-back (dcr/store.h, DetachDataSync).
    setup->baseline->DetachDataSync();
    if (keepable) {
      kept->store = setup->baseline;
      kept->device = st.st_dev;
      kept->inode = st.st_ino;
    }
    return Status::OK();
  }
  const Status& e = store.status();
  if (!strict || (e.IsNotFound() && options.mode != RefitMode::kDelta)) {
    return Status::OK();
  }
  std::string msg = fmt::format(
      "root.baseline: {}{}", e.message(),
      e.IsNotFound() ? " (copy the checkpoint the relays hold there, or "
                       "seed the tree with dcr refit --full)"
                     : "");
  return e.IsNotFound()     ? Status::NotFound(msg)
         : e.IsCorruption() ? Status::Corruption(msg)
                            : Status::IOError(msg);
}

// Whether a delta refit codes its chunks in the base's context: as told,
// or (auto) whichever the cost model predicts faster, per subtree of the
// root (ChooseContextPerSubtree): a subtree without serving ranks that
// would not gain joins setup->plain_nodes.
bool UseContextCoding(const RefitOptions& options, RefitSetup* setup) {
  using CC = RefitOptions::ContextCoding;
  // A producers' refit too: its root codes each whole span in the context
  // of root.baseline's bits (docs/design/producer-stream.md §"Context
  // coding").
  if (options.context_coding != CC::kAuto) {
    return options.context_coding == CC::kOn;
  }
  if (!setup->target) return false;
  double rate = 0.03;
  if (auto last = setup->state.ReadLastRefit();
      last.ok() && last->total_elements > 0 && last->changed_elements > 0) {
    rate = std::clamp(static_cast<double>(last->changed_elements) /
                          static_cast<double>(last->total_elements),
                      0.001, 1.0);
  }
  const Tree& tree = setup->tree;
  std::vector<bool> plain;
  for (int c : tree.nodes[0].children) {
    plain.push_back(
        setup->plain_nodes.contains(tree.nodes[static_cast<size_t>(c)].name));
  }
  const double bytes =
      static_cast<double>(setup->target->manifest().TotalBytes());
  // The history keeps each chunk's base-independent copy anyway (RefitRun
  // records a whole-tree delta refit).
  const bool records =
      options.only_nodes.empty() && options.topology.root.keep_deltas > 0;
  // A producers' refit: its ranks' cores are not known here; the model's
  // default per rank stands for them.
  auto choice = ChooseContextPerSubtree(
      tree, plain, bytes, rate, static_cast<uint32_t>(setup->pool->size()),
      ApplyThreads(options.topology.defaults), records,
      options.producers ? options.producers->layout().ranks() : 0);
  if (!choice.ok()) {
    spdlog::info("context coding: off (no estimate: {})",
                 choice.status().ToString());
    return false;
  }
  std::vector<std::string> on, off;
  for (size_t i = 0; i < choice->children.size(); ++i) {
    const std::vector<int> sub = tree.Subtree(choice->children[i]);
    const std::string& head = tree.nodes[sub[0]].name;
    (choice->context[i] ? on : off).push_back(head);
    if (choice->any() && !choice->context[i]) {
      for (int k : sub) {
        setup->plain_nodes.insert(tree.nodes[static_cast<size_t>(k)].name);
      }
    }
  }
  spdlog::info(
      "context coding: {} (auto: {:.2f} s predicted, {:.2f} s without, at "
      "{:.1f}% change; --context on|off to choose)",
      !choice->any() ? std::string("off")
      : off.empty()  ? std::string("on")
                     : fmt::format("on for the subtrees of {}, off for {}",
                                   fmt::join(on, ", "), fmt::join(off, ", ")),
      choice->with_s, choice->without_s, 100 * rate);
  return choice->any();
}

// The PLAN fields a refit and a resume share.
void FillPlan(const RefitOptions& options, const RefitReport& report,
              RefitSetup* setup) {
  const Topology& topo = options.topology;
  PlanMsg& plan = setup->plan;
  plan.mode = report.mode;
  plan.base = report.base;
  plan.target = report.target;
  plan.span_elems = topo.defaults.span_elems;
  plan.chunk_window_bytes =
      std::max<uint64_t>(topo.defaults.window_bytes, 1u << 20);
  plan.phase_timeout_ms = static_cast<uint32_t>(options.phase_timeout.count());
  plan.heartbeat_ms = static_cast<uint32_t>(options.heartbeat.count());
  plan.nodes = PlanNodes(setup->tree);
  // A serving rank holds parts of spans, not whole ones to decode against:
  // the subtree of each root child that holds one takes base-independent
  // chunks (its relays forward one encoding to all).
  const Tree& tree = setup->tree;
  setup->plain_nodes.clear();
  size_t canonical_children = 0;
  std::vector<std::string> plain_heads;
  for (int child : tree.nodes[0].children) {
    std::vector<int> sub = tree.Subtree(child);
    if (std::none_of(sub.begin(), sub.end(), [&](int k) {
          const TreeNode& n = tree.nodes[static_cast<size_t>(k)];
          return n.serving || options.TEST_plain_nodes.contains(n.name);
        })) {
      ++canonical_children;
      continue;
    }
    plain_heads.push_back(tree.nodes[static_cast<size_t>(child)].name);
    std::vector<std::string> canonical;
    for (int k : sub) {
      const TreeNode& n = tree.nodes[static_cast<size_t>(k)];
      setup->plain_nodes.insert(n.name);
      if (!n.serving) canonical.push_back(n.name);
    }
    // docs/design/context-per-subtree.md §8: no transcoding relay.
    if (!canonical.empty() && report.mode == RefitMode::kDelta &&
        options.context_coding != RefitOptions::ContextCoding::kOff) {
      spdlog::warn(
          "{}: canonical relays fed with serving ranks below them take "
          "base-independent chunks too ({}); give the serving clusters a "
          "link from the root's cluster to keep context coding for them",
          tree.nodes[static_cast<size_t>(child)].name,
          fmt::join(canonical, ", "));
    }
  }
  // Every node of a delta plan holds the base whole (nodes at other
  // versions are caught up or repaired in refits of their own, with
  // base-independent chunks).
  plan.context_coded = report.mode == RefitMode::kDelta && !setup->composed &&
                       canonical_children > 0 &&
                       UseContextCoding(options, setup);
  if (setup->mixed() &&
      options.context_coding == RefitOptions::ContextCoding::kOn) {
    spdlog::info(
        "context coding: on, but base-independent chunks for the subtrees "
        "of {}, which hold serving ranks",
        fmt::join(plain_heads, ", "));
  }
}

// Names the serving ranks' bits in the PLAN: at the base when root.baseline
// holds it, at the target when the PLAN names the target (otherwise END
// does, RefitRun::Vote).
Status NameServingBits(const RefitReport& report, RefitSetup* setup) {
  if (setup->serving.empty()) return Status::OK();
  const auto t0 = std::chrono::steady_clock::now();
  PlanMsg& plan = setup->plan;
  // root.baseline's bits are the plan's base (report.base is its record's
  // version, or its digest without one).
  const WeightStore* baseline = setup->baseline.get();
  if (baseline) {
    DCR_ASSIGN_OR_RETURN(
        plan.serving_base,
        setup->serving.Bits(*baseline, /*regions=*/false, setup->pool.get()));
  } else {
    spdlog::warn(
        "no root.baseline to name the base's bits (step {}): the serving "
        "nodes {} cannot check a restore after a crash against them",
        report.base.step, setup->serving.nodes());
  }
  if (!plan.target_at_end()) {
    DCR_ASSIGN_OR_RETURN(plan.serving_target,
                         setup->serving.Bits(*setup->target, /*regions=*/true,
                                             setup->pool.get()));
  }
  spdlog::info(
      "serving nodes {}: their ranks' bits named in {:.3f} s",
      setup->serving.nodes(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return Status::OK();
}

// Checks what only a refit (not a resume) needs of target and baseline,
// and sets the report's versions.
Status CheckVersions(const RefitOptions& options, const HistoryFeed& feed,
                     CheckpointDigests* target_digests, RefitSetup* setup,
                     RefitReport* report) {
  const Topology& topo = options.topology;
  WeightStore* baseline = setup->baseline.get();
  const Checkpoint& target = *setup->target;
  if (baseline && baseline->manifest().digest() != target.manifest().digest()) {
    return Status::InvalidArgument(fmt::format(
        "the target {} does not have the baseline's tensors: {}",
        options.target,
        Manifest::Difference(baseline->manifest(), target.manifest())));
  }
  if (baseline && baseline->InProgress()) {
    // Not one a stopped coordinator's commit phase left (RunRefit finishes
    // those first): its bits are unknown.
    return Status::InvalidArgument(fmt::format(
        "root.baseline {} holds an unfinished update (refit {}) that no "
        "recorded commit decision in {} explains; restore it from the last "
        "committed checkpoint",
        baseline->describe(), baseline->InProgress()->refit.ToHex(),
        topo.root.state_dir));
  }
  setup->pool = std::make_unique<ThreadPool>(options.threads);
  report->checkpoint_bytes = target.manifest().TotalBytes();
  report->total_elements = target.manifest().TotalElements();
  if (baseline) {
    if (auto c = baseline->committed()) {
      report->base = *c;
    } else {
      report->base = Version{0, baseline->Digests(setup->pool.get()).version};
    }
  }
  if (options.only_nodes.empty()) {
    // The whole tree: the encoder hashes the target as it streams, and END
    // names its digests (the PLAN goes out with a zero digest).
    report->target = Version{report->base.step + 1, Digest128{}};
    return Status::OK();
  }
  // Named nodes are seeded with (or caught up to) the tree's version: the
  // target must be the baseline's bits, checked before any relay is asked.
  // (A catch-up whose relays already hold the target's bits, the tree
  // having gone back to them, moves nothing and relabels them.)
  *target_digests = target.ComputeDigests(setup->pool.get());
  if (!baseline || target_digests->version != report->base.digest) {
    return Status::InvalidArgument(fmt::format(
        "refitting named nodes seeds them with the tree's current version: "
        "the target {} must hold the bits of root.baseline (step {}); "
        "refit the whole tree to move to another version",
        options.target, report->base.step));
  }
  report->target = report->base;
  if (!feed.empty()) {
    DCR_ASSIGN_OR_RETURN(
        setup->composed,
        ComposedDelta::Open(feed.files, target.manifest().digest(),
                            topo.defaults.span_elems, feed.kind));
  }
  if (!feed.empty() && feed.kind == ComposedDelta::Kind::kChain) {
    if (setup->composed->target() != report->target) {
      return Status::InvalidArgument(fmt::format(
          "the history chain ends at step {}, the baseline is step {}",
          setup->composed->target().step, report->target.step));
    }
    report->base = setup->composed->base();
  }
  return Status::OK();
}

}  // namespace

Result<RefitSetup> SetUpRefit(const RefitOptions& options, HistoryFeed feed,
                              RefitReport* report) {
  const Topology& topo = options.topology;
  RefitSetup setup;
  DCR_ASSIGN_OR_RETURN(setup.tree, RefitTree(options, !feed.empty()));
  if (setup.tree.nodes.size() < 2) {
    return Status::InvalidArgument(topo.source +
                                   ": the topology has no relays to refit");
  }
  if (topo.root.state_dir.empty()) {
    return Status::InvalidArgument(
        topo.source +
        ": root.state_dir is required for a refit (the coordinator keeps its "
        "epoch and commit decisions there)");
  }
  setup.state = StateDir(topo.root.state_dir);
  DCR_RETURN_IF_ERROR(setup.state.Create());
  // First: it also explains a baseline the stopped run left flagged.
  if (setup.state.HasCurrent()) {
    return Status::InvalidArgument(fmt::format(
        "{} names a refit that did not finish (the coordinator "
        "stopped); run dcr refit --resume to commit or abort it first",
        setup.state.CurrentPath()));
  }
  if (!options.signing_key_file.empty()) {
    auto signer = EndSigner::Load(options.signing_key_file,
                                  options.transport_options.frames,
                                  topo.defaults.span_elems);
    if (!signer.ok()) {
      return signer.status().WithContext(topo.source +
                                         ": root.signing_key_file");
    }
    setup.signer = *std::move(signer);
  }
  if (options.producers) {
    if (options.mode != RefitMode::kDelta || !options.only_nodes.empty() ||
        !feed.empty()) {
      return Status::InvalidArgument(
          "a producers' refit is a delta refit of the whole tree (no --full, "
          "no --node)");
    }
    if (topo.root.baseline.empty()) {
      return Status::InvalidArgument(
          topo.source +
          ": root.baseline is required for a producers' refit (the canonical "
          "copy the merged stream is applied to)");
    }
    // root.baseline becomes the target as the producers' parts are
    // applied to it: repairs and the history read the target there.
    DCR_ASSIGN_OR_RETURN(
        setup.target,
        Checkpoint::Open(topo.root.baseline, Checkpoint::Mode::kReadOnly));
  } else {
    DCR_ASSIGN_OR_RETURN(
        setup.target,
        Checkpoint::Open(options.target, Checkpoint::Mode::kReadOnly));
  }
  if (topo.root.baseline.empty() && options.mode == RefitMode::kDelta) {
    return Status::InvalidArgument(
        topo.source +
        ": root.baseline is required for a delta refit (the checkpoint "
        "every relay holds now)");
  }
  DCR_RETURN_IF_ERROR(OpenBaseline(options, /*strict=*/true, &setup));
  report->mode = options.mode;
  report->refit = NewRefitId();
  CheckpointDigests target_digests;
  DCR_RETURN_IF_ERROR(
      CheckVersions(options, feed, &target_digests, &setup, report));
  DCR_ASSIGN_OR_RETURN(
      setup.serving, ServingRanks::Load(setup.tree, setup.target->manifest()));
  FillPlan(options, *report, &setup);
  if (setup.signer) {
    // END carries a manifest entry per chunk: refuse now, before any relay
    // is asked, a refit whose manifest could not fit in one frame.
    uint64_t spans = 0;
    for (const TensorInfo& t : setup.target->manifest().tensors()) {
      spans += SpanCount(t.NumElements(), topo.defaults.span_elems);
    }
    // A producers' stream carries up to one part per rank per span.
    if (options.producers) spans *= options.producers->layout().ranks();
    // A mixed tree lists a context-coded chunk once per encoding.
    if (setup.mixed()) spans *= 2;
    if (Status s = setup.signer->CheckFits(
            spans, setup.target->manifest().size(), setup.serving.size());
        !s.ok()) {
      return Status::InvalidArgument(topo.source + ": " +
                                     std::string(s.message()));
    }
  }
  DCR_ASSIGN_OR_RETURN(report->epoch, setup.state.NextEpoch());
  setup.plan.manifest = setup.target->manifest().digest();
  if (options.mode == RefitMode::kFull) {
    setup.plan.tensors = setup.target->manifest().tensors();
  }
  setup.plan.target_tensor_digests = std::move(target_digests.tensors);
  DCR_RETURN_IF_ERROR(NameServingBits(*report, &setup));
  return setup;
}

Result<RefitSetup> SetUpResume(const RefitOptions& options, RefitReport* report,
                               Resumption* resumption) {
  const Topology& topo = options.topology;
  RefitSetup setup;
  DCR_ASSIGN_OR_RETURN(setup.tree, BuildTree(topo));
  if (topo.root.state_dir.empty()) {
    return Status::InvalidArgument(topo.source +
                                   ": root.state_dir is required to resume");
  }
  setup.state = StateDir(topo.root.state_dir);
  DCR_ASSIGN_OR_RETURN(CurrentRefit current, setup.state.ReadCurrent());
  report->refit = current.refit;
  report->mode = current.mode;
  report->base = current.base;
  report->target = current.target;
  resumption->target_path = current.target_path;
  // The decision, if the interrupted run reached one.
  DCR_ASSIGN_OR_RETURN(std::optional<Decision> decision,
                       setup.state.ReadDecision(current.refit));
  if (decision) {
    // current.json was written before the stream named the target's digest
    // (it reads zero there); the decision holds it.
    if (decision->commit) report->target = decision->target;
    resumption->commit = decision->commit;
    resumption->commit_set.insert(decision->commit_set.begin(),
                                  decision->commit_set.end());
  }
  setup.pool = std::make_unique<ThreadPool>(options.threads);
  DCR_RETURN_IF_ERROR(OpenBaseline(options, /*strict=*/false, &setup));
  // The baseline moves to the target on commit, from the target file.
  resumption->baseline_done =
      setup.baseline && setup.baseline->committed() == report->target;
  // With no decision, a baseline the run began to update while streaming
  // goes back to the base, from the history's undo log and the target.
  auto in_progress =
      setup.baseline ? setup.baseline->InProgress() : std::nullopt;
  resumption->restore_base =
      !resumption->commit && in_progress && in_progress->refit == current.refit;
  resumption->producers = current.target_path.rfind(kProducersTarget, 0) == 0;
  if (!resumption->producers &&
      ((resumption->commit && !resumption->baseline_done) ||
       resumption->restore_base) &&
      !topo.root.baseline.empty()) {
    auto t = Checkpoint::Open(current.target_path, Checkpoint::Mode::kReadOnly);
    if (!t.ok()) {
      return t.status().WithContext(
          resumption->commit
              ? "the interrupted refit's target (needed to advance "
                "root.baseline)"
              : "the interrupted refit's target (needed to restore "
                "root.baseline to its base)");
    }
    // An update the interrupted run began is redone whole: its record
    // keeps naming the refit in progress (BeginRefit replaces it) until
    // the new pass commits, so a crash now still finds it unfinished.
    setup.target = *std::move(t);
  }
  DCR_ASSIGN_OR_RETURN(report->epoch, setup.state.NextEpoch());
  FillPlan(options, *report, &setup);
  // A resumed refit's nodes may hold some of its spans already: only
  // base-independent chunks.
  setup.plan.context_coded = false;
  if (setup.baseline) {
    setup.plan.manifest = setup.baseline->manifest().digest();
  } else if (setup.target) {
    setup.plan.manifest = setup.target->manifest().digest();
  }
  return setup;
}

Result<bool> CommitPhaseInterrupted(const RefitOptions& options) {
  const Topology& topo = options.topology;
  if (topo.root.state_dir.empty() || topo.root.baseline.empty()) return false;
  StateDir state(topo.root.state_dir);
  if (!state.HasCurrent()) return false;
  DCR_ASSIGN_OR_RETURN(CurrentRefit current, state.ReadCurrent());
  DCR_ASSIGN_OR_RETURN(std::optional<Decision> decision,
                       state.ReadDecision(current.refit));
  if (!decision || !decision->commit) return false;
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kFile;
  spec.path = topo.root.baseline;
  auto record = ReadVersionRecord(DefaultRecordPath(spec));
  if (!record.ok() || !*record || !(*record)->in_progress) return false;
  return (*record)->in_progress->refit == current.refit;
}

}  // namespace dcr
