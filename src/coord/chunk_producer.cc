#include "coord/chunk_producer.h"

#include <algorithm>
#include <cassert>

namespace dcr {

bool ChunkQueue::Push(Outgoing o) {
  MutexLock lock(&mu_);
  while (!cancelled_ && bytes_ >= capacity_) {
    ++blocked_;
    space_.Wait(&mu_);
    --blocked_;
  }
  if (cancelled_) return false;
  bytes_ += o.bytes();
  items_.push_back(std::move(o));
  return true;
}

std::optional<Outgoing> ChunkQueue::Pop() {
  MutexLock lock(&mu_);
  if (items_.empty()) return std::nullopt;
  Outgoing o = std::move(items_.front());
  items_.pop_front();
  bytes_ -= o.bytes();
  space_.Signal();
  return o;
}

void ChunkQueue::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  space_.SignalAll();
}

uint64_t ChunkQueue::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

size_t ChunkQueue::blocked() const {
  MutexLock lock(&mu_);
  return blocked_;
}

ChunkProducer::ChunkProducer(ThreadPool* pool, uint64_t capacity,
                             std::function<void()> wake)
    : pool_(pool), queue_(capacity), wake_(std::move(wake)) {}

ChunkProducer::~ChunkProducer() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void ChunkProducer::Hold() {
  assert(!thread_.joinable());
  held_ = true;
}

void ChunkProducer::Release() {
  {
    MutexLock lock(&gate_mu_);
    released_ = true;
    gate_.SignalAll();
  }
  // A producer that stopped while held (no items, a prepare failure) woke
  // the consumer then, before it waited for this stream: again.
  if (done() && wake_) wake_();
}

void ChunkProducer::Cancel() {
  {
    MutexLock lock(&gate_mu_);
    cancelled_ = true;
    gate_.SignalAll();
  }
  queue_.Cancel();
  if (job_.interrupt && !done()) job_.interrupt();
}

bool ChunkProducer::AwaitRelease() {
  MutexLock lock(&gate_mu_);
  while (!released_ && !cancelled_) gate_.Wait(&gate_mu_);
  // Released, then cancelled (the consumer gave up the stream it began):
  // the emit's Push finds the queue cancelled and stops as before.
  return released_;
}

void ChunkProducer::Start(ChunkJob job) {
  job_ = std::move(job);
  thread_ = std::thread([this] { Run(); });
}

Status ChunkProducer::Join() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

void ChunkProducer::Stop(Status why) {
  error_ = std::move(why);
  done_.store(true, std::memory_order_release);
  if (wake_) wake_();
}

Status ChunkProducer::QueueMark() {
  if (!job_.mark || !job_.fetch) return Status::OK();
  Result<std::optional<Outgoing>> m = job_.mark();
  if (!m.ok()) return m.status();
  if (!*m) return Status::OK();
  if (!queue_.Push(**std::move(m))) {
    return Status::Aborted("the stream was cancelled");
  }
  if (wake_) wake_();
  return Status::OK();
}

void ChunkProducer::Run() {
  if (held_ && job_.mark) {
    // Its first mark would be queued before the gate.
    return Stop(Status::Internal("a held stream cannot have marks"));
  }
  if (job_.prepare) {
    if (Status s = job_.prepare(); !s.ok()) return Stop(std::move(s));
  }
  const size_t batch = std::max<size_t>(4, pool_->size() * 4);
  std::vector<EncodedChunk> out(batch);
  std::vector<Status> errors(batch);
  // The first batch holds one item per worker, so that the stream's first
  // chunk goes out after one item's encode rather than a whole batch's
  // (on the testbed's 2 cores, 8 spans diffed, encoded, hashed and written
  // to root.baseline: about 0.02 s before the first byte left the root).
  size_t want = std::min(batch, std::max<size_t>(1, pool_->size()));
  if (Status s = QueueMark(); !s.ok()) return Stop(std::move(s));
  for (size_t begin = 0;; want = batch) {
    size_t n = 0;
    if (job_.fetch) {
      Result<size_t> fetched = job_.fetch(want);
      if (!fetched.ok()) return Stop(fetched.status());
      n = std::min(*fetched, want);
    } else if (begin < job_.items) {
      n = std::min(want, job_.items - begin);
    }
    if (n == 0) {
      // The stream's last mark: everything is out.
      if (Status s = QueueMark(); !s.ok()) return Stop(std::move(s));
      break;
    }
    pool_->ParallelFor(n, [&](size_t i, size_t worker) {
      out[i].Clear();
      errors[i] = job_.encode(begin + i, worker, &out[i]);
    });
    if (held_ && begin == 0 && !AwaitRelease()) {
      return Stop(Status::Aborted("the stream was cancelled before it began"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].ok()) return Stop(std::move(errors[i]));
      if (out[i].bytes.empty()) continue;
      Result<Outgoing> o = job_.emit(begin + i, out[i]);
      if (!o.ok()) return Stop(o.status());
      // False: cancelled by the consumer, which is not waiting for more.
      if (!queue_.Push(*std::move(o))) {
        // A fetched stream cut short is not whole (items: the consumer
        // stopped wanting them).
        return Stop(job_.fetch ? Status::Aborted("the stream was cancelled")
                               : Status::OK());
      }
      if (wake_) wake_();
    }
    if (Status s = QueueMark(); !s.ok()) return Stop(std::move(s));
    if (job_.after_batch && !job_.fetch) {
      if (Status s = job_.after_batch(begin + n == job_.items); !s.ok()) {
        return Stop(std::move(s));
      }
    }
    begin += n;
  }
  Stop(Status::OK());
}

}  // namespace dcr
