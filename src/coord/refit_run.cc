#include "coord/refit_run.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "common/elapsed.h"
#include "common/failpoint.h"
#include "coord/baseline_update.h"
#include "coord/catch_up.h"
#include "coord/chunk_producer.h"
#include "coord/repair.h"
#include "coord/span_encoder.h"

namespace dcr {

RefitRun::RefitRun(const RefitOptions& options, HistoryFeed feed)
    : options_(options), feed_(std::move(feed)) {}

RefitRun::~RefitRun() = default;

Status RefitRun::WriteCurrent() {
  std::error_code ec;
  std::string target =
      producers_
          ? std::string(kProducersTarget) + options_.producers->layout().source
          : std::filesystem::absolute(options_.target, ec).string();
  return setup_.state.WriteCurrent(
      CurrentRefit{report_.refit, report_.epoch, report_.mode, report_.base,
                   report_.target, ec ? options_.target : target});
}

Result<RefitReport> RefitRun::Run() {
  if (options_.producers) {
    producers_ = std::make_unique<ProducerFeed>(options_.producers);
  }
  Result<RefitReport> r = RunPhases();
  if (producers_) {
    // The producers learn the decision before any catch-up runs.
    ProducerOutcome outcome = ProducerOutcome::kRefused;
    std::string reason;
    if (!r.ok()) {
      reason = std::string(r.status().message());
    } else {
      reason = r->reason;
      switch (r->outcome) {
        case RefitOutcome::kCommitted:
          outcome = ProducerOutcome::kCommitted;
          break;
        case RefitOutcome::kPartial:
          outcome = ProducerOutcome::kPartial;
          break;
        case RefitOutcome::kAborted:
          outcome = ProducerOutcome::kAborted;
          break;
        case RefitOutcome::kUnfinished:
          outcome = ProducerOutcome::kUnfinished;
          break;
      }
    }
    producers_->Decide(outcome, report_.refit, report_.target, reason);
  }
  return r;
}

Result<RefitReport> RefitRun::RunPhases() {
  if (producers_) {
    // First: a long-running coordinator waits here for the trainer's next
    // step; whatever fails after is told to the producers.
    DCR_RETURN_IF_ERROR(producers_->Gather(options_.producer_wait));
  }
  auto t0 = Clock::now();
  DCR_ASSIGN_OR_RETURN(setup_, SetUpRefit(options_, feed_, &report_));
  const Topology& topo = options_.topology;
  if (producers_) {
    DCR_RETURN_IF_ERROR(
        producers_->CheckBaseline(*setup_.baseline, report_.base,
                                  setup_.pool.get(), options_.phase_timeout));
    report_.producers = producers_->ranks();
    report_.trainer_step = producers_->step();
    spdlog::info("{} producers at trainer step {}", report_.producers,
                 report_.trainer_step);
  }
  sent_.set_sign(setup_.signer != nullptr);
  if (options_.mode == RefitMode::kDelta && options_.only_nodes.empty() &&
      setup_.baseline) {
    record_ = HistoryRecording(
        DeltaHistory(setup_.state.HistoryDir(), topo.root.keep_deltas),
        report_.refit);
  }
  if (setup_.target) target_stamps_ = FileStamps(*setup_.target);
  // Before current.json: a store that refuses the root stops the refit
  // with nothing to resume.
  DCR_RETURN_IF_ERROR(OpenObjects(/*for_upload=*/true));
  DCR_RETURN_IF_ERROR(WriteCurrent());
  DCR_RETURN_IF_ERROR(phases_.Prepared());
  auto t_prepared = Clock::now();
  report_.prepare_seconds = Seconds(t0, t_prepared);
  const Tree& tree = setup_.tree;
  spdlog::info("refit {} (epoch {}): {} step {} -> {}{}, {} receivers",
               report_.refit.ToHex(), report_.epoch,
               options_.mode == RefitMode::kFull ? "full" : "delta",
               report_.base.step, report_.target.step,
               setup_.plan.target_at_end()
                   ? ""
                   : fmt::format(" ({})", report_.target.digest.ShortHex()),
               tree.nodes.size() - 1);
  root_ = std::make_unique<RootTree>(
      options_, setup_.plan, report_.epoch, report_.refit, /*resume=*/false,
      objects_.get(),
      setup_.mixed() ? setup_.plain_nodes : std::set<std::string>());
  if (options_.on_progress) {
    root_->SetProgress([this](RefitOptions::Progress* p) { FillProgress(p); });
  }

  // 1. Plan. The stream's first batch encodes meanwhile (a producers'
  // refit has its ranks' streams, which start at GO).
  DCR_FAILPOINT("coord.before_plan");
  DCR_RETURN_IF_ERROR(phases_.Plan());
  if (!producers_) {
    DCR_ASSIGN_OR_RETURN(ahead_, StartPass(/*repair=*/false, {}));
  }
  replies_.plan = root_->Plan();
  root_->BeginStream();
  for (const NodeResult& r : replies_.plan) {
    if (r.code == NodeCode::kNeedsCatchUp) behind_.push_back(r);
  }
  auto t_plan = Clock::now();
  report_.plan_seconds = Seconds(t_prepared, t_plan);
  size_t receivers = tree.nodes.size() - 1;
  // Named nodes are all required; min_commit is about the whole tree.
  size_t required =
      topo.defaults.min_commit == 0 || !options_.only_nodes.empty()
          ? receivers
          : topo.defaults.min_commit;
  size_t planned = std::count_if(
      replies_.plan.begin(), replies_.plan.end(),
      [](const NodeResult& r) { return r.code == NodeCode::kOk; });
  // Relays behind at an older step of this tree are brought to the target
  // after the commit (RunRefit's catch-up), and relays whose store holds an
  // unfinished refit's mix or is missing are repaired or seeded (whatever
  // this refit's outcome): they count towards min_commit.
  size_t catching_up = 0;
  if (options_.catch_up && options_.only_nodes.empty()) {
    DeltaHistory history(setup_.state.HistoryDir(), topo.root.keep_deltas);
    catching_up =
        std::count_if(behind_.begin(), behind_.end(), [&](const NodeResult& r) {
          return NeedsRepair(r) ||
                 HowToCatchUp(history, r.version, report_.base,
                              report_.target.step) != CatchUpBy::kNone;
        });
  }
  std::set<std::string> commit_set;
  bool commit = false;
  if (planned + catching_up < required) {
    report_.reason =
        fmt::format("{} of {} receivers took the plan; min_commit needs {}",
                    planned, receivers, required);
    ahead_.reset();  // nothing of it was sent
  } else {
    // 2. Stream.
    DCR_RETURN_IF_ERROR(phases_.Stream());
    Status produced = Stream(/*repair=*/false);
    DCR_FAILPOINT("coord.after_stream");
    auto t_stream = Clock::now();
    report_.stream_seconds = Seconds(t_plan, t_stream);
    if (!produced.ok()) {
      report_.reason = (producers_ ? "the producers' stream failed: "
                                   : "encoding failed: ") +
                       produced.ToString();
    } else if (options_.mode == RefitMode::kDelta && target_at_end_ &&
               report_.target.digest == report_.base.digest) {
      // Known only now that the target is hashed: aborted, not refused
      // before the PLAN (the relays restore nothing; no chunk was sent).
      // (A catch-up may move nothing: it relabels.)
      report_.reason = fmt::format(
          "the target {} holds the same bits as the baseline (step {}): "
          "nothing to refit",
          producers_ ? fmt::format("of trainer step {}", report_.trainer_step)
                     : options_.target,
          report_.base.step);
    } else {
      // 3. Vote (and repair).
      DCR_RETURN_IF_ERROR(phases_.Vote());
      DCR_ASSIGN_OR_RETURN(bool sent, Vote());
      report_.vote_seconds = Seconds(t_stream, Clock::now());
      if (stream_applied_at_ && *stream_applied_at_ > t_stream) {
        report_.applied_seconds = Seconds(t_stream, *stream_applied_at_);
      }
      commit_set = YesVotes(replies_.votes, report_.target);
      commit = sent && !commit_set.empty() &&
               commit_set.size() + catching_up >= required;
      if (!commit && report_.reason.empty()) {
        report_.reason = fmt::format(
            "{} of {} receivers verified the target; min_commit needs {}",
            commit_set.size(), receivers, required);
      }
    }
  }

  // 4. Decide, durably, then tell the tree.
  auto t_decide = Clock::now();
  if (in_stream_) AwaitBaselineWrites(t_decide, &commit);
  if (commit && producers_) {
    if (Status s = producers_->StillThere(); !s.ok()) {
      commit = false;
      report_.reason = std::string(s.message()) + "; aborted";
    }
  }
  if (commit && in_stream_ && in_stream_->touched()) {
    // The baseline took the target's bits from the file as it streamed:
    // a file rewritten meanwhile would leave it at other bits than the
    // relays verified.
    if (std::string f = target_stamps_.Changed(); !f.empty()) {
      commit = false;
      report_.reason = fmt::format(
          "the target file {} changed during the refit (root.baseline took "
          "its bits while streaming); aborted",
          f);
    }
  }
  if (commit) {
    Status s = setup_.state.WriteDecision(Decision{
        report_.refit, report_.epoch, true, report_.base, report_.target,
        std::vector<std::string>(commit_set.begin(), commit_set.end())});
    if (!s.ok()) {
      commit = false;
      report_.reason = "cannot record the commit decision: " + s.ToString();
    }
  }
  DCR_RETURN_IF_ERROR(phases_.Decide(commit));
  if (commit && options_.TEST_crash_after_decision) {
    // Tests: the coordinator "dies" with its decision durable.
    DCR_RETURN_IF_ERROR(phases_.Stop());
    root_->Stop();
    report_.stream_bytes = root_->stream_bytes();
    report_.reason = "stopped after the decision (TEST_crash_after_decision)";
    return report_;
  }
  return Conclude(commit, std::move(commit_set), t0, t_decide);
}

Status RefitRun::SignEnd(EndMsg* end) const {
  if (!setup_.signer) return Status::OK();
  RefitManifest m;
  m.refit = report_.refit;
  m.epoch = report_.epoch;
  m.mode = setup_.plan.mode;
  m.base = setup_.plan.base;
  m.target = setup_.plan.target;
  m.chunks = sent_.manifest();
  return setup_.signer->Sign(m, end);
}

const std::vector<ServingBits>& RefitRun::ServingTargets() {
  if (serving_targets_) return *serving_targets_;
  serving_targets_.emplace();
  if (!setup_.target) {
    spdlog::warn("no target checkpoint to name the serving nodes' bits ({})",
                 setup_.serving.nodes());
    return *serving_targets_;
  }
  const auto t0 = Clock::now();
  auto bits =
      setup_.serving.Bits(*setup_.target, /*regions=*/true, setup_.pool.get());
  if (!bits.ok()) {
    spdlog::warn("cannot name the serving nodes' bits ({}): {}",
                 setup_.serving.nodes(), bits.status().ToString());
    return *serving_targets_;
  }
  *serving_targets_ = *std::move(bits);
  spdlog::info("serving nodes {}: their ranks' target bits in {:.3f} s",
               setup_.serving.nodes(),
               std::chrono::duration<double>(Clock::now() - t0).count());
  return *serving_targets_;
}

Result<bool> RefitRun::Vote() {
  for (int round = 0;; ++round) {
    // END names every distinct chunk id sent so far, and the target when
    // the PLAN left it to END.
    EndMsg end = sent_.End();
    if (target_at_end_) {
      end.target = report_.target;
      end.target_tensor_digests = setup_.plan.target_tensor_digests;
      if (!setup_.serving.empty()) end.serving_target = ServingTargets();
    }
    root_->Expect(FrameType::kVote);
    Status s = SignEnd(&end);
    if (s.ok()) s = root_->SendDown(FrameType::kEnd, EncodeEnd(end));
    if (!s.ok()) {
      report_.reason = s.ToString();
      replies_.votes = root_->Results();
      return false;  // no END went down: no vote will come
    }
    root_->WaitPhase();
    if (round == 0) stream_applied_at_ = root_->applied_at();
    replies_.votes = root_->Results();
    // Receivers whose bits differ name the tensors; overwrite chunks of
    // those tensors (idempotent, whatever each receiver applied before)
    // go down the whole tree, and everyone votes again.
    RepairRequest want = RepairsWanted(replies_.votes);
    if (want.tensors.empty()) return true;
    if (round >= options_.repair_rounds) {
      spdlog::warn("{} still differ after {} repair rounds; excluding them",
                   fmt::join(want.nodes, ", "), round);
      return true;
    }
    report_.repair_rounds = round + 1;
    spdlog::warn(
        "repair round {}: {} tensors differ on {}; resending them as "
        "overwrites",
        round + 1, want.tensors.size(), fmt::join(want.nodes, ", "));
    DCR_RETURN_IF_ERROR(phases_.Repair());
    (void)Stream(/*repair=*/true, std::move(want.tensors));
    DCR_RETURN_IF_ERROR(phases_.Vote());
    if (root_->live_children() == 0) return true;
  }
}

Result<RefitReport> RefitRun::Conclude(bool commit,
                                       std::set<std::string> commit_set,
                                       Clock::time_point t0,
                                       Clock::time_point t_decide) {
  const size_t receivers = setup_.tree.nodes.size() - 1;
  if (commit) {
    CommitMsg msg{report_.target, std::vector<std::string>(commit_set.begin(),
                                                           commit_set.end())};
    DCR_FAILPOINT("coord.before_commit");
    root_->Expect(FrameType::kCommitReply);
    Status s = root_->SendDown(FrameType::kCommit, EncodeCommit(msg));
    Status b = AdvanceBaselineAndHistory(s.ok(), commit_set, t_decide);
    DCR_FAILPOINT("coord.after_commit");
    replies_.final = root_->Results();
    // Committed everywhere only if every receiver confirmed it: a node that
    // voted yes and then vanished before its COMMIT_REPLY is stale.
    size_t confirmed = std::count_if(
        replies_.final.begin(), replies_.final.end(), [&](const NodeResult& r) {
          return commit_set.count(r.node) && r.code == NodeCode::kOk &&
                 r.version == report_.target;
        });
    report_.outcome = confirmed == receivers ? RefitOutcome::kCommitted
                                             : RefitOutcome::kPartial;
    if (options_.only_nodes.empty() &&
        CommitReachedNoOne(replies_.final, commit_set)) {
      report_.outcome = RefitOutcome::kUnfinished;
      report_.reason = UnfinishedReason(replies_.final, report_);
    } else if (!b.ok()) {
      spdlog::error("the refit committed but the baseline was not advanced: {}",
                    b.ToString());
      report_.reason = "baseline not advanced: " + b.ToString();
    }
  } else {
    root_->Expect(FrameType::kAbortReply);
    Status s = root_->SendDown(FrameType::kAbort,
                               EncodeAbort(AbortMsg{report_.reason}));
    if (s.ok()) root_->WaitPhase();
    replies_.final = root_->Results();
    report_.outcome = RefitOutcome::kAborted;
    commit_set.clear();
    if (producers_) {
      // root.baseline took the producers' parts: its session restores the
      // base from its journal, as a relay does.
      if (Status r = producers_->Abort(); !r.ok()) {
        spdlog::error(
            "root.baseline could not be restored to step {}: {}; it stays "
            "flagged unfinished",
            report_.base.step, r.ToString());
        keep_current_ = true;
      }
    }
    // The baseline back to the base before its undo log moves, once its
    // last writes ended (the relays were told first: they do not wait on
    // this disk). The undo is exact while the target's bits are the ones
    // the baseline took; where its files changed (the abort's likely
    // cause), the result is checked whole.
    JoinBaselineWrites();
    const bool restored =
        !in_stream_ || !in_stream_->touched() ||
        RestoreBaseline(record_.undo_path(),
                        /*verify=*/!target_stamps_.Changed().empty());
    // Kept apart from the chain: a relay that died applying it is repaired
    // with its change set (coord/repair.h).
    if (record_.active()) record_.FinishAborted(RecordHeader(), report_.refit);
    record_.Discard();  // removes the temporary file (unless pinned)
    if (in_stream_ && in_stream_->touched() && restored) {
      // A pinned record that failed left its temporary file: restored.
      std::error_code ec;
      std::filesystem::remove(record_.undo_path(), ec);
    }
  }
  baseline_version_ = commit ? report_.target : report_.base;
  if (setup_.baseline && setup_.baseline->committed()) {
    baseline_version_ = *setup_.baseline->committed();
  }
  report_.commit_seconds = Seconds(t_decide, Clock::now());
  root_->CountAdoptions(&report_);
  report_.stream_bytes = root_->stream_bytes();
  if (setup_.mixed()) {
    for (size_t i = 1; i < setup_.tree.nodes.size(); ++i) {
      const std::string& name = setup_.tree.nodes[i].name;
      if (!root_->plain_nodes().contains(name)) {
        report_.context_nodes.push_back(name);
      }
    }
  }
  root_->Close();
  SummarizeNodes(setup_.tree, replies_, commit_set, &report_);
  if (report_.outcome == RefitOutcome::kPartial && report_.reason.empty()) {
    report_.reason = ExcludedReason(report_);
  }
  report_.total_seconds = Seconds(t0, Clock::now());
  root_->FlushAndStop();
  FinishObjects();
  DCR_RETURN_IF_ERROR(phases_.Finish());
  setup_.state.WriteReport(&report_);
  // Unfinished: --resume (or the next refit) finishes it from current.json.
  if (report_.outcome != RefitOutcome::kUnfinished && !keep_current_) {
    setup_.state.RemoveCurrent();
  }
  if (Status s = setup_.state.PruneDecisions(); !s.ok()) {
    spdlog::warn("cannot prune the decisions: {}", s.ToString());
  }
  return report_;
}

Status RefitRun::OpenObjects(bool for_upload) {
  const Topology& topo = options_.topology;
  const bool pulls =
      std::any_of(setup_.plan.nodes.begin(), setup_.plan.nodes.end(),
                  [](const PlanNode& n) { return n.pulls_objects; });
  if (!pulls || !topo.objstore) return Status::OK();
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(*topo.objstore);
  if (!store.ok()) {
    return store.status().WithContext(
        topo.source +
        ": objstore (clusters with source: objstore pull "
        "their chunks from it)");
  }
  objects_ = std::move(*store);
  retention_.emplace(setup_.state, objects_.get(), topo.root.keep_deltas);
  if (!for_upload) return Status::OK();
  // A test write before PLAN: a refused credential or a missing bucket is
  // an error now, naming what to fix, not a refit that times out.
  const std::string probe = RefitObjectPrefix(report_.refit.ToHex()) + "probe";
  const std::array<std::byte, 1> one{};
  Status probed = objects_->Put(probe, one);
  if (probed.ok()) probed = objects_->Delete(probe);
  if (!probed.ok()) {
    return probed.WithContext(
        fmt::format("{}: objstore: {} refused a test write before PLAN",
                    topo.source, objects_->describe()));
  }
  // Recorded before the first upload: a root that dies leaves a record of
  // the objects for the next prune or dcr gc. Only a refit of the whole
  // tree counts towards root.keep_deltas.
  DCR_RETURN_IF_ERROR(retention_->Begin(report_.refit, report_.epoch,
                                        report_.target.step,
                                        options_.only_nodes.empty()));
  spdlog::info("refit {}: chunks for the clusters that pull go to {}",
               report_.refit.ToHex(), objects_->describe());
  return Status::OK();
}

void RefitRun::FinishObjects() {
  if (!retention_) return;
  if (report_.outcome == RefitOutcome::kAborted) {
    // The objects pushed, by name, beside those a LIST finds (a LIST may
    // lag behind recent writes).
    const uint64_t pushed =
        root_ && root_->uploader() ? root_->uploader()->pushed() : 0;
    if (Status s = retention_->Remove(report_.refit, pushed); !s.ok()) {
      spdlog::warn("the aborted refit's objects: {} (dcr gc removes them)",
                   s.ToString());
    }
    return;
  }
  if (report_.outcome != RefitOutcome::kCommitted &&
      report_.outcome != RefitOutcome::kPartial) {
    return;  // unfinished: dcr refit --resume may need them
  }
  if (Status s = retention_->Committed(report_.refit); !s.ok()) {
    spdlog::warn("cannot record that refit {}'s objects are kept: {}",
                 report_.refit.ToHex(), s.ToString());
    return;
  }
  Result<RetentionReport> pruned = retention_->Prune(std::nullopt);
  if (!pruned.ok()) {
    spdlog::warn("older refits' objects not removed: {} (dcr gc removes them)",
                 pruned.status().ToString());
  } else if (pruned->objects_removed > 0 || pruned->failures > 0) {
    spdlog::info("object store: removed {} objects of refits no longer kept{}",
                 pruned->objects_removed,
                 pruned->failures > 0
                     ? fmt::format(" ({} refits failed; dcr gc retries)",
                                   pruned->failures)
                     : "");
  }
}

Result<RefitReport> RefitRun::Resume() {
  auto t0 = Clock::now();
  Resumption r;
  DCR_ASSIGN_OR_RETURN(setup_, SetUpResume(options_, &report_, &r));
  // Resuming a commit redoes the baseline's update whole.
  copy_all_ = setup_.target != nullptr;
  DCR_RETURN_IF_ERROR(phases_.Prepared());
  spdlog::info("resuming refit {} (epoch {}): {} step {} -> {}",
               report_.refit.ToHex(), report_.epoch,
               r.commit ? "commit" : "abort (no decision was recorded)",
               report_.base.step, report_.target.step);
  report_.prepare_seconds = Seconds(t0, Clock::now());
  // A resume only decides (COMMIT or ABORT over the links): the store is
  // opened for the retention of the refit's objects, and a store that is
  // down or refuses costs only that (dcr gc removes them later).
  if (Status s = OpenObjects(/*for_upload=*/false); !s.ok()) {
    spdlog::warn("{}; this refit's objects stay until dcr gc", s.ToString());
    objects_.reset();
    retention_.reset();
  }
  root_ = std::make_unique<RootTree>(options_, setup_.plan, report_.epoch,
                                     report_.refit, /*resume=*/true,
                                     objects_.get());
  if (options_.on_progress) {
    root_->SetProgress([this](RefitOptions::Progress* p) { FillProgress(p); });
  }
  // Every relay that holds the refit takes this run as its parent (an
  // adoption at the new epoch) and says where it is; then the decision.
  auto t_plan = Clock::now();
  DCR_RETURN_IF_ERROR(phases_.Plan());
  replies_.plan = root_->Plan();
  report_.plan_seconds = Seconds(t_plan, Clock::now());
  if (!r.commit) {
    report_.reason =
        "the coordinator stopped before deciding; aborted by dcr refit "
        "--resume";
  }
  if (r.baseline_done) setup_.target.reset();
  if (r.producers && setup_.baseline &&
      (r.restore_base || (r.commit && !r.baseline_done))) {
    if (Status s =
            SettleRootSession(setup_.baseline.get(), r.commit, report_.target,
                              report_.refit, setup_.pool.get());
        !s.ok()) {
      spdlog::error("{}; root.baseline stays flagged unfinished", s.ToString());
      keep_current_ = true;
    }
  } else if (r.restore_base) {
    // The interrupted run's undo log: its history record, unfinished (the
    // run died) or kept as aborted (its restore failed).
    DeltaHistory history(setup_.state.HistoryDir(),
                         options_.topology.root.keep_deltas);
    std::string tmp = history.TmpPathFor(report_.refit);
    std::error_code ec;
    if (!std::filesystem::exists(tmp, ec) &&
        report_.target.digest != Digest128{}) {
      // Recorded by a coordinator of before PROTOCOL.md §"Target digests
      // at END", which named it by its target.
      tmp = history.PathFor(report_.target) + ".tmp";
    }
    std::string log = tmp;
    if (!std::filesystem::exists(log, ec)) {
      log = history.AbortedPathFor(report_.refit);
    }
    if (RestoreBaseline(log, /*verify=*/true)) {
      std::filesystem::remove(tmp, ec);
    }
  }
  DCR_RETURN_IF_ERROR(phases_.Decide(r.commit));
  return Conclude(r.commit, std::move(r.commit_set), t0, Clock::now());
}

}  // namespace dcr
