#include "relay/apply_workers.h"

#include <algorithm>

#include "dcr/codec.h"

namespace dcr {

void ApplyTracker::WaitIdle() {
  MutexLock lock(&mu_);
  while (in_flight_.load() != 0) idle_cv_.Wait(&mu_);
}

Status ApplyTracker::TakeFirstError() {
  MutexLock lock(&mu_);
  Status out = first_error_;
  first_error_ = Status::OK();
  return out;
}

std::vector<AppliedChunk> ApplyTracker::AppliedChunks() {
  MutexLock lock(&mu_);
  return applied_chunks_;
}

void ApplyTracker::Started(uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    in_flight_ += 1;
  }
  backlog_bytes_ += bytes;
}

void ApplyTracker::Done(uint64_t bytes,
                        Result<RefitSession::ApplyOutcome> outcome,
                        std::optional<AppliedChunk> hashed) {
  if (outcome.ok()) {
    if (*outcome == RefitSession::ApplyOutcome::kApplied) {
      applied_bytes_ += bytes;
      applied_ += 1;
    } else {
      duplicates_ += 1;
    }
  }
  backlog_bytes_ -= bytes;
  MutexLock lock(&mu_);
  if (!outcome.ok() && first_error_.ok()) first_error_ = outcome.status();
  if (hashed) applied_chunks_.push_back(*hashed);
  in_flight_ -= 1;
  if (in_flight_.load() == 0) idle_cv_.SignalAll();
}

ApplyWorkers::ApplyWorkers(size_t threads, std::function<void()> on_done)
    : on_done_(std::move(on_done)) {
  for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

ApplyWorkers::~ApplyWorkers() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

void ApplyWorkers::Submit(Job job) {
  job.tracker->Started(job.chunk.size());
  {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.Signal();
}

void ApplyWorkers::Loop() {
  auto decoder = ChunkDecoder::Create();
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Result<RefitSession::ApplyOutcome> outcome =
        decoder.ok() ? job.session->Apply(job.chunk, decoder->get())
                     : Result<RefitSession::ApplyOutcome>(decoder.status());
    job.session->Unqueued(job.chunk);
    // Hashed here, on the worker, not on the actor thread.
    std::optional<AppliedChunk> hashed;
    if (job.hash && outcome.ok() &&
        *outcome == RefitSession::ApplyOutcome::kApplied) {
      auto header = PeekChunkHeader(job.chunk);  // valid: it was applied
      hashed =
          AppliedChunk{header.ok() ? header->id : ChunkId{}, Sha256(job.chunk)};
    }
    job.tracker->Done(job.chunk.size(), std::move(outcome), hashed);
    if (on_done_) on_done_();
  }
}

}  // namespace dcr
