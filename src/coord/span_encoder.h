// What one pass of a refit encodes and how, span by span: the XOR diff of
// baseline and target (a delta refit), dense overwrites of every span (a
// full refit, or the tensors of a repair round), or the composed chunks of
// a history chain (catch-up), or the overwrites that repair a store left
// with a mix of versions (coord/repair.h). It is the ChunkJob body of a refit:
// the chunk producer (chunk_producer.h) runs Prepare once, then Encode for
// every item on the pool's workers.
//
// Thread safety: Encode may run concurrently for distinct items on
// distinct workers; Prepare runs before, alone. The target, baseline and
// composed delta must outlive it.
#ifndef DCR_COORD_SPAN_ENCODER_H_
#define DCR_COORD_SPAN_ENCODER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "coord/chunk_producer.h"
#include "coord/history.h"
#include "coord/target_digests.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/store.h"

namespace dcr {

class SpanEncoder {
 public:
  enum class Kind {
    kDiff,     // XOR of baseline and target, every span
    kFull,     // dense overwrites of every span of `tensors`
    kCompose,  // the composition of a history chain, its chunk ids
    kRepair,   // overwrites of every element a union of deltas changes
  };
  struct Options {
    const Checkpoint* target = nullptr;
    const WeightStore* baseline = nullptr;    // kDiff
    const ComposedDelta* composed = nullptr;  // kCompose, kRepair
    uint64_t span_elems = 0;
    bool compress = true;  // compressed value planes
    bool hash = false;     // SHA-256 of every chunk (signed refits)
    // kDiff: code chunks in the context of the baseline's bits where that
    // is smaller.
    bool context = false;
    // With `context`: EncodedChunk::base_independent holds the same changes
    // in a base-independent encoding whenever `bytes` is context-coded
    // (what the history keeps).
    bool base_independent = false;
    // With `base_independent` and `hash`: hash that copy too (it is sent
    // beside the first, to a mixed tree's subtrees without context).
    bool hash_base_independent = false;
    // Target bytes encoded so far, if counted.
    std::atomic<uint64_t>* scanned = nullptr;
    // kDiff, kFull: each span encoded is offered for the target's digests
    // (the first pass of a refit whose PLAN left them to END).
    TargetDigests* digests = nullptr;
  };
  // `tensors`: kFull only, the tensors to send (empty: every tensor).
  SpanEncoder(Options options, Kind kind, std::vector<uint32_t> tensors = {});

  size_t size() const { return items_.size(); }
  const ChunkId& id(size_t i) const { return items_[i]; }

  // One encoder (and decoder, to compose) per worker.
  Status Prepare(size_t workers);
  // Encodes items()[i]; `out->bytes` stays empty when the span has nothing
  // to send.
  Status Encode(size_t i, size_t worker, EncodedChunk* out);

 private:
  Options options_;
  Kind kind_;
  std::vector<ChunkId> items_;  // in canonical (stream) order
  std::vector<std::unique_ptr<ChunkEncoder>> encoders_;
  std::vector<std::unique_ptr<ChunkDecoder>> decoders_;
  std::vector<std::vector<std::byte>> scratch_;
};

}  // namespace dcr

#endif  // DCR_COORD_SPAN_ENCODER_H_
