// A fixed pool of worker threads for data-parallel loops (digests, diff,
// encode, apply). Each worker has a stable index in [0, size()), so callers
// can keep per-worker state such as compression contexts.
//
// Thread safety: ParallelFor may be called from one thread at a time; the
// body runs concurrently on the workers and on the calling thread.
#ifndef DCR_THREAD_POOL_H_
#define DCR_THREAD_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dcr {

class ThreadPool {
 public:
  // `threads` workers in total, counting the caller of ParallelFor (so 1
  // means "run everything on the caller"). 0 picks the hardware count.
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return size_; }

  // Calls body(i, worker) for every i in [0, n), each exactly once, in no
  // particular order, with worker in [0, size()); returns when all calls
  // have returned. Items are handed out one at a time, so uneven items
  // balance themselves. If a call throws, items not yet started are
  // skipped and the first exception is rethrown here once every running
  // call has returned. Not re-entrant: `body` must not call ParallelFor.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& body);

 private:
  void WorkerLoop(size_t worker);
  void RunItems(size_t worker);

  size_t size_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Guarded by mu_.
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t n_ = 0;
  size_t next_ = 0;
  size_t running_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace dcr

#endif  // DCR_THREAD_POOL_H_
