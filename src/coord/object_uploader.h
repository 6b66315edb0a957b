// The root's half of the object store path (docs/PROTOCOL.md §"Chunks
// through an object store"): the CHUNK and END frames for clusters that
// pull (PlanNode::pulls_objects) become objects RefitObjectKey(refit, 0),
// (refit, 1), ... in the order the Fanout pushes them, each the whole
// frame (header, payload, authentication tag) as it would have crossed a
// link. Up to `parallel` uploads run at once, so objects may appear out of
// order; pullers read them in order.
//
// A frame is pushed as soon as it is encoded: construction overlaps
// upload. An upload that fails after the store's own retries (a server
// down or restarting) is tried again after kRetryMin, doubling to
// kRetryMax, until it is stored, Stop(), or `give_up_after` has passed
// since its first failure: a hole in the sequence would hold every puller
// for ObjectPuller::kSkipAfter, and a missing END for the whole phase. An
// object still failing then (a full disk, a bucket gone) is given up: its
// bytes leave QueuedBytes, which the root's stream waits on for every
// child, so a broken store never holds the clusters fed by links. A
// refusal (InvalidArgument: credentials, access) is not retried. Either
// is logged, and the pullers' votes say what is missing (incomplete, then
// the repair round's overwrite objects, or a timeout).
//
// Thread safety: Push, QueuedBytes and the counters may be called from
// any thread; the wake callback runs on the upload threads.
#ifndef DCR_COORD_OBJECT_UPLOADER_H_
#define DCR_COORD_OBJECT_UPLOADER_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "dcr/objstore.h"
#include "protocol/object_sink.h"

namespace dcr {

class ObjectUploader final : public ObjectSink {
 public:
  static constexpr std::chrono::milliseconds kRetryMin{200};
  static constexpr std::chrono::milliseconds kRetryMax{5000};

  // `wake` runs after each upload (the root waits on its mailbox while the
  // queue is over its window). `refit_hex` names the refit's objects.
  ObjectUploader(ObjectStore* store, std::string refit_hex, int parallel,
                 std::function<void()> wake,
                 std::chrono::milliseconds give_up_after);
  ~ObjectUploader() override;  // Stop()
  // Drops what is queued (the refit is over: it would reach nobody),
  // waits for the uploads in flight and stops the threads; later Pushes
  // are ignored. Idempotent.
  void Stop();
  ObjectUploader(const ObjectUploader&) = delete;
  ObjectUploader& operator=(const ObjectUploader&) = delete;

  void Push(const FrameBuffer& frame) override;
  size_t QueuedBytes() const override;

  uint64_t uploaded() const { return uploaded_.load(); }
  uint64_t uploaded_bytes() const { return uploaded_bytes_.load(); }
  // Failed attempts (each retried, but refusals and those cut by Stop).
  uint64_t failures() const { return failures_.load(); }
  // Objects pushed so far (the next ordinal).
  uint64_t pushed() const;

 private:
  struct Item {
    uint64_t ordinal;
    FrameBuffer frame;
  };
  void Work();

  ObjectStore* const store_;
  const std::string refit_hex_;
  const std::function<void()> wake_;
  const std::chrono::milliseconds give_up_after_;
  mutable Mutex mu_;
  CondVar cv_;  // queue_ or stop_ changed
  std::deque<Item> queue_ DCR_GUARDED_BY(mu_);
  uint64_t next_ DCR_GUARDED_BY(mu_) = 0;
  size_t queued_bytes_ DCR_GUARDED_BY(mu_) = 0;  // queued or uploading
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> uploaded_{0};
  std::atomic<uint64_t> uploaded_bytes_{0};
  std::atomic<uint64_t> failures_{0};
  std::vector<std::thread> threads_;
};

}  // namespace dcr

#endif  // DCR_COORD_OBJECT_UPLOADER_H_
