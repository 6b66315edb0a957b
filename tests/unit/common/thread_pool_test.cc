#include "dcr/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace dcr
