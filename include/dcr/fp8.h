// FP8 serving weights (issue 18): the quantizer a receiver layout declares
// for a tensor served as FP8, specified bit for bit in docs/PLACEMENT.md
// §"FP8 serving", and the requantization of only the blocks a refit
// touched.
//
// A relay that serves a tensor as FP8 keeps the tensor's canonical bits (a
// shadow: BF16, F16 or F32), applies each delta there, marks the blocks
// the delta touched (Fp8BlockSet) and requantizes those blocks into the
// serving store's values and scales (RequantizeFp8). "Bit-exact" for such
// a tensor means: the values and scales are bit-identical to QuantizeFp8
// applied to the dense target.
//
// The format is OCP FP8 E4M3 ("E4M3FN" in PyTorch): bias 7, no
// infinities, S.1111.111 is NaN, largest finite 448, smallest subnormal
// 2^-9. The quantizer is the one DeepSeek-V3 and Qwen3 FP8 checkpoints
// are made with (a block's absolute maximum mapped to 448, the inverse
// scale stored as F32), with every rounding step fixed:
//
//   amax      = max |x| over the block's finite elements, in F32 (exact;
//               0 if it has none)
//   m         = max(amax, min_amax)
//   mult      = 448 / m        F32, rounded to nearest even
//   scale_inv = m / 448        F32, rounded to nearest even (stored)
//   q         = E4M3(x * mult) the product in F32, rounded to nearest
//               even, then Fp8E4M3FromF32
//
// A serving process dequantizes with q's value (Fp8E4M3Table) times
// scale_inv.
//
// Thread safety: the functions touch only their arguments; an Fp8BlockSet
// is a value, used by one thread at a time. RequantizeFp8 calls on
// disjoint block sets of one tensor may run concurrently.
#ifndef DCR_FP8_H_
#define DCR_FP8_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/status.h"

namespace dcr {

inline constexpr float kFp8E4M3Max = 448.0f;

// v rounded to nearest even in E4M3. Finite values beyond 448 and ±Inf
// saturate to ±448 (0x7E / 0xFE); NaN gives 0x7F with v's sign bit; the
// sign of a zero (also of a value rounded to zero) is kept.
uint8_t Fp8E4M3FromF32(float v);

// The value of every E4M3 code, NaN for 0x7F and 0xFF.
const float* Fp8E4M3Table();

// A block's scale floor: an all-zero block gets m = 1e-4 (as the DeepSeek
// quantizer's clamp), so its scale is finite and its values are zeros.
inline constexpr float kFp8DefaultMinAmax = 1e-4f;

// A canonical tensor quantized to E4M3, seen as a row-major [rows, cols]
// matrix (a 1-D tensor is [1, n]; a higher-rank one folds its leading
// dimensions into rows).
struct Fp8Tensor {
  DType dtype = DType::kBF16;  // of the canonical bits: BF16, F16 or F32
  uint64_t rows = 0, cols = 0;
  // The block shape; the last block of a row or column may be partial.
  // block_rows = block_cols = 0 means one scale for the whole tensor.
  uint32_t block_rows = 128, block_cols = 128;
  float min_amax = kFp8DefaultMinAmax;

  uint64_t elements() const { return rows * cols; }
  bool per_tensor() const { return block_rows == 0 && block_cols == 0; }
  // Blocks down and across; the scales are a row-major
  // [blocks_down, blocks_across] F32 matrix (one scale if per_tensor).
  uint64_t blocks_down() const;
  uint64_t blocks_across() const;
  uint64_t blocks() const { return blocks_down() * blocks_across(); }
};

// InvalidArgument unless `t` can be quantized: a floating dtype of 2 or 4
// bytes, rows * cols without overflow, both block sides set or both 0, and
// min_amax finite and at least 448 x 2^-126 (so that 448 / m is finite and
// m / 448 normal).
Status CheckFp8Tensor(const Fp8Tensor& t);

// Which blocks of a tensor must be requantized: those holding an element
// a refit changed.
class Fp8BlockSet {
 public:
  // No block marked. A tensor CheckFp8Tensor refuses gives an empty set.
  explicit Fp8BlockSet(const Fp8Tensor& t);

  // Marks the blocks holding elements offset + p for each p of
  // `positions` (any order); elements at or past t.elements() are ignored.
  void MarkElements(uint64_t offset, std::span<const uint32_t> positions);
  // Marks the blocks holding elements [first, first + count).
  void MarkRange(uint64_t first, uint64_t count);
  void MarkAll();

  // Marks the blocks `other` (a set of the same tensor) marks: how the
  // marks of threads that applied chunks concurrently are joined.
  void Merge(const Fp8BlockSet& other);

  bool marked(uint64_t block) const {
    return (bits_[block >> 6] >> (block & 63)) & 1;
  }
  uint64_t count() const;  // blocks marked
  uint64_t size() const { return blocks_; }
  void Clear();

 private:
  void Mark(uint64_t block) {
    bits_[block >> 6] |= uint64_t{1} << (block & 63);
  }
  void MarkCols(uint64_t block_row, uint64_t c0, uint64_t c1);

  uint64_t elements_, cols_, block_rows_, block_cols_, across_, blocks_;
  std::vector<uint64_t> bits_;
};

// Quantizes every block of `src` (t.elements() elements of t.dtype) into
// `q` (t.elements() codes, row-major like src) and `scale_inv`
// (t.blocks() scales).
Status QuantizeFp8(const Fp8Tensor& t, std::span<const std::byte> src,
                   std::span<uint8_t> q, std::span<float> scale_inv);

// Requantizes the blocks `blocks` marks, and only those, from `src` into
// `q` and `scale_inv`. If q and scale_inv held QuantizeFp8 of bits that
// differ from src only in marked blocks, they then hold QuantizeFp8(src).
Status RequantizeFp8(const Fp8Tensor& t, std::span<const std::byte> src,
                     const Fp8BlockSet& blocks, std::span<uint8_t> q,
                     std::span<float> scale_inv);

// One scale for the whole of a tensor: the quantizer's mult and scale_inv
// of its one block (t.per_tensor()).
struct Fp8Scale {
  float mult = 0, scale_inv = 0;
};

// The per-tensor scale of `src` (t.elements() elements of t.dtype; t's
// block shape must be 0 x 0): what QuantizeFp8 would store for it.
Result<Fp8Scale> Fp8TensorScale(const Fp8Tensor& t,
                                std::span<const std::byte> src);

// Codes of a box of a tensor with one scale, and of nothing else (a serving
// rank's slice of a tensor quantized per tensor): rows [row, row + rows)
// and columns [col, col + cols) of `src` (t.elements() elements of
// t.dtype, block shape 0 x 0) quantized with `scale.mult` into `q`, row r
// of the box at q[r * q_stride .. + cols). With the scale Fp8TensorScale
// gives, the codes equal QuantizeFp8's of the whole tensor at those
// elements. InvalidArgument if the box leaves the tensor or `q` is short.
Status QuantizeFp8Box(const Fp8Tensor& t, std::span<const std::byte> src,
                      Fp8Scale scale, uint64_t row, uint64_t col, uint64_t rows,
                      uint64_t cols, std::span<uint8_t> q, uint64_t q_stride);

}  // namespace dcr

#endif  // DCR_FP8_H_
