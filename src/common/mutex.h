// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations (and SharedMutex with ReaderMutexLock
// and WriterMutexLock: std::shared_mutex likewise), so `clang++
// -Wthread-safety` (see tools/thread-safety) checks at compile time that every
// member marked DCR_GUARDED_BY(mu_) is touched only with mu_ held, and that
// every function marked DCR_REQUIRES(mu_) is called with it held. Modelled on
// leveldb's port::Mutex and abseil's Mutex/MutexLock/CondVar.
//
// The DCR_* macros expand to clang attributes under clang and to nothing
// under other compilers (g++ builds the releases; it has no such analysis).
// libstdc++'s std::mutex carries no capability attribute, so code that locks
// a raw std::mutex is invisible to the analysis: lock a Mutex instead.
//
// Usage:
//   class Queue {
//    public:
//     void Push(int x) DCR_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       items_.push_back(x);
//       cv_.SignalAll();
//     }
//     int Pop() DCR_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       while (items_.empty()) cv_.Wait(&mu_);
//       return TakeFront();
//     }
//    private:
//     int TakeFront() DCR_REQUIRES(mu_);
//     Mutex mu_;
//     CondVar cv_;
//     std::deque<int> items_ DCR_GUARDED_BY(mu_);
//   };
//
// Wait in a loop on the condition, as above, rather than passing a predicate:
// the analysis sees the loop runs with mu_ held, whereas a lambda is analysed
// as a function of its own that holds nothing.
//
// Thread safety: a Mutex, a SharedMutex and a CondVar may be used from any
// thread; a MutexLock, ReaderMutexLock or WriterMutexLock belongs to the
// thread that created it.
#ifndef DCR_COMMON_MUTEX_H_
#define DCR_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

// ---------------------------------------------------------------- annotations
// See https://clang.llvm.org/docs/ThreadSafetyAnalysis.html for the meaning
// of each attribute.

#if defined(__clang__)
#define DCR_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define DCR_THREAD_ANNOTATION_(x)
#endif

// On a class: its objects are a capability (a lock) named `x` in warnings.
#define DCR_CAPABILITY(x) DCR_THREAD_ANNOTATION_(capability(x))
// On a class: an RAII holder that acquires in its constructor and releases
// in its destructor.
#define DCR_SCOPED_CAPABILITY DCR_THREAD_ANNOTATION_(scoped_lockable)
// On a data member: reading it needs `x` held (shared or exclusive), writing
// it needs `x` held exclusively.
#define DCR_GUARDED_BY(x) DCR_THREAD_ANNOTATION_(guarded_by(x))
// On a pointer member: the pointed-to data is guarded by `x` (the pointer
// itself is not).
#define DCR_PT_GUARDED_BY(x) DCR_THREAD_ANNOTATION_(pt_guarded_by(x))
// On a mutex member: lock order. This one is taken before / after those.
#define DCR_ACQUIRED_BEFORE(...) \
  DCR_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define DCR_ACQUIRED_AFTER(...) \
  DCR_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
// On a function: the caller must hold these (exclusively / shared).
#define DCR_REQUIRES(...) \
  DCR_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define DCR_REQUIRES_SHARED(...) \
  DCR_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// On a function: it acquires / releases these (no argument: `this`). On a
// scoped capability's destructor, DCR_RELEASE releases whatever it holds,
// shared or exclusive.
#define DCR_ACQUIRE(...) DCR_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define DCR_RELEASE(...) DCR_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
// As DCR_ACQUIRE / DCR_RELEASE, in shared (reader) mode.
#define DCR_ACQUIRE_SHARED(...) \
  DCR_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define DCR_RELEASE_SHARED(...) \
  DCR_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
// On a function: it acquires the capability iff it returns `success`
// (exclusively / shared).
#define DCR_TRY_ACQUIRE(...) \
  DCR_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define DCR_TRY_ACQUIRE_SHARED(...) \
  DCR_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))
// On a function: the caller must not hold these (the function takes them).
#define DCR_EXCLUDES(...) DCR_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
// On a function: after it returns, the analysis assumes `x` is held
// (exclusively / shared).
#define DCR_ASSERT_CAPABILITY(x) DCR_THREAD_ANNOTATION_(assert_capability(x))
#define DCR_ASSERT_SHARED_CAPABILITY(x) \
  DCR_THREAD_ANNOTATION_(assert_shared_capability(x))
// On a function: it returns a reference to the capability `x`.
#define DCR_RETURN_CAPABILITY(x) DCR_THREAD_ANNOTATION_(lock_returned(x))
// On a function: the analysis skips its body. Say why beside each use.
#define DCR_NO_THREAD_SAFETY_ANALYSIS \
  DCR_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace dcr {

// A non-recursive exclusive lock. Locking it twice from one thread
// deadlocks, as with std::mutex.
class DCR_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() DCR_ACQUIRE() { mu_.lock(); }
  void Unlock() DCR_RELEASE() { mu_.unlock(); }
  // Takes the lock if it is free; returns whether it did. Never blocks.
  bool TryLock() DCR_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis that the calling thread holds the lock, where it
  // cannot see it (a callback run under a lock taken elsewhere). Checks
  // nothing at run time: std::mutex does not record its owner.
  void AssertHeld() const DCR_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Unlock() and Lock() release and retake it
// inside the scope (to run a callback without the lock); the destructor
// releases it only if held.
class DCR_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) DCR_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() DCR_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Precondition: held (Lock) / not held (Unlock) by this MutexLock.
  void Unlock() DCR_RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() DCR_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable for Mutex. Every wait may also return spuriously:
// wait in a loop that re-checks the condition with the mutex held.
class CondVar {
 public:
  using Clock = std::chrono::steady_clock;

  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Atomically releases `mu` and blocks until signalled, then retakes `mu`
  // before returning.
  void Wait(Mutex* mu) DCR_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // `mu` stays held, as the caller expects
  }

  // As Wait, but returns at `deadline` at the latest. Returns true if the
  // deadline passed (the condition may still have become true meanwhile).
  bool WaitUntil(Mutex* mu, Clock::time_point deadline) DCR_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out =
        cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }

  // As WaitUntil, `timeout` from now.
  bool WaitFor(Mutex* mu, Clock::duration timeout) DCR_REQUIRES(mu) {
    return WaitUntil(mu, Clock::now() + timeout);
  }

  // Wakes one waiter / every waiter. The caller need not hold the mutex.
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A reader-writer lock: any number of readers (shared) or one writer
// (exclusive). Not recursive, and a reader cannot upgrade to a writer.
// Data marked DCR_GUARDED_BY a SharedMutex may be read with it held either
// way and written only with it held exclusively.
class DCR_CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() DCR_ACQUIRE() { mu_.lock(); }
  void Unlock() DCR_RELEASE() { mu_.unlock(); }
  // Takes the lock exclusively if no one holds it; never blocks.
  bool TryLock() DCR_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  void LockShared() DCR_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() DCR_RELEASE_SHARED() { mu_.unlock_shared(); }
  // Takes the lock shared if no writer holds it; never blocks.
  bool TryLockShared() DCR_TRY_ACQUIRE_SHARED(true) {
    return mu_.try_lock_shared();
  }

  // As Mutex::AssertHeld: checks nothing at run time.
  void AssertHeld() const DCR_ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() const DCR_ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for its scope. Constructed with
// std::defer_lock it holds nothing until TryLock succeeds (the pattern of
// std::unique_lock with std::try_to_lock):
//   WriterMutexLock lock(&mu, std::defer_lock);
//   if (!lock.TryLock()) return;  // someone else holds it
// The destructor releases the lock only if held.
class DCR_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) DCR_ACQUIRE(mu) : mu_(mu) {
    mu_->Lock();
  }
  WriterMutexLock(SharedMutex* mu, std::defer_lock_t) DCR_EXCLUDES(mu)
      : mu_(mu), held_(false) {}
  ~WriterMutexLock() DCR_RELEASE() {
    if (held_) mu_->Unlock();
  }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

  // Precondition: not held by this WriterMutexLock. Never blocks.
  bool TryLock() DCR_TRY_ACQUIRE(true) {
    held_ = mu_->TryLock();
    return held_;
  }

 private:
  SharedMutex* const mu_;
  bool held_ = true;
};

// Holds a SharedMutex shared for its scope; as WriterMutexLock otherwise.
class DCR_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) DCR_ACQUIRE_SHARED(mu) : mu_(mu) {
    mu_->LockShared();
  }
  ReaderMutexLock(SharedMutex* mu, std::defer_lock_t) DCR_EXCLUDES(mu)
      : mu_(mu), held_(false) {}
  ~ReaderMutexLock() DCR_RELEASE() {
    if (held_) mu_->UnlockShared();
  }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

  // Precondition: not held by this ReaderMutexLock. Never blocks.
  bool TryLock() DCR_TRY_ACQUIRE_SHARED(true) {
    held_ = mu_->TryLockShared();
    return held_;
  }

 private:
  SharedMutex* const mu_;
  bool held_ = true;
};

}  // namespace dcr

#endif  // DCR_COMMON_MUTEX_H_
