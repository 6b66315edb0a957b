#include "protocol/mailbox.h"

namespace dcr {

bool Mailbox::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
  return true;
}

size_t Mailbox::RunUntil(Clock::time_point deadline) {
  std::deque<std::function<void()>> batch;
  {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, deadline,
                   [&] { return closed_ || woken_ || !queue_.empty(); });
    woken_ = false;
    batch.swap(queue_);
  }
  for (auto& fn : batch) fn();
  return batch.size();
}

void Mailbox::Wake() {
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

void Mailbox::Close() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
}

}  // namespace dcr
