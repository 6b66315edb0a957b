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
// tensor whose shard dtype differs is refused at Create.
//
// FP8 serving (an entry's `fp8`, docs/PLACEMENT.md §"FP8 serving"): the
// rank keeps three tensors for such a shard S: S itself, the E4M3 codes
// the server computes with; the scales (Fp8Serving::scale_shard, F32, one
// per block of S); and S's shadow (ShadowName(S), the canonical dtype),
// the canonical bits it was quantized from. Apply writes the shadow and
// marks the blocks it touched; Requantize recomputes those blocks' codes
// and scales. Each held box must keep whole blocks (start on a block
// boundary in the shard and in the tensor, end on one unless it ends
// both), so that S's blocks are the canonical tensor's: the codes and
// scales are then bit-identical to QuantizeFp8 of the dense target.
//
// Per-tensor FP8 (`block: tensor`): one scale per canonical tensor, whose
// maximum runs over elements other ranks hold. So the rank keeps the
// whole canonical tensor T as its shadow (ShadowName(T.name), T's shape:
// a copy of T, applied and voted on like one), and S's codes are its
// boxes of T quantized with the scale of all of T (QuantizeFp8Box). S's
// scales are F32 [parts]: one per canonical tensor S holds part of, in
// the order of their first element in S (q, k, v of a fused qkv). The
// boxes need not keep blocks whole; they must be 2-D, not transposed or
// interleaved, and must not overlap.
//
// Thread safety: a ReceiverMap is immutable after Create. Apply calls on
// disjoint shard elements may run concurrently, each with its own
// Fp8Dirty (an Fp8Dirty is a value used by one thread at a time); join
// the threads' marks with Fp8BlockSet::Merge before Requantize.
#ifndef DCR_RECEIVER_MAP_H_
#define DCR_RECEIVER_MAP_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/fp8.h"
#include "dcr/layout.h"
#include "dcr/placement.h"
#include "dcr/shard_diff.h"
#include "dcr/status.h"

namespace dcr {

// A rank's shard tensors by name, writable.
using MutableShardBytes = std::map<std::string, std::span<std::byte>>;
// The blocks of each FP8 shard that applied chunks touched, by shard name.
using Fp8Dirty = std::map<std::string, Fp8BlockSet>;

class ReceiverMap {
 public:
  // The pieces and copies of `layout` that serving rank `rank` holds.
  // InvalidArgument if the rank is not below layout.ranks(), or if it
  // holds a converted tensor (naming it).
  static Result<ReceiverMap> Create(const Layout& layout, uint32_t rank);

  uint32_t rank() const { return rank_; }
  // The tensors the rank keeps, by name, copies included: for an FP8 shard
  // its codes (F8_E4M3), its scales (F32) and its shadow.
  const std::map<std::string, LayoutShard>& shards() const { return shards_; }
  // The tensors a serving process computes with: shards() less the FP8
  // shadows, whose canonical bits only the relay's store keeps. What a
  // server exports to its relay over CUDA IPC (dcr/cuda.h IpcManifest).
  std::map<std::string, LayoutShard> DeviceShards() const;
  // Where an FP8 shard's canonical bits are kept.
  static std::string ShadowName(const std::string& shard) {
    return shard + ".shadow";
  }
  // An FP8 shard: its 2-D view (dtype: the shadow's; block 0 x 0 if its
  // scales are per tensor) and its scales' name.
  struct Fp8Shard {
    Fp8Tensor view;
    std::string scales;
    // Per-tensor scales: the canonical tensors (Layout::tensors order) S
    // holds part of, one scale each, in the scales' order.
    std::vector<uint32_t> parts;
    // What Fp8Dirty keeps for the shard: its blocks, or (per tensor) its
    // parts, a [1, parts] tensor of 1 x 1 blocks.
    Fp8Tensor marks() const;
    // Its scales' shape.
    Shape scales_shape() const;
  };
  // The rank's FP8 shards, by name.
  const std::map<std::string, Fp8Shard>& fp8_shards() const { return fp8_; }
  // Per-tensor FP8: each such tensor's boxes in its codes shards, as the
  // layout places them (held() maps the tensor into its shadow instead).
  const std::map<uint32_t, std::vector<AffinePiece>>& fp8_boxes() const {
    return fp8_boxes_;
  }
  bool serves_fp8() const { return !fp8_.empty(); }
  // `shards` with each block-scaled FP8 shard's name bound to its shadow:
  // the canonical bits held() places, as HashShardRegions and
  // CompareShards over held() read them (a per-tensor shard's shadows are
  // held() shards of their own). NotFound if a shadow is missing.
  Result<ShardBytes> Shadows(const ShardBytes& shards) const;
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
  // second XOR would undo the first. An FP8 tensor's changes go to its
  // shadow, and the blocks they land in are marked in `dirty` (required
  // then; Requantize after the refit's chunks). Returns how many elements
  // it wrote. InvalidArgument if `tensor` is past the layout, the chunk's
  // element size is not the tensor's, its span runs past the tensor, or a
  // shard it writes is missing from `shards` or not of its layout size.
  Result<uint64_t> Apply(uint32_t tensor, uint64_t first, const DecodedChunk& c,
                         const MutableShardBytes& shards,
                         Fp8Dirty* dirty = nullptr) const;

  // The values `shards` hold now at the positions of `c` that Apply would
  // write (the same boxes, tied boxes skipped as there): position i's
  // element bytes go to `old` at i * element size (dense: every element of
  // the span); positions the rank does not hold leave `old` as it was.
  // Written back with Apply of an overwrite chunk of those positions and
  // values, they undo an Apply of `c` (what a relay's journal records). An
  // FP8 tensor is read from its shadow. Returns how many elements it read.
  // Errors as Apply's, and InvalidArgument if `old` is not one element per
  // position.
  Result<uint64_t> Gather(uint32_t tensor, uint64_t first,
                          const DecodedChunk& c,
                          const MutableShardBytes& shards,
                          std::span<std::byte> old) const;

  // Requantizes the blocks `dirty` marks, from each FP8 shard's shadow into
  // its codes and scales, and clears the marks. On an error (a shard
  // missing or of the wrong size) the shards before it in name order are
  // requantized and their marks cleared; the rest keep theirs.
  Status Requantize(const MutableShardBytes& shards, Fp8Dirty* dirty) const;

  // The rank's shards built from canonical tensors: every element a piece
  // or copy maps holds the canonical element's bits, the rest (vocabulary
  // padding) zero; an FP8 shard's shadow so, and its codes and scales
  // quantized from it. What a serving rank loads before its first refit.
  // Errors as BuildShards'.
  Result<std::map<std::string, std::vector<std::byte>>> Build(
      const CanonicalBytes& canonical) const;

  // What a serving rank votes with: per canonical tensor (Layout::tensors
  // order), the linear digest of the canonical bits it holds in `shards`,
  // each region hashed at its canonical byte offset (HashShardRegions);
  // zero for a tensor it does not hold. ExpectedRegions computes the same
  // from canonical tensors (the root's target), without building shards:
  // the two agree iff the rank holds those bits (up to the digest's
  // collision bound); an FP8 tensor is hashed from its shadow. Errors as
  // HashShardRegions' and BuildShards'.
  Result<std::vector<LinearDigest>> HashRegions(const ShardBytes& shards) const;
  Result<std::vector<LinearDigest>> ExpectedRegions(
      const CanonicalBytes& canonical) const;
  // The one digest a serving rank's bits go by (its vote, its journal):
  // XXH3-128 over a tag, the layout's Fingerprint, the rank, and every
  // tensor's region digest in order (docs/PLACEMENT.md §"Serving relays").
  // Equal for two sets of regions iff they are equal (up to XXH3-128).
  Digest128 BitsDigest(const std::vector<LinearDigest>& regions) const;
  // The serving layout's Fingerprint (of the whole file, not held()).
  const Digest128& fingerprint() const { return fingerprint_; }
  // The rank's shard tensors as a store's manifest (the names of shards(),
  // FP8 codes, scales and shadows included), and the layout's canonical
  // tensors as a checkpoint's: what a serving store holds, and what the
  // refits it takes part in carry.
  Result<Manifest> StoreManifest() const;
  Result<Manifest> CanonicalManifest() const;

 private:
  // A box of a matrix (or vector) held as it lies, no transpose or
  // interleave: the common case, mapped a row at a time.
  struct Rows {
    bool ok = false;
    uint64_t cols = 1;  // of the canonical tensor (1-D: its length)
    uint64_t to_row = 0, to_col = 0, rows = 0, width = 0;  // the box
    uint64_t from_row = 0, from_col = 0, shard_cols = 1;   // in the shard
  };
  struct Held {
    PieceMap map;
    Rows rows;
    std::string shard;
    bool apply;  // false where an earlier tensor's box holds the same bits
  };
  static Rows RowsOf(const AffinePiece& p, const Shape& shape);
  // Whether the shard boxes of two pieces of one shard share an element.
  static bool BoxesMeet(const AffinePiece& a, const AffinePiece& b);
  // Applies positions [0, count) of `c` that `h` holds to `out`.
  // With `gather`, reads those elements into it instead (Gather).
  static Result<uint64_t> ApplyHeld(const Held& h, uint64_t first,
                                    const DecodedChunk& c, size_t count,
                                    size_t w, std::span<std::byte> out,
                                    Fp8BlockSet* marks, std::byte* gather);
  // Apply, or with `gather` Gather.
  Result<uint64_t> Visit(uint32_t tensor, uint64_t first, const DecodedChunk& c,
                         const MutableShardBytes& shards, Fp8Dirty* dirty,
                         std::span<std::byte> gather) const;
  ReceiverMap() = default;
  // Records tensor t's held FP8 pieces, refusing those that cut blocks.
  Status AddFp8(uint32_t tensor, const LayoutTensor& t,
                const std::vector<AffinePiece>& held);
  // Sorts each per-tensor FP8 shard's parts by their first element in it,
  // refusing parts whose boxes meet, and fills fp8_parts_.
  Status OrderFp8Parts();
  // Requantizes the marked parts of per-tensor FP8 shard `name`.
  Status RequantizePerTensor(const std::string& name, const Fp8Shard& f,
                             const MutableShardBytes& shards,
                             const Fp8BlockSet& marks) const;

  uint32_t rank_ = 0;
  Digest128 fingerprint_;
  // The layout cut down to what this rank holds: its pieces and its
  // copies (as pieces of this rank), no other rank's; FP8 shards appear
  // as their shadows (the canonical dtype, no fp8).
  Layout held_;
  std::map<std::string, Fp8Shard> fp8_;
  // Per-tensor FP8: each such tensor's boxes (as the layout places them,
  // in the codes shard) and, per tensor, the codes shards and parts its
  // changes mark.
  std::map<uint32_t, std::vector<AffinePiece>> fp8_boxes_;
  std::map<uint32_t, std::vector<std::pair<std::string, uint32_t>>> fp8_parts_;
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
