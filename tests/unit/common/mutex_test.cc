#include "common/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace dcr {
namespace {

using namespace std::chrono_literals;

// Whether `mu` was free: takes it if so, and releases it again.
bool WasFree(Mutex* mu) {
  if (!mu->TryLock()) return false;
  mu->Unlock();
  return true;
}

// WasFree, asked from another thread (TryLock on a mutex the calling
// thread holds is undefined).
bool WasFreeForAnotherThread(Mutex* mu) {
  bool free = false;
  std::thread([&] { free = WasFree(mu); }).join();
  return free;
}

// A counter whose invariant (two fields equal) breaks if two increments
// interleave.
class Counter {
 public:
  void Add() DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ++a_;
    ++b_;
  }
  bool Consistent(int* value) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    *value = a_;
    return a_ == b_;
  }

 private:
  Mutex mu_;
  int a_ DCR_GUARDED_BY(mu_) = 0;
  int b_ DCR_GUARDED_BY(mu_) = 0;
};

TEST(MutexTest, MutexLockSerializesWriters) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < 10000; ++i) c.Add();
    });
  }
  for (auto& t : threads) t.join();
  int value = 0;
  EXPECT_TRUE(c.Consistent(&value));
  EXPECT_EQ(value, 40000);
}

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsIt) {
  Mutex mu;
  mu.Lock();
  EXPECT_FALSE(WasFreeForAnotherThread(&mu));
  mu.Unlock();
  EXPECT_TRUE(WasFreeForAnotherThread(&mu));
  EXPECT_TRUE(WasFree(&mu));
}

TEST(MutexTest, MutexLockUnlockAndRelockInsideItsScope) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    lock.Unlock();
    EXPECT_TRUE(WasFreeForAnotherThread(&mu));
    lock.Lock();
    EXPECT_FALSE(WasFreeForAnotherThread(&mu));
  }
  // The destructor released it.
  EXPECT_TRUE(WasFree(&mu));
  {
    // Released by hand and not retaken: the destructor leaves it alone.
    MutexLock lock(&mu);
    lock.Unlock();
  }
  EXPECT_TRUE(WasFree(&mu));
}

TEST(CondVarTest, WaitReturnsOnceTheConditionIsSignalled) {
  Mutex mu;
  CondVar cv;
  int stage = 0;  // 1: the waiter is ready; 2: the signaller is done
  std::thread waiter([&] {
    MutexLock lock(&mu);
    stage = 1;
    cv.SignalAll();
    while (stage != 2) cv.Wait(&mu);
  });
  {
    MutexLock lock(&mu);
    while (stage != 1) cv.Wait(&mu);
    stage = 2;
  }
  cv.SignalAll();
  waiter.join();
  MutexLock lock(&mu);
  EXPECT_EQ(stage, 2);
}

TEST(CondVarTest, WaitUntilReportsAPassedDeadline) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitUntil(&mu, CondVar::Clock::now() - 1s));
  EXPECT_TRUE(cv.WaitFor(&mu, 1ms));
  // Still held after a timed-out wait: the lock's destructor releases it.
}

TEST(CondVarTest, WaitForReturnsEarlyWhenSignalled) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread signaller([&] {
    MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  });
  {
    MutexLock lock(&mu);
    const auto deadline = CondVar::Clock::now() + 60s;
    while (!ready) {
      ASSERT_FALSE(cv.WaitUntil(&mu, deadline));
    }
  }
  signaller.join();
}

// Whether `mu` could be taken exclusively / shared by another thread (which
// releases it again at once).
bool WriterCouldLock(SharedMutex* mu) {
  bool free = false;
  std::thread([&] {
    WriterMutexLock lock(mu, std::defer_lock);
    free = lock.TryLock();
  }).join();
  return free;
}

bool ReaderCouldLock(SharedMutex* mu) {
  bool free = false;
  std::thread([&] {
    ReaderMutexLock lock(mu, std::defer_lock);
    free = lock.TryLock();
  }).join();
  return free;
}

TEST(SharedMutexTest, ReadersShareAndExcludeWriters) {
  SharedMutex mu;
  {
    ReaderMutexLock reading(&mu);
    EXPECT_TRUE(ReaderCouldLock(&mu));
    EXPECT_FALSE(WriterCouldLock(&mu));
  }
  EXPECT_TRUE(WriterCouldLock(&mu));
}

TEST(SharedMutexTest, WriterExcludesEveryone) {
  SharedMutex mu;
  {
    WriterMutexLock writing(&mu);
    EXPECT_FALSE(ReaderCouldLock(&mu));
    EXPECT_FALSE(WriterCouldLock(&mu));
  }
  EXPECT_TRUE(ReaderCouldLock(&mu));
  EXPECT_TRUE(WriterCouldLock(&mu));
}

TEST(SharedMutexTest, AFailedTryLockReleasesNothing) {
  SharedMutex mu;
  ReaderMutexLock reading(&mu);
  EXPECT_FALSE(WriterCouldLock(&mu));
  // Had the failed lock's destructor released `mu`, a writer could take it.
  EXPECT_FALSE(WriterCouldLock(&mu));
  EXPECT_TRUE(ReaderCouldLock(&mu));
}

TEST(SharedMutexTest, ScopedTryLockTakesAFreeLockUntilItsScopeEnds) {
  SharedMutex mu;
  {
    WriterMutexLock writing(&mu, std::defer_lock);
    ASSERT_TRUE(writing.TryLock());
    EXPECT_FALSE(ReaderCouldLock(&mu));
  }
  EXPECT_TRUE(WriterCouldLock(&mu));
  {
    ReaderMutexLock reading(&mu, std::defer_lock);
    ASSERT_TRUE(reading.TryLock());
    EXPECT_TRUE(ReaderCouldLock(&mu));
    EXPECT_FALSE(WriterCouldLock(&mu));
  }
  EXPECT_TRUE(WriterCouldLock(&mu));
}

// A pair whose invariant (two fields equal) readers check while writers
// update it.
class Pair {
 public:
  void Add() DCR_EXCLUDES(mu_) {
    WriterMutexLock lock(&mu_);
    ++a_;
    ++b_;
  }
  bool Consistent() DCR_EXCLUDES(mu_) {
    ReaderMutexLock lock(&mu_);
    return a_ == b_;
  }
  int value() DCR_EXCLUDES(mu_) {
    ReaderMutexLock lock(&mu_);
    return a_;
  }

 private:
  SharedMutex mu_;
  int a_ DCR_GUARDED_BY(mu_) = 0;
  int b_ DCR_GUARDED_BY(mu_) = 0;
};

TEST(SharedMutexTest, ReadersNeverSeeAHalfWrite) {
  Pair p;
  std::atomic<bool> torn{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&p] {
      for (int i = 0; i < 10000; ++i) p.Add();
    });
    threads.emplace_back([&p, &torn] {
      for (int i = 0; i < 10000; ++i) {
        if (!p.Consistent()) torn = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(torn);
  EXPECT_EQ(p.value(), 20000);
}

}  // namespace
}  // namespace dcr
