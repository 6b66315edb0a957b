#include "dcr/thread_pool.h"

#include <algorithm>
#include <exception>
#include <utility>

namespace dcr {

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  size_ = threads;
  threads_.reserve(size_ - 1);
  for (size_t w = 1; w < size_; ++w) {
    threads_.emplace_back([this, w] { WorkerLoop(w); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::RunItems(size_t worker) {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < n_) {
    size_t i = next_++;
    const auto* body = body_;
    lock.unlock();
    try {
      (*body)(i, worker);
    } catch (...) {
      // Hand the first exception to ParallelFor's caller, after every
      // worker has left the body; skip the items not started yet.
      lock.lock();
      if (!error_) error_ = std::current_exception();
      next_ = n_;
      continue;
    }
    lock.lock();
  }
}

void ThreadPool::WorkerLoop(size_t worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++running_;
    lock.unlock();
    RunItems(worker);
    lock.lock();
    if (--running_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(size_t n,
                             const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  if (size_ == 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    next_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  RunItems(0);
  std::unique_lock<std::mutex> lock(mu_);
  // Every item has been handed out; wait for the workers still running one.
  done_cv_.wait(lock, [&] { return running_ == 0; });
  body_ = nullptr;
  n_ = 0;
  std::swap(error, error_);
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace dcr
