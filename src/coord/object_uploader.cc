#include "coord/object_uploader.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "common/failpoint.h"

namespace dcr {

ObjectUploader::ObjectUploader(ObjectStore* store, std::string refit_hex,
                               int parallel, std::function<void()> wake,
                               uint64_t first_ordinal)
    : store_(store),
      refit_hex_(std::move(refit_hex)),
      wake_(std::move(wake)),
      next_(first_ordinal) {
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
    // Until it is stored or the refit is over: a store down for a while
    // (its own retries spent) must not leave a hole that every puller
    // waits on, least of all the END object.
    for (std::chrono::milliseconds wait = kRetryMin; s.ok();) {
      s = store_->Put(key, fp.corrupt()
                               ? std::span<const std::byte>(damaged)
                               : std::span<const std::byte>(*item.frame));
      if (s.ok()) break;
      failures_.fetch_add(1);
      if (s.IsInvalidArgument()) break;  // refused: no retry
      spdlog::warn("objstore: {} not uploaded ({}); again in {} ms", key,
                   s.ToString(), wait.count());
      MutexLock lock(&mu_);
      const auto until = std::chrono::steady_clock::now() + wait;
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

Result<uint64_t> NextObjectOrdinal(ObjectStore* store,
                                   std::string_view refit_hex) {
  const std::string first = RefitObjectKey(refit_hex, 0);
  const std::string frames = first.substr(0, first.rfind('/') + 1);
  DCR_ASSIGN_OR_RETURN(std::vector<std::string> keys, store->List(frames));
  uint64_t next = 0;
  for (const std::string& key : keys) {
    uint64_t ordinal = 0;
    const std::string_view digits = std::string_view(key).substr(frames.size());
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
    if (ec == std::errc() && end == digits.data() + digits.size()) {
      next = std::max(next, ordinal + 1);
    }
  }
  return next;
}

}  // namespace dcr
