// Placement on the receiver (issue 18): how one serving rank holds the
// canonical tensors, and the apply of canonical chunks to its shards.
//
// A serving layout is a layout file of the sender's family
// (docs/PLACEMENT.md): its ranks are the serving engine's ranks (tensor
// parallel fastest), and rank `rank` holds the shard tensors the layout
// gives it, in the serving engine's names and order (fused qkv and
// gate/up, a tensor-parallel slice). Unlike a producer, a serving rank
// also holds the copies: a replicated tensor (a norm) on every
// tensor-parallel rank, a tensor outside the experts on every
// expert-parallel group (LayoutTensor::copies_tp, copies_ep).
//
// A canonical chunk (a span of a canonical tensor, decoded: positions and
// XOR masks or new values) lands on the elements the rank holds; the rest
// of it is not the rank's and is left alone (a relay still forwards the
// whole chunk to its children). Bit-preserving maps keep XOR as XOR.
//
// Only identity conversions: a serving rank holds canonical bits. A
// tensor whose shard dtype differs is refused at Create (FP8 serving is
// declared otherwise; dcr/fp8.h).
//
// Thread safety: a ReceiverMap is immutable after Create; Apply calls on
// disjoint shard elements may run concurrently.
#ifndef DCR_RECEIVER_MAP_H_
#define DCR_RECEIVER_MAP_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/layout.h"
#include "dcr/placement.h"
#include "dcr/shard_diff.h"
#include "dcr/status.h"

namespace dcr {

// A rank's shard tensors by name, writable.
using MutableShardBytes = std::map<std::string, std::span<std::byte>>;

class ReceiverMap {
 public:
  // The pieces and copies of `layout` that serving rank `rank` holds.
  // InvalidArgument if the rank is not below layout.ranks(), or if it
  // holds a converted tensor (naming it).
  static Result<ReceiverMap> Create(const Layout& layout, uint32_t rank);

  uint32_t rank() const { return rank_; }
  // The shard tensors the rank holds, by name, copies included.
  const std::map<std::string, LayoutShard>& shards() const { return shards_; }
  // The layout cut down to this rank: each tensor's pieces are those the
  // rank holds, copies included (as the rank's own pieces).
  const Layout& held() const { return held_; }
  // Whether the rank holds any element of canonical tensor `tensor`.
  bool Holds(uint32_t tensor) const {
    return tensor < tensors_.size() && !tensors_[tensor].empty();
  }

  // Applies decoded chunk `c` of canonical tensor `tensor` (Layout::tensors
  // order), whose span starts at canonical element `first`, to `shards`:
  // every changed element the rank holds is XORed with its mask, or
  // overwritten, at its shard position. Where two canonical tensors share
  // a shard box (a tied head declared from its embedding's shard), only
  // the first tensor's chunks write it: both carry the same bits, and a
  // second XOR would undo the first. Returns how many elements it wrote.
  // InvalidArgument if `tensor` is past the layout, the chunk's element
  // size is not the tensor's, its span runs past the tensor, or a shard it
  // writes is missing from `shards` or not of its layout size.
  Result<uint64_t> Apply(uint32_t tensor, uint64_t first, const DecodedChunk& c,
                         const MutableShardBytes& shards) const;

  // The rank's shards built from canonical tensors: every element a piece
  // or copy maps holds the canonical element's bits, the rest (vocabulary
  // padding) zero. What a serving rank loads before its first refit.
  // Errors as BuildShards'.
  Result<std::map<std::string, std::vector<std::byte>>> Build(
      const CanonicalBytes& canonical) const;

  // What a serving rank votes with: per canonical tensor (Layout::tensors
  // order), the linear digest of the canonical bits it holds in `shards`,
  // each region hashed at its canonical byte offset (HashShardRegions);
  // zero for a tensor it does not hold. ExpectedRegions computes the same
  // from canonical tensors (the root's target), without building shards:
  // the two agree iff the rank holds those bits (up to the digest's
  // collision bound). Errors as HashShardRegions' and BuildShards'.
  Result<std::vector<LinearDigest>> HashRegions(const ShardBytes& shards) const;
  Result<std::vector<LinearDigest>> ExpectedRegions(
      const CanonicalBytes& canonical) const;

 private:
  struct Held {
    PieceMap map;
    std::string shard;
    bool apply;  // false where an earlier tensor's box holds the same bits
  };
  ReceiverMap() = default;

  uint32_t rank_ = 0;
  // The layout cut down to what this rank holds: its pieces and its
  // copies (as pieces of this rank), no other rank's.
  Layout held_;
  std::map<std::string, LayoutShard> shards_;
  std::vector<std::vector<Held>> tensors_;  // per canonical tensor
};

// `layout` as serving ranks hold it: every tensor's pieces are every
// rank's held pieces, copies included (ReceiverMap::held of each rank).
// The pieces no longer tile (copies overlap); ShardsOf, CompareShards and
// BuildShards of a rank then give what a serving rank holds. Errors as
// ReceiverMap::Create's.
Result<Layout> ServingView(const Layout& layout);

}  // namespace dcr

#endif  // DCR_RECEIVER_MAP_H_
