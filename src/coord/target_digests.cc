#include "coord/target_digests.h"

#include <algorithm>
#include <chrono>

namespace dcr {

struct TargetDigests::Tensor {
  Mutex mu;
  // Offered and not hashed yet, per span.
  std::vector<uint8_t> offered DCR_GUARDED_BY(mu);
  uint32_t next DCR_GUARDED_BY(mu) = 0;  // the first span not hashed
  // A thread is hashing: only it touches `hasher` until it clears this.
  bool hashing DCR_GUARDED_BY(mu) = false;
  // Written by the thread that set `hashing` (without the lock: the flag,
  // taken and cleared under it, orders the accesses), then by Finish.
  Hasher128 hasher;
  uint32_t spans = 0;
};

TargetDigests::TargetDigests(const Checkpoint* target, uint64_t span_elems)
    : target_(target), span_elems_(span_elems) {
  const Manifest& m = target_->manifest();
  tensors_.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    auto t = std::make_unique<Tensor>();
    t->spans = static_cast<uint32_t>(SpanCount(m[i].NumElements(), span_elems));
    MutexLock lock(&t->mu);
    t->offered.assign(t->spans, 0);
    tensors_.push_back(std::move(t));
  }
}

TargetDigests::~TargetDigests() = default;

void TargetDigests::HashSpan(Tensor& t, uint32_t tensor, uint32_t span) {
  const TensorInfo& info = target_->manifest()[tensor];
  const size_t es = DTypeSize(info.dtype);
  const uint64_t first = uint64_t{span} * span_elems_;
  const uint64_t count = std::min(span_elems_, info.NumElements() - first);
  t.hasher.Update(target_->TensorData(tensor).subspan(first * es, count * es));
}

void TargetDigests::Offer(const ChunkId& id) {
  if (id.tensor >= tensors_.size()) return;
  Tensor& t = *tensors_[id.tensor];
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  {
    MutexLock lock(&t.mu);
    if (id.span < t.next || id.span >= t.spans) return;
    t.offered[id.span] = 1;
    if (t.hashing || id.span != t.next) return;
    t.hashing = true;
    const size_t es = DTypeSize(target_->manifest()[id.tensor].dtype);
    while (t.next < t.spans && t.offered[t.next]) {
      const uint32_t s = t.next;
      lock.Unlock();
      HashSpan(t, id.tensor, s);
      lock.Lock();
      t.offered[s] = 0;
      ++t.next;
      const uint64_t first = uint64_t{s} * span_elems_;
      bytes += std::min(span_elems_,
                        target_->manifest()[id.tensor].NumElements() - first) *
               es;
    }
    t.hashing = false;
  }
  offered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  offered_ns_.fetch_add(
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now() - t0)
              .count()),
      std::memory_order_relaxed);
}

CheckpointDigests TargetDigests::Finish(ThreadPool* pool) {
  CheckpointDigests d;
  d.manifest = target_->manifest().digest();
  d.tensors.resize(tensors_.size());
  auto body = [&](size_t i, size_t /*worker*/) {
    Tensor& t = *tensors_[i];
    MutexLock lock(&t.mu);
    for (; t.next < t.spans; ++t.next) {
      HashSpan(t, static_cast<uint32_t>(i), t.next);
    }
    d.tensors[i] = t.hasher.Finish();
  };
  if (pool != nullptr) {
    pool->ParallelFor(tensors_.size(), body);
  } else {
    for (size_t i = 0; i < tensors_.size(); ++i) body(i, 0);
  }
  d.version = VersionDigest(d.manifest, d.tensors);
  return d;
}

double TargetDigests::offered_seconds() const {
  return static_cast<double>(offered_ns_.load(std::memory_order_relaxed)) / 1e9;
}

}  // namespace dcr
