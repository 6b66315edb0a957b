// The placement layout: how a Megatron-style trainer's ranks hold the
// canonical (Hugging Face safetensors) tensors, read from YAML and resolved
// into affine pieces (dcr/placement.h). The schema is documented key by key
// in docs/PLACEMENT.md.
//
// A layout names the parallel configuration (tensor, pipeline and expert
// parallel sizes), the model's layers and experts, and one entry per
// canonical tensor or tensor family ("model.layers.{layer}.mlp.down_proj.
// weight"): the shard tensor that holds it on a rank and how (`split`).
// ResolveLayout expands the families and turns every entry into pieces,
// then checks that each canonical tensor is tiled exactly once.
//
// Producer ranks: the layout counts tp x ep x pp producers, numbered with
// tensor parallel fastest: rank = tp_rank + tp * (ep_rank + ep * pp_rank).
// Data-parallel replicas beyond the expert-parallel group hold copies and
// produce nothing. A tensor held by several ranks in full (a replicated
// norm, a router) is produced by one owner: the stage's rank with
// tp_rank = 0 and ep_rank = 0 (for an expert's tensors, the expert's rank
// with tp_rank = 0).
//
// Errors are InvalidArgument statuses naming the file, the 1-based line and
// the key path, and for a resolved tensor its name and the ranks involved:
//   "layout.yaml:12: tensors[3].split: expected one of replicated, column,
//    row, vocab, qkv, gate_up, pieces, got 'rows'"
//   "layout.yaml:18: tensors[2]: tensor 'model.layers.0.self_attn.q_proj.
//    weight': 4 kv_heads do not split evenly over tp 3"
//
// Thread safety: the types are values; the functions touch only their
// arguments (LoadLayout reads the file).
#ifndef DCR_LAYOUT_H_
#define DCR_LAYOUT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/digest.h"
#include "dcr/dtype.h"
#include "dcr/placement.h"
#include "dcr/status.h"

namespace dcr {

// The one layout schema version this build reads.
inline constexpr int kLayoutVersion = 1;

// How a shard holds its canonical tensor(s); docs/PLACEMENT.md has a
// figure for each.
enum class SplitKind : uint8_t {
  kReplicated,  // every rank of the group holds the whole tensor
  kColumn,      // column-parallel linear: dim 0 split evenly over tp
  kRow,         // row-parallel linear: dim 1 split evenly over tp
  kVocab,       // dim 0 padded to a multiple of `pad_to` x tp, then split
  kQkv,         // fused QKV with grouped-query attention (Megatron order)
  kGateUp,      // fused gate/up: each rank's gate rows, then its up rows
  kPieces,      // explicit affine pieces
};
std::string_view SplitKindName(SplitKind k);

// How a canonical value is computed from the shard's (the residual
// conversion). Whatever the conversion, equal shard bits give equal
// canonical bits, so a producer diffs shard bits and converts only the
// changed elements.
struct Conversion {
  DType shard_dtype = DType::kBF16;  // the shard tensor's element type
  // Added to the shard value before rounding (a zero-centred norm weight
  // stored as w - 1 has add = 1). 0: none.
  double add = 0;
  // True iff canonical bits are a copy of the shard's bits: same dtype and
  // nothing added. Otherwise the canonical value is the shard value (plus
  // `add`) rounded to nearest even in the canonical dtype.
  bool identity(DType canonical) const {
    return shard_dtype == canonical && add == 0;
  }
};

// A tensor a serving rank holds as FP8 (docs/PLACEMENT.md §"FP8
// serving"): its shard holds E4M3 codes (dcr/fp8.h) quantized in blocks
// of the shard, and `scale_shard` the F32 inverse scales, one per block;
// or, with a 0 x 0 block (`block: tensor`), one scale per canonical tensor
// the shard holds part of. Only serving layouts take it (ReceiverMap);
// producers refuse it.
struct Fp8Serving {
  uint32_t block_rows = 128, block_cols = 128;
  std::string scale_shard;  // families expanded
  bool per_tensor() const { return block_rows == 0 && block_cols == 0; }
};

// One canonical tensor, resolved.
struct LayoutTensor {
  std::string name;  // canonical name, families expanded
  Shape shape;
  DType dtype = DType::kBF16;
  Conversion conversion;
  std::vector<AffinePiece> pieces;  // of every rank; they tile `shape`
  // Where other ranks hold copies of the pieces (a producer ignores them;
  // a serving rank holds them too, ReceiverMap): a replicated tensor on
  // every tensor-parallel rank of its owner's group (copies_tp), a tensor
  // outside the experts on every expert-parallel group (copies_ep), each
  // on the same stage.
  bool copies_tp = false;
  bool copies_ep = false;
  std::optional<Fp8Serving> fp8;  // served as FP8 (serving layouts only)
  int line = 0;                   // of its entry in the layout file
};

// A shard tensor one rank must hand its producer.
struct LayoutShard {
  std::string name;  // the rank's local name, families expanded
  Shape shape;
  DType dtype = DType::kBF16;
};

struct Layout {
  std::string source;  // the file it was read from, for messages
  uint32_t tp = 1, pp = 1, ep = 1;
  uint32_t layers = 0;                // 0: no {layer} families
  std::vector<uint32_t> stages;       // layers per pipeline stage (pp of them)
  uint32_t experts = 0;               // 0: no {expert} families
  std::vector<LayoutTensor> tensors;  // in canonical name order

  uint32_t ranks() const { return tp * pp * ep; }
  // The shards rank `rank` holds, by name (each once, also when several
  // canonical tensors read it, as a tied embedding does).
  std::map<std::string, LayoutShard> ShardsOf(uint32_t rank) const;
  // A digest, independent of entry and piece order, of everything a producer
  // and the coordinator must agree on: ranks, tensors, shapes, dtypes,
  // conversions and pieces; and what a serving rank holds beyond them
  // (copies, fp8). Producers of different layouts are refused.
  Digest128 Fingerprint() const;
};

// Parses and resolves a layout from YAML text. `source_name` is used only
// in messages.
Result<Layout> ParseLayout(std::string_view text,
                           std::string_view source_name = "<layout>");
// Reads and parses a layout file (at most 16 MiB). A missing file is
// NotFound; everything else InvalidArgument.
Result<Layout> LoadLayout(const std::string& path);

}  // namespace dcr

#endif  // DCR_LAYOUT_H_
