// A fixed pool of worker threads for data-parallel loops (digests, diff,
// encode, apply). Each worker has a stable index in [0, size()), so callers
// can keep per-worker state such as compression contexts.
//
// Thread safety: ParallelFor may be called from one thread at a time; the
// body runs concurrently on the workers and on the calling thread.
#ifndef DCR_THREAD_POOL_H_
#define DCR_THREAD_POOL_H_

#include <cstddef>
#include <functional>
#include <memory>

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
  // The workers and the state they share with ParallelFor, behind a pointer
  // so this public header holds no lock type (see src/common/mutex.h).
  class Workers;

  size_t size_;
  std::unique_ptr<Workers> workers_;
};

}  // namespace dcr

#endif  // DCR_THREAD_POOL_H_
