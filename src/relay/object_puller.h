// A cluster head's half of the object store path (docs/PROTOCOL.md
// §"Chunks through an object store"): reads the refit's frame objects
// RefitObjectKey(refit, 0), (refit, 1), ... in order, from a thread of its
// own, and hands each to `deliver` (which posts it to the relay's actor,
// where it takes the path of a frame from the parent link).
//
// While objects are there (the head behind the upload, or a store far
// away), up to kParallel reads are in flight, a sliding window refilled as
// the first completes: it doubles from 1 with each object found and falls
// back to 1 at the first one missing (what was read past it is kept), so
// polling the frontier costs about one request per wait while a backlog
// costs one round trip per kParallel objects. Objects are delivered in
// order all the same. kParallel = 6 is a measured compromise
// (bench/README.md, objstore): more reads in flight hide more of a round
// trip, but on the shaped testbed 8 concurrent responses overflowed the
// WAN's queue and cost a fifth of its throughput.
//
// An object not there yet is asked for again after a wait that starts at
// kPollMin and doubles to kPollMax while nothing new appears: an idle
// refit costs at most 1 / kPollMax requests per second per head, and a
// chunk waits at most kPollMax longer than its upload. An object that
// fails its checks (corrupt, not dcr's) kBadReads times in a row (a
// server that is not atomic may serve one mid-write: s3rver does) is
// skipped and counted: the vote then names what is missing and the repair
// round's overwrite objects replace it. So is one still missing kSkipAfter
// after a later object appeared (an upload that failed for good).
//
// A refusal that waiting cannot cure (InvalidArgument from the store:
// wrong credentials, no access to the bucket) ends the pull: `fail` gets
// it once, on the puller's thread, and nothing is read after it.
//
// The relay reports each object it has taken (Consumed): no more than
// `max_unconsumed_bytes` (plus one object) wait in its mailbox, and at
// most kParallel more are held (read, or kept past a missing one).
//
// Stop waits for the reads in flight (up to kParallel): dcr-relay opens
// the store with one attempt per request and a 2 s stall limit
// (ObjectRequestLimits), which bounds a read that stalls, not one that
// moves slowly (a few MiB over a slow WAN).
//
// Thread safety: Pause, Stop and the counters may be called from any
// thread; `deliver` and `fail` run on the puller's thread.
#ifndef DCR_RELAY_OBJECT_PULLER_H_
#define DCR_RELAY_OBJECT_PULLER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "dcr/objstore.h"
#include "dcr/wire.h"

namespace dcr {

class ObjectPuller {
 public:
  static constexpr std::chrono::milliseconds kPollMin{5};
  static constexpr std::chrono::milliseconds kPollMax{100};
  static constexpr std::chrono::seconds kSkipAfter{10};
  // Reads of an object that fails its checks before it is skipped.
  static constexpr int kBadReads = 6;
  static constexpr int kParallel = 6;
  static constexpr size_t kMaxUnconsumedBytes = size_t{64} << 20;

  // Starts paused: the relay lets it read once its PLAN phase is over
  // (objects already stored, for a head that rejoins, would otherwise
  // arrive while it still plans, and be refused).
  ObjectPuller(ObjectStore* store, std::string refit_hex,
               std::function<void(FrameBuffer)> deliver,
               std::function<void(Status)> fail,
               size_t max_unconsumed_bytes = kMaxUnconsumedBytes);
  ~ObjectPuller();  // Stop()
  ObjectPuller(const ObjectPuller&) = delete;
  ObjectPuller& operator=(const ObjectPuller&) = delete;

  // While paused (the relay's forward or apply window is full), no object
  // is read.
  void Pause(bool paused) DCR_EXCLUDES(mu_);
  // `bytes` of a delivered object were taken off the relay's mailbox.
  void Consumed(size_t bytes) DCR_EXCLUDES(mu_);
  // Stops and joins the thread; idempotent.
  void Stop() DCR_EXCLUDES(mu_);

  uint64_t pulled() const { return pulled_.load(); }
  uint64_t pulled_bytes() const { return pulled_bytes_.load(); }
  uint64_t skipped() const { return skipped_.load(); }
  uint64_t requests() const { return requests_.load(); }

 private:
  void Run();
  // Waits `d`, or less if stopped; false when stopped.
  bool Sleep(std::chrono::milliseconds d) DCR_EXCLUDES(mu_);
  // Waits while paused or the relay holds kMaxUnconsumedBytes; false when
  // stopped.
  bool WaitReady() DCR_EXCLUDES(mu_);
  void Deliver(std::vector<std::byte> object) DCR_EXCLUDES(mu_);

  ObjectStore* const store_;
  const std::string refit_hex_;
  const std::function<void(FrameBuffer)> deliver_;
  const std::function<void(Status)> fail_;
  const size_t max_unconsumed_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  bool paused_ DCR_GUARDED_BY(mu_) = true;
  size_t unconsumed_ DCR_GUARDED_BY(mu_) = 0;  // delivered, not Consumed
  std::atomic<uint64_t> pulled_{0};
  std::atomic<uint64_t> pulled_bytes_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> requests_{0};
  std::thread thread_;
};

}  // namespace dcr

#endif  // DCR_RELAY_OBJECT_PULLER_H_
