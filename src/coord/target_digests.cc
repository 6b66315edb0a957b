#include "coord/target_digests.h"

#include <algorithm>
#include <chrono>

namespace dcr {

struct TargetDigests::Tensor {
  Mutex mu;
  std::vector<uint8_t> hashed DCR_GUARDED_BY(mu);  // per span
  LinearDigest sum DCR_GUARDED_BY(mu);             // of the spans hashed
};

TargetDigests::TargetDigests(const Checkpoint* target, uint64_t span_elems)
    : target_(target), span_elems_(span_elems) {
  const Manifest& m = target_->manifest();
  tensors_.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    auto t = std::make_unique<Tensor>();
    MutexLock lock(&t->mu);
    t->hashed.assign(SpanCount(m[i].NumElements(), span_elems), 0);
    tensors_.push_back(std::move(t));
  }
}

TargetDigests::~TargetDigests() = default;

std::span<const std::byte> TargetDigests::SpanBytes(uint32_t tensor,
                                                    uint32_t span,
                                                    uint64_t* offset) const {
  const TensorInfo& info = target_->manifest()[tensor];
  const size_t es = DTypeSize(info.dtype);
  const uint64_t first = uint64_t{span} * span_elems_;
  const uint64_t count = std::min(span_elems_, info.NumElements() - first);
  *offset = first * es;
  return target_->TensorData(tensor).subspan(first * es, count * es);
}

void TargetDigests::Offer(const ChunkId& id) {
  if (id.tensor >= tensors_.size()) return;
  Tensor& t = *tensors_[id.tensor];
  {
    MutexLock lock(&t.mu);
    if (id.span >= t.hashed.size() || t.hashed[id.span]) return;
    t.hashed[id.span] = 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t offset = 0;
  std::span<const std::byte> bytes = SpanBytes(id.tensor, id.span, &offset);
  const LinearDigest part = LinearHash(offset, bytes);
  {
    MutexLock lock(&t.mu);
    t.sum ^= part;
  }
  offered_bytes_.fetch_add(bytes.size(), std::memory_order_relaxed);
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
    const auto ti = static_cast<uint32_t>(i);
    for (uint32_t s = 0; s < t.hashed.size(); ++s) {
      if (t.hashed[s]) continue;
      uint64_t offset = 0;
      std::span<const std::byte> bytes = SpanBytes(ti, s, &offset);
      t.sum ^= LinearHash(offset, bytes);
      t.hashed[s] = 1;
    }
    const TensorInfo& info = target_->manifest()[i];
    d.tensors[i] = FinishTensorDigest(t.sum, info.NumBytes());
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
