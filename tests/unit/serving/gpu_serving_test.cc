// A relay keeping a serving process's GPU buffers at its live image (the
// GPU half of relay/serving_images.h), with the buffers faked in host
// memory: the attach, the pause around each commit, and every way it is
// refused. The CUDA IPC mapping itself runs in tests/cuda on a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

#include "unit/serving/gpu_serving_testing.h"

namespace dcr {
namespace {

using serving_testing::Filled;
using serving_testing::GpuServingTest;
using serving_testing::LineClient;
using ::testing::HasSubstr;
using Op = PauseMsg::Op;

// Holds the attach's first sync until `first` is set and every later one
// until `second` is; the count of syncs started.
std::shared_ptr<std::atomic<int>> HoldAttachSyncs(std::function<void()>* hold,
                                                  std::promise<void>& first,
                                                  std::promise<void>& second) {
  std::shared_future<void> released[2] = {first.get_future().share(),
                                          second.get_future().share()};
  auto syncs = std::make_shared<std::atomic<int>>(0);
  *hold = [released, syncs] {
    const int k = (*syncs)++;
    released[std::min(k, 1)].wait_for(std::chrono::seconds(20));
  };
  return syncs;
}

TEST_F(GpuServingTest, AttachBringsTheBuffersToTheLiveImageBeforeLive) {
  LineClient c(socket_);
  ASSERT_TRUE(c.connected());
  c.Send(Hello("/run/server/weights.sock"));
  auto live = NextMsg(c);
  ASSERT_EQ(attach_paths_,
            std::vector<std::string>{"/run/server/weights.sock"});
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->op, Op::kLive);
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->version.step, 1u);
  ASSERT_NE(gpu_, nullptr);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x10));
  EXPECT_EQ(gpu_->writes, 2);
  EXPECT_TRUE(images_->stats().gpu);
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);
  EXPECT_EQ(images_->stats().gpu_rewritten, 2u);
}

TEST_F(GpuServingTest, ACommitWritesTheBuffersOnlyWhileTheServerIsPaused) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());  // live
  const int writes_at_attach = gpu_->writes;
  RefitId refit;
  refit.bytes.fill(0x42);
  Flip(refit);
  auto pause = NextMsg(c);
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  EXPECT_EQ(pause->refit, refit);
  // Nothing is written, nor committed, until the server stopped.
  EXPECT_EQ(gpu_->writes, writes_at_attach);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_FALSE(c.Line(50).has_value());
  EXPECT_TRUE(images_->AwaitingMove());

  c.Send(Paused(refit));
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
  EXPECT_EQ(commit->image, 1u);
  EXPECT_EQ(commit->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x20));
  EXPECT_EQ(images_->stats().gpu_syncs, 2u);

  c.Send(Flipped(1, 2));
  EXPECT_TRUE(PumpUntil([&] { return images_->stats().pauses == 1; }));
  EXPECT_FALSE(images_->AwaitingMove());
  EXPECT_EQ(images_->stats().pauses, 1u);
  EXPECT_THAT(images_->MoveSummary(), HasSubstr("serving process moved in"));
}

class GpuServingDeadlineTest : public GpuServingTest {
 protected:
  GpuServingDeadlineTest() { deadline_ = std::chrono::milliseconds(300); }
};

TEST_F(GpuServingDeadlineTest, AServerThatDoesNotPauseIsDetachedAtIt) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());
  RefitId refit;
  refit.bytes.fill(1);
  Flip(refit);
  Pump(500);  // past the 300 ms deadline
  auto pause = c.Msg();
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  EXPECT_FALSE(c.Msg(1000).has_value());
  EXPECT_TRUE(c.closed());
  Pump();
  EXPECT_FALSE(images_->stats().attached);
  EXPECT_FALSE(images_->stats().gpu);
  // Its pause is over: the standby may catch up and take refits again
  // (once the flip's diff, which ran beside, stopped reading it).
  EXPECT_TRUE(PumpUntil([&] { return images_->CatchUpDue(); }));

  // Attaching again brings its buffers to the live image (step 2).
  LineClient again(socket_);
  again.Send(Hello("/run/w.sock"));
  auto live = NextMsg(again);
  ASSERT_TRUE(live.has_value());
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
}

TEST_F(GpuServingTest, RefusedBuffersAreNamedAndTheServerDetached) {
  refuse_ = Status::InvalidArgument(
      "the GPU buffers serving rank 0 exported do not match the layout: 'a' "
      "is not exported");
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  auto error = NextMsg(c);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->op, Op::kError);
  EXPECT_THAT(error->detail, HasSubstr("/run/w.sock were refused"));
  EXPECT_THAT(error->detail, HasSubstr("'a' is not exported"));
  EXPECT_FALSE(c.Msg(1000).has_value());  // no live: it must not compute
  EXPECT_TRUE(c.closed());
}

TEST_F(GpuServingTest, BuffersThatDoNotTakeTheWriteAreRefused) {
  drop_writes_ = true;
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  auto error = NextMsg(c);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->op, Op::kError);
  EXPECT_THAT(error->detail, HasSubstr("does not hold what was written"));
  EXPECT_THAT(error->detail, HasSubstr("must not compute"));
  EXPECT_FALSE(c.Msg(1000).has_value());
  EXPECT_TRUE(c.closed());
  EXPECT_FALSE(images_->stats().gpu);
}

TEST_F(GpuServingTest, AFlipBeforeTheHelloEndsWhenTheBuffersAttach) {
  LineClient c(socket_);
  ASSERT_TRUE(PumpUntil([&] { return images_->stats().attached; }));
  // Connected, hello not yet sent: the flip sends it a plain commit,
  // which a GPU server ignores.
  RefitId refit;
  refit.bytes.fill(5);
  Flip(refit);
  EXPECT_TRUE(images_->AwaitingMove());
  c.Send(Hello("/run/w.sock"));
  std::optional<PauseMsg> m = NextMsg(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->op, Op::kCommit);
  m = NextMsg(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->op, Op::kLive);
  EXPECT_TRUE(m->cuda);
  EXPECT_EQ(m->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  // The attach ended that pause: the relay's reply need not wait.
  EXPECT_FALSE(images_->AwaitingMove());
  EXPECT_EQ(images_->MoveSummary(),
            "serving process attached its GPU buffers at step 2");
}

// Bringing the buffers to the live image hashes them all (seconds for a
// large rank): it runs beside the relay's loop, which goes on meanwhile,
// and the server gets its live line when it is done.
TEST_F(GpuServingTest, TheAttachSyncRunsBesideTheLoop) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  hold_attach_ = [released] { released.wait_for(std::chrono::seconds(20)); };
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(PumpUntil([&] { return gpu_ != nullptr; }));
  // Nothing goes to the server, and a vote does not wait for it.
  EXPECT_FALSE(NextMsg(c, 200).has_value());
  RefitId refit;
  refit.bytes.fill(0x31);
  EXPECT_EQ(images_->ReadyToVote(refit, 2), ServingImages::Gate::kReady);
  EXPECT_FALSE(NextMsg(c, 50).has_value());
  EXPECT_FALSE(images_->stats().gpu);
  EXPECT_TRUE(images_->stats().gpu_attaching);
  EXPECT_EQ(gpu_->writes, 0);
  release.set_value();
  auto live = NextMsg(c);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->op, Op::kLive);
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->version.step, 1u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_TRUE(images_->stats().gpu);
  EXPECT_FALSE(images_->stats().gpu_attaching);
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);
  // From now on a vote asks it.
  EXPECT_EQ(images_->ReadyToVote(refit, 2), ServingImages::Gate::kWait);
  auto prepare = NextMsg(c);
  ASSERT_TRUE(prepare.has_value());
  EXPECT_EQ(prepare->op, Op::kPrepare);
}

// A commit flips the images while the attach brings the buffers to the
// old live image: the server, which never computed on it, gets no pause;
// the sync runs again to the new image, whose live line ends that pause.
// From the flip until then no catch-up writes the old live image, now the
// standby: first because the sync reads it, then so that no further flip
// sends the sync round again.
TEST_F(GpuServingTest, AFlipDuringTheAttachSyncsAgainToTheNewImage) {
  std::promise<void> first, second;
  auto syncs = HoldAttachSyncs(&hold_attach_, first, second);
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(PumpUntil([&] { return *syncs == 1; }));
  RefitId refit;
  refit.bytes.fill(0x32);
  Flip(refit);
  EXPECT_FALSE(NextMsg(c, 100).has_value());  // no pause, no commit
  EXPECT_TRUE(images_->AwaitingMove());
  auto standby_held = [&] {
    EXPECT_FALSE(images_->CatchUpDue());
    auto ready = images_->MaybeCatchUp(standby_, false);
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
    EXPECT_FALSE(*ready);
    EXPECT_THAT(images_->why_waiting(), HasSubstr("attaching GPU server"));
  };
  standby_held();
  first.set_value();
  ASSERT_TRUE(PumpUntil([&] { return *syncs == 2; }));
  Pump(20);
  standby_held();
  EXPECT_FALSE(c.Line(20).has_value());
  second.set_value();
  auto live = NextMsg(c);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->op, Op::kLive);
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->image, 1u);
  EXPECT_EQ(live->version.step, 2u);
  EXPECT_EQ(*syncs, 2);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x20));
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);  // the one that went live
  EXPECT_FALSE(images_->AwaitingMove());
  EXPECT_EQ(images_->MoveSummary(),
            "serving process attached its GPU buffers at step 2");
  EXPECT_TRUE(PumpUntil([&] { return images_->CatchUpDue(); }));
  auto ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_TRUE(*ready);
}

// A server that leaves during the sync a flip sent round again frees the
// standby at once (the running sync reads the live image, not it), and
// the sync's result is dropped when it ends.
TEST_F(GpuServingTest, AServerThatLeavesDuringTheSecondSyncFreesTheStandby) {
  std::promise<void> first, second;
  auto syncs = HoldAttachSyncs(&hold_attach_, first, second);
  auto c = std::make_unique<LineClient>(socket_);
  c->Send(Hello("/run/w.sock"));
  ASSERT_TRUE(PumpUntil([&] { return *syncs == 1; }));
  RefitId refit;
  refit.bytes.fill(0x33);
  Flip(refit);
  first.set_value();
  ASSERT_TRUE(PumpUntil([&] { return *syncs == 2; }));
  Pump(20);
  EXPECT_FALSE(images_->CatchUpDue());
  c.reset();
  EXPECT_TRUE(PumpUntil([&] { return !images_->stats().attached; }));
  EXPECT_FALSE(images_->stats().gpu_attaching);
  EXPECT_TRUE(PumpUntil([&] { return images_->CatchUpDue(); }));
  auto ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_TRUE(*ready);
  EXPECT_EQ(gpus_closed_, 0);  // the sync still writes them
  second.set_value();
  EXPECT_TRUE(PumpUntil([&] { return gpus_closed_ == 1; }));
  Pump(20);
  EXPECT_EQ(images_->stats().gpu_syncs, 0u);
  EXPECT_FALSE(images_->stats().gpu);
}

// A server that leaves while its buffers are synced is forgotten; its
// buffers stay open until the sync ends. One that attaches meanwhile is
// synced after it, and only it goes live.
TEST_F(GpuServingTest, AServerThatLeavesDuringTheAttachSyncIsForgotten) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto syncs = std::make_shared<std::atomic<int>>(0);
  hold_attach_ = [released, syncs] {
    *syncs += 1;
    released.wait_for(std::chrono::seconds(20));
  };
  auto first = std::make_unique<LineClient>(socket_);
  first->Send(Hello("/run/first.sock"));
  ASSERT_TRUE(PumpUntil([&] { return *syncs == 1; }));
  first.reset();
  EXPECT_TRUE(PumpUntil([&] { return !images_->stats().attached; }));
  EXPECT_EQ(gpus_closed_, 0);  // the sync still writes them
  LineClient second(socket_);
  second.Send(Hello("/run/second.sock"));
  ASSERT_TRUE(PumpUntil([&] { return attach_paths_.size() == 2; }));
  // Its sync waits for the first one's to end.
  EXPECT_FALSE(NextMsg(second, 100).has_value());
  EXPECT_EQ(*syncs, 1);
  EXPECT_EQ(gpus_closed_, 0);
  release.set_value();
  auto live = NextMsg(second);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->op, Op::kLive);
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(*syncs, 2);
  EXPECT_EQ(gpus_closed_, 1);  // the first server's, once its sync ended
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);
  EXPECT_TRUE(images_->stats().gpu);
}

TEST_F(GpuServingTest, PausedWithoutAPauseDetaches) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());
  PauseMsg paused;
  paused.op = Op::kPaused;
  paused.refit.bytes.fill(9);
  c.Send(paused);
  EXPECT_FALSE(NextMsg(c).has_value());
  EXPECT_TRUE(c.closed());
}

TEST_F(GpuServingTest, AHostServerStillGetsCommitWithoutAPause) {
  LineClient c(socket_);
  c.Send(Hello(""));
  auto live = NextMsg(c);
  ASSERT_TRUE(live.has_value());
  EXPECT_FALSE(live->cuda);
  EXPECT_TRUE(attach_paths_.empty());
  RefitId refit;
  refit.bytes.fill(3);
  Flip(refit);
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
}

// Images whose first tensor is long enough to be patched.
class GpuPatchServingTest : public GpuServingTest {
 protected:
  GpuPatchServingTest() {
    tensors_ = {{"a", DType::kBF16, {600}}, {"b", DType::kU8, {3}}};
  }
};

TEST_F(GpuPatchServingTest, ACommitWritesOnlyTheChangedElements) {
  // Step 2 changes two elements of "a" (and every byte of "b").
  std::vector<std::byte> want = Filled(1200, 0x10);
  want[14] = std::byte{0x20};
  want[1199] = std::byte{0x21};
  SetStagedTensor(0, want);
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());  // live
  const int writes_at_attach = gpu_->writes;
  RefitId refit;
  refit.bytes.fill(0x43);
  Flip(refit);
  auto pause = NextMsg(c);
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  // The patches wait in the apply share: the standby does not catch up,
  // and so takes no refit (a node answers busy, saying why), until the
  // pause is over, even once the diff is done.
  EXPECT_TRUE(PumpUntil([&] {
    return images_->why_waiting().find("still reading") == std::string::npos;
  }));
  EXPECT_FALSE(images_->CatchUpDue());
  auto ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_FALSE(*ready);
  EXPECT_THAT(images_->why_waiting(),
              HasSubstr("has not answered its pause for step 2"));
  EXPECT_EQ(gpu_->patches, 0);
  c.Send(Paused(refit));
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
  EXPECT_EQ(gpu_->patches, 1);
  EXPECT_EQ(gpu_->writes, writes_at_attach + 1);  // "b", changed whole
  EXPECT_EQ(gpu_->bytes(0), want);
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x20));
  EXPECT_EQ(images_->stats().gpu_patched, 1u);
  EXPECT_EQ(images_->stats().gpu_patched_bytes, 12u);
  EXPECT_EQ(images_->stats().gpu_rewritten, 3u);  // 2 at the attach
  EXPECT_TRUE(images_->CatchUpDue());
  ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_TRUE(*ready);
}

class GpuPatchDeadlineTest : public GpuPatchServingTest {
 protected:
  GpuPatchDeadlineTest() { deadline_ = std::chrono::milliseconds(500); }
};

// The diff runs beside the relay's loop: a server that answers pause
// before it is done waits for it, past the deadline (it did its part);
// one that leaves meanwhile is forgotten, and the standby catches up once
// the diff stopped reading it.
TEST_F(GpuPatchDeadlineTest, ThePauseWaitsForTheDiffRunningBesideTheLoop) {
  std::vector<std::byte> want = Filled(1200, 0x10);
  want[100] = std::byte{0x22};
  SetStagedTensor(0, want);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  hold_diff_ = [released] { released.wait_for(std::chrono::seconds(20)); };
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());  // live
  RefitId refit;
  refit.bytes.fill(0x44);
  Flip(refit);
  auto pause = NextMsg(c);
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  c.Send(Paused(refit));
  // The loop runs past the deadline: no commit, no detach, and the
  // COMMIT_REPLY still waits (the server did its part).
  EXPECT_FALSE(NextMsg(c, 800).has_value());
  EXPECT_FALSE(c.closed());
  EXPECT_TRUE(images_->stats().attached);
  EXPECT_TRUE(images_->AwaitingMove());
  EXPECT_THAT(images_->why_waiting(), HasSubstr("still reading the images"));
  EXPECT_EQ(gpu_->patches, 0);
  release.set_value();
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
  EXPECT_EQ(gpu_->patches, 1);
  EXPECT_EQ(gpu_->bytes(0), want);
  // Its deadline to move runs from the commit line.
  EXPECT_TRUE(images_->AwaitingMove());
  c.Send(Flipped(1, 2));
  EXPECT_TRUE(PumpUntil([&] { return !images_->AwaitingMove(); }));
  EXPECT_THAT(images_->MoveSummary(), HasSubstr("serving process moved in"));
}

TEST_F(GpuPatchServingTest, AServerThatLeavesDuringTheDiffIsForgotten) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  hold_diff_ = [released] { released.wait_for(std::chrono::seconds(20)); };
  auto c = std::make_unique<LineClient>(socket_);
  c->Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(*c).has_value());  // live
  RefitId refit;
  refit.bytes.fill(0x45);
  Flip(refit);
  ASSERT_TRUE(NextMsg(*c).has_value());  // pause
  c.reset();
  EXPECT_TRUE(PumpUntil([&] { return !images_->stats().attached; }));
  // Its pause is over, but the diff still reads the old live image:
  // neither the loop's catch-up nor a new refit's may write it.
  EXPECT_FALSE(images_->CatchUpDue());
  auto ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_FALSE(*ready);
  EXPECT_THAT(images_->why_waiting(), HasSubstr("still reading the images"));
  release.set_value();
  EXPECT_TRUE(PumpUntil([&] { return images_->CatchUpDue(); }));
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);  // the attach's; no commit's
  ready = images_->MaybeCatchUp(standby_, false);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_TRUE(*ready);
}

}  // namespace
}  // namespace dcr
