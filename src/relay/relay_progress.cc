// A relay's progress in a refit, for its HEARTBEATs up: what kept its
// parent link unread (protocol/liveness.h) and the delivered bytes of its
// subtree (docs/PROTOCOL.md §"Progress").
#include <algorithm>
#include <chrono>
#include <optional>

#include "relay/relay_impl.h"

namespace dcr {

void Relay::Impl::SampleProgress() {
  Current& c = *current_;
  // Unread for its own work: frames wait for this thread beyond the
  // inbound quota, or the apply window (not the children's) holds it.
  c.progress.Sample(
      std::chrono::steady_clock::now(),
      c.parent->held_by_waiting() ||
          (c.parent->paused() && c.refit->tracker().backlog_bytes() >
                                     options_.apply_window_bytes / 2));
}

ProgressMsg Relay::Impl::ProgressReport() {
  Current& c = *current_;
  ProgressMsg m = c.progress.Report(std::chrono::steady_clock::now(),
                                    c.parent->waiting_bytes(),
                                    c.refit->tracker().backlog_bytes());
  // A node that only forwards counts for nothing itself: its children's
  // figure, or none (then its parent leaves it out).
  const std::optional<uint64_t> below = c.fanout->Delivered();
  if (!c.refit->applies()) {
    m.delivered_bytes = below;
    return m;
  }
  const uint64_t own = c.refit->tracker().applied_bytes();
  m.delivered_bytes = std::min(own, below.value_or(own));
  return m;
}

}  // namespace dcr
