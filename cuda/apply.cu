// dcr/cuda.h ApplyChanges and ApplyDense: decoded changes into a device
// span, in place.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

constexpr int kThreads = 256;

// One change per thread (grid-stride). Positions are distinct, so no two
// threads write one element.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SparseKernel(T* span, uint64_t span_elems, const uint32_t* positions,
                 const T* values, uint64_t count, bool xor_values) {
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  for (uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    const uint32_t p = __ldcs(positions + i);
    if (p >= span_elems) continue;
    const T v = __ldcs(values + i);
    span[p] = xor_values ? T(span[p] ^ v) : v;
  }
}

// XOR of `bytes` bytes of `values` into `span`: 16 bytes per thread and
// step where both are aligned, else one byte.
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
    XorKernel(uint8_t* span, const uint8_t* values, uint64_t bytes) {
  const uint64_t stride = uint64_t(gridDim.x) * kThreads;
  const uint64_t first = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (kAligned) {
    const uint64_t vecs = bytes / 16;
    auto* s = reinterpret_cast<uint4*>(span);
    const auto* v = reinterpret_cast<const uint4*>(values);
    for (uint64_t i = first; i < vecs; i += stride) {
      uint4 a = s[i];
      const uint4 b = __ldcs(v + i);
      a.x ^= b.x;
      a.y ^= b.y;
      a.z ^= b.z;
      a.w ^= b.w;
      s[i] = a;
    }
    for (uint64_t i = vecs * 16 + first; i < bytes; i += stride) {
      span[i] ^= values[i];
    }
  } else {
    for (uint64_t i = first; i < bytes; i += stride) span[i] ^= values[i];
  }
}

int Blocks(uint64_t work) {
  static const int max_blocks = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return std::max(1, sms) * 16;
  }();
  const uint64_t want = (work + kThreads - 1) / kThreads;
  return static_cast<int>(
      std::min<uint64_t>(std::max<uint64_t>(want, 1), max_blocks));
}

Status CheckArgs(ChunkKind kind, size_t elem_size, const void* span,
                 const void* values) {
  if (kind != ChunkKind::kXor && kind != ChunkKind::kOverwrite) {
    return Status::InvalidArgument("CUDA apply: unknown chunk kind");
  }
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) {
    return Status::InvalidArgument("element size must be 1, 2, 4 or 8, got " +
                                   std::to_string(elem_size));
  }
  if (reinterpret_cast<uintptr_t>(span) % elem_size != 0 ||
      reinterpret_cast<uintptr_t>(values) % elem_size != 0) {
    return Status::InvalidArgument(
        "CUDA apply: span and values must be aligned to the element size (" +
        std::to_string(elem_size) + " bytes)");
  }
  return Status::OK();
}

}  // namespace

Status ApplyChanges(ChunkKind kind, size_t elem_size, void* d_span,
                    uint64_t span_elems, const uint32_t* d_positions,
                    const void* d_values, uint64_t count, Stream stream) {
  DCR_RETURN_IF_ERROR(CheckArgs(kind, elem_size, d_span, d_values));
  if (count == 0) return Status::OK();
  const bool x = kind == ChunkKind::kXor;
  const int blocks = Blocks(count);
  switch (elem_size) {
    case 1:
      SparseKernel<uint8_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<uint8_t*>(d_span), span_elems, d_positions,
          static_cast<const uint8_t*>(d_values), count, x);
      break;
    case 2:
      SparseKernel<uint16_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<uint16_t*>(d_span), span_elems, d_positions,
          static_cast<const uint16_t*>(d_values), count, x);
      break;
    case 4:
      SparseKernel<uint32_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<uint32_t*>(d_span), span_elems, d_positions,
          static_cast<const uint32_t*>(d_values), count, x);
      break;
    default:
      SparseKernel<uint64_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<uint64_t*>(d_span), span_elems, d_positions,
          static_cast<const uint64_t*>(d_values), count, x);
      break;
  }
  return LaunchStatus("the sparse apply kernel");
}

Status ApplyDense(ChunkKind kind, size_t elem_size, void* d_span,
                  uint64_t span_elems, const void* d_values, Stream stream) {
  DCR_RETURN_IF_ERROR(CheckArgs(kind, elem_size, d_span, d_values));
  const uint64_t bytes = span_elems * elem_size;
  if (bytes == 0) return Status::OK();
  if (kind == ChunkKind::kOverwrite) {
    return CudaStatus(cudaMemcpyAsync(d_span, d_values, bytes,
                                      cudaMemcpyDeviceToDevice, stream),
                      "the dense overwrite");
  }
  const bool aligned = reinterpret_cast<uintptr_t>(d_span) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(d_values) % 16 == 0;
  auto* s = static_cast<uint8_t*>(d_span);
  const auto* v = static_cast<const uint8_t*>(d_values);
  if (aligned) {
    XorKernel<true><<<Blocks(bytes / 16), kThreads, 0, stream>>>(s, v, bytes);
  } else {
    XorKernel<false><<<Blocks(bytes), kThreads, 0, stream>>>(s, v, bytes);
  }
  return LaunchStatus("the dense XOR kernel");
}

}  // namespace dcr::cuda
