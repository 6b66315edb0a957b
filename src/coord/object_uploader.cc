#include "coord/object_uploader.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/failpoint.h"

namespace dcr {

ObjectUploader::ObjectUploader(ObjectStore* store, std::string refit_hex,
                               int parallel, std::function<void()> wake)
    : store_(store), refit_hex_(std::move(refit_hex)), wake_(std::move(wake)) {
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

void ObjectUploader::Drain() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || in_flight_ > 0) cv_.Wait(&mu_);
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
      ++in_flight_;
    }
    const std::string key = RefitObjectKey(refit_hex_, item.ordinal);
    Status s;
    const FailpointHit fp = DCR_FAILPOINT("coord.upload");
    if (fp.drop()) {
      s = Status::Aborted("dropped by the coord.upload failpoint");
    } else if (fp.corrupt()) {
      std::vector<std::byte> damaged = *item.frame;
      fp.Corrupt(damaged);
      s = store_->Put(key, damaged);
    } else {
      s = store_->Put(key, *item.frame);
    }
    if (s.ok()) {
      uploaded_.fetch_add(1);
      uploaded_bytes_.fetch_add(item.frame->size());
    } else {
      failures_.fetch_add(1);
      spdlog::error("objstore: {} not uploaded: {}", key, s.ToString());
    }
    {
      MutexLock lock(&mu_);
      queued_bytes_ -= item.frame->size();
      --in_flight_;
      cv_.SignalAll();
    }
    if (wake_) wake_();
  }
}

}  // namespace dcr
