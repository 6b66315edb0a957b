// SendPacer: a token bucket in bytes that paces one TCP link's writes to
// TransportOptions::max_send_bps (`--link-rate`).
//
// Thread safety: none; the link's event thread only.
#ifndef DCR_TRANSPORT_TCP_SEND_PACER_H_
#define DCR_TRANSPORT_TCP_SEND_PACER_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace dcr::transport_internal {

class SendPacer {
 public:
  using Clock = std::chrono::steady_clock;

  // `bits_per_second` 0: unlimited (enabled() is false).
  explicit SendPacer(uint64_t bits_per_second)
      : rate_(static_cast<double>(bits_per_second) / 8),
        burst_(std::max(64.0 * 1024, rate_ / 50)),
        tokens_(burst_),
        last_(Clock::now()) {}

  bool enabled() const { return rate_ > 0; }

  // Bytes worth waiting for before a write: enough to keep timer wakeups
  // and small writes rare, small enough to keep the pace smooth.
  size_t quantum() const {
    return static_cast<size_t>(std::min(burst_ / 4, 64.0 * 1024));
  }

  // Whole bytes that may be written now.
  size_t Available() {
    const Clock::time_point now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
    return static_cast<size_t>(tokens_);
  }

  void Spend(size_t bytes) { tokens_ -= static_cast<double>(bytes); }

  // How long until `bytes` (at most the burst) may be written.
  std::chrono::microseconds TimeUntil(size_t bytes) const {
    const double missing = static_cast<double>(bytes) - tokens_;
    if (missing <= 0) return std::chrono::microseconds(0);
    return std::chrono::microseconds(
        static_cast<int64_t>(std::ceil(missing / rate_ * 1e6)));
  }

 private:
  const double rate_;   // bytes per second
  const double burst_;  // the most tokens saved up
  double tokens_;
  Clock::time_point last_;
};

}  // namespace dcr::transport_internal

#endif  // DCR_TRANSPORT_TCP_SEND_PACER_H_
