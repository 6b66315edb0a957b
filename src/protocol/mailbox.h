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
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

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
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool closed_ = false;                      // guarded by mu_
  bool woken_ = false;                       // guarded by mu_
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_MAILBOX_H_
