// The relay tree over the fake transport when chunks are damaged, links
// are cut after the vote and a child is slow: resends from the parent,
// repair rounds, exclusion without them, reconnection and backpressure.
#include "relay_tree_fixture.h"

namespace dcr {
namespace {

TEST_F(RelayTreeTest, CorruptChunkOnOneLinkIsResentByTheParentAndCommits) {
  SeedAll(0);
  StartAll();
  // The 5th frame from a0 to its first child is corrupted: the child's
  // decoder refuses it and closes the link. a0 connects to a1 again (an
  // adoption); a1 says which chunk it took last and a0 resends the rest
  // from its resend buffer: no repair round.
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(network_->Stats("a0", "a1").frames_corrupted, 1u);
  EXPECT_EQ(r.repair_rounds, 0);
  RelayStats a0 = relays_["a0"]->Stats();
  EXPECT_GT(a0.resent_chunks, 0u);
  EXPECT_GT(a0.resent_bytes, 0u);
  EXPECT_EQ(a0.resend_misses, 0u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, CorruptChunkWithoutAResendBufferIsRepairedAndCommits) {
  resend_buffer_bytes_ = 0;
  SeedAll(0);
  StartAll();
  // As above without a resend buffer: a1 misses the chunks in between,
  // votes no naming the tensors that differ, and the root's repair round
  // overwrites them.
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(network_->Stats("a0", "a1").frames_corrupted, 1u);
  EXPECT_EQ(r.repair_rounds, 1);
  EXPECT_GT(r.repair_bytes, 0u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, WithoutRepairRoundsTheDamagedNodeIsExcluded) {
  resend_buffer_bytes_ = 0;  // nor a resend: a1 keeps what it missed
  SeedAll(0);
  StartAll();
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4,
                        [](RefitOptions& o) { o.repair_rounds = 0; });
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_EQ(r.repair_rounds, 0);
  EXPECT_FALSE(Node(r, "a1")->committed);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kIncomplete);
  EXPECT_EQ(Node(r, "a1")->phase, "vote");
  WaitIdle("a1");
  EXPECT_EQ(DigestOf(StorePath("a1")), DigestOf(Ckpt(0)));  // base restored
  for (const char* n : {"a0", "a2", "b0", "b1"}) {
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, ALinkCutAfterTheVoteIsReconnected) {
  SeedAll(0);
  StartAll();
  // a0's link to the root is cut after three frames (HELLO, PLAN_REPLY,
  // VOTE). The root connects to a0 again (an adoption PLAN for the same
  // refit): a0 repeats its answers, gets COMMIT, and its subtree commits.
  FakeFaults f;
  f.cut_after_frames = 3;
  network_->SetFaults("a0", "root", f);
  RefitReport r = Refit(1);
  EXPECT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_GE(network_->Stats("a0", "root").cuts, 1u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, SlowChildBackpressureStillDelivers) {
  SeedAll(0);
  StartAll();
  // Every frame towards b1 is delayed: b0's queue to it grows past the
  // window, b0 stops reading from the root, and the root's own window
  // throttles the encoder. Everything still arrives, in order.
  FakeFaults f;
  f.delay = 2ms;
  network_->SetFaults("b0", "b1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

}  // namespace
}  // namespace dcr
