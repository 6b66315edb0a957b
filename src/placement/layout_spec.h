// The layout file as written, before its families are expanded and its
// entries turned into pieces: the parser's output and the resolver's input.
// Not part of the public API.
#ifndef DCR_PLACEMENT_LAYOUT_SPEC_H_
#define DCR_PLACEMENT_LAYOUT_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dcr/layout.h"

namespace dcr::layout_internal {

// Limits that keep a hostile or mistyped file from expanding without bound.
inline constexpr uint32_t kMaxParallel = 4096;     // tp, pp, ep each
inline constexpr uint32_t kMaxRanks = 65536;       // tp x pp x ep
inline constexpr uint32_t kMaxLayers = 100000;     // also experts
inline constexpr uint64_t kMaxTensors = 1u << 18;  // after expansion
inline constexpr size_t kMaxDims = 8;
inline constexpr uint64_t kMaxDim = 1ull << 40;      // one dimension's size
inline constexpr uint64_t kMaxHeads = 1u << 16;      // heads, kv_heads
inline constexpr size_t kMaxPieces = 4096;           // per explicit entry
inline constexpr uint64_t kMaxAllPieces = 1u << 20;  // after expansion
// The tiling check compares a tensor's pieces pairwise: at most this many
// comparisons over the whole layout.
inline constexpr uint64_t kMaxTilingWork = 1u << 26;
// Elements of one tensor or shard: its bytes stay far below 2^64.
inline constexpr uint64_t kMaxElements = 1ull << 56;

// "first" is stage 0; "last" is pp - 1, resolved once pp is known.
struct StageSpec {
  bool last = false;
  uint32_t index = 0;
};

struct EntrySpec {
  int line = 0;
  std::string path;  // "tensors[3]", for messages
  SplitKind split = SplitKind::kReplicated;
  std::vector<std::string> names;    // 1; 3 for qkv (q, k, v); 2 for gate_up
  std::string shard;                 // empty for kPieces
  Shape shape;                       // canonical shape (each, for gate_up)
  uint64_t pad_to = 128;             // kVocab
  std::optional<StageSpec> stage;    // for tensors outside the layers
  std::optional<DType> dtype;        // default: the file's
  std::optional<DType> shard_dtype;  // default: dtype
  double add = 0;
  bool transpose = false;
  uint64_t heads = 0, kv_heads = 0, head_dim = 0;  // kQkv
  // kQkv: Megatron's per-group interleave (false), or each rank's query
  // rows, then its key rows, then its value rows (vLLM and SGLang).
  bool stacked = false;
  // Served as FP8: the block shape, and the scale shard's name (empty:
  // the shard's name + "_scale_inv").
  std::optional<Fp8Serving> fp8;
  std::optional<uint64_t> columns;  // kQkv; none: a bias
  std::vector<AffinePiece> pieces;  // kPieces
};

struct LayoutSpec {
  std::string source;
  uint32_t tp = 1, pp = 1, ep = 1;
  uint32_t layers = 0;
  std::vector<uint32_t> stages;  // empty: an even split
  uint32_t experts = 0;
  DType dtype = DType::kBF16;
  std::vector<EntrySpec> entries;
  std::map<std::string, int, std::less<>> lines;  // top-level key -> line
};

// Parses the YAML text (after yaml_doc::CheckSafe).
Result<LayoutSpec> ParseLayoutSpec(std::string_view text,
                                   std::string_view source);
// Expands and checks a parsed spec.
Result<Layout> ResolveLayout(const LayoutSpec& spec);

}  // namespace dcr::layout_internal

#endif  // DCR_PLACEMENT_LAYOUT_SPEC_H_
