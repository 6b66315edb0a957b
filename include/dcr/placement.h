// Placement on the sender: how a trainer's shards hold the canonical
// (Hugging Face safetensors) tensors, as fixed affine maps from a shard's
// element coordinates to a canonical tensor's (docs/PLACEMENT.md).
//
// A piece says: the elements of shard tensor `shard` on trainer rank
// `rank` inside the box [from, from + extent) are the elements of one
// canonical tensor at
//
//   canonical[d] = to[d] + step[d] * (shard[axis[d]] - from[axis[d]])
//
// for every canonical dimension d. `axis` is a permutation of the shard's
// dimensions (a transpose where it is not the identity) and step[d] >= 1
// (an interleave where it is more than 1: every step-th row). Shard and
// canonical tensors have the same number of dimensions; a layout with a
// fused tensor (QKV, gate/up) or an interleave by groups is several pieces.
// The pieces of all ranks for one canonical tensor must tile it: every
// canonical element is the image of exactly one shard element.
//
// Positions are flat row-major element indices, as everywhere in dcr.
//
// Thread safety: the types are values; the functions touch only their
// arguments.
#ifndef DCR_PLACEMENT_H_
#define DCR_PLACEMENT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/status.h"

namespace dcr {

using Shape = std::vector<uint64_t>;

// "[4096, 1024]": a shape as messages name it.
std::string ShapeText(const Shape& shape);

struct AffinePiece {
  uint32_t rank = 0;           // the trainer rank holding the shard
  std::string shard;           // the shard tensor's name on that rank
  Shape shard_shape;           // the whole shard tensor's shape
  Shape from;                  // the box's first element, shard coordinates
  Shape extent;                // the box's size along each shard dimension
  Shape to;                    // canonical coordinates of `from`
  std::vector<uint32_t> axis;  // canonical dim d takes shard dim axis[d]
  Shape step;                  // canonical stride per shard step, >= 1

  // The identity map of a whole shard of `shape` placed at `to`.
  static AffinePiece Block(uint32_t rank, std::string shard, Shape shape,
                           Shape to);
};

// OK iff `p` is well formed (ranks agree, axis a permutation, steps >= 1,
// the box inside the shard, and its image inside `canonical_shape`);
// otherwise InvalidArgument naming `tensor`, the rank and the shard.
Status CheckPiece(const std::string& tensor, const Shape& canonical_shape,
                  const AffinePiece& p);

// OK iff `pieces` (each passing CheckPiece) tile `canonical_shape`: no two
// images share an element and together they hold every element. Otherwise
// InvalidArgument naming `tensor` and the ranks of the pieces that overlap,
// or the number of elements no piece holds. Exact for any steps: it
// intersects the images' arithmetic progressions dimension by dimension,
// in O(pieces^2 x dims) with no pass over the elements.
Status CheckTiling(const std::string& tensor, const Shape& canonical_shape,
                   std::span<const AffinePiece> pieces);

// One piece's map between flat positions, precomputed for speed. Built
// from a piece that passed CheckPiece.
class PieceMap {
 public:
  PieceMap(const AffinePiece& p, const Shape& canonical_shape);

  // True iff shard position `s` lies in the piece's box.
  bool Holds(uint64_t s) const;
  // The canonical position of shard position `s`; `s` must be Held.
  uint64_t ToCanonical(uint64_t s) const;
  // The shard position whose image is canonical position `c`; false if no
  // element of the piece lands there.
  bool ToShard(uint64_t c, uint64_t* s) const;

  // Appends to `out` the canonical positions of the shard positions in
  // `changed` (ascending) that the piece holds, ascending. Returns how
  // many it appended.
  size_t Project(std::span<const uint64_t> changed,
                 std::vector<uint64_t>* out) const;

  uint64_t elements() const { return elements_; }
  // For a piece of at least one element: the first and the last canonical
  // position its elements land on (flat, row-major); every one of them
  // lies in [first(), last()].
  uint64_t first() const { return origin_; }
  uint64_t last() const;

 private:
  size_t dims_ = 0;
  uint64_t elements_ = 0;
  Shape shard_shape_, canonical_shape_;
  Shape shard_stride_;      // row-major strides of the shard tensor
  Shape canonical_stride_;  // of the canonical tensor
  Shape from_, extent_, to_, step_;
  std::vector<uint32_t> axis_;
  // The canonical position of the box's first element, and the canonical
  // step per shard step along each shard dimension.
  uint64_t origin_ = 0;
  Shape delta_;
  bool ascending_ = true;  // shard order maps to canonical order
};

}  // namespace dcr

#endif  // DCR_PLACEMENT_H_
