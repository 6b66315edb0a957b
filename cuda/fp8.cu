// dcr/cuda.h RequantizeFp8: dcr/fp8.h's block requantization on the GPU,
// one thread block per marked FP8 block, bit-identical to the CPU's (every
// rounding step is the F32 operation the format fixes; NaN's code takes
// the element's sign directly, since the GPU's arithmetic returns a
// canonical NaN where the CPU's keeps the operand's).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <string>
#include <vector>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"
#include "dcr/fp8.h"

namespace dcr::cuda {

namespace {

constexpr int kThreads = 256;

// dcr/fp8.h Fp8E4M3FromF32, on the device.
__device__ __forceinline__ uint8_t ToE4M3(float v) {
  const uint32_t b = __float_as_uint(v);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(0x7Fu | sign);
  if (a >= 0x43E00000u) return static_cast<uint8_t>(0x7Eu | sign);
  uint32_t code;
  if (a < 0x3C800000u) {  // below 2^-6: |v| / 2^-9 to nearest even
    code = __float_as_uint(
               __fadd_rn(__fmul_rn(__uint_as_float(a), 512.0f), 8388608.0f)) &
           0xFu;
  } else {
    code = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  }
  return static_cast<uint8_t>(code | sign);
}

__device__ __forceinline__ float HalfBitsToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    return __uint_as_float(
        __float_as_uint(__fmul_rn(static_cast<float>(mant), 0x1p-24f)) | sign);
  }
  if (exp == 31) return __uint_as_float(sign | 0x7F800000u | (mant << 13));
  return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// The canonical dtypes: their bits, |x|'s bits and order, and F32 value.
template <DType D>
struct Elem;
template <>
struct Elem<DType::kBF16> {
  using Bits = uint16_t;
  static constexpr uint32_t kAbs = 0x7FFF, kNonFinite = 0x7F80;
  __device__ static float ToF32(Bits b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  }
};
template <>
struct Elem<DType::kF16> {
  using Bits = uint16_t;
  static constexpr uint32_t kAbs = 0x7FFF, kNonFinite = 0x7C00;
  __device__ static float ToF32(Bits b) { return HalfBitsToF32(b); }
};
template <>
struct Elem<DType::kF32> {
  using Bits = uint32_t;
  static constexpr uint32_t kAbs = 0x7FFFFFFF, kNonFinite = 0x7F800000;
  __device__ static float ToF32(Bits b) { return __uint_as_float(b); }
};

struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const {
    return a > b ? a : b;
  }
};

struct Shape {
  uint64_t rows, cols, block_rows, block_cols, across;
  float min_amax;
};

template <DType D>
__global__ void __launch_bounds__(kThreads)
    RequantKernel(Shape s, const typename Elem<D>::Bits* src,
                  const uint32_t* blocks, uint8_t* q, float* scale_inv) {
  using E = Elem<D>;
  const uint64_t b = blocks[blockIdx.x];
  const uint64_t br = b / s.across, bc = b % s.across;
  const uint64_t r0 = br * s.block_rows, c0 = bc * s.block_cols;
  const uint64_t r1 = min(s.rows, r0 + s.block_rows);
  const uint64_t c1 = min(s.cols, c0 + s.block_cols);
  // A block holds fewer than 2^32 elements (RequantizeFp8 checks), so
  // the index arithmetic is 32-bit.
  const uint32_t width = static_cast<uint32_t>(c1 - c0);
  const uint32_t n = static_cast<uint32_t>((r1 - r0) * width);
  const typename E::Bits* base = src + r0 * s.cols + c0;
  // The largest finite |x|, as bits (their order is |x|'s).
  uint32_t amax = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t r = i / width;
    const uint32_t x = base[r * s.cols + (i - r * width)] & E::kAbs;
    if (x < E::kNonFinite) amax = max(amax, x);
  }
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float mult;
  const uint32_t block_max = Reduce(tmp).Reduce(amax, MaxOp());
  if (threadIdx.x == 0) {
    const float m =
        fmaxf(E::ToF32(static_cast<typename E::Bits>(block_max)), s.min_amax);
    mult = __fdiv_rn(448.0f, m);
    scale_inv[b] = __fdiv_rn(m, 448.0f);
  }
  __syncthreads();
  const float k = mult;
  uint8_t* out = q + r0 * s.cols + c0;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t r = i / width;
    const uint64_t at = r * s.cols + (i - r * width);
    const typename E::Bits x = base[at];
    const float f = E::ToF32(x);
    out[at] =
        isnan(f)
            ? static_cast<uint8_t>(0x7Fu | ((__float_as_uint(f) >> 24) & 0x80u))
            : ToE4M3(__fmul_rn(f, k));
  }
}

}  // namespace

Status RequantizeFp8(const Fp8Tensor& t, const void* d_src,
                     const Fp8BlockSet& blocks, uint8_t* d_q,
                     float* d_scale_inv, Stream stream) {
  DCR_RETURN_IF_ERROR(CheckFp8Tensor(t));
  if (t.per_tensor()) {
    return Status::Unsupported(
        "GPU FP8 requantization is block-wise; a per-tensor scale is "
        "requantized on the CPU");
  }
  if (blocks.size() != t.blocks()) {
    return Status::InvalidArgument("fp8: a block set of another tensor");
  }
  std::vector<uint32_t> list;
  for (uint64_t b = 0; b < blocks.size(); ++b) {
    if (blocks.marked(b)) list.push_back(static_cast<uint32_t>(b));
  }
  if (list.empty()) return Status::OK();
  if (uint64_t{t.block_rows} * t.block_cols > UINT32_MAX) {
    return Status::Unsupported("fp8: blocks of 2^32 elements or more");
  }
  if (t.blocks() > UINT32_MAX) {
    return Status::Unsupported("fp8: more than 2^32 blocks in one tensor");
  }
  DCR_ASSIGN_OR_RETURN(DeviceBuffer d_list,
                       DeviceBuffer::Allocate(list.size() * sizeof(uint32_t)));
  // On `stream`, so the kernel after it reads the list as copied.
  DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_list.data(), list.data(),
                                           list.size() * sizeof(uint32_t),
                                           cudaMemcpyHostToDevice, stream),
                           "copying the block list");
  const Shape s{
      t.rows,    t.cols, t.block_rows, t.block_cols, t.blocks_across(),
      t.min_amax};
  const auto* ids = static_cast<const uint32_t*>(d_list.data());
  const auto grid = static_cast<unsigned>(list.size());
  switch (t.dtype) {
    case DType::kBF16:
      RequantKernel<DType::kBF16><<<grid, kThreads, 0, stream>>>(
          s, static_cast<const uint16_t*>(d_src), ids, d_q, d_scale_inv);
      break;
    case DType::kF16:
      RequantKernel<DType::kF16><<<grid, kThreads, 0, stream>>>(
          s, static_cast<const uint16_t*>(d_src), ids, d_q, d_scale_inv);
      break;
    default:
      RequantKernel<DType::kF32><<<grid, kThreads, 0, stream>>>(
          s, static_cast<const uint32_t*>(d_src), ids, d_q, d_scale_inv);
      break;
  }
  DCR_RETURN_IF_ERROR(LaunchStatus("the FP8 requantization kernel"));
  // d_list is freed on return: wait for the kernel that reads it.
  return CudaStatus(cudaStreamSynchronize(stream), "FP8 requantization");
}

}  // namespace dcr::cuda
