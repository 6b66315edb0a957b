// Whether an inbound link of a relay is read (relay/relay.cc's per-peer
// limit and its backpressure share one pause switch per link).
//
// Thread safety: every member may be called from any thread; the lock
// keeps the link's PauseReading/ResumeReading calls in the order of the
// decisions.
#ifndef DCR_RELAY_READ_GATE_H_
#define DCR_RELAY_READ_GATE_H_

#include <algorithm>
#include <cstdint>
#include <memory>

#include "common/mutex.h"
#include "dcr/transport.h"

namespace dcr {

// Whether an inbound link is read. Two reasons stop it: its frames wait
// for the relay's thread with more than `quota` bytes (kQueued, until they
// fall to half), or, on the refit's parent link, the windows are full
// (kWindows). The link reads iff neither holds. Queued runs on the
// transport's thread, Handled and Set on the relay's. A quota of 0 never
// pauses for queued frames.
class ReadGate {
 public:
  enum Reason : unsigned { kQueued = 1, kWindows = 2 };

  ReadGate(std::weak_ptr<Link> link, uint64_t quota)
      : link_(std::move(link)), quota_(quota) {}

  // Adds frames handed to the relay's thread; true iff that made kQueued
  // hold.
  bool Queued(uint64_t bytes) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    queued_ += bytes;
    if (quota_ == 0 || queued_ <= quota_ || (reasons_ & kQueued)) return false;
    Change(reasons_ | kQueued);
    return true;
  }
  void Handled(uint64_t bytes) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    queued_ -= std::min(queued_, bytes);
    if ((reasons_ & kQueued) && queued_ <= quota_ / 2) {
      Change(reasons_ & ~unsigned{kQueued});
    }
  }
  void Set(Reason why, bool on) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    Change(on ? (reasons_ | why) : (reasons_ & ~unsigned{why}));
  }
  // Bytes of frames handed to the relay's thread and not handled yet.
  uint64_t queued() const DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return queued_;
  }
  bool paused(Reason why) const DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return (reasons_ & why) != 0;
  }

 private:
  // Pauses or resumes the link with the lock held, so that the link sees
  // the decisions in the order they were made.
  void Change(unsigned reasons) DCR_REQUIRES(mu_) {
    const bool was = reasons_ != 0;
    reasons_ = reasons;
    if (was == (reasons_ != 0)) return;
    if (auto link = link_.lock()) {
      if (reasons_ != 0) {
        link->PauseReading();
      } else {
        link->ResumeReading();
      }
    }
  }

  mutable Mutex mu_;
  std::weak_ptr<Link> link_;
  const uint64_t quota_;
  uint64_t queued_ DCR_GUARDED_BY(mu_) = 0;
  unsigned reasons_ DCR_GUARDED_BY(mu_) = 0;
};

}  // namespace dcr

#endif  // DCR_RELAY_READ_GATE_H_
