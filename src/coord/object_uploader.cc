#include "coord/object_uploader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "common/failpoint.h"

namespace dcr {

ObjectUploader::ObjectUploader(ObjectStore* store, std::string refit_hex,
                               int parallel, std::function<void()> wake,
                               std::chrono::milliseconds give_up_after)
    : store_(store),
      refit_hex_(std::move(refit_hex)),
      wake_(std::move(wake)),
      give_up_after_(give_up_after) {
  for (int i = 0; i < std::max(parallel, 1); ++i) {
    threads_.emplace_back([this] { Work(); });
  }
}

ObjectUploader::~ObjectUploader() { Stop(); }

void ObjectUploader::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    for (const Item& item : queue_) queued_bytes_ -= item.frame->size();
    queue_.clear();
    cv_.SignalAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ObjectUploader::Push(const FrameBuffer& frame) {
  MutexLock lock(&mu_);
  if (stop_) return;
  queue_.push_back(Item{next_++, frame});
  queued_bytes_ += frame->size();
  cv_.SignalAll();
}

size_t ObjectUploader::QueuedBytes() const {
  MutexLock lock(&mu_);
  return queued_bytes_;
}

uint64_t ObjectUploader::pushed() const {
  MutexLock lock(&mu_);
  return next_;
}

void ObjectUploader::Work() {
  for (;;) {
    Item item;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    const std::string key = RefitObjectKey(refit_hex_, item.ordinal);
    const FailpointHit fp = DCR_FAILPOINT("coord.upload");
    std::vector<std::byte> damaged;
    if (fp.corrupt()) {
      damaged = *item.frame;
      fp.Corrupt(damaged);
    }
    Status s = fp.drop()
                   ? Status::Aborted("dropped by the coord.upload failpoint")
                   : Status::OK();
    // Until it is stored, the refit is over or give_up_after_ passed: a
    // store down for a while (its own retries spent) must not leave a hole
    // that every puller waits on, least of all the END object.
    std::optional<std::chrono::steady_clock::time_point> give_up;
    for (std::chrono::milliseconds wait = kRetryMin; s.ok();) {
      s = store_->Put(key, fp.corrupt()
                               ? std::span<const std::byte>(damaged)
                               : std::span<const std::byte>(*item.frame));
      if (s.ok()) break;
      failures_.fetch_add(1);
      if (s.IsInvalidArgument()) break;  // refused: no retry
      const auto now = std::chrono::steady_clock::now();
      if (!give_up) give_up = now + give_up_after_;
      if (now >= *give_up) {
        s = s.WithContext(
            fmt::format("still failing after {} ms", give_up_after_.count()));
        break;
      }
      spdlog::warn("objstore: {} not uploaded ({}); again in {} ms", key,
                   s.ToString(), wait.count());
      MutexLock lock(&mu_);
      const auto until = std::min(now + wait, *give_up);
      while (!stop_ && std::chrono::steady_clock::now() < until) {
        cv_.WaitUntil(&mu_, until);
      }
      if (stop_) break;
      wait = std::min(wait * 2, kRetryMax);
      s = Status::OK();
    }
    if (s.ok()) {
      uploaded_.fetch_add(1);
      uploaded_bytes_.fetch_add(item.frame->size());
    } else {
      spdlog::error("objstore: {} not uploaded: {}", key, s.ToString());
    }
    {
      MutexLock lock(&mu_);
      queued_bytes_ -= item.frame->size();
      cv_.SignalAll();
    }
    if (wake_) wake_();
  }
}

}  // namespace dcr
