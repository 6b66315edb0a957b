#include "protocol/liveness.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kWindow = 1000;
constexpr uint64_t kGbps = 1'000'000'000;

LinkObservation Seen(Clock::time_point t0, int ms, int rx_ms, uint64_t queued,
                     uint64_t sent, bool owes = false, uint64_t bps = kGbps) {
  return LinkObservation{
      t0 + milliseconds(ms), t0 + milliseconds(rx_ms), owes, queued, sent, bps,
      std::nullopt};
}

TEST(LivenessTest, Table) {
  const LivenessPolicy policy{milliseconds(100), kWindow};
  const Clock::time_point t0{};
  using K = LivenessVerdict::Kind;
  struct Step {
    int ms, rx_ms;
    uint64_t queued, sent;
    bool owes;
    uint64_t bps;
    K expect;
  };
  struct Case {
    const char* what;
    std::vector<Step> steps;
  };
  for (const Case& c : {
           Case{"heard from recently: alive",
                {{350, 0, 0, 0, false, kGbps, K::kAlive}}},
           Case{"silent for 4 intervals and a bit: silent",
                {{401, 0, 0, 0, false, kGbps, K::kSilent}}},
           Case{"silent but owes a slow reply: alive",
                {{5000, 0, 0, 0, true, kGbps, K::kAlive}}},
           Case{"blocked 8 intervals at a trickle: slow",
                {{0, 0, 2000, 0, false, kGbps, K::kAlive},
                 {801, 800, 2000, 10, false, kGbps, K::kSlow}}},
           Case{"blocked but fast enough: alive",
                {{0, 0, 2000, 0, false, 1000, K::kAlive},
                 {900, 900, 2000, 1000, false, 1000, K::kAlive}}},
           Case{"blocked at a trickle on a link of unknown speed: alive",
                {{0, 0, 2000, 0, false, 0, K::kAlive},
                 {900, 900, 2000, 0, false, 0, K::kAlive}}},
           Case{"drained to half the window: the hold starts again",
                {{0, 0, 2000, 0, false, kGbps, K::kAlive},
                 {500, 500, 400, 10, false, kGbps, K::kAlive},
                 {600, 600, 2000, 10, false, kGbps, K::kAlive},
                 {1300, 1300, 2000, 20, false, kGbps, K::kAlive},
                 {1401, 1400, 2000, 20, false, kGbps, K::kSlow}}},
           Case{"a queue kept just under the window by a sender that "
                "stops there is full: slow",
                {{0, 0, 990, 0, false, kGbps, K::kAlive},
                 {801, 800, 960, 10, false, kGbps, K::kSlow}}},
           Case{"a queue at 3/4 of the window or less starts no hold",
                {{0, 0, 750, 0, false, kGbps, K::kAlive},
                 {900, 900, 750, 0, false, kGbps, K::kAlive}}},
           Case{"judged at every tick of the hold, not only when full",
                {{0, 0, 2000, 0, false, kGbps, K::kAlive},
                 {801, 800, 600, 10, false, kGbps, K::kSlow}}},
           Case{"between half and the whole window: the hold goes on",
                {{0, 0, 2000, 0, false, kGbps, K::kAlive},
                 {500, 500, 700, 10, false, kGbps, K::kAlive},
                 {801, 800, 2000, 10, false, kGbps, K::kSlow}}},
       }) {
    LivenessState state;
    for (const Step& s : c.steps) {
      LivenessVerdict v = CheckLiveness(
          state, policy,
          Seen(t0, s.ms, s.rx_ms, s.queued, s.sent, s.owes, s.bps));
      EXPECT_EQ(v.kind, s.expect) << c.what << " at " << s.ms << " ms";
      EXPECT_EQ(v.why.empty(), s.expect == K::kAlive) << c.what;
    }
  }
}

TEST(LivenessTest, TheReasonNamesTheMeasuredRate) {
  LivenessState state;
  const Clock::time_point t0{};
  LivenessPolicy policy{milliseconds(100), kWindow};
  (void)CheckLiveness(state, policy, Seen(t0, 0, 0, 2000, 0));
  LivenessVerdict v =
      CheckLiveness(state, policy, Seen(t0, 1000, 1000, 2000, 125000));
  ASSERT_EQ(v.kind, LivenessVerdict::Kind::kSlow);
  EXPECT_NE(v.why.find("1 Mbit/s on a 1e+03 Mbit/s link"), std::string::npos)
      << v.why;
}

// The child reports its progress (ProgressMsg): the verdict tells a slow
// link (the child keeps up) from a slow node (bytes wait in it, or it
// keeps its parent link unread for its own work). Window 1000 bytes,
// interval 100 ms, a 1 Gbit/s link in the topology: 1 byte per 100 ms is
// 80 bit/s, far under a tenth of it.
TEST(LivenessTest, SlowLinkOrSlowNode) {
  const LivenessPolicy policy{milliseconds(100), kWindow};
  const Clock::time_point t0{};
  using K = LivenessVerdict::Kind;
  struct Step {
    int ms;
    uint64_t queued, sent;
    std::optional<ProgressMsg> progress;  // received, backlog, self held
    K expect;
    uint64_t bps = kGbps;
  };
  struct Case {
    const char* what;
    std::vector<Step> steps;
  };
  for (const Case& c : {
           Case{"queue full 8 intervals, the child keeps up (backlog 0, "
                "never held): the link is slow, nobody is cut out",
                {{0, 2000, 0, ProgressMsg{0, 0, 0, {}}, K::kAlive},
                 {801, 2000, 10, ProgressMsg{10, 0, 0, {}}, K::kSlowLink},
                 // the hold starts over: the next note 8 intervals later
                 {1200, 2000, 14, ProgressMsg{14, 0, 0, {}}, K::kAlive},
                 {1602, 2000, 20, ProgressMsg{20, 0, 0, {}}, K::kSlowLink}}},
           Case{"the child keeps up with its children's windows full "
                "(held below it, not by itself): not slow",
                {{0, 2000, 0, ProgressMsg{0, 400, 0, {}}, K::kAlive},
                 {801, 2000, 0, ProgressMsg{0, 400, 0, {}}, K::kSlowLink}}},
           Case{"queue full, the child holds its link unread for its own "
                "work most of the hold: a slow node",
                {{0, 2000, 0, ProgressMsg{0, 0, 0, {}}, K::kAlive},
                 {801, 2000, 10, ProgressMsg{10, 0, 700, {}}, K::kSlow}}},
           Case{"queue full, held by itself for under half the hold: the "
                "link is slow",
                {{0, 2000, 0, ProgressMsg{0, 0, 0, {}}, K::kAlive},
                 {801, 2000, 10, ProgressMsg{10, 0, 390, {}}, K::kSlowLink}}},
           Case{"queue empty, but bytes pile up in the child (its thread "
                "takes them in, nothing consumes them): a slow node",
                {{0, 0, 0, ProgressMsg{1500, 1500, 0, {}}, K::kAlive},
                 {500, 0, 0, ProgressMsg{3000, 2990, 0, {}}, K::kAlive},
                 {801, 0, 0, ProgressMsg{5000, 4980, 0, {}}, K::kSlow}}},
           Case{"a backlog above half the window during a hold: a slow node",
                {{0, 2000, 0, ProgressMsg{0, 900, 0, {}}, K::kAlive},
                 {801, 2000, 5, ProgressMsg{5, 900, 0, {}}, K::kSlow}}},
           Case{"a slow node on a link of unknown speed never measured: "
                "alive",
                {{0, 2000, 0, ProgressMsg{0, 900, 0, {}}, K::kAlive, 0},
                 {801, 2000, 5, ProgressMsg{5, 900, 800, {}}, K::kAlive, 0}}},
           Case{"the child's backlog drains to half the window and the "
                "queue too: the hold ends",
                {{0, 0, 0, ProgressMsg{1500, 1500, 0, {}}, K::kAlive},
                 {500, 0, 0, ProgressMsg{1500, 400, 0, {}}, K::kAlive},
                 {600, 0, 0, ProgressMsg{3000, 1500, 0, {}}, K::kAlive},
                 {1300, 0, 0, ProgressMsg{3000, 1500, 0, {}}, K::kAlive},
                 {1401, 0, 0, ProgressMsg{3000, 1500, 0, {}}, K::kSlow}}},
       }) {
    LivenessState state;
    for (const Step& s : c.steps) {
      LinkObservation seen =
          Seen(t0, s.ms, s.ms, s.queued, s.sent, false, s.bps);
      seen.progress = s.progress;
      LivenessVerdict v = CheckLiveness(state, policy, seen);
      EXPECT_EQ(v.kind, s.expect) << c.what << " at " << s.ms << " ms";
      EXPECT_EQ(v.why.empty(), s.expect == K::kAlive) << c.what;
    }
  }
}

// Expectations come from measured rates as well as from the topology: once
// the link was measured to deliver 80 kbit/s (10,000 bytes a second while
// the child kept up), a node consuming about 15 kbit/s is not slow (over a
// tenth of what its link carries), though it is under a tenth of the
// 1 Gbit/s the topology declares; one consuming about 4 kbit/s is.
TEST(LivenessTest, ExpectationsFollowTheMeasuredRate) {
  const LivenessPolicy policy{milliseconds(100), kWindow};
  const Clock::time_point t0{};
  auto at = [&](int ms, uint64_t sent, ProgressMsg p) {
    LinkObservation seen = Seen(t0, ms, ms, 2000, sent);
    seen.progress = p;
    return seen;
  };
  for (uint64_t per_s : {2000u, 500u}) {
    LivenessState state;
    (void)CheckLiveness(state, policy, at(0, 0, {0, 0, 0, {}}));
    LivenessVerdict v =
        CheckLiveness(state, policy, at(1000, 10000, {10000, 0, 0, {}}));
    ASSERT_EQ(v.kind, LivenessVerdict::Kind::kSlowLink) << v.why;
    EXPECT_EQ(state.measured_bps, 80000u);
    EXPECT_NE(v.why.find("delivered 0.08 Mbit/s (topology: 1e+03 Mbit/s)"),
              std::string::npos)
        << v.why;
    // Now the node falls behind: its backlog stays above half the window.
    (void)CheckLiveness(state, policy, at(1100, 10000, {10900, 900, 0, {}}));
    v = CheckLiveness(state, policy,
                      at(2100, 10000, {10900 + per_s, 900, 0, {}}));
    EXPECT_EQ(v.kind, per_s == 2000 ? LivenessVerdict::Kind::kAlive
                                    : LivenessVerdict::Kind::kSlow)
        << per_s << ": " << v.why;
  }
}

// Without a topology bandwidth, the measured rate alone sets the
// expectation: before any measurement such a link is never slow.
TEST(LivenessTest, AMeasuredRateStandsInForAnUnknownBandwidth) {
  const LivenessPolicy policy{milliseconds(100), kWindow};
  const Clock::time_point t0{};
  LivenessState state;
  auto at = [&](int ms, ProgressMsg p) {
    LinkObservation seen = Seen(t0, ms, ms, 2000, 0, false, 0);
    seen.progress = p;
    return seen;
  };
  (void)CheckLiveness(state, policy, at(0, {0, 0, 0, {}}));
  ASSERT_EQ(CheckLiveness(state, policy, at(1000, {10000, 0, 0, {}})).kind,
            LivenessVerdict::Kind::kSlowLink);
  (void)CheckLiveness(state, policy, at(1100, {10000, 900, 0, {}}));
  LivenessVerdict v =
      CheckLiveness(state, policy, at(2100, {10100, 900, 0, {}}));
  EXPECT_EQ(v.kind, LivenessVerdict::Kind::kSlow) << v.why;
}

TEST(ProgressMeterTest, CountsOnlyTimeHeldForItsOwnWork) {
  ProgressMeter m;
  const Clock::time_point t0{};
  m.Received(100);
  m.Sample(t0, true);
  m.Sample(t0 + milliseconds(300), false);  // held 300 ms
  m.Sample(t0 + milliseconds(500), true);   // not held 200 ms
  m.Received(50);
  // 10 bytes wait for its thread, 30 for its apply workers; held 100 ms more.
  ProgressMsg p = m.Report(t0 + milliseconds(600), 10, 30);
  EXPECT_EQ(p, (ProgressMsg{160, 40, 400, {}}));
  EXPECT_EQ(*DecodeProgress(EncodeProgress(p)), p);
  std::vector<std::byte> bytes = EncodeProgress(p);
  bytes.pop_back();
  EXPECT_TRUE(DecodeProgress(bytes).status().IsCorruption());
  EXPECT_TRUE(DecodeProgress({}).status().IsCorruption());
}

TEST(ProgressMsgTest, DeliveredBytesTravelInVersion2) {
  ProgressMsg v1{160, 40, 400, {}};
  std::vector<std::byte> b1 = EncodeProgress(v1);
  ASSERT_EQ(b1.size(), 25u);
  EXPECT_EQ(b1[0], std::byte{1});  // an older parent reads it as before
  ProgressMsg v2 = v1;
  v2.delivered_bytes = 150;
  std::vector<std::byte> b2 = EncodeProgress(v2);
  ASSERT_EQ(b2.size(), 33u);
  EXPECT_EQ(b2[0], std::byte{2});
  auto back = DecodeProgress(b2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, v2);
  EXPECT_FALSE(DecodeProgress(b1)->delivered_bytes.has_value());
  // Version 2 without its field, version 1 with it, an unknown version.
  std::vector<std::byte> short2 = b2;
  short2.resize(25);
  EXPECT_TRUE(DecodeProgress(short2).status().IsCorruption());
  std::vector<std::byte> long1 = b2;
  long1[0] = std::byte{1};
  EXPECT_TRUE(DecodeProgress(long1).status().IsCorruption());
  std::vector<std::byte> v3 = b2;
  v3[0] = std::byte{3};
  EXPECT_TRUE(DecodeProgress(v3).status().IsCorruption());
}

}  // namespace
}  // namespace dcr
