// One Asio io_context and the thread that runs it: the event thread of a
// transport (src/transport/tcp) or of a fake network (src/transport/fake).
//
// Thread safety: every member may be called from any thread.
#ifndef DCR_TRANSPORT_EVENT_LOOP_H_
#define DCR_TRANSPORT_EVENT_LOOP_H_

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/mutex.h"

namespace dcr::transport_internal {

class EventLoop {
 public:
  // Starts the thread, named `thread_name` (at most 15 characters shown).
  explicit EventLoop(std::string thread_name);
  // Shuts down (without a closer) unless Shutdown already ran.
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // For objects bound to the loop; their handlers run on the event thread.
  asio::io_context& io() { return io_; }

  // Runs `fn` on the event thread after everything posted before it.
  // Returns false, dropping `fn`, once Shutdown has begun.
  bool Post(std::function<void()> fn);

  // Runs `fn` on the event thread and waits for it; runs it inline when
  // called there. Returns false, without running it, once Shutdown began.
  bool RunSync(const std::function<void()>& fn);

  bool InThread() const { return std::this_thread::get_id() == thread_id_; }
  bool stopping() const;

  // Refuses further Post, runs `closer` on the event thread after the work
  // posted before it, lets the loop run out of work (closer must cancel
  // every pending operation) and joins the thread. Later calls only join.
  // From the event thread it cannot join: the thread ends when the current
  // handler returns, and a later call from another thread joins it.
  void Shutdown(std::function<void()> closer);

 private:
  void Run();

  asio::io_context io_{1};
  mutable Mutex mu_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>>
      guard_ DCR_GUARDED_BY(mu_);
  bool stopping_ DCR_GUARDED_BY(mu_) = false;
  Mutex join_mu_;  // serializes joins
  std::thread thread_ DCR_GUARDED_BY(join_mu_);
  std::thread::id thread_id_;
  std::string thread_name_;
};

}  // namespace dcr::transport_internal

#endif  // DCR_TRANSPORT_EVENT_LOOP_H_
