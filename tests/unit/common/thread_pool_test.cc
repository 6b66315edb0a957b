#include "dcr/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace dcr {
namespace {

TEST(ThreadPoolTest, EveryItemRunsExactlyOnceWithValidWorker) {
  for (size_t threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> bad_worker{false};
      pool.ParallelFor(n, [&](size_t i, size_t w) {
        hits[i].fetch_add(1);
        if (w >= pool.size()) bad_worker = true;
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1);
      EXPECT_FALSE(bad_worker);
    }
  }
}

TEST(ThreadPoolTest, ReusableManyTimes) {
  ThreadPool pool(3);
  std::atomic<uint64_t> sum{0};
  for (int round = 0; round < 200; ++round) {
    pool.ParallelFor(10, [&](size_t i, size_t) { sum += i; });
  }
  EXPECT_EQ(sum.load(), 200u * 45u);
}

TEST(ThreadPoolTest, ExceptionIsRethrownAfterEveryWorkerLeft) {
  ThreadPool pool(3);
  std::atomic<int> running{0};
  std::atomic<int> max_after{0};
  EXPECT_THROW(pool.ParallelFor(1000,
                                [&](size_t i, size_t) {
                                  ++running;
                                  if (i == 10) throw std::runtime_error("x");
                                  --running;
                                }),
               std::runtime_error);
  // Only the throwing call is unaccounted for: no body is still running.
  EXPECT_EQ(running.load(), 1);
  // The pool is usable afterwards.
  std::atomic<int> count{0};
  pool.ParallelFor(50, [&](size_t, size_t) { ++count; });
  EXPECT_EQ(count.load(), 50);
  (void)max_after;
}

}  // namespace
}  // namespace dcr
