// The target's digests, computed in the encoder's pass over it (DESIGN.md
// §3) instead of in a pass of their own before PLAN: a refit's PLAN goes
// out as soon as the manifest is known, and END carries the digests
// (docs/PROTOCOL.md §"Target digests at END").
//
// A tensor's digest is linear in its bytes (docs/FORMAT.md §"Digests"):
// the XOR of LinearHash over its spans, each at its byte offset, finished
// with the length. So the worker that offers a span hashes it at once,
// from the target's mapped bytes while the encoder's read of it is still
// in cache, in whatever order the pool encodes spans; no copy is kept and
// nobody waits for another span.
//
// Finish hashes whatever was not offered (an encode pass that stopped
// early, a tensor no item covered), so its digests are those of the
// target's bits whatever the offers were: the pass only moves the work.
//
// Memory: a byte per span and 16 bytes per tensor.
//
// Thread safety: Offer may run concurrently from any threads; Finish after
// every Offer returned, alone.
#ifndef DCR_COORD_TARGET_DIGESTS_H_
#define DCR_COORD_TARGET_DIGESTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"  // ChunkId
#include "dcr/digest.h"
#include "dcr/thread_pool.h"

namespace dcr {

class TargetDigests {
 public:
  // `target` must outlive this; `span_elems` > 0 as in the refit's PLAN.
  TargetDigests(const Checkpoint* target, uint64_t span_elems);
  ~TargetDigests();
  TargetDigests(const TargetDigests&) = delete;
  TargetDigests& operator=(const TargetDigests&) = delete;

  // Span `id` of the target may be hashed now. Offering a span twice, or
  // one past its tensor's end, is ignored.
  void Offer(const ChunkId& id);

  // The digests of every tensor and the version digest; hashes the spans
  // not hashed yet (with `pool` across tensors, if given).
  CheckpointDigests Finish(ThreadPool* pool);

  // Seconds the offers spent hashing, summed over threads.
  double offered_seconds() const;
  // Bytes hashed by offers (not by Finish).
  uint64_t offered_bytes() const {
    return offered_bytes_.load(std::memory_order_relaxed);
  }

 private:
  struct Tensor;
  // Span `span` of `tensor` in the target, and its byte offset.
  std::span<const std::byte> SpanBytes(uint32_t tensor, uint32_t span,
                                       uint64_t* offset) const;

  const Checkpoint* target_;
  uint64_t span_elems_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::atomic<uint64_t> offered_ns_{0};
  std::atomic<uint64_t> offered_bytes_{0};
};

}  // namespace dcr

#endif  // DCR_COORD_TARGET_DIGESTS_H_
