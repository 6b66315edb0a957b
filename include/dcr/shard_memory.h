// Where a producer keeps a trainer rank's baseline shards when the shards
// live in memory the host does not read: a GPU's (dcr/cuda.h
// CreateShardMemory). The producer (dcr/shard_delta.h ShardProducer) asks
// that memory only for what changed, so no pass over the rank's shards
// crosses to the host at a step:
//
//   FindChanges  per shard, the changed elements' positions and their
//                baseline and target bits (copied back: a few % of the
//                shard at a BF16 step), which the producer projects into
//                canonical coordinates (ProjectShardChanges) and encodes;
//   Fingerprint  a digest of a shard, to tell at the commit whether the
//                trainer stepped again since the diff;
//   Advance      the committed shards copied over the baseline, in place.
//
// The target's digest parts follow from the baseline's and the changes
// (LinearHashElements), so they need no pass either. Only setting a
// baseline from the shards themselves reads them to the host, one shard at
// a time, to hash its regions (once per run, or after a rank lost its
// baseline).
//
// Shards are handed as ShardBytes whose spans address this memory (device
// pointers and sizes); the producer reads their sizes, never their bytes.
//
// Thread safety: one thread at a time (the producer's).
#ifndef DCR_SHARD_MEMORY_H_
#define DCR_SHARD_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/digest.h"
#include "dcr/shard_diff.h"
#include "dcr/status.h"

namespace dcr {

class ShardMemory {
 public:
  virtual ~ShardMemory() = default;

  // Names the memory in messages ("cuda:0").
  virtual std::string name() const = 0;
  // Copies `shards` (spans of this memory) as the baseline, replacing what
  // was held. The shards must stay unchanged until it returns.
  virtual Status SetBaseline(const ShardBytes& shards) = 0;
  // The same from host memory (the tree's baseline, fetched from the
  // coordinator).
  virtual Status SetBaselineFromHost(const ShardBytes& shards) = 0;
  // Frees the baseline.
  virtual void DropBaseline() = 0;
  virtual uint64_t baseline_bytes() const = 0;
  // Copies bytes [offset, offset + out.size()) of the baseline of shard
  // `shard` to `out` (host memory). NotFound for a shard not held,
  // InvalidArgument past its end.
  virtual Status ReadBaseline(std::string_view shard, uint64_t offset,
                              std::span<std::byte> out) = 0;
  // The elements of `target` (a span of this memory holding elements of
  // `elem_size` bytes) whose bits differ from the baseline of shard
  // `shard`, which must be as long: NotFound / InvalidArgument otherwise.
  // `out` is replaced (its buffers' capacity reused).
  virtual Status FindChanges(std::string_view shard, size_t elem_size,
                             std::span<const std::byte> target,
                             ShardChanges* out) = 0;
  // TensorDigest (dcr/digest.h) of `shard`'s bytes (a span of this memory).
  virtual Result<Digest128> Fingerprint(std::span<const std::byte> shard) = 0;
  // Copies each of `target`'s shards over the baseline of the same name
  // (each held, and as long: nothing copied otherwise).
  virtual Status Advance(const ShardBytes& target) = 0;
};

}  // namespace dcr

#endif  // DCR_SHARD_MEMORY_H_
