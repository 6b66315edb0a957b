// A queue of functions run by one owner thread: the actor that drives a
// relay's or the coordinator's refit. Transport callbacks and worker
// threads Post work here instead of touching the owner's state, so that
// state needs no lock and the owner can wait with a deadline (the phase
// timeouts) without a timer service.
//
// Thread safety: Post and Close may be called from any thread; RunUntil only
// from the owner thread.
#ifndef DCR_PROTOCOL_MAILBOX_H_
#define DCR_PROTOCOL_MAILBOX_H_

#include <chrono>
#include <deque>
#include <functional>

#include "common/mutex.h"

namespace dcr {

class Mailbox {
 public:
  using Clock = std::chrono::steady_clock;

  // Queues `fn`; false (and `fn` dropped) after Close.
  bool Post(std::function<void()> fn);

  // Runs every queued function, waiting until `deadline` for the first one
  // if none is queued. Returns the number run (0: the deadline passed or
  // the mailbox was closed or woken with nothing to do).
  size_t RunUntil(Clock::time_point deadline);

  // Wakes a RunUntil that waits, without queueing anything.
  void Wake();

  // Refuses further Post; functions already queued are dropped.
  void Close();

 private:
  Mutex mu_;
  CondVar cv_;  // signalled when queue_, closed_ or woken_ changes
  std::deque<std::function<void()>> queue_ DCR_GUARDED_BY(mu_);
  bool closed_ DCR_GUARDED_BY(mu_) = false;
  bool woken_ DCR_GUARDED_BY(mu_) = false;
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_MAILBOX_H_
