#include "protocol/mailbox.h"

namespace dcr {

bool Mailbox::Post(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (closed_) return false;
    queue_.push_back(std::move(fn));
  }
  cv_.Signal();
  return true;
}

size_t Mailbox::RunUntil(Clock::time_point deadline) {
  std::deque<std::function<void()>> batch;
  {
    MutexLock lock(&mu_);
    while (!closed_ && !woken_ && queue_.empty()) {
      if (cv_.WaitUntil(&mu_, deadline)) break;
    }
    woken_ = false;
    batch.swap(queue_);
  }
  for (auto& fn : batch) fn();
  return batch.size();
}

void Mailbox::Wake() {
  {
    MutexLock lock(&mu_);
    woken_ = true;
  }
  cv_.Signal();
}

void Mailbox::Close() {
  std::deque<std::function<void()>> dropped;
  {
    MutexLock lock(&mu_);
    closed_ = true;
    dropped.swap(queue_);
  }
  cv_.SignalAll();
}

}  // namespace dcr
