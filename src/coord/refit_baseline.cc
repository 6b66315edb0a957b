// RefitRun's root.baseline and delta history at the end of a refit: the
// wait for its last writes before the decision, the commit phase's record (or
// the pass after the decision where the baseline did not take the target while
// streaming), and the restore of the base on abort (docs/FORMAT.md §5). The
// phase driver is refit_run.cc.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/elapsed.h"
#include "coord/baseline_update.h"
#include "coord/refit_run.h"

namespace dcr {

Status RefitRun::AdvanceBaselineAndHistory(
    bool commit_sent, const std::set<std::string>& commit_set,
    Clock::time_point t_decide) {
  // The decision is durable: the baseline takes the target's bits while
  // the relays commit. (Named nodes only: the baseline already holds the
  // target, and the history does not change.)
  const bool whole_tree = options_.only_nodes.empty();
  const auto t_sent = Clock::now();
  Status b;
  std::thread baseline([&] {
    if (!whole_tree || !setup_.target) return;
    // A producers' refit applied every chunk it sent (parts, and spans
    // composed of parts) to root.baseline as it streamed: its session
    // commits below.
    if (producers_) return;
    // Written while streaming: nothing left but the record.
    if (in_stream_ && in_stream_->complete() && !copy_all_) return;
    BaselineUpdate u;
    u.target = setup_.target.get();
    u.pool = setup_.pool.get();
    u.refit = report_.refit;
    u.base = report_.base;
    u.to = report_.target;
    u.tensor_digests = &setup_.plan.target_tensor_digests;
    u.span_elems = setup_.plan.span_elems;
    u.all = report_.mode == RefitMode::kFull || copy_all_;
    if (!u.all) u.changed = sent_.StreamSpans();
    b = UpdateBaseline(u, setup_.baseline_spec, &setup_.baseline);
  });
  // The history file is made durable while the replies come and the
  // baseline pass (if any) runs: its fsync waits for a file system commit,
  // which a busy disk can hold up for as long as the relays take.
  std::optional<std::string> recorded;
  Clock::time_point t_recorded;
  // (RecordHeader reads the target's manifest: only a run that recorded,
  // never a resume, which may hold no target. WaitPhase touches none of
  // what it reads.)
  std::thread finish_history([&] {
    if (whole_tree && record_.active()) {
      recorded = record_.Finish(RecordHeader());
    }
    record_.Discard();
    t_recorded = Clock::now();
  });
  if (commit_sent) root_->WaitPhase();
  const auto t_replies = Clock::now();
  finish_history.join();
  baseline.join();
  if (b.ok() && whole_tree && setup_.target && setup_.baseline) {
    // Fenced off or unanswered: the baseline's record keeps naming this
    // refit in progress for --resume (DESIGN.md invariant 8).
    b = CommitReachedNoOne(root_->Results(), commit_set)
            ? Status::Aborted("the COMMIT reached no one")
        : producers_ ? producers_->Commit()
                     : setup_.baseline->Commit(report_.target, report_.refit);
  }
  // A producers' root.baseline whose commit failed stays flagged: the next
  // run settles it from its journal (FinishInterruptedCommit).
  if (!b.ok() && producers_ && whole_tree) keep_current_ = true;
  if (!b.ok() && recorded) {
    // The history must end at the baseline's version.
    std::error_code ec;
    std::filesystem::remove(*recorded, ec);
    if (ec) {
      spdlog::warn("cannot remove {} (the baseline is not at its target): {}",
                   *recorded, ec.message());
    }
  }
  if (whole_tree) {
    DeltaHistory history(setup_.state.HistoryDir(),
                         options_.topology.root.keep_deltas);
    if (Status s = history.Prune(); !s.ok()) {
      spdlog::warn("cannot prune the delta history: {}", s.ToString());
    }
  }
  spdlog::debug(
      "commit phase: decision recorded {:.3f} s, replies {:.3f} s, delta "
      "history durable {:.3f} s (alongside), baseline committed at {:.3f} s",
      Seconds(t_decide, t_sent), Seconds(t_sent, t_replies),
      Seconds(t_sent, t_recorded), Seconds(t_sent, Clock::now()));
  return b;
}

void RefitRun::AwaitBaselineWrites(Clock::time_point t_decide, bool* commit) {
  // root.baseline's last writes ran beside the vote; the baseline holds
  // the target's bits before any decision says so. The tree's links
  // stay served meanwhile (heartbeats: the relays would drop a silent
  // root), as long as the writes move: writes that make no progress
  // for a phase (a disk that hangs) abort the refit rather than hold
  // every voted relay, and the abort restores the baseline once they
  // end (Conclude). A slow disk that writes is waited for.
  root_->Hold();
  uint64_t ended = in_stream_->writes_ended();
  Clock::time_point deadline = t_decide + options_.phase_timeout;
  for (;;) {
    root_->RunUntil([&] { return in_stream_->finished(); }, deadline);
    if (in_stream_->finished()) break;
    const uint64_t now_ended = in_stream_->writes_ended();
    if (now_ended == ended) break;  // stalled for a whole phase
    ended = now_ended;
    deadline = Clock::now() + options_.phase_timeout;
  }
  report_.baseline_waited_seconds = Seconds(t_decide, Clock::now());
  if (!in_stream_->finished()) {
    const double phase =
        std::chrono::duration<double>(options_.phase_timeout).count();
    if (*commit) {
      *commit = false;
      report_.reason = fmt::format(
          "root.baseline's last writes ({}) made no progress for {} s "
          "(--timeout; a stalled disk?); aborted",
          setup_.baseline->describe(), phase);
    }
    spdlog::warn(
        "root.baseline's last writes still run {:.1f} s after the votes, "
        "none ended in the last {} s",
        report_.baseline_waited_seconds, phase);
  } else {
    Status b = in_stream_->Join();
    report_.baseline_in_stream_seconds = in_stream_->seconds();
    spdlog::debug(
        "root.baseline: {:.1f} MB written during the stream and the vote "
        "in {:.3f} s ({:.3f} s waited for){}",
        static_cast<double>(in_stream_->written_bytes()) / 1e6,
        in_stream_->seconds(), report_.baseline_waited_seconds,
        in_stream_->complete()
            ? ""
            : " (not every span: the rest after the decision)");
    if (!b.ok() && *commit) {
      *commit = false;
      report_.reason = b.ToString() + "; aborted";
    }
  }
}

void RefitRun::JoinBaselineWrites() {
  if (!in_stream_) return;
  const bool running = !in_stream_->finished();
  if (running) {
    spdlog::warn(
        "waiting for root.baseline's last writes to end before "
        "restoring it to step {} (interrupted, it stays flagged "
        "unfinished: dcr refit --resume restores it)",
        report_.base.step);
  }
  const auto t_wait = Clock::now();
  Status b = in_stream_->Join();  // at once where they ended
  if (running) {
    spdlog::info("root.baseline's last writes ended {:.1f} s later{}",
                 Seconds(t_wait, Clock::now()),
                 b.ok() ? "" : ": " + b.ToString());
  } else if (!b.ok()) {
    spdlog::warn("root.baseline's last writes failed: {}", b.ToString());
  }
  report_.baseline_in_stream_seconds = in_stream_->seconds();
}

bool RefitRun::RestoreBaseline(const std::string& log, bool verify) {
  const auto t0 = Clock::now();
  auto r = RestoreBase(log, *setup_.target, setup_.baseline.get(),
                       setup_.plan.span_elems, setup_.pool.get());
  Status s = r.ok() ? Status::OK() : r.status();
  if (s.ok() && verify) {
    // After a crash: the bits are checked whole before the flag goes.
    Digest128 d = setup_.baseline->Digests(setup_.pool.get()).version;
    if (d != report_.base.digest) {
      s = Status::Corruption(fmt::format(
          "root.baseline reads {} after the restore from {}, not the base {} "
          "(was the target file changed or the undo log lost?)",
          d.ShortHex(), log, report_.base.digest.ShortHex()));
    }
  }
  if (s.ok()) s = setup_.baseline->EndRefit();
  if (!s.ok()) {
    spdlog::error(
        "root.baseline could not be restored to step {} ({}): {}; it stays "
        "flagged unfinished: run dcr refit --resume once the cause is fixed",
        report_.base.step, report_.base.digest.ShortHex(), s.ToString());
    keep_current_ = true;
    return false;
  }
  spdlog::info("root.baseline restored to step {}: {} spans in {:.3f} s{}",
               report_.base.step, r->spans, Seconds(t0, Clock::now()),
               r->torn_tail ? " (its undo log ended in a torn chunk)" : "");
  return true;
}

DeltaHeader RefitRun::RecordHeader() const {
  const Manifest& m = setup_.target->manifest();
  DeltaHeader h;
  h.base = report_.base;
  h.target = report_.target;
  h.manifest = m.digest();
  h.span_elems = setup_.plan.span_elems;
  h.tensor_count = m.size();
  h.total_elements = report_.total_elements;
  h.total_bytes = report_.checkpoint_bytes;
  h.changed_elements = sent_.changed_elements();
  return h;
}

}  // namespace dcr
