// The FP8 quantizer of dcr/fp8.h. The per-element work is written without
// branches so the compiler vectorizes the BF16 and F32 loops.
#include "dcr/fp8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "dcr/shard_diff.h"

namespace dcr {
namespace {

constexpr uint32_t kF32Abs = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32Max448 = 0x43E00000u;         // 448.0f
constexpr uint32_t kF32MinNormalE4M3 = 0x3C800000u;  // 2^-6

// E4M3 of v; see Fp8E4M3FromF32. Branch-free: every path is computed and
// the answer selected.
[[gnu::always_inline]] inline uint8_t ToE4M3(float v) {
  const uint32_t b = std::bit_cast<uint32_t>(v);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & kF32Abs;
  // Normal: the exponent and the top 3 mantissa bits, rounded to nearest
  // even on the 20 bits dropped (a carry moves into the exponent), then
  // rebiased from 127 to 7.
  const uint32_t normal =
      ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  // Below 2^-6: the code is |v| / 2^-9 rounded to nearest even, which the
  // F32 addition of 2^23 does (its ulp there is 1); 8 is the smallest
  // normal's code, so a carry is right too.
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) * 512.0f + 8388608.0f) &
      0xFu;
  uint32_t code = a < kF32MinNormalE4M3 ? sub : normal;
  code = a >= kF32Max448 ? 0x7Eu : code;  // saturate, ±Inf included
  code = a > kF32Inf ? 0x7Fu : code;      // NaN
  return static_cast<uint8_t>(code | sign);
}

std::array<float, 256> BuildTable() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    float v;
    if ((c & 0x7Fu) == 0x7Fu) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (e == 0) {
      v = std::ldexp(static_cast<float>(m), -9);
    } else {
      v = std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
    }
    t[c] = (c & 0x80u) ? -v : v;
  }
  return t;
}

// The absolute value's bits of an element, as an unsigned integer whose
// order is |x|'s order among finite values, and the bound at and above
// which an element is not finite.
template <DType D>
struct Elem;
template <>
struct Elem<DType::kBF16> {
  using Bits = uint16_t;
  static constexpr Bits kAbs = 0x7FFF, kNonFinite = 0x7F80;
  static float ToF32(Bits b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
  }
};
template <>
struct Elem<DType::kF16> {
  using Bits = uint16_t;
  static constexpr Bits kAbs = 0x7FFF, kNonFinite = 0x7C00;
  static float ToF32(Bits b) { return HalfToFloat(b); }
};
template <>
struct Elem<DType::kF32> {
  using Bits = uint32_t;
  static constexpr Bits kAbs = kF32Abs, kNonFinite = kF32Inf;
  static float ToF32(Bits b) { return std::bit_cast<float>(b); }
};

struct Block {
  uint64_t r0, r1, c0, c1;
};

// The row loops, branch-free so the vectorizer takes them: the largest
// finite |x| (as bits) of n elements, and their codes given the block's
// multiplier.
template <DType D>
[[gnu::always_inline]] inline typename Elem<D>::Bits AmaxRowT(
    const std::byte* p, uint64_t n) {
  using E = Elem<D>;
  using Bits = typename E::Bits;
  Bits m = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Bits x;
    std::memcpy(&x, p + i * sizeof(Bits), sizeof(Bits));
    x = static_cast<Bits>(x & E::kAbs);
    // All ones where finite: a mask, not a select, keeps it a reduction.
    const Bits keep = static_cast<Bits>(0 - Bits{x < E::kNonFinite});
    m = std::max(m, static_cast<Bits>(x & keep));
  }
  return m;
}

template <DType D>
[[gnu::always_inline]] inline void QuantizeRowT(const std::byte* p, uint64_t n,
                                                float mult, uint8_t* out) {
  using E = Elem<D>;
  using Bits = typename E::Bits;
  for (uint64_t i = 0; i < n; ++i) {
    Bits x;
    std::memcpy(&x, p + i * sizeof(Bits), sizeof(Bits));
    out[i] = ToE4M3(E::ToF32(x) * mult);
  }
}

// BF16 and F32 rows are also compiled for AVX2 and AVX-512 and picked when
// the program loads (GCC's target_clones); F16 widens through a call.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCR_FP8_CLONES \
  [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#else
#define DCR_FP8_CLONES
#endif

DCR_FP8_CLONES uint16_t AmaxRowBf16(const std::byte* p, uint64_t n) {
  return AmaxRowT<DType::kBF16>(p, n);
}
DCR_FP8_CLONES uint32_t AmaxRowF32(const std::byte* p, uint64_t n) {
  return AmaxRowT<DType::kF32>(p, n);
}
DCR_FP8_CLONES void QuantizeRowBf16(const std::byte* p, uint64_t n, float mult,
                                    uint8_t* out) {
  QuantizeRowT<DType::kBF16>(p, n, mult, out);
}
DCR_FP8_CLONES void QuantizeRowF32(const std::byte* p, uint64_t n, float mult,
                                   uint8_t* out) {
  QuantizeRowT<DType::kF32>(p, n, mult, out);
}

template <DType D>
typename Elem<D>::Bits AmaxRow(const std::byte* p, uint64_t n) {
  if constexpr (D == DType::kBF16) return AmaxRowBf16(p, n);
  if constexpr (D == DType::kF32) return AmaxRowF32(p, n);
  return AmaxRowT<D>(p, n);
}

template <DType D>
void QuantizeRow(const std::byte* p, uint64_t n, float mult, uint8_t* out) {
  if constexpr (D == DType::kBF16) return QuantizeRowBf16(p, n, mult, out);
  if constexpr (D == DType::kF32) return QuantizeRowF32(p, n, mult, out);
  return QuantizeRowT<D>(p, n, mult, out);
}

template <DType D>
void QuantizeBlock(const Fp8Tensor& t, const std::byte* src, const Block& k,
                   uint8_t* q, float* scale_inv) {
  using E = Elem<D>;
  using Bits = typename E::Bits;
  const uint64_t width = k.c1 - k.c0;
  Bits amax = 0;
  for (uint64_t r = k.r0; r < k.r1; ++r) {
    amax = std::max(
        amax, AmaxRow<D>(src + (r * t.cols + k.c0) * sizeof(Bits), width));
  }
  const float m = std::max(E::ToF32(amax), t.min_amax);
  const float mult = kFp8E4M3Max / m;
  *scale_inv = m / kFp8E4M3Max;
  for (uint64_t r = k.r0; r < k.r1; ++r) {
    QuantizeRow<D>(src + (r * t.cols + k.c0) * sizeof(Bits), width, mult,
                   q + r * t.cols + k.c0);
  }
}

Block BlockAt(const Fp8Tensor& t, uint64_t b) {
  if (t.per_tensor()) return {0, t.rows, 0, t.cols};
  const uint64_t across = t.blocks_across();
  const uint64_t br = b / across, bc = b % across;
  return {br * t.block_rows, std::min(t.rows, (br + 1) * t.block_rows),
          bc * t.block_cols, std::min(t.cols, (bc + 1) * t.block_cols)};
}

Status CheckBuffers(const Fp8Tensor& t, std::span<const std::byte> src,
                    std::span<uint8_t> q, std::span<float> scale_inv) {
  DCR_RETURN_IF_ERROR(CheckFp8Tensor(t));
  if (src.size() != t.elements() * DTypeSize(t.dtype) ||
      q.size() != t.elements() || scale_inv.size() != t.blocks()) {
    return Status::InvalidArgument(
        "fp8: buffers of " + std::to_string(src.size()) + ", " +
        std::to_string(q.size()) + " and " + std::to_string(scale_inv.size()) +
        " where the tensor needs " +
        std::to_string(t.elements() * DTypeSize(t.dtype)) + " bytes, " +
        std::to_string(t.elements()) + " codes and " +
        std::to_string(t.blocks()) + " scales");
  }
  return Status::OK();
}

template <typename Each>
Status ForEachDType(const Fp8Tensor& t, Each&& each) {
  switch (t.dtype) {
    case DType::kBF16:
      each.template operator()<DType::kBF16>();
      break;
    case DType::kF16:
      each.template operator()<DType::kF16>();
      break;
    case DType::kF32:
      each.template operator()<DType::kF32>();
      break;
    default:
      return Status::InvalidArgument("fp8: unsupported dtype");
  }
  return Status::OK();
}

}  // namespace

uint8_t Fp8E4M3FromF32(float v) { return ToE4M3(v); }

const float* Fp8E4M3Table() {
  static const std::array<float, 256> table = BuildTable();
  return table.data();
}

uint64_t Fp8Tensor::blocks_down() const {
  if (per_tensor()) return 1;
  return block_rows == 0 ? 0 : (rows + block_rows - 1) / block_rows;
}

uint64_t Fp8Tensor::blocks_across() const {
  if (per_tensor()) return 1;
  return block_cols == 0 ? 0 : (cols + block_cols - 1) / block_cols;
}

Status CheckFp8Tensor(const Fp8Tensor& t) {
  if (t.dtype != DType::kBF16 && t.dtype != DType::kF16 &&
      t.dtype != DType::kF32) {
    return Status::InvalidArgument(
        "fp8: a tensor quantized to F8_E4M3 must be BF16, F16 or F32, not " +
        std::string(DTypeName(t.dtype)));
  }
  if (t.cols != 0 &&
      t.rows > std::numeric_limits<uint64_t>::max() / 4 / t.cols) {
    return Status::InvalidArgument("fp8: " + std::to_string(t.rows) + " x " +
                                   std::to_string(t.cols) +
                                   " elements overflow");
  }
  if ((t.block_rows == 0) != (t.block_cols == 0)) {
    return Status::InvalidArgument(
        "fp8: block shape " + std::to_string(t.block_rows) + " x " +
        std::to_string(t.block_cols) +
        ": set both sides, or both to 0 for one scale per tensor");
  }
  // Below 448 x the smallest normal F32, 448 / m overflows to infinity
  // and m / 448 is subnormal.
  if (!(t.min_amax >= kFp8E4M3Max * std::numeric_limits<float>::min()) ||
      !std::isfinite(t.min_amax)) {
    return Status::InvalidArgument(
        "fp8: min_amax must be a finite F32 of at least 448 x 2^-126 "
        "(about 5.3e-36)");
  }
  return Status::OK();
}

Fp8BlockSet::Fp8BlockSet(const Fp8Tensor& t)
    : elements_(0),
      cols_(1),
      block_rows_(1),
      block_cols_(1),
      across_(1),
      blocks_(0) {
  // A tensor CheckFp8Tensor refuses gets an empty set: nothing to mark.
  if (!CheckFp8Tensor(t).ok()) return;
  elements_ = t.elements();
  cols_ = std::max<uint64_t>(t.cols, 1);
  block_rows_ = t.per_tensor() ? std::max<uint64_t>(t.rows, 1) : t.block_rows;
  block_cols_ = t.per_tensor() ? std::max<uint64_t>(t.cols, 1) : t.block_cols;
  across_ = std::max<uint64_t>(t.blocks_across(), 1);
  // An empty tensor with one scale still has its block (and its scale).
  blocks_ = t.blocks();
  bits_.assign((blocks_ + 63) / 64, 0);
}

void Fp8BlockSet::Merge(const Fp8BlockSet& other) {
  for (size_t i = 0; i < bits_.size() && i < other.bits_.size(); ++i) {
    bits_[i] |= other.bits_[i];
  }
}

void Fp8BlockSet::MarkElements(uint64_t offset,
                               std::span<const uint32_t> positions) {
  // Positions usually ascend: the row of the last one saves a division.
  uint64_t row_first = 0, row_block = 0;  // the row's first element, block row
  bool have_row = false;
  for (uint32_t p : positions) {
    const uint64_t e = offset + p;
    if (e < offset || e >= elements_) continue;
    if (!have_row || e < row_first || e - row_first >= cols_) {
      const uint64_t r = e / cols_;
      row_first = r * cols_;
      row_block = (r / block_rows_) * across_;
      have_row = true;
    }
    Mark(row_block + (e - row_first) / block_cols_);
  }
}

void Fp8BlockSet::MarkRange(uint64_t first, uint64_t count) {
  if (first >= elements_ || count == 0) return;
  const uint64_t last = first + std::min(count, elements_ - first) - 1;
  const uint64_t r0 = first / cols_, r1 = last / cols_;
  if (r0 == r1) {
    MarkCols(r0 / block_rows_, first % cols_, last % cols_);
    return;
  }
  // The first row from its column, the whole rows between, the last row
  // up to its column.
  MarkCols(r0 / block_rows_, first % cols_, cols_ - 1);
  if (r0 + 1 < r1) {
    for (uint64_t br = (r0 + 1) / block_rows_; br <= (r1 - 1) / block_rows_;
         ++br) {
      MarkCols(br, 0, cols_ - 1);
    }
  }
  MarkCols(r1 / block_rows_, 0, last % cols_);
}

void Fp8BlockSet::MarkCols(uint64_t block_row, uint64_t c0, uint64_t c1) {
  for (uint64_t bc = c0 / block_cols_; bc <= c1 / block_cols_; ++bc) {
    Mark(block_row * across_ + bc);
  }
}

void Fp8BlockSet::MarkAll() {
  for (uint64_t b = 0; b < blocks_; ++b) Mark(b);
}

uint64_t Fp8BlockSet::count() const {
  uint64_t n = 0;
  for (uint64_t w : bits_) n += static_cast<uint64_t>(std::popcount(w));
  return n;
}

void Fp8BlockSet::Clear() { std::fill(bits_.begin(), bits_.end(), 0); }

Result<Fp8Scale> Fp8TensorScale(const Fp8Tensor& t,
                                std::span<const std::byte> src) {
  DCR_RETURN_IF_ERROR(CheckFp8Tensor(t));
  if (!t.per_tensor() || src.size() != t.elements() * DTypeSize(t.dtype)) {
    return Status::InvalidArgument(
        "fp8: a per-tensor scale needs a 0 x 0 block and the whole tensor");
  }
  Fp8Scale s;
  DCR_RETURN_IF_ERROR(ForEachDType(t, [&]<DType D>() {
    using E = Elem<D>;
    // Row by row: a row is at most what AmaxRow reads in one call.
    typename E::Bits amax = 0;
    for (uint64_t r = 0; r < t.rows; ++r) {
      amax = std::max(
          amax,
          AmaxRow<D>(src.data() + r * t.cols * DTypeSize(t.dtype), t.cols));
    }
    const float m = std::max(E::ToF32(amax), t.min_amax);
    s.mult = kFp8E4M3Max / m;
    s.scale_inv = m / kFp8E4M3Max;
  }));
  return s;
}

Status QuantizeFp8Box(const Fp8Tensor& t, std::span<const std::byte> src,
                      Fp8Scale scale, uint64_t row, uint64_t col, uint64_t rows,
                      uint64_t cols, std::span<uint8_t> q, uint64_t q_stride) {
  DCR_RETURN_IF_ERROR(CheckFp8Tensor(t));
  if (!t.per_tensor() || src.size() != t.elements() * DTypeSize(t.dtype) ||
      row > t.rows || rows > t.rows - row || col > t.cols ||
      cols > t.cols - col || q_stride == 0 || cols > q_stride ||
      (rows != 0 && (q.size() / q_stride < rows - 1 ||
                     q.size() - (rows - 1) * q_stride < cols))) {
    return Status::InvalidArgument(
        "fp8: box of " + std::to_string(rows) + "x" + std::to_string(cols) +
        " at [" + std::to_string(row) + ", " + std::to_string(col) +
        "] does not fit the tensor or its codes");
  }
  return ForEachDType(t, [&]<DType D>() {
    for (uint64_t r = 0; r < rows; ++r) {
      QuantizeRow<D>(
          src.data() + ((row + r) * t.cols + col) * DTypeSize(t.dtype), cols,
          scale.mult, q.data() + r * q_stride);
    }
  });
}

Status QuantizeFp8(const Fp8Tensor& t, std::span<const std::byte> src,
                   std::span<uint8_t> q, std::span<float> scale_inv) {
  Fp8BlockSet all(t);
  all.MarkAll();
  return RequantizeFp8(t, src, all, q, scale_inv);
}

Status RequantizeFp8(const Fp8Tensor& t, std::span<const std::byte> src,
                     const Fp8BlockSet& blocks, std::span<uint8_t> q,
                     std::span<float> scale_inv) {
  DCR_RETURN_IF_ERROR(CheckBuffers(t, src, q, scale_inv));
  if (blocks.size() != t.blocks()) {
    return Status::InvalidArgument("fp8: a block set of another tensor");
  }
  return ForEachDType(t, [&]<DType D>() {
    for (uint64_t b = 0; b < blocks.size(); ++b) {
      if (blocks.marked(b)) {
        QuantizeBlock<D>(t, src.data(), BlockAt(t, b), q.data(),
                         scale_inv.data() + b);
      }
    }
  });
}

}  // namespace dcr
