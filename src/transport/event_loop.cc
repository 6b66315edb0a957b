#include "transport/event_loop.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <asio/post.hpp>
#include <exception>
#include <future>

namespace dcr::transport_internal {

EventLoop::EventLoop(std::string thread_name)
    : thread_name_(std::move(thread_name)) {
  guard_.emplace(io_.get_executor());
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread([this, &started] {
    thread_id_ = std::this_thread::get_id();
    pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
    started.set_value();
    Run();
  });
  ready.wait();  // thread_id_ is set before anyone asks InThread()
}

EventLoop::~EventLoop() {
  if (InThread()) {
    // Destroyed by a handler of its own loop: nothing can join the thread.
    spdlog::error("dcr: event loop '{}' destroyed on its own thread",
                  thread_name_);
    thread_.detach();
    return;
  }
  Shutdown([] {});
}

void EventLoop::Run() {
  try {
    io_.run();
  } catch (const std::exception& e) {
    spdlog::critical("dcr: uncaught exception on event thread '{}': {}",
                     thread_name_, e.what());
    std::terminate();
  }
}

bool EventLoop::Post(std::function<void()> fn) {
  MutexLock lock(&mu_);
  if (stopping_) return false;
  asio::post(io_, std::move(fn));
  return true;
}

bool EventLoop::RunSync(const std::function<void()>& fn) {
  if (InThread()) {
    if (stopping()) return false;
    fn();
    return true;
  }
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  if (!Post([&fn, &done] {
        fn();
        done.set_value();
      })) {
    return false;
  }
  finished.wait();
  return true;
}

bool EventLoop::stopping() const {
  MutexLock lock(&mu_);
  return stopping_;
}

void EventLoop::Shutdown(std::function<void()> closer) {
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      asio::post(io_, std::move(closer));
      guard_.reset();
    }
  }
  if (InThread()) return;
  MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

}  // namespace dcr::transport_internal
