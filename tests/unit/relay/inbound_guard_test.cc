// What bounds a relay against idle and hostile peers: the default memory
// limit (relay/memory_budget.h), the HELLO and idle deadlines and the
// eviction of silent slot holders (LinkDeadlines), and the rate-limited
// log of cut-off peers (TokenBucket, CutoffLog; relay/inbound_links.h).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "dcr/wire.h"
#include "relay/inbound_links.h"
#include "relay/memory_budget.h"
#include "relay/relay_stats.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

using testing::kGiB;
using testing::kMiB;

const SteadyTime kT0 = SteadyTime() + std::chrono::hours(1);

TEST(DefaultMemoryLimitTest, AQuarterOfTheMachineWithinBounds) {
  const uint32_t frame = kDefaultMaxFramePayload;
  // A quarter, in whole MiB.
  EXPECT_EQ(DefaultMemoryLimit(4 * kGiB, 2, frame), 1 * kGiB);
  EXPECT_EQ(DefaultMemoryLimit(6 * kGiB + 3, 2, frame), 1536 * kMiB);
  // At most kDefaultMemoryLimitMax, however large the machine.
  EXPECT_EQ(DefaultMemoryLimit(23 * kGiB, 2, frame), kDefaultMemoryLimitMax);
  EXPECT_EQ(DefaultMemoryLimit(2048 * kGiB, 8, frame), kDefaultMemoryLimitMax);
  // At least what works (a small machine, an unknown one, many threads).
  EXPECT_EQ(DefaultMemoryLimit(512 * kMiB, 2, frame), MinMemoryLimit(2, frame));
  EXPECT_EQ(DefaultMemoryLimit(0, 2, frame), MinMemoryLimit(2, frame));
  EXPECT_EQ(DefaultMemoryLimit(1 * kGiB, 64, frame), MinMemoryLimit(64, frame));
  // Whatever it picks, the budget plans, bounded frames and links.
  for (uint64_t machine :
       {uint64_t{0}, 1 * kGiB, 8 * kGiB, 23 * kGiB, 1024 * kGiB}) {
    for (size_t threads : {1u, 2u, 16u}) {
      const uint64_t limit = DefaultMemoryLimit(machine, threads, frame);
      auto b = PlanMemoryBudget(limit, threads, frame);
      ASSERT_TRUE(b.ok()) << machine << " " << threads;
      EXPECT_LE(b->Total(), limit);
      EXPECT_LT(b->max_frame_payload, frame);
      EXPECT_LE(b->max_inbound_links, kMaxInboundLinks);
    }
  }
}

TEST(DefaultMemoryLimitTest, TheMinimumIsWhatThePlanAccepts) {
  for (size_t threads : {1u, 2u, 8u}) {
    const uint64_t min = MinMemoryLimit(threads, kDefaultMaxFramePayload);
    EXPECT_TRUE(PlanMemoryBudget(min, threads, kDefaultMaxFramePayload).ok());
    EXPECT_FALSE(
        PlanMemoryBudget(min - 1, threads, kDefaultMaxFramePayload).ok());
  }
}

TEST(ParseCgroupMemoryLimitTest, NumbersAndNoLimit) {
  EXPECT_EQ(ParseCgroupMemoryLimit("1073741824\n"), 1 * kGiB);
  EXPECT_EQ(ParseCgroupMemoryLimit("536870912"), 512 * kMiB);
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt);  // v2
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"),
            std::nullopt);  // v1's "no limit"
  EXPECT_EQ(ParseCgroupMemoryLimit(""), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("12k"), std::nullopt);
}

TEST(MachineMemoryTest, KnowsThisMachine) {
  const uint64_t bytes = MachineMemoryBytes();
  EXPECT_GT(bytes, 64 * kMiB);
}

TEST(TokenBucketTest, BurstThenRate) {
  TokenBucket b(/*per_second=*/2, /*burst=*/3);
  int taken = 0;
  for (int i = 0; i < 10; ++i) taken += b.Take(kT0);
  EXPECT_EQ(taken, 3);
  EXPECT_FALSE(b.Take(kT0 + milliseconds(400)));  // 0.8 token
  EXPECT_TRUE(b.Take(kT0 + milliseconds(500)));   // 1 token
  EXPECT_FALSE(b.Ready(kT0 + milliseconds(600)));
  // Refills to the burst, not beyond.
  taken = 0;
  for (int i = 0; i < 10; ++i) taken += b.Take(kT0 + seconds(100));
  EXPECT_EQ(taken, 3);
  // Time going backwards takes nothing and gives nothing.
  EXPECT_FALSE(b.Take(kT0));
}

TEST(CutoffLogTest, OneLinePerPeerRateLimitedWithASummary) {
  std::vector<std::string> lines;
  std::array<std::atomic<uint64_t>, kCutReasons> counters{};
  CutoffLog log("b1", counters.data(),
                [&](const std::string& l) { lines.push_back(l); });
  for (int i = 0; i < 25; ++i) {
    log.Cut(kT0, "10.0.0.9:" + std::to_string(4000 + i),
            i < 20 ? CutReason::kLinksFull : CutReason::kHelloTimeout,
            "detail " + std::to_string(i));
  }
  // The burst is logged, one line each, naming the peer and the reason.
  ASSERT_EQ(lines.size(), size_t(kCutLogBurst));
  EXPECT_EQ(lines[0], "b1: cut off 10.0.0.9:4000: links_full: detail 0");
  // Every cut is counted, logged or not.
  EXPECT_EQ(counters[size_t(CutReason::kLinksFull)], 20u);
  EXPECT_EQ(counters[size_t(CutReason::kHelloTimeout)], 5u);
  // No token yet: the summary waits.
  EXPECT_TRUE(log.Flush(kT0 + milliseconds(500)));
  EXPECT_EQ(lines.size(), size_t(kCutLogBurst));
  // Once a token is back, the summary says how many were not logged, by
  // reason.
  EXPECT_FALSE(log.Flush(kT0 + seconds(1)));
  ASSERT_EQ(lines.size(), size_t(kCutLogBurst) + 1);
  EXPECT_EQ(lines.back(),
            "b1: 15 more peers cut off and not logged: links_full 10, "
            "hello_timeout 5");
  EXPECT_FALSE(log.Flush(kT0 + seconds(10)));  // nothing left
  EXPECT_EQ(lines.size(), size_t(kCutLogBurst) + 1);
}

TEST(CutoffLogTest, TheNextLineCarriesTheSummary) {
  std::vector<std::string> lines;
  CutoffLog log("a0", nullptr,
                [&](const std::string& l) { lines.push_back(l); });
  for (int i = 0; i < int(kCutLogBurst) + 2; ++i) {
    log.Cut(kT0, "p", CutReason::kBadFrame, "x");
  }
  log.Cut(kT0 + seconds(2), "q", CutReason::kIdle, "y");
  ASSERT_EQ(lines.size(), size_t(kCutLogBurst) + 1);
  EXPECT_EQ(lines.back(),
            "a0: cut off q: idle: y (2 more peers cut off and not logged: "
            "bad_frame 2)");
}

LinkDeadlines::Options Opts(size_t max_links) {
  return {max_links, milliseconds(1000), milliseconds(5000),
          milliseconds(2000)};
}

TEST(LinkDeadlinesTest, HelloDeadline) {
  LinkDeadlines d(Opts(0));
  ASSERT_TRUE(d.Open(1, kT0).accepted);
  ASSERT_TRUE(d.Open(2, kT0).accepted);
  d.Heard(2, kT0 + milliseconds(100));  // a frame, but not a HELLO yet
  EXPECT_TRUE(d.Expired(kT0 + milliseconds(999)).empty());
  d.Greeted(1);
  auto e = d.Expired(kT0 + milliseconds(1100));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].id, 2u);
  EXPECT_EQ(e[0].reason, CutReason::kHelloTimeout);
  // Each expiry once; the slot stays until the link is closed.
  EXPECT_TRUE(d.Expired(kT0 + seconds(2)).empty());
  EXPECT_EQ(d.open(), 2u);
  d.Closed(2);
  EXPECT_EQ(d.open(), 1u);
}

TEST(LinkDeadlinesTest, IdleTimeoutCountsFromTheLastFrame) {
  LinkDeadlines d(Opts(0));
  d.Open(1, kT0);
  d.Greeted(1);
  d.Heard(1, kT0 + seconds(3));
  EXPECT_TRUE(d.Expired(kT0 + milliseconds(7999)).empty());
  auto e = d.Expired(kT0 + seconds(8));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].reason, CutReason::kIdle);
  EXPECT_EQ(e[0].silence, seconds(5));
}

TEST(LinkDeadlinesTest, AnExemptLinkIsNeverCutAndCountsFromItsRelease) {
  LinkDeadlines d(Opts(1));
  d.Open(1, kT0);
  d.Greeted(1);
  d.SetExempt(1, true, kT0);  // the refit's parent, heartbeats off
  EXPECT_TRUE(d.Expired(kT0 + seconds(60)).empty());
  // Nor does it lose its slot.
  EXPECT_FALSE(d.Open(2, kT0 + seconds(60)).accepted);
  d.SetExempt(1, false, kT0 + seconds(60));
  EXPECT_TRUE(d.Expired(kT0 + seconds(64)).empty());
  EXPECT_EQ(d.Expired(kT0 + seconds(65)).size(), 1u);
}

TEST(LinkDeadlinesTest, ASilentSlotHolderLosesItsSlotToANewLink) {
  LinkDeadlines d(Opts(3));
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(d.Open(id, kT0).accepted);
    d.Greeted(id);
  }
  d.Heard(1, kT0 + seconds(1));
  d.Heard(3, kT0 + milliseconds(1500));
  // All speaking within evict_after: a new link is refused.
  auto a = d.Open(4, kT0 + milliseconds(1900));
  EXPECT_FALSE(a.accepted);
  EXPECT_FALSE(a.evicted);
  // Link 2 has been silent for 2 s: its slot goes to the new link.
  a = d.Open(5, kT0 + seconds(2));
  EXPECT_TRUE(a.accepted);
  EXPECT_EQ(a.evicted, std::optional<uint64_t>(2));
  EXPECT_EQ(a.evicted_silence, seconds(2));
  EXPECT_EQ(d.open(), 3u);
  d.Greeted(5);
  // The next one goes to the silent-longest of the rest: 1 (3 s), not 3
  // (2.5 s) nor 5 (2 s).
  a = d.Open(6, kT0 + seconds(4));
  EXPECT_EQ(a.evicted, std::optional<uint64_t>(1));
}

TEST(LinkDeadlinesTest, AnUngreetedLinkIsEvictedFirst) {
  LinkDeadlines d(Opts(2));
  d.Open(1, kT0);
  d.Greeted(1);
  d.Open(2, kT0 + seconds(1));  // never greets
  auto a = d.Open(3, kT0 + seconds(4));
  EXPECT_EQ(a.evicted, std::optional<uint64_t>(2));
}

TEST(LinkDeadlinesTest, ZeroTurnsTheChecksOff) {
  LinkDeadlines d({0, milliseconds(0), milliseconds(0), milliseconds(2000)});
  for (uint64_t id = 1; id <= 100; ++id) ASSERT_TRUE(d.Open(id, kT0).accepted);
  d.Greeted(1);
  EXPECT_TRUE(d.Expired(kT0 + std::chrono::hours(10)).empty());
}

}  // namespace
}  // namespace dcr
