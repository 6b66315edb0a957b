// root.baseline and the target across a refit, over the fake transport:
// a target file changed under a running refit, and --resume after the
// coordinator stopped, with or without a decision.
#include "coord/history.h"
#include "coord/refit_report.h"
#include "coord/state_dir.h"
#include "relay_tree_fixture.h"

namespace dcr {
namespace {

// The target file changes after the decision (the trainer wrote the next
// step over it): root.baseline took the target's bits while the refit
// streamed, so the relays and the baseline commit the bits the relays
// verified, and the history keeps the delta.
TEST_F(RelayTreeTest, ATargetChangedAfterTheDecisionChangesNothing) {
  SeedAll(0);
  StartAll();
  std::string a = *ReadFileToString(Ckpt(0)), b = *ReadFileToString(Ckpt(1));
  ASSERT_EQ(a.size(), b.size());
  size_t at = a.size() - 1;
  while (at > 0 && a[at] == b[at]) --at;
  ASSERT_NE(a[at], b[at]);
  std::string v1_copy;
  auto refit = RefitToACopyOfV1("coord.before_commit=delay(1500)", &v1_copy);
  const std::string decisions = dir_.Path("state/decisions");
  ASSERT_TRUE(WaitUntil([&] {
    std::error_code ec;
    return std::filesystem::exists(decisions, ec) &&
           !std::filesystem::is_empty(decisions, ec);
  })) << "no decision within 30 s";
  {
    std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(b[at] ^ 0x01));
  }
  RefitReport r = refit.get();
  DisarmFailpoints();
  EXPECT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(r.reason, "");
  EXPECT_GT(r.baseline_in_stream_seconds, 0);
  const Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  bool recorded = false;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(dir_.Path("state/history"), ec)) {
    recorded |= e.path().filename().string().find("000000000001-") == 0;
  }
  EXPECT_TRUE(recorded) << "no history file for step 1";
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

// The target file changes while the refit runs, after the baseline took
// some of its bits: the refit aborts before deciding and root.baseline goes
// back to the base from its undo log (the history record) and the target.
// Replaced by a rename (how checkpoints are written), the mapped old file
// still holds the bits the baseline took: restored at once, checked by
// digest. Rewritten in place, the undo cannot be exact: the baseline stays
// flagged until the file is put back and --resume restores it.
class TargetChangedTest : public RelayTreeTest,
                          public ::testing::WithParamInterface<bool> {};

TEST_P(TargetChangedTest, DuringTheRefitAbortsAndRestoresTheBase) {
  const bool in_place = GetParam();
  SeedAll(0);
  StartAll();
  std::string v1_copy;
  auto refit = RefitToACopyOfV1("coord.after_stream=delay(1500)", &v1_copy);
  // The baseline flags the refit before its first write (this model's
  // writes all come at the end of the stream); then the failpoint holds
  // the run before the vote while the target changes.
  const std::string record = dir_.Path("base.safetensors.dcr-version");
  ASSERT_TRUE(WaitUntil([&] {
    auto rec = ReadVersionRecord(record);
    return rec.ok() && *rec && (*rec)->in_progress.has_value();
  })) << "root.baseline never flagged the refit";
  std::string v1 = *ReadFileToString(Ckpt(1));
  std::string changed = v1;
  changed.back() = static_cast<char>(changed.back() ^ 0x7f);
  if (in_place) {
    std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put(changed.back());
  } else {
    ASSERT_TRUE(WriteFileAtomic(v1_copy, std::as_bytes(std::span(changed)))
                    .ok());  // tmp + rename
  }
  RefitReport r = refit.get();
  DisarmFailpoints();
  EXPECT_EQ(r.outcome, RefitOutcome::kAborted) << r.ToJson();
  EXPECT_THAT(r.reason, ::testing::HasSubstr("changed during the refit"));
  const Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
  }
  auto rec = ReadVersionRecord(record);
  ASSERT_TRUE(rec.ok() && *rec);
  if (in_place) {
    // Flagged, and resumable once the target holds its bits again.
    EXPECT_TRUE((*rec)->in_progress.has_value());
    EXPECT_TRUE(std::filesystem::exists(dir_.Path("state/current.json")));
    EXPECT_FALSE(RunRefit(OptionsFor(1)).ok());
    {
      std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-1, std::ios::end);
      f.put(v1.back());
    }
    RefitOptions o = ResumeOptions();
    auto resumed = ResumeRefit(o);
    ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
    EXPECT_EQ(resumed->outcome, RefitOutcome::kAborted);
    rec = ReadVersionRecord(record);
    ASSERT_TRUE(rec.ok() && *rec);
  }
  EXPECT_FALSE((*rec)->in_progress.has_value());
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("state/current.json")));
  EXPECT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
}

INSTANTIATE_TEST_SUITE_P(ReplacedOrRewritten, TargetChangedTest,
                         ::testing::Values(false, true),
                         [](const auto& param_info) {
                           return param_info.param ? "InPlace" : "Renamed";
                         });

TEST_F(RelayTreeTest, ResumeCommitsWhatTheStoppedCoordinatorDecided) {
  SeedAll(0);
  StartAll();
  RefitReport stopped = Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.TEST_crash_after_decision = true;
  });
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("state/current.json")));
  // The relays voted and wait for the decision (prepared), at the target's
  // bits but not committed.
  for (const auto& n : kRelays) {
    for (int i = 0; i < 500 && relays_[n]->Stats().state != "voted"; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(relays_[n]->Stats().state, "voted") << n;
    EXPECT_FALSE(relays_[n]->Stats().committed.has_value()) << n;
  }
  // root.baseline took the target's bits while streaming and still flags
  // the refit in progress: nothing is committed before the decision is
  // carried out.
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(1)));
  {
    auto rec = ReadVersionRecord(dir_.Path("base.safetensors.dcr-version"));
    ASSERT_TRUE(rec.ok() && *rec && (*rec)->in_progress);
    EXPECT_EQ((*rec)->in_progress->refit, stopped.refit);
  }
  RefitOptions o = ResumeOptions();
  auto r = ResumeRefit(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, RefitOutcome::kCommitted) << r->ToJson();
  EXPECT_EQ(r->refit, stopped.refit);
  EXPECT_GT(r->epoch, stopped.epoch);
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("state/current.json")));
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_EQ(*relays_[n]->Stats().committed, stopped.target) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  // Nothing left to resume; the tree moves on.
  EXPECT_TRUE(ResumeRefit(o).status().IsNotFound());
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

TEST_F(RelayTreeTest, ResumeWithoutADecisionAbortsAndRestoresEveryBase) {
  SeedAll(0);
  StartAll();
  RefitReport stopped = Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.TEST_crash_after_decision = true;
  });
  // As if it had stopped just before writing its decision.
  std::filesystem::remove(
      dir_.Path("state/decisions/" + stopped.refit.ToHex() + ".json"));
  RefitOptions o = ResumeOptions();
  auto r = ResumeRefit(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, RefitOutcome::kAborted) << r->ToJson();
  Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  EXPECT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
}

// root.baseline's `record` names `v` committed and no refit in progress.
void ExpectBaselineCommittedAt(const std::string& record, const Version& v) {
  auto rec = ReadVersionRecord(record);
  ASSERT_TRUE(rec.ok() && *rec && (*rec)->committed);
  EXPECT_EQ((*rec)->committed->version, v);
  EXPECT_FALSE((*rec)->in_progress);
}

// The coordinator stopped after root.baseline committed but before it
// removed current.json: --resume finds the baseline done, needs no target,
// and finishes the refit (the relays answer how they ended).
TEST_F(RelayTreeTest, ResumeAfterTheBaselineCommittedNeedsNoTarget) {
  SeedAll(0);
  StartAll();
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  for (const auto& n : kRelays) WaitIdle(n);
  StateDir state(dir_.Path("state"));
  ASSERT_TRUE(state
                  .WriteCurrent(CurrentRefit{r.refit, r.epoch, r.mode, r.base,
                                             Version{r.target.step, {}},
                                             dir_.Path("gone.safetensors")})
                  .ok());
  auto resumed = ResumeRefit(ResumeOptions());
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->outcome, RefitOutcome::kCommitted) << resumed->ToJson();
  EXPECT_EQ(resumed->target, r.target);
  EXPECT_FALSE(state.HasCurrent());
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(1)));
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

// The whole tree: PLAN goes out before the target is hashed (the encoder
// hashes it as it streams) and END names its digests; the relays vote and
// commit that target, and the history names the delta by it.
TEST_F(RelayTreeTest, TheTargetIsHashedDuringTheStreamAndNamedAtEnd) {
  SeedAll(0);
  StartAll();
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  const Digest128 v1 = DigestOf(Ckpt(1));
  EXPECT_EQ(r.target, (Version{1, v1}));
  EXPECT_GT(r.hashed_in_stream_seconds, 0);
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  ExpectBaselineCommittedAt(dir_.Path("base.safetensors.dcr-version"),
                            r.target);
  DeltaHistory history(dir_.Path("state/history"), 8);
  EXPECT_TRUE(std::filesystem::exists(history.PathFor(r.target)));
  EXPECT_FALSE(std::filesystem::exists(history.TmpPathFor(r.refit)));
  // The next refit takes it as its base.
  RefitReport two = Refit(2);
  ASSERT_EQ(two.outcome, RefitOutcome::kCommitted) << two.ToJson();
  EXPECT_EQ(two.base, r.target);
}

// root.baseline's last writes (here all of them: this model's history is
// far below a sync's 64 MB) run beside the vote: END does not wait for
// them, the decision does, and the root keeps the tree's links alive
// meanwhile (heartbeats every 0.3 s: a relay whose parent is silent for
// 1.2 s drops it).
TEST_F(RelayTreeTest, TheBaselinesLastWritesOverlapTheVote) {
  SeedAll(0);
  StartAll();
  ASSERT_TRUE(ArmFailpoints("coord.baseline_write=delay(3000)@1").ok());
  RefitReport r = Refit(1, RefitMode::kDelta, 0,
                        [](RefitOptions& o) { o.heartbeat = 300ms; });
  DisarmFailpoints();
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(r.adoptions, 0u) << r.ToJson();
  EXPECT_GE(r.baseline_in_stream_seconds, 3.0);
  EXPECT_LT(r.stream_seconds, 3.0) << "END waited for the baseline's writes";
  // The votes of this small tree came well before the writes ended.
  EXPECT_GT(r.baseline_waited_seconds, 1.0);
  // (Measured on two threads: the writer's start and the wake-up after
  // the writes add a little.)
  EXPECT_LE(r.baseline_waited_seconds, r.baseline_in_stream_seconds + 0.5);
  EXPECT_GE(r.commit_seconds, r.baseline_waited_seconds);
  const Digest128 v1 = DigestOf(Ckpt(1));
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  ExpectBaselineCommittedAt(dir_.Path("base.safetensors.dcr-version"),
                            r.target);
  ExpectRelaysHold(v1);
  // last-refit.json keeps it.
  auto back = RefitReportFromJson(nlohmann::json::parse(r.ToJson()), "f");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->baseline_waited_seconds, r.baseline_waited_seconds);
}

// root.baseline's last writes stalled (a disk that hangs) past a phase's
// timeout after the votes: the refit aborts rather than hold the voted
// relays, which restore the base while the writes still run; the root
// restores root.baseline once they end, and the next refit commits.
// Without heartbeats: nothing but the deadline wakes the root's wait.
TEST_F(RelayTreeTest,
       BaselineWritesStalledPastTheTimeoutAbortWithoutHoldingTheRelays) {
  SeedAll(0);
  StartAll();
  // One span's write hangs; the others end at once (the settle's pool), so
  // the writes stop ending within a phase of the votes, at most two.
  ASSERT_TRUE(ArmFailpoints("coord.baseline_write=delay(12000)@1").ok());
  auto refit = std::async(std::launch::async, [this] {
    return Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
      o.heartbeat = 0ms;
      o.phase_timeout = 3s;
    });
  });
  // Every relay aborted and went idle while the root still waits for the
  // writes (at least 3 s more).
  const bool released = WaitUntil([&] {
    for (const auto& n : kRelays) {
      RelayStats st = relays_[n]->Stats();
      if (st.refits_aborted != 1 || st.state != "idle") return false;
    }
    return true;
  });
  const bool still_writing =
      refit.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  RefitReport r = refit.get();
  DisarmFailpoints();
  ASSERT_TRUE(released) << r.ToJson();
  EXPECT_TRUE(still_writing) << "the relays waited for root.baseline";
  EXPECT_EQ(r.outcome, RefitOutcome::kAborted) << r.ToJson();
  EXPECT_THAT(r.reason,
              ::testing::HasSubstr("root.baseline's last writes (file:"));
  EXPECT_THAT(r.reason, ::testing::HasSubstr("made no progress for 3 s"));
  EXPECT_LT(r.baseline_waited_seconds, 9.0) << r.ToJson();
  EXPECT_GE(r.baseline_in_stream_seconds, 12.0) << r.ToJson();
  const Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  // Restored: no refit in progress (and no commit: it never had one).
  auto rec = ReadVersionRecord(dir_.Path("base.safetensors.dcr-version"));
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_TRUE(!*rec || !(*rec)->in_progress);
  RefitReport next = Refit(1);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.ToJson();
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(1)));
}

// A slow disk that writes is not a stalled one: root.baseline's last
// writes take longer than a phase after the votes (18 spans at 0.7 s each
// on the settle's 2 threads: about 6 s against 2 s), but one ends at least
// every phase, so the decision waits for them and the refit commits.
TEST_F(RelayTreeTest, SlowBaselineWritesThatProgressAreWaitedFor) {
  SeedAll(0);
  StartAll();
  ASSERT_TRUE(ArmFailpoints("coord.baseline_write=delay(700)").ok());
  RefitReport r = Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.heartbeat = 300ms;
    o.phase_timeout = 2s;
  });
  DisarmFailpoints();
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_GT(r.baseline_waited_seconds, 2.0) << r.ToJson();
  const Digest128 v1 = DigestOf(Ckpt(1));
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  ExpectBaselineCommittedAt(dir_.Path("base.safetensors.dcr-version"),
                            r.target);
  ExpectRelaysHold(v1);
}

// A target with the baseline's bits is found out by the stream's hash: the
// refit aborts with the reason, having sent no chunk, and changes nothing.
TEST_F(RelayTreeTest, ATargetWithTheBaselinesBitsAbortsNothingToRefit) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  for (const auto& n : kRelays) WaitIdle(n);
  RefitReport same = Refit(1);
  EXPECT_EQ(same.outcome, RefitOutcome::kAborted);
  EXPECT_THAT(same.reason, ::testing::HasSubstr("nothing to refit"));
  EXPECT_EQ(same.chunks, 0u);
  const Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  ExpectBaselineCommittedAt(dir_.Path("base.safetensors.dcr-version"),
                            Version{1, v1});
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

// A process running refits one after another keeps root.baseline open
// between them (RefitOptions::kept_baseline): no other process opens it
// meanwhile, and a file replaced under it (another inode: a backup put
// back by rename) is opened afresh.
TEST_F(RelayTreeTest, AKeptBaselineServesTheNextRefitUnlessReplaced) {
  SeedAll(0);
  StartAll();
  auto kept = std::make_shared<KeptBaseline>();
  auto keep = [&](RefitOptions& o) { o.kept_baseline = kept; };
  const std::string base = dir_.Path("base.safetensors");
  auto settle = [&] {
    for (const auto& n : kRelays) WaitIdle(n);
  };
  RefitReport one = Refit(1, RefitMode::kDelta, 0, keep);
  ASSERT_EQ(one.outcome, RefitOutcome::kCommitted) << one.ToJson();
  settle();
  ASSERT_NE(kept->store, nullptr);
  // (Not a second owner: the test must not keep a replaced store alive.)
  const std::weak_ptr<WeightStore> first = kept->store;
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kFile;
  spec.path = base;
  auto other = OpenStore(spec);
  EXPECT_FALSE(other.ok()) << "a kept baseline was opened by another store";

  RefitReport two = Refit(2, RefitMode::kDelta, 0, keep);
  ASSERT_EQ(two.outcome, RefitOutcome::kCommitted) << two.ToJson();
  settle();
  EXPECT_EQ(kept->store, first.lock()) << "opened again for the next refit";
  EXPECT_EQ(kept->store->committed(), two.target);
  EXPECT_EQ(DigestOf(base), DigestOf(Ckpt(2)));
  ExpectBaselineCommittedAt(base + ".dcr-version", two.target);

  // Replaced by a copy of itself (the same bits and record, a new inode).
  std::filesystem::copy_file(base, base + ".new");
  std::filesystem::rename(base + ".new", base);
  RefitReport three = Refit(1, RefitMode::kDelta, 0, keep);
  ASSERT_EQ(three.outcome, RefitOutcome::kCommitted) << three.ToJson();
  settle();
  EXPECT_EQ(three.base, two.target);
  EXPECT_TRUE(first.expired()) << "a replaced file's old mapping was kept";
  EXPECT_EQ(DigestOf(base), DigestOf(Ckpt(1)));
  ExpectBaselineCommittedAt(base + ".dcr-version", three.target);
}

}  // namespace
}  // namespace dcr
