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
//  - Held: the child holds the tree back: its send queue is full (above
//    3/4 of the plan's window: a sender that stops at the window keeps it
//    just under or a frame over; the owner waits for it), or the child
//    reports a receive backlog above 3/4 of the window (bytes reach it
//    faster than it consumes them). The hold ends once both are down to
//    half the window; it is judged at every tick in between.
//  - After kSlowIntervals of a hold, the verdict names who is slow:
//     - a slow link: the child reports that it kept up (its backlog at
//       most half the window, and it kept its parent link unread for
//       reasons of its own less than half the hold). Bytes wait in front
//       of the link, not in the node, or below it (its own children's
//       windows: its own Fanout judges those). Never a failure: cutting
//       the child out and adopting its children across the same link
//       would only add crossings of it. The verdict (kSlowLink, once per
//       hold) records the rate the link delivered (measured_bps) and the
//       hold starts over.
//     - a slow node: the child reports a backlog above half the window,
//       or that it held its parent link unread for half the hold or more
//       (its apply, disk or CPU: its children starve while its uplink is
//       idle), and it consumed bytes at under 1/kSlowFraction of what its
//       link is expected to carry: kSlow.
//    A child that reports nothing (a relay of an older release) is judged
//    as before: slow if its link took bytes at under 1/kSlowFraction of
//    the expectation.
//  - The expectation of a link is the smaller of the topology's bandwidth
//    (link_bps; 0: unknown) and the best rate it was measured to deliver
//    (measured_bps; 0: not measured yet). With neither, never slow.
//
// The child side: ProgressMeter keeps what a relay reports in its
// HEARTBEATs up (ProgressMsg, protocol/messages.h).
//
// Thread safety: values and pure functions; a ProgressMeter belongs to
// one thread.
#ifndef DCR_PROTOCOL_LIVENESS_H_
#define DCR_PROTOCOL_LIVENESS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "protocol/messages.h"

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
  // The child's last progress report (none: it sends none).
  std::optional<ProgressMsg> progress;
};

struct LivenessPolicy {
  std::chrono::milliseconds interval{1000};  // heartbeat interval
  uint64_t window_bytes = 0;                 // the plan's chunk window
};

// What the owner tracks per child between ticks.
struct LivenessState {
  std::optional<std::chrono::steady_clock::time_point> blocked_since;
  uint64_t blocked_sent = 0;  // its link's bytes when it got blocked
  // The child's report when the hold began (none: it had sent none).
  std::optional<ProgressMsg> blocked_progress;
  // The best rate (bits/s) the link was measured to deliver over a hold
  // in which the child kept up; 0: not measured.
  uint64_t measured_bps = 0;
};

struct LivenessVerdict {
  // kSlowLink: alive; the link, not the child, held the tree back.
  enum class Kind { kAlive, kSilent, kSlow, kSlowLink };
  Kind kind = Kind::kAlive;
  std::string why;  // for every kind but kAlive
};

LivenessVerdict CheckLiveness(LivenessState& state,
                              const LivenessPolicy& policy,
                              const LinkObservation& seen);

// The child side: counts what a relay reports to its parent. The relay's
// thread calls Received for each CHUNK taken from a parent, Sample
// whenever what holds its parent link may change (a chunk, a pause, a
// resume, a timer), and Report for each HEARTBEAT up.
class ProgressMeter {
 public:
  using Clock = std::chrono::steady_clock;
  void Received(uint64_t bytes) { received_ += bytes; }
  // `self_held`: the parent link is unread now for a reason of this node's
  // own (frames wait for its thread, its apply window is full). The time
  // since the previous sample counts as held if that sample said so.
  void Sample(Clock::time_point now, bool self_held);
  // `waiting_bytes`: frames from the parent not yet handled by the relay's
  // thread (received, not yet counted by Received); `unapplied_bytes`:
  // chunks waiting for its apply workers.
  ProgressMsg Report(Clock::time_point now, uint64_t waiting_bytes,
                     uint64_t unapplied_bytes);

 private:
  uint64_t received_ = 0;
  std::chrono::nanoseconds held_{0};
  std::optional<Clock::time_point> last_;
  bool held_now_ = false;
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_LIVENESS_H_
