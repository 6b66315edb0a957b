// One pause switch per inbound link, two reasons (relay/read_gate.h).
#include "relay/read_gate.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace dcr {
namespace {

// Records what the gate asks of the link; the link reads iff !paused.
class CountingLink : public Link {
 public:
  void Send(FrameBuffer) override {}
  size_t QueuedBytes() const override { return 0; }
  void SetWatermarks(size_t, size_t) override {}
  void Close() override {}
  void CloseAfterFlush() override {}
  void PauseReading() override {
    ASSERT_FALSE(paused) << "paused twice";
    paused = true;
    ++pauses;
  }
  void ResumeReading() override {
    ASSERT_TRUE(paused) << "resumed while reading";
    paused = false;
  }
  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return 1; }
  LinkStats stats() const override { return {}; }

  bool paused = false;
  int pauses = 0;

 private:
  std::string peer_ = "peer";
};

TEST(ReadGateTest, QueuedFramesPauseAboveTheQuotaAndResumeAtHalf) {
  auto link = std::make_shared<CountingLink>();
  ReadGate gate(link, 100);
  EXPECT_FALSE(gate.Queued(60));
  EXPECT_FALSE(gate.Queued(40));  // at the quota: still read
  EXPECT_FALSE(link->paused);
  EXPECT_TRUE(gate.Queued(1));
  EXPECT_TRUE(link->paused);
  EXPECT_FALSE(gate.Queued(30));  // already paused
  gate.Handled(60);               // 71 > 50
  EXPECT_TRUE(link->paused);
  gate.Handled(21);  // 50
  EXPECT_FALSE(link->paused);
  EXPECT_EQ(link->pauses, 1);
}

TEST(ReadGateTest, TheLinkReadsOnlyWhenNeitherReasonHolds) {
  auto link = std::make_shared<CountingLink>();
  ReadGate gate(link, 100);
  gate.Set(ReadGate::kWindows, true);
  EXPECT_TRUE(link->paused);
  EXPECT_TRUE(gate.Queued(500));
  gate.Set(ReadGate::kWindows, false);  // frames still wait
  EXPECT_TRUE(link->paused);
  EXPECT_FALSE(gate.paused(ReadGate::kWindows));
  EXPECT_TRUE(gate.paused(ReadGate::kQueued));
  gate.Set(ReadGate::kWindows, true);
  gate.Handled(500);  // the windows still hold it
  EXPECT_TRUE(link->paused);
  gate.Set(ReadGate::kWindows, false);
  EXPECT_FALSE(link->paused);
  EXPECT_EQ(link->pauses, 1);
}

TEST(ReadGateTest, ZeroQuotaNeverPausesForQueuedFrames) {
  auto link = std::make_shared<CountingLink>();
  ReadGate gate(link, 0);
  EXPECT_FALSE(gate.Queued(uint64_t{1} << 40));
  EXPECT_FALSE(link->paused);
  gate.Handled(uint64_t{1} << 41);  // more than queued: clamps at 0
  EXPECT_FALSE(link->paused);
}

TEST(ReadGateTest, AGoneLinkIsNotTouched) {
  auto link = std::make_shared<CountingLink>();
  ReadGate gate(link, 10);
  link.reset();
  EXPECT_TRUE(gate.Queued(11));
  gate.Handled(11);
  gate.Set(ReadGate::kWindows, true);
}

TEST(ReadGateTest, ConcurrentQueueAndHandleEndReading) {
  auto link = std::make_shared<CountingLink>();
  ReadGate gate(link, 64);
  constexpr int kFrames = 20000;
  std::thread transport([&] {
    for (int i = 0; i < kFrames; ++i) gate.Queued(8);
  });
  std::thread relay([&] {
    for (int i = 0; i < kFrames; ++i) gate.Handled(8);
  });
  transport.join();
  relay.join();
  // Handled may run ahead of Queued (it clamps); settle what is left.
  gate.Handled(uint64_t{8} * kFrames);
  EXPECT_FALSE(link->paused);
}

}  // namespace
}  // namespace dcr
