#include "relay/apply_workers.h"

#include <algorithm>

#include "dcr/codec.h"

namespace dcr {

void ApplyTracker::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return in_flight_.load() == 0; });
}

Status ApplyTracker::TakeFirstError() {
  std::lock_guard lock(mu_);
  Status out = first_error_;
  first_error_ = Status::OK();
  return out;
}

std::vector<AppliedChunk> ApplyTracker::AppliedChunks() {
  std::lock_guard lock(mu_);
  return applied_chunks_;
}

void ApplyTracker::Started(uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    in_flight_ += 1;
  }
  backlog_bytes_ += bytes;
}

void ApplyTracker::Done(uint64_t bytes,
                        Result<RefitSession::ApplyOutcome> outcome,
                        std::optional<AppliedChunk> hashed) {
  if (outcome.ok()) {
    (*outcome == RefitSession::ApplyOutcome::kApplied ? applied_
                                                      : duplicates_) += 1;
  }
  backlog_bytes_ -= bytes;
  std::lock_guard lock(mu_);
  if (!outcome.ok() && first_error_.ok()) first_error_ = outcome.status();
  if (hashed) applied_chunks_.push_back(*hashed);
  in_flight_ -= 1;
  if (in_flight_.load() == 0) idle_cv_.notify_all();
}

ApplyWorkers::ApplyWorkers(size_t threads, std::function<void()> on_done)
    : on_done_(std::move(on_done)) {
  for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

ApplyWorkers::~ApplyWorkers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ApplyWorkers::Submit(Job job) {
  job.tracker->Started(job.chunk.size());
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void ApplyWorkers::Loop() {
  auto decoder = ChunkDecoder::Create();
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Result<RefitSession::ApplyOutcome> outcome =
        decoder.ok() ? job.session->Apply(job.chunk, decoder->get())
                     : Result<RefitSession::ApplyOutcome>(decoder.status());
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
