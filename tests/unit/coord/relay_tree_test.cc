// The relay state machine and the coordinator together, over the fake
// transport: real Relay engines with file stores in a temp dir, a real
// RunRefit, and faults injected on the simulated links.
#include "relay_tree_fixture.h"

namespace dcr {
namespace {

TEST_F(RelayTreeTest, ConsecutiveDeltaRefitsCommitEverywhere) {
  SeedAll(0);
  StartAll();
  for (int v = 1; v <= 2; ++v) {
    RefitReport r = Refit(v);
    ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
    EXPECT_EQ(r.base.step, uint64_t(v - 1));
    EXPECT_EQ(r.target.step, uint64_t(v));
    EXPECT_GT(r.chunks, 0u);
    EXPECT_LT(r.payload_bytes, r.checkpoint_bytes / 4);
    EXPECT_GT(r.link_class_bytes["wan"], 0u);
    EXPECT_GT(r.link_class_bytes["lan"], 0u);
    Digest128 want = DigestOf(Ckpt(v));
    EXPECT_EQ(r.target.digest, want);
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n;
      EXPECT_TRUE(Node(r, n)->committed) << n;
      auto s = relays_[n]->Stats();
      ASSERT_TRUE(s.committed) << n;
      EXPECT_EQ(*s.committed, r.target) << n;
    }
    EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), want);
  }
  // Every vote has every tensor's digest: hashed ahead as the stream moved
  // past it (and again at the vote if written since), or at the vote. The
  // last tensor has no later one to pass it.
  for (const auto& n : kRelays) {
    auto s = relays_[n]->Stats();
    EXPECT_GE(s.tensors_hashed_ahead + s.tensors_hashed_at_vote,
              2 * infos_.size())
        << n;
    EXPECT_GE(s.tensors_hashed_at_vote, 2u) << n;
    EXPECT_GT(s.tensors_hashed_ahead, 0u) << n;
  }
  // A relay forwards each chunk once per child: a0 has children, a2 none.
  EXPECT_GT(relays_["a0"]->Stats().chunks_forwarded, 0u);
  EXPECT_EQ(relays_["a2"]->Stats().chunks_forwarded, 0u);
  // The decision was written before COMMIT.
  EXPECT_FALSE(std::filesystem::is_empty(dir_.Path("state/decisions")));

  TransportOptions to;
  to.name = "status-client";
  to.fake_network = network_;
  auto status = QueryStatus(MakeTopology(), 5s, "fake", to);
  ASSERT_EQ(status.size(), kRelays.size());
  for (const auto& s : status) {
    EXPECT_TRUE(s.reachable) << s.node << ": " << s.error;
    ASSERT_TRUE(s.committed) << s.node;
    EXPECT_EQ(s.committed->step, 2u);
  }
}

TEST_F(RelayTreeTest, BaseMismatchAbortsAndLeavesEveryStoreAtItsBase) {
  SeedAll(0);
  Seed("a1", 1);  // holds other bits than the baseline
  StartAll();
  RefitReport r = Refit(1);
  EXPECT_EQ(r.outcome, RefitOutcome::kAborted);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kNeedsCatchUp);
  EXPECT_EQ(Node(r, "a1")->phase, "plan");
  EXPECT_EQ(r.chunks, 0u);  // nothing sent before min_commit could be met
  Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    if (n != "a1") {
      EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
    }
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
}

TEST_F(RelayTreeTest, MinCommitLetsTheRestCommitAndReportsTheStaleNode) {
  SeedAll(0);
  Seed("a1", 1);
  StartAll();
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_FALSE(Node(r, "a1")->committed);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kNeedsCatchUp);
  // a1 forwards to its subtree although it does not apply.
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;  // a1 was already at v1 bits
    if (n != "a1") {
      EXPECT_TRUE(Node(r, n)->committed) << n;
    }
  }
  EXPECT_FALSE(relays_["a1"]->Stats().committed);  // no record: not bound
}

// A cluster head that is down before the refit starts (its connection is
// refused at PLAN) is routed around like one that fails mid-refit: the root
// adopts its live child, which commits.
TEST_F(RelayTreeTest, AHeadDownAtPlanHasItsLiveChildrenAdopted) {
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b0") StartRelay(n);  // b0 heads cluster cb; b1 is behind it
  }
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_EQ(Node(r, "b0")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b0")->phase, "plan");
  EXPECT_THAT(Node(r, "b0")->detail,
              ::testing::HasSubstr("its children were adopted"));
  EXPECT_EQ(r.adoptions, 1u) << r.ToJson();  // b1, once: no rejoin tries
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a0", "a1", "a2", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

// A whole cluster down at PLAN: the root adopts b1, which cannot be reached
// either. Neither took the plan, so neither is tried again (the vote does
// not wait for rejoin tries); b1 is reported unreachable, not split.
TEST_F(RelayTreeTest, AClusterDownAtPlanIsReportedWithoutRejoinTries) {
  SeedAll(0);
  for (const char* n : {"a0", "a1", "a2"}) StartRelay(n);
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/3);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_THAT(Node(r, "b0")->detail,
              ::testing::HasSubstr("its children were adopted"));
  EXPECT_EQ(Node(r, "b1")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b1")->detail.find("adopted"), std::string::npos)
      << Node(r, "b1")->detail;
  EXPECT_EQ(r.adoptions, 1u) << r.ToJson();
}

// A leaf that is down at PLAN has nobody to hand on: it is reported alone.
TEST_F(RelayTreeTest, ALeafDownAtPlanIsReportedUnreachable) {
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b1") StartRelay(n);
  }
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_EQ(Node(r, "b1")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b1")->phase, "plan");
  EXPECT_EQ(Node(r, "b1")->detail.find("adopted"), std::string::npos);
  EXPECT_EQ(r.adoptions, 0u) << r.ToJson();
}

TEST_F(RelayTreeTest, AMissingStoreIsSeededByTheNextRefit) {
  SeedAll(0);
  std::filesystem::remove(StorePath("b1"));
  StartAll();
  EXPECT_EQ(relays_["b1"]->Stats().state, "no store");
  // A delta refit (min_commit: all) counts the missing store as one the
  // root seeds, commits the others, then seeds b1 with a dense copy.
  RefitReport delta = Refit(1);
  ASSERT_EQ(delta.outcome, RefitOutcome::kCommitted) << delta.reason;
  ASSERT_EQ(delta.catch_up.size(), 1u);
  EXPECT_EQ(delta.catch_up[0].method, "seed");
  EXPECT_EQ(delta.catch_up[0].nodes, std::vector<std::string>{"b1"});
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  // The tree continues with deltas from there.
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(2))) << n;
  }
}

TEST_F(RelayTreeTest, AStoppedMidTreeRelaysChildrenAreAdoptedAndCommit) {
  SeedAll(0);
  StartAll();
  // Frames from a0 to its children arrive late, so the refit is still
  // streaming into a0's subtree when a0 stops.
  FakeFaults slow;
  slow.delay = 100ms;
  network_->SetFaults("a0", "a1", slow);
  network_->SetFaults("a0", "a2", slow);
  auto refit = std::async(std::launch::async, [&] {
    return Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  });
  for (int i = 0; i < 1000 && relays_["a0"]->Stats().chunks_received == 0;
       ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_GT(relays_["a0"]->Stats().chunks_received, 0u);
  relays_["a0"]->Stop();  // restores its own base
  // The root cannot reach a0 again, so it adopts a1 and a2; they vote no
  // (chunks missed), get a repair round and commit. a0 is excluded.
  RefitReport r = refit.get();
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_EQ(Node(r, "a0")->code, NodeCode::kUnreachable);
  EXPECT_NE(Node(r, "a0")->detail.find("children were adopted"),
            std::string::npos)
      << Node(r, "a0")->detail;
  EXPECT_GE(r.adoptions, 3u);  // a0 again, then a1 and a2
  relays_.erase("a0");         // release its store lock
  EXPECT_EQ(DigestOf(StorePath("a0")), DigestOf(Ckpt(0)));
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a1", "a2", "b0", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, ASilentRelayIsFoundByHeartbeatsAndRoutedAround) {
  SeedAll(0);
  prepared_wait_ = 1s;
  StartAll();
  // Once a0 took the plan it stops talking to the root both ways (as if
  // its process were stopped): the root hears no heartbeat for 4
  // intervals, cannot adopt a0 again (the new link is held too), and
  // adopts a1 and a2, which leave a0 (the root is above it) and commit.
  FakeFaults slow;
  slow.delay = 50ms;
  network_->SetFaults("a0", "a1", slow);
  network_->SetFaults("a0", "a2", slow);
  RefitReport r = RefitWithA0Silenced(3s);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_FALSE(Node(r, "a0")->committed);
  EXPECT_EQ(Node(r, "a0")->code, NodeCode::kTimeout) << Node(r, "a0")->detail;
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a1", "a2", "b0", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  // a0, orphaned and not adopted, restores its base (after the phase
  // timeout, or prepared_wait once it voted).
  for (int i = 0; i < 500 && relays_["a0"]->Stats().state != "idle"; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  WaitIdle("a0");
  EXPECT_EQ(DigestOf(StorePath("a0")), DigestOf(Ckpt(0)));
}

// a0 stops hearing anyone, as a stopped process would: first its parent
// (it orphans itself: it adopts nobody while it has no parent), then its
// children (they fail while a0 is an orphan). The root tries a0 again;
// the links come back before that try times out, so a0 is adopted, and
// then recovers its children (once, they were given up for good and the
// refit went on without them).
TEST_F(RelayTreeTest, AHeadAdoptedAfterItsLinksFellSilentRecoversItsChildren) {
  SeedAll(0);
  StartAll();
  auto refit = std::async(std::launch::async, [&] {
    return Refit(1, RefitMode::kDelta, /*min_commit=*/4, [](RefitOptions& o) {
      o.heartbeat = 100ms;
      o.connect_timeout = 4s;
    });
  });
  for (int i = 0; i < 1000 && relays_["a0"]->Stats().state == "idle"; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  network_->Pause("a0", "root");
  network_->Pause("root", "a0");
  std::this_thread::sleep_for(250ms);  // a0 finds its parent silent first
  for (const char* c : {"a1", "a2"}) {
    network_->Pause("a0", c);
    network_->Pause(c, "a0");
  }
  // a0 is an orphan at 0.4 s, its children fail at 0.65 s; the root tries
  // a0 again at about 0.45 s and gives that try 4 s.
  std::this_thread::sleep_for(1200ms);
  for (const char* c : {"root", "a1", "a2"}) {
    network_->Resume("a0", c);
    network_->Resume(c, "a0");
  }
  RefitReport r = refit.get();
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, AnOrphanTakesTheNextRefitAndCatchesUp) {
  SeedAll(0);
  StartAll();
  // As above: a0 falls silent once it took the plan and is routed around.
  // It waits to be adopted for as long as the phase may last (30 s).
  RefitReport r = RefitWithA0Silenced(30s);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_FALSE(Node(r, "a0")->committed);
  // a0 is still an orphan of that run, but the next coordinator run (a
  // higher epoch) replaces it: a0 restores its base, takes the plan,
  // answers needs catch-up (it holds v0, the base is v1), counts towards
  // min_commit (all) as it will catch up, and is caught up from the
  // history after the commit.
  EXPECT_NE(relays_["a0"]->Stats().state, "idle");
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.ToJson();
  ASSERT_EQ(next.catch_up.size(), 1u) << next.ToJson();
  EXPECT_EQ(next.catch_up[0].method, "history");
  EXPECT_EQ(next.catch_up[0].nodes, std::vector<std::string>{"a0"});
  Digest128 v2 = DigestOf(Ckpt(2));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v2) << n;
  }
}

// A history file torn after its header (a crash mid-write, a bad disk) is
// moved to history/quarantine/ and treated as absent: the relay that
// needed it is caught up with a dense copy, and the refit commits.
TEST_F(RelayTreeTest,
       ATornHistoryFileIsQuarantinedAndTheNextRefitStillCommits) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  for (const auto& n : kRelays) WaitIdle(n);
  // a2 (a leaf) misses the refit to step 2 (its relay is down).
  relays_.erase("a2");
  RefitReport two = Refit(2, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(two.outcome, RefitOutcome::kPartial) << two.ToJson();
  const std::string history = dir_.Path("state/history");
  std::string torn;
  for (const auto& e : std::filesystem::directory_iterator(history)) {
    if (e.path().filename().string().rfind("000000000002-", 0) == 0) {
      torn = e.path().string();
    }
  }
  ASSERT_FALSE(torn.empty());
  std::filesystem::resize_file(torn, kDeltaHeaderBytes + 10);
  // a2 comes back at step 1; the next refit (to step 3, v0's bits) finds
  // it behind, and the chain from step 1 runs through the torn file.
  StartRelay("a2");
  RefitReport three = Refit(0);
  ASSERT_EQ(three.outcome, RefitOutcome::kCommitted) << three.ToJson();
  ASSERT_EQ(three.catch_up.size(), 1u) << three.ToJson();
  EXPECT_EQ(three.catch_up[0].method, "dense");
  EXPECT_EQ(three.catch_up[0].nodes, std::vector<std::string>{"a2"});
  EXPECT_FALSE(std::filesystem::exists(torn));
  EXPECT_TRUE(
      std::filesystem::exists(history + "/quarantine/" +
                              std::filesystem::path(torn).filename().string()));
  Digest128 v3 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v3) << n;
  }
}

TEST_F(RelayTreeTest, ShmStoreIsSeededAndRefitLikeAFileStore) {
  // b1 keeps its weights in POSIX shared memory, as a serving process on
  // the node would map them: created by a full refit, then refit in place.
  std::string name = "/dcr-tree-test-" + std::to_string(::getpid());
  StoreSpec spec = *ParseStoreSpec("shm:" + name);
  ASSERT_TRUE(RemoveStore(spec).ok());
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b1") StartRelay(n);
  }
  // Its undo logs go to a directory of their own (on a disk, in real use),
  // which Start checks.
  {
    RelayOptions bad;
    bad.name = "b1";
    bad.store = spec;
    bad.transport = "fake";
    bad.transport_options.fake_network = network_;
    bad.undo_dir = dir_.Path("no-such-dir");
    auto r = Relay::Start(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::HasSubstr("undo directory '" + bad.undo_dir + "'"));
  }
  undo_dir_ = dir_.Path("undo");
  ASSERT_TRUE(std::filesystem::create_directory(undo_dir_));
  StartRelay("b1", "shm:" + name);
  undo_dir_.clear();
  EXPECT_EQ(relays_["b1"]->Stats().state, "no store");
  RefitReport seed = Refit(0, RefitMode::kFull);
  ASSERT_EQ(seed.outcome, RefitOutcome::kCommitted) << seed.reason;
  WaitIdle("b1");
  EXPECT_EQ(DigestOf("/dev/shm" + name), DigestOf(Ckpt(0)));
  RefitReport delta = Refit(1);
  ASSERT_EQ(delta.outcome, RefitOutcome::kCommitted) << delta.reason;
  WaitIdle("b1");
  EXPECT_EQ(DigestOf("/dev/shm" + name), DigestOf(Ckpt(1)));
  relays_.clear();
  EXPECT_TRUE(RemoveStore(spec).ok());
  // The relay's epoch file is its own, beside the store's record: not the
  // store's to remove.
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::remove("/dev/shm" + name + ".dcr-epoch", ec))
      << ec.message();
}

TEST_F(RelayTreeTest, OlderCoordinatorEpochIsFencedAcrossRelayRestarts) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);  // epoch 1
  // The relays restart: the epoch they accepted is on disk beside the store.
  relays_.clear();
  StartAll();
  EXPECT_TRUE(std::filesystem::exists(StorePath("a0") + ".dcr-epoch"));
  // A coordinator whose state_dir is behind (a stale copy, or an old
  // process waking up) runs at epoch 1 again: nobody takes its plan.
  std::filesystem::remove(dir_.Path("state/epoch"));
  RefitReport stale = Refit(2);
  EXPECT_EQ(stale.epoch, 1u);
  EXPECT_EQ(stale.outcome, RefitOutcome::kAborted);
  EXPECT_EQ(stale.chunks, 0u);
  for (const auto& n : kRelays) {
    const NodeOutcome* o = Node(stale, n);
    EXPECT_EQ(o->code, NodeCode::kRejected) << n;
    EXPECT_EQ(o->phase, "plan") << n;
    // The heads refuse for their whole subtree.
    EXPECT_NE(
        o->detail.find(n == "a0" || n == "b0" ? "stale coordinator epoch 1"
                                              : "which refused the plan"),
        std::string::npos)
        << n << ": " << o->detail;
  }
  // Refusing subtrees are not waited for in later phases.
  EXPECT_LT(stale.total_seconds, 5.0);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  // Past the relays' epoch, the same refit goes through.
  std::ofstream(dir_.Path("state/epoch")) << "7\n";
  RefitReport r = Refit(2);
  EXPECT_EQ(r.epoch, 8u);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
}

TEST_F(RelayTreeTest, FullRefitOfANamedNodeSeedsItAtTheCurrentVersion) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  // a1 loses its store; only a1 is refit, from the root, at step 1.
  relays_.erase("a1");
  std::filesystem::remove(StorePath("a1"));
  std::filesystem::remove(StorePath("a1") + ".dcr-version");
  StartRelay("a1");
  auto only_a1 = [](RefitOptions& o) { o.only_nodes = {"a1"}; };
  // The target must be the tree's current version.
  {
    RefitOptions o = OptionsFor(2);
    o.mode = RefitMode::kFull;
    only_a1(o);
    auto bad = RunRefit(o);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("must hold the bits of "
                                          "root.baseline"),
              std::string::npos)
        << bad.status().ToString();
    o.target = Ckpt(1);
    o.only_nodes = {"a9"};
    bad = RunRefit(o);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("no relay named 'a9'"),
              std::string::npos);
  }
  Digest128 base_before = DigestOf(dir_.Path("base.safetensors"));
  RefitReport r = Refit(1, RefitMode::kFull, 0, only_a1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  ASSERT_EQ(r.nodes.size(), 1u);
  EXPECT_EQ(r.nodes[0].node, "a1");
  EXPECT_EQ(r.target.step, 1u);
  WaitIdle("a1");
  EXPECT_EQ(DigestOf(StorePath("a1")), DigestOf(Ckpt(1)));
  EXPECT_EQ(*relays_["a1"]->Stats().committed, r.target);
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), base_before);
  // The tree moves on together.
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(2))) << n;
  }
}

TEST_F(RelayTreeTest, PlanForAnotherNodeIsRefused) {
  SeedAll(0);
  StartAll();
  // Swap a1 and a2's names in the topology: a1's address now gets a2's
  // plan, which names a2.
  Topology topo = MakeTopology(/*min_commit=*/1);
  for (auto& c : topo.clusters) {
    for (auto& n : c.nodes) {
      if (n.name == "a1")
        n.host = "a2";
      else if (n.name == "a2")
        n.host = "a1";
    }
  }
  RefitOptions o;
  o.topology = topo;
  o.target = Ckpt(1);
  o.phase_timeout = 10s;
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  auto r = RunRefit(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, RefitOutcome::kPartial);
  EXPECT_EQ(Node(*r, "a1")->code, NodeCode::kRejected);
  EXPECT_EQ(Node(*r, "a2")->code, NodeCode::kRejected);
}

// Going back to earlier bits (v1 -> v2 -> v1's bits as step 3): a relay
// that missed step 2 holds step 1, the same bits as the target. Its
// catch-up composes masks that cancel: it is relabelled to step 3 with
// nothing sent, reported as coming from step 1 (not a dense copy from
// "step 0").
TEST_F(RelayTreeTest, ARelayAlreadyHoldingTheTargetBitsIsRelabelled) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  for (const auto& n : kRelays) WaitIdle(n);
  relays_.erase("a2");
  ASSERT_EQ(Refit(2, RefitMode::kDelta, /*min_commit=*/4).outcome,
            RefitOutcome::kPartial);
  StartRelay("a2");
  RefitReport three = Refit(1);  // step 3, v1's bits
  ASSERT_EQ(three.outcome, RefitOutcome::kCommitted) << three.ToJson();
  EXPECT_EQ(three.target.step, 3u);
  ASSERT_EQ(three.catch_up.size(), 1u) << three.ToJson();
  const CatchUpReport& c = three.catch_up[0];
  EXPECT_EQ(c.method, "history");
  EXPECT_EQ(c.nodes, std::vector<std::string>{"a2"});
  EXPECT_EQ(c.from.step, 1u);
  EXPECT_EQ(c.from.digest, DigestOf(Ckpt(1)));
  EXPECT_EQ(c.chunks, 0u);
  EXPECT_EQ(c.payload_bytes, 0u);
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

}  // namespace
}  // namespace dcr
