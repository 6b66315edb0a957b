// The relay's apply pool: a few worker threads, each with its own chunk
// decoder, apply CHUNK payloads to a refit's RefitSession, and an
// ApplyTracker counts what they did for that refit (in flight, backlog,
// applied, duplicates, the first error, and, for signed refits, the SHA-256
// of every chunk applied).
//
// Contract: a job's session outlives the job. The owner of a refit waits
// for its tracker to be idle (no job in flight) before it votes, commits,
// restores or destroys the session: ApplyTracker::idle() is the guard, and
// WaitIdle() blocks on a condition variable (never a sleep loop) where the
// owner must wait (shutdown).
//
// Thread safety: Submit is called from the relay's actor thread; jobs run
// on the worker threads, which call `on_done` (the actor's Mailbox::Wake:
// an apply completion is an event of the refit's state machine) after each
// job. ApplyTracker's counters may be read from any thread.
#ifndef DCR_RELAY_APPLY_WORKERS_H_
#define DCR_RELAY_APPLY_WORKERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "dcr/status.h"
#include "dcr/transport.h"
#include "protocol/refit_manifest.h"
#include "session/refit_session.h"

namespace dcr {

// What the apply workers report back about one refit.
class ApplyTracker {
 public:
  uint64_t in_flight() const { return in_flight_.load(); }
  bool idle() const { return in_flight_.load() == 0; }
  uint64_t backlog_bytes() const { return backlog_bytes_.load(); }
  uint64_t applied() const { return applied_.load(); }
  // Bytes of the chunks applied() counts (their encoded size, as sent).
  uint64_t applied_bytes() const { return applied_bytes_.load(); }
  uint64_t duplicates() const { return duplicates_.load(); }

  // Blocks until no job of this refit is in flight.
  void WaitIdle() DCR_EXCLUDES(mu_);

  // The first apply error since the last call, which clears it (one per
  // vote), and a copy of the chunks applied so far (signed refits).
  Status TakeFirstError() DCR_EXCLUDES(mu_);
  std::vector<AppliedChunk> AppliedChunks() DCR_EXCLUDES(mu_);

 private:
  friend class ApplyWorkers;
  void Started(uint64_t bytes) DCR_EXCLUDES(mu_);
  void Done(uint64_t bytes, Result<RefitSession::ApplyOutcome> outcome,
            std::optional<AppliedChunk> hashed) DCR_EXCLUDES(mu_);

  // Written under mu_ (so that WaitIdle cannot miss the last Done), read
  // without it by in_flight() and idle(): an atomic, not DCR_GUARDED_BY.
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<uint64_t> backlog_bytes_{0};
  std::atomic<uint64_t> applied_{0};
  std::atomic<uint64_t> applied_bytes_{0};
  std::atomic<uint64_t> duplicates_{0};
  Mutex mu_;
  CondVar idle_cv_;  // in_flight_ reached 0
  Status first_error_ DCR_GUARDED_BY(mu_);
  std::vector<AppliedChunk> applied_chunks_ DCR_GUARDED_BY(mu_);
};

// Applies chunks on a few threads, each with its own decoder.
class ApplyWorkers {
 public:
  struct Job {
    FrameBuffer buffer;  // keeps `chunk` alive
    std::span<const std::byte> chunk;
    RefitSession* session = nullptr;
    std::shared_ptr<ApplyTracker> tracker;
    bool hash = false;  // record the SHA-256 of the chunk once applied
  };

  // `on_done` runs on a worker thread after every job (may be empty).
  ApplyWorkers(size_t threads, std::function<void()> on_done);
  ~ApplyWorkers();  // finishes the queued jobs, then joins
  ApplyWorkers(const ApplyWorkers&) = delete;
  ApplyWorkers& operator=(const ApplyWorkers&) = delete;

  void Submit(Job job) DCR_EXCLUDES(mu_);

 private:
  void Loop() DCR_EXCLUDES(mu_);

  std::function<void()> on_done_;
  Mutex mu_;
  CondVar cv_;  // a job was queued, or stop_ set
  std::deque<Job> jobs_ DCR_GUARDED_BY(mu_);
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace dcr

#endif  // DCR_RELAY_APPLY_WORKERS_H_
