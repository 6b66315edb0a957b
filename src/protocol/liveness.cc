#include "protocol/liveness.h"

#include <fmt/format.h>

namespace dcr {

LivenessVerdict CheckLiveness(LivenessState& state,
                              const LivenessPolicy& policy,
                              const LinkObservation& seen) {
  using Secs = std::chrono::duration<double>;
  LivenessVerdict v;
  if (seen.now - seen.last_rx > kSilentIntervals * policy.interval &&
      !seen.owes_slow_reply) {
    v.kind = LivenessVerdict::Kind::kSilent;
    v.why = fmt::format("silent for {:.1f} s (heartbeat every {} ms)",
                        Secs(seen.now - seen.last_rx).count(),
                        policy.interval.count());
    return v;
  }
  if (seen.queued_bytes > policy.window_bytes && seen.link_bps != 0) {
    if (!state.blocked_since) {
      state.blocked_since = seen.now;
      state.blocked_sent = seen.sent_bytes;
    }
    double held = Secs(seen.now - *state.blocked_since).count();
    double bps =
        8.0 * static_cast<double>(seen.sent_bytes - state.blocked_sent) / held;
    if (seen.now - *state.blocked_since > kSlowIntervals * policy.interval &&
        bps < static_cast<double>(seen.link_bps) / kSlowFraction) {
      v.kind = LivenessVerdict::Kind::kSlow;
      v.why = fmt::format(
          "too slow: it held the tree back for {:.1f} s, taking {:.3g} "
          "Mbit/s on a {:.3g} Mbit/s link",
          held, bps / 1e6, static_cast<double>(seen.link_bps) / 1e6);
    }
  } else if (seen.queued_bytes <= policy.window_bytes / 2) {
    state.blocked_since.reset();
  }
  return v;
}

}  // namespace dcr
