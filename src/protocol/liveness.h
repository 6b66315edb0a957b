// Liveness of one child link, decided from what the owner observes at a
// heartbeat tick: a pure function of the observation and the child's
// tracking state, no links or clocks of its own. Fanout::Tick calls it for
// every live child and fails the child it condemns.
//
//  - Silent: nothing arrived for kSilentIntervals heartbeat intervals (a
//    hung or stopped process), unless the child owes a reply that may
//    legitimately take long (PLAN_REPLY while it creates or hashes its
//    store, a decision reply while it syncs): the phase deadline bounds
//    those.
//  - Slow: its send queue stayed above the plan's window (so the whole
//    tree waited for it) for kSlowIntervals intervals while it took bytes
//    at under 1/kSlowFraction of its link's bandwidth in the topology
//    (unknown bandwidth: never slow). The hold ends once the queue drains
//    to half the window.
//
// Thread safety: a value and pure functions.
#ifndef DCR_PROTOCOL_LIVENESS_H_
#define DCR_PROTOCOL_LIVENESS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace dcr {

inline constexpr int kSilentIntervals = 4;
inline constexpr int kSlowIntervals = 8;
inline constexpr double kSlowFraction = 10;

struct LinkObservation {
  using Clock = std::chrono::steady_clock;
  Clock::time_point now;
  Clock::time_point last_rx;  // the last frame from the child
  bool owes_slow_reply = false;
  uint64_t queued_bytes = 0;  // its send queue now
  uint64_t sent_bytes = 0;    // bytes its link took so far
  uint64_t link_bps = 0;      // its link's bandwidth (0: unknown)
};

struct LivenessPolicy {
  std::chrono::milliseconds interval{1000};  // heartbeat interval
  uint64_t window_bytes = 0;                 // the plan's chunk window
};

// What the owner tracks per child between ticks.
struct LivenessState {
  std::optional<std::chrono::steady_clock::time_point> blocked_since;
  uint64_t blocked_sent = 0;  // its link's bytes when it got blocked
};

struct LivenessVerdict {
  enum class Kind { kAlive, kSilent, kSlow };
  Kind kind = Kind::kAlive;
  std::string why;  // for kSilent and kSlow
};

LivenessVerdict CheckLiveness(LivenessState& state,
                              const LivenessPolicy& policy,
                              const LinkObservation& seen);

}  // namespace dcr

#endif  // DCR_PROTOCOL_LIVENESS_H_
