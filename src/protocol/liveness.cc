#include "protocol/liveness.h"

#include <fmt/format.h>

#include <algorithm>

namespace dcr {
namespace {

using Secs = std::chrono::duration<double>;

// What the link is expected to carry (bits/s; 0: no expectation).
uint64_t Expectation(uint64_t link_bps, uint64_t measured_bps) {
  if (link_bps == 0) return measured_bps;
  if (measured_bps == 0) return link_bps;
  return std::min(link_bps, measured_bps);
}

uint64_t Consumed(const ProgressMsg& p) {
  return p.received_bytes - std::min(p.received_bytes, p.backlog_bytes);
}

uint64_t Delta(uint64_t now, uint64_t then) {
  return now > then ? now - then : 0;
}

double Mbps(double bps) { return bps / 1e6; }

}  // namespace

LivenessVerdict CheckLiveness(LivenessState& state,
                              const LivenessPolicy& policy,
                              const LinkObservation& seen) {
  LivenessVerdict v;
  if (seen.now - seen.last_rx > kSilentIntervals * policy.interval &&
      !seen.owes_slow_reply) {
    v.kind = LivenessVerdict::Kind::kSilent;
    v.why = fmt::format("silent for {:.1f} s (heartbeat every {} ms)",
                        Secs(seen.now - seen.last_rx).count(),
                        policy.interval.count());
    return v;
  }
  const std::optional<ProgressMsg>& p = seen.progress;
  const uint64_t window = policy.window_bytes;
  // A sender that stops at the window (the root's stream, a relay's
  // backpressure) keeps a full queue just under it or a frame over it:
  // three quarters of it is full.
  const uint64_t full = window - window / 4;
  const bool held = seen.queued_bytes > full || (p && p->backlog_bytes > full);
  const bool drained =
      seen.queued_bytes <= window / 2 && (!p || p->backlog_bytes <= window / 2);
  auto start_hold = [&] {
    state.blocked_since = seen.now;
    state.blocked_sent = seen.sent_bytes;
    state.blocked_progress = p;
  };
  // A hold runs from a tick that finds the queue (or the backlog) above
  // the window to one that finds both down to half of it, and is judged
  // at every tick between: a sender that refills to the window as soon as
  // there is room keeps the queue around the window, above it at only
  // some ticks.
  if (!state.blocked_since) {
    if (!held) return v;
    start_hold();
  } else if (drained) {
    state.blocked_since.reset();
    return v;
  }
  // The child's first report arrived during a hold: measure from it.
  if (p && !state.blocked_progress) start_hold();
  const double held_s = Secs(seen.now - *state.blocked_since).count();
  if (seen.now - *state.blocked_since <= kSlowIntervals * policy.interval) {
    return v;
  }
  const uint64_t expect = Expectation(seen.link_bps, state.measured_bps);
  if (!p) {
    // No report: judged by what its link took, as before reports existed.
    const double bps =
        8.0 * static_cast<double>(Delta(seen.sent_bytes, state.blocked_sent)) /
        held_s;
    if (expect != 0 && bps < static_cast<double>(expect) / kSlowFraction) {
      v.kind = LivenessVerdict::Kind::kSlow;
      v.why = fmt::format(
          "too slow: it held the tree back for {:.1f} s, taking {:.3g} "
          "Mbit/s on a {:.3g} Mbit/s link",
          held_s, Mbps(bps), Mbps(static_cast<double>(expect)));
    }
    return v;
  }
  const ProgressMsg& b = *state.blocked_progress;
  const double self_held_s =
      static_cast<double>(Delta(p->self_held_ms, b.self_held_ms)) / 1e3;
  const bool kept_up =
      p->backlog_bytes <= window / 2 && 2 * self_held_s < held_s;
  if (kept_up) {
    // The bytes waited in front of the link (or below the child): the
    // link's rate is what it delivered.
    const double delivered =
        8.0 * static_cast<double>(Delta(p->received_bytes, b.received_bytes)) /
        held_s;
    state.measured_bps =
        std::max(state.measured_bps, static_cast<uint64_t>(delivered));
    v.kind = LivenessVerdict::Kind::kSlowLink;
    v.why = fmt::format(
        "the link (or the subtree below) is the bottleneck, not the node: for "
        "{:.1f} s it delivered {:.3g} Mbit/s (topology: {}) and the node kept "
        "up "
        "({} bytes waiting in it); not cut out",
        held_s, Mbps(delivered),
        seen.link_bps == 0
            ? std::string("unknown")
            : fmt::format("{:.3g} Mbit/s",
                          Mbps(static_cast<double>(seen.link_bps))),
        p->backlog_bytes);
    start_hold();
    return v;
  }
  const double consumed =
      8.0 * static_cast<double>(Delta(Consumed(*p), Consumed(b))) / held_s;
  if (expect != 0 && consumed < static_cast<double>(expect) / kSlowFraction) {
    v.kind = LivenessVerdict::Kind::kSlow;
    v.why = fmt::format(
        "too slow: it held the tree back for {:.1f} s, consuming {:.3g} "
        "Mbit/s where its link carries {:.3g} Mbit/s ({} bytes waiting in "
        "it, its parent link unread {:.1f} s for its own work)",
        held_s, Mbps(consumed), Mbps(static_cast<double>(expect)),
        p->backlog_bytes, self_held_s);
  }
  return v;
}

void ProgressMeter::Sample(Clock::time_point now, bool self_held) {
  if (last_ && held_now_) held_ += now - *last_;
  last_ = now;
  held_now_ = self_held;
}

ProgressMsg ProgressMeter::Report(Clock::time_point now, uint64_t waiting_bytes,
                                  uint64_t unapplied_bytes) {
  Sample(now, held_now_);
  ProgressMsg m;
  m.received_bytes = received_ + waiting_bytes;
  m.backlog_bytes = waiting_bytes + unapplied_bytes;
  m.self_held_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(held_).count());
  return m;
}

}  // namespace dcr
