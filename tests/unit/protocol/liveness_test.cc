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
      t0 + milliseconds(ms), t0 + milliseconds(rx_ms), owes, queued, sent, bps};
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

}  // namespace
}  // namespace dcr
