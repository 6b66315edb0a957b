#include "dcr/thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace dcr {

// The size() - 1 worker threads and the loop they share with the caller of
// ParallelFor: `generation_` announces a new loop, `next_` hands out items,
// `running_` counts workers inside one.
class ThreadPool::Workers {
 public:
  // Starts `count` threads, numbered 1..count (the caller of ParallelFor is
  // worker 0). Every member is initialized by now: the threads read them.
  explicit Workers(size_t count) {
    threads_.reserve(count);
    for (size_t w = 1; w <= count; ++w) {
      threads_.emplace_back([this, w] { WorkerLoop(w); });
    }
  }

  ~Workers() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    for (auto& t : threads_) t.join();
  }

  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& body)
      DCR_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      body_ = &body;
      n_ = n;
      next_ = 0;
      ++generation_;
    }
    work_cv_.SignalAll();
    RunItems(0);
    std::exception_ptr error;
    {
      MutexLock lock(&mu_);
      // Every item has been handed out; wait for the workers still running
      // one.
      while (running_ != 0) done_cv_.Wait(&mu_);
      body_ = nullptr;
      n_ = 0;
      std::swap(error, error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  void WorkerLoop(size_t worker) DCR_EXCLUDES(mu_) {
    uint64_t seen = 0;
    MutexLock lock(&mu_);
    while (true) {
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      ++running_;
      lock.Unlock();
      RunItems(worker);
      lock.Lock();
      if (--running_ == 0) done_cv_.SignalAll();
    }
  }

  void RunItems(size_t worker) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (next_ < n_) {
      size_t i = next_++;
      const auto* body = body_;
      lock.Unlock();
      try {
        (*body)(i, worker);
      } catch (...) {
        // Hand the first exception to ParallelFor's caller, after every
        // worker has left the body; skip the items not started yet.
        lock.Lock();
        if (!error_) error_ = std::current_exception();
        next_ = n_;
        continue;
      }
      lock.Lock();
    }
  }

  std::vector<std::thread> threads_;
  Mutex mu_;
  CondVar work_cv_;  // signalled when generation_ or stop_ changes
  CondVar done_cv_;  // signalled when running_ drops to 0
  const std::function<void(size_t, size_t)>* body_ DCR_GUARDED_BY(mu_) =
      nullptr;
  size_t n_ DCR_GUARDED_BY(mu_) = 0;
  size_t next_ DCR_GUARDED_BY(mu_) = 0;
  size_t running_ DCR_GUARDED_BY(mu_) = 0;
  uint64_t generation_ DCR_GUARDED_BY(mu_) = 0;
  std::exception_ptr error_ DCR_GUARDED_BY(mu_);
  bool stop_ DCR_GUARDED_BY(mu_) = false;
};

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  size_ = threads;
  workers_ = std::make_unique<Workers>(size_ - 1);
}

ThreadPool::~ThreadPool() = default;

void ThreadPool::ParallelFor(size_t n,
                             const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  if (size_ == 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  workers_->ParallelFor(n, body);
}

}  // namespace dcr
