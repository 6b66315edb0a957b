// The root's encoder pipeline: a producer thread hands the items of a job
// (the spans of a refit, in canonical order) a batch at a time to a thread
// pool to encode, then frames the encoded chunks in item order and queues
// them for the coordinator thread, which sends them down the tree.
// Construction overlaps transfer and runs at most one window ahead of it:
// the queue holds at most `capacity` bytes of frames (Push blocks).
//
// Contract: Start once; the coordinator thread Pops until done() and the
// queue is empty, or Cancels. The producer stops at its first failure (a
// job's prepare, encode or emit error) with one exit: the failure is kept
// for Join, done() turns true, nothing more is queued, and `wake` runs.
//
// Thread safety: ChunkQueue is thread-safe. ChunkProducer: Hold, Release,
// Pop, done, Cancel and Join from one (the consumer's) thread; the job's encode
// runs on the pool's workers (several at once, distinct items), prepare and
// emit on the producer thread.
#ifndef DCR_COORD_CHUNK_PRODUCER_H_
#define DCR_COORD_CHUNK_PRODUCER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "dcr/codec.h"
#include "dcr/status.h"
#include "dcr/thread_pool.h"
#include "dcr/wire.h"
#include "wire/signature.h"

namespace dcr {

// One encoded chunk framed and waiting to be sent.
struct Outgoing {
  FrameBuffer frame;
  uint64_t payload = 0;  // the chunk's encoded bytes (without the frame)
  // A mixed tree (some subtrees take no context-coded chunks): the same
  // chunk base-independent at the same sequence number when `frame` is
  // context-coded, and its payload bytes; else null (`frame` is for all).
  FrameBuffer plain = nullptr;
  uint64_t plain_payload = 0;
  // `frame` is a STREAM_MARK, not a CHUNK: a hint to every child that
  // takes chunks, counted in no chunk figure (Fanout::Hint).
  bool mark = false;
  // Bytes queued: both frames.
  uint64_t bytes() const { return frame->size() + (plain ? plain->size() : 0); }
};

// Frames between the producer and the sender; Push blocks while `capacity`
// bytes or more wait.
class ChunkQueue {
 public:
  explicit ChunkQueue(uint64_t capacity) : capacity_(capacity) {}
  // False (and nothing queued) once cancelled.
  bool Push(Outgoing o) DCR_EXCLUDES(mu_);
  std::optional<Outgoing> Pop() DCR_EXCLUDES(mu_);
  // Wakes a blocked Push; every later Push returns false.
  void Cancel() DCR_EXCLUDES(mu_);
  uint64_t bytes() const DCR_EXCLUDES(mu_);
  // Pushes waiting for space now (tests synchronize on it).
  size_t blocked() const DCR_EXCLUDES(mu_);

 private:
  const uint64_t capacity_;
  mutable Mutex mu_;
  CondVar space_;  // bytes_ fell below capacity_, or cancelled_
  std::deque<Outgoing> items_ DCR_GUARDED_BY(mu_);
  uint64_t bytes_ DCR_GUARDED_BY(mu_) = 0;
  bool cancelled_ DCR_GUARDED_BY(mu_) = false;
  size_t blocked_ DCR_GUARDED_BY(mu_) = 0;
};

// One item's encoding: empty `bytes` when the item has nothing to send.
struct EncodedChunk {
  std::vector<std::byte> bytes;
  // The same changes in a base-independent encoding when `bytes` is
  // context-coded (what the history keeps); empty otherwise.
  std::vector<std::byte> base_independent;
  ChunkSizes sizes;
  Sha256Digest sha256{};  // set by jobs that sign what they send
  // Of `base_independent`, when it is sent too (a mixed tree) and signed.
  Sha256Digest base_independent_sha256{};

  // Empty again for the next item: the producer reuses one per slot, and
  // encoders append.
  void Clear() {
    bytes.clear();
    base_independent.clear();
    sizes = ChunkSizes();
    sha256 = Sha256Digest{};
    base_independent_sha256 = Sha256Digest{};
  }
};

struct ChunkJob {
  // The items: `items` of them, or, with `fetch`, as many as it brings.
  size_t items = 0;
  // Brings the next batch of at most `max` items (numbered on from those
  // before it) and returns how many; blocks until it has some, 0 when
  // there are no more. An error stops the producer.
  std::function<Result<size_t>(size_t max)> fetch;
  // With `fetch`: wakes a fetch that blocks (the consumer cancelled).
  std::function<void()> interrupt;
  // Runs first, on the producer thread (per-worker encoders, say).
  std::function<Status()> prepare;
  // Encodes item `i` on pool worker `worker` into `out` (cleared).
  std::function<Status(size_t i, size_t worker, EncodedChunk* out)> encode;
  // Frames encoded item `i`, in item order, on the producer thread.
  std::function<Result<Outgoing>(size_t i, const EncodedChunk& chunk)> emit;
  // Optional: after each batch's items were emitted and queued, on the
  // producer thread (`last`: the final batch; never with `fetch`); it may
  // use the pool. An error stops the producer like an encode failure.
  std::function<Status(bool last)> after_batch;
  // Optional, with `fetch`: before the first batch and after each batch's
  // items were queued, on the producer thread, a frame to queue there (a
  // STREAM_MARK), or nullopt. An error stops the producer like an encode
  // failure.
  std::function<Result<std::optional<Outgoing>>()> mark;
};

class ChunkProducer {
 public:
  // `wake` runs on the producer thread after every chunk queued and once
  // when it stops (the consumer's mailbox wake-up).
  ChunkProducer(ThreadPool* pool, uint64_t capacity,
                std::function<void()> wake);
  // Cancels and joins.
  ~ChunkProducer();
  ChunkProducer(const ChunkProducer&) = delete;
  ChunkProducer& operator=(const ChunkProducer&) = delete;

  // Before Start: the producer runs the job's prepare and encodes its
  // first batch, then waits, emitting nothing, until Release (or Cancel).
  // The coordinator starts the refit's stream so before the PLAN's replies
  // are in, whose round trip then hides that encode, and releases it once
  // the tree took the plan. Not with a `mark` job (its first mark would be
  // queued before the gate): that stops it with an error. A release wins
  // over a later Cancel: the stream had begun.
  void Hold();
  void Release() DCR_EXCLUDES(gate_mu_);
  void Start(ChunkJob job);
  std::optional<Outgoing> Pop() { return queue_.Pop(); }
  // The producer stopped: every item queued, a failure, or cancelled. What
  // it queued before stays to be popped.
  bool done() const { return done_.load(std::memory_order_acquire); }
  void Cancel() DCR_EXCLUDES(gate_mu_);
  // The producer waits for the consumer: the queue is full.
  bool blocked() const { return queue_.blocked() != 0; }
  // Waits for the producer thread; its failure, or OK.
  Status Join();

 private:
  void Run();
  // Queues the job's mark, if it gives one.
  Status QueueMark();
  void Stop(Status why);  // the one exit of Run
  // Hold's gate: true once released, false once cancelled.
  bool AwaitRelease() DCR_EXCLUDES(gate_mu_);

  ThreadPool* pool_;
  ChunkQueue queue_;
  std::function<void()> wake_;
  ChunkJob job_;
  std::thread thread_;
  Status error_;  // written by the producer thread before done_
  std::atomic<bool> done_{false};
  bool held_ = false;  // set before Start
  Mutex gate_mu_;
  CondVar gate_;  // released_ or cancelled_
  bool released_ DCR_GUARDED_BY(gate_mu_) = false;
  bool cancelled_ DCR_GUARDED_BY(gate_mu_) = false;
};

}  // namespace dcr

#endif  // DCR_COORD_CHUNK_PRODUCER_H_
