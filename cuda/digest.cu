// dcr/cuda.h Digester: LinearHash (dcr/digest.h) of device memory.
//
// L = XOR over 16-byte blocks X_b of X_b * K^(b + 1) in GF(2^128). Each warp
// takes a contiguous range of blocks starting at block `start`; lane t reads
// blocks start + 32 i + t (so a warp's loads are contiguous) and folds them
// by Horner's rule with the fixed multiplier K^32:
//
//   r_t = XOR over i of X_(start + 32 i + t) * K^(32 i),
//
// and the range contributes K^start * XOR over t of r_t * K^(t + 1).
// Multiplying by the fixed K^32 is 16 lookups in tables of 256 products per
// byte of the operand (64 KiB of shared memory per block); the per-lane
// and per-warp products are bitwise, as the CPU's generic kernel. Bytes
// before the first whole block and after the last are hashed on the CPU
// from a host copy (at most 30 bytes); linearity makes the parts add up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/linear_digest.h"
#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kBatch = 8;  // blocks per lane loaded before they are folded
constexpr size_t kTableEntries = 16 * 256;
constexpr size_t kTableBytes = kTableEntries * sizeof(ulonglong2);

struct Consts {
  ulonglong2 lane[32];  // K^(t + 1)
  ulonglong2 pow2[64];  // K^(2^j)
};

// a * b, bitwise (common/linear_digest.cc MultiplyGeneric).
__device__ __forceinline__ ulonglong2 Mul(ulonglong2 a, ulonglong2 b) {
  unsigned long long ol = 0, oh = 0, vl = a.x, vh = a.y;
#pragma unroll 4
  for (int i = 0; i < 128; ++i) {
    const unsigned long long w = i < 64 ? b.x : b.y;
    if ((w >> (i & 63)) & 1) {
      ol ^= vl;
      oh ^= vh;
    }
    const unsigned long long carry = vh >> 63;
    vh = (vh << 1) | (vl >> 63);
    vl = (vl << 1) ^ (carry ? 0x87ull : 0ull);
  }
  return make_ulonglong2(ol, oh);
}

// x * K^32 through the byte tables.
__device__ __forceinline__ ulonglong2 MulK32(const ulonglong2* tab,
                                             ulonglong2 x) {
  unsigned long long ol = 0, oh = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const ulonglong2 t = tab[j * 256 + ((x.x >> (8 * j)) & 0xff)];
    ol ^= t.x;
    oh ^= t.y;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const ulonglong2 t = tab[(8 + j) * 256 + ((x.y >> (8 * j)) & 0xff)];
    ol ^= t.x;
    oh ^= t.y;
  }
  return make_ulonglong2(ol, oh);
}

template <bool kAligned>
__device__ __forceinline__ ulonglong2 LoadBlock(const uint8_t* data, uint64_t g,
                                                uint64_t blocks) {
  if (g >= blocks) return make_ulonglong2(0, 0);
  if (kAligned) return __ldcs(reinterpret_cast<const ulonglong2*>(data) + g);
  unsigned long long lo = 0, hi = 0;
  const uint8_t* p = data + g * 16;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    lo |= static_cast<unsigned long long>(p[k]) << (8 * k);
    hi |= static_cast<unsigned long long>(p[8 + k]) << (8 * k);
  }
  return make_ulonglong2(lo, hi);
}

// `per_warp` is a multiple of 32 * kBatch.
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
    DigestKernel(const uint8_t* data, uint64_t blocks, uint64_t per_warp,
                 const ulonglong2* tables, const Consts* consts,
                 unsigned long long* out) {
  extern __shared__ ulonglong2 tab[];
  for (int i = threadIdx.x; i < int(kTableEntries); i += kThreads) {
    tab[i] = tables[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint64_t warp =
      uint64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const uint64_t start = warp * per_warp;
  if (start >= blocks) return;  // whole warps leave together
  const uint64_t rows = per_warp / 32;
  ulonglong2 acc = make_ulonglong2(0, 0);
  for (uint64_t r = rows; r > 0; r -= kBatch) {
    ulonglong2 x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      x[k] = LoadBlock<kAligned>(data, start + (r - 1 - k) * 32 + lane, blocks);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      acc = MulK32(tab, acc);
      acc.x ^= x[k].x;
      acc.y ^= x[k].y;
    }
  }
  acc = Mul(acc, consts->lane[lane]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    acc.x ^= __shfl_xor_sync(0xffffffffu, acc.x, d);
    acc.y ^= __shfl_xor_sync(0xffffffffu, acc.y, d);
  }
  if (lane == 0) {
    ulonglong2 k = make_ulonglong2(1, 0);
    for (int j = 0; j < 64; ++j) {
      if ((start >> j) & 1) k = Mul(k, consts->pow2[j]);
    }
    acc = Mul(acc, k);
    atomicXor(out, acc.x);
    atomicXor(out + 1, acc.y);
  }
}

ulonglong2 Pack(const LinearDigest& d) {
  return make_ulonglong2(d.low, d.high);
}

}  // namespace

struct Digester::Impl {
  DeviceBuffer tables;                     // kTableEntries ulonglong2
  DeviceBuffer consts;                     // Consts
  DeviceBuffer out;                        // 2 x u64
  unsigned long long* host_out = nullptr;  // pinned, 2 x u64
  std::byte* edge = nullptr;               // pinned, 32: head and tail
  int max_blocks = 0;                      // resident blocks of the kernel

  ~Impl() {
    if (host_out != nullptr) cudaFreeHost(host_out);
    if (edge != nullptr) cudaFreeHost(edge);
  }

  // XOR over whole blocks b < `blocks` at d of X_b * K^(b + 1).
  Result<LinearDigest> Body(const uint8_t* d, uint64_t blocks, Stream s) {
    const bool aligned = reinterpret_cast<uintptr_t>(d) % 16 == 0;
    const uint64_t unit = 32 * kBatch;
    const uint64_t warps_max = uint64_t(max_blocks) * kWarpsPerBlock;
    uint64_t per_warp = (blocks + warps_max - 1) / warps_max;
    per_warp = std::max<uint64_t>((per_warp + unit - 1) / unit * unit, unit);
    const uint64_t warps = (blocks + per_warp - 1) / per_warp;
    const auto grid =
        static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
    auto* o = static_cast<unsigned long long*>(out.data());
    DCR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o, 0, 16, s), "cudaMemsetAsync");
    const auto* t = static_cast<const ulonglong2*>(tables.data());
    const auto* c = static_cast<const Consts*>(consts.data());
    if (aligned) {
      DigestKernel<true>
          <<<grid, kThreads, kTableBytes, s>>>(d, blocks, per_warp, t, c, o);
    } else {
      DigestKernel<false>
          <<<grid, kThreads, kTableBytes, s>>>(d, blocks, per_warp, t, c, o);
    }
    DCR_RETURN_IF_ERROR(LaunchStatus("the digest kernel"));
    DCR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_out, o, 16, cudaMemcpyDeviceToHost, s),
        "reading the digest");
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "the digest");
    return LinearDigest{host_out[0], host_out[1]};
  }
};

Digester::Digester(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Digester::~Digester() = default;

Result<std::unique_ptr<Digester>> Digester::Create() {
  DCR_RETURN_IF_ERROR(RequireDevice());
  auto impl = std::make_unique<Impl>();
  // The tables of x * K^32 for x a single byte v at byte j of the operand.
  const LinearDigest k32 = linear_digest::Power(32);
  std::vector<ulonglong2> tables(kTableEntries);
  for (int j = 0; j < 16; ++j) {
    for (int v = 0; v < 256; ++v) {
      LinearDigest x;
      (j < 8 ? x.low : x.high) = static_cast<uint64_t>(v) << (8 * (j % 8));
      tables[j * 256 + v] = Pack(GfMultiply(x, k32));
    }
  }
  Consts c;
  for (int t = 0; t < 32; ++t) c.lane[t] = Pack(linear_digest::Power(t + 1));
  LinearDigest p = kLinearDigestKey;
  for (int j = 0; j < 64; ++j) {
    c.pow2[j] = Pack(p);
    p = GfMultiply(p, p);
  }
  DCR_ASSIGN_OR_RETURN(impl->tables, DeviceBuffer::Allocate(kTableBytes));
  DCR_ASSIGN_OR_RETURN(impl->consts, DeviceBuffer::Allocate(sizeof(Consts)));
  DCR_ASSIGN_OR_RETURN(impl->out, DeviceBuffer::Allocate(16));
  DCR_RETURN_IF_ERROR(CopyToDevice(impl->tables.data(),
                                   std::as_bytes(std::span<const ulonglong2>(
                                       tables.data(), tables.size()))));
  DCR_RETURN_IF_ERROR(CopyToDevice(
      impl->consts.data(), std::as_bytes(std::span<const Consts>(&c, 1))));
  DCR_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&impl->host_out), 16),
      "cudaMallocHost");
  DCR_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&impl->edge), 32),
      "cudaMallocHost");
  for (auto* fn : {DigestKernel<true>, DigestKernel<false>}) {
    DCR_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kTableBytes)),
        "raising the digest kernel's shared memory");
  }
  int per_sm = 0, dev = 0, sms = 0;
  DCR_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DigestKernel<true>,
                                                    kThreads, kTableBytes),
      "sizing the digest grid");
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  impl->max_blocks = std::max(1, per_sm) * std::max(1, sms);
  return std::unique_ptr<Digester>(new Digester(std::move(impl)));
}

Result<LinearDigest> Digester::LinearHash(uint64_t offset, const void* d_data,
                                          uint64_t bytes, Stream stream) {
  if (bytes == 0) return LinearDigest{};
  const auto* d = static_cast<const uint8_t*>(d_data);
  // Head: up to the string's next 16-byte boundary; tail: after the last
  // whole block. Both are hashed on the CPU.
  const uint64_t head = std::min<uint64_t>((16 - offset % 16) % 16, bytes);
  const uint64_t blocks = (bytes - head) / 16;
  const uint64_t tail = bytes - head - blocks * 16;
  // The edges are read on `stream`, after the work it holds (whatever
  // wrote the bytes), into pinned memory.
  const uint64_t at = head + blocks * 16;
  std::byte* edge = impl_->edge;
  if (head > 0) {
    DCR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(edge, d, head, cudaMemcpyDeviceToHost, stream),
        "reading the digest's head");
  }
  if (tail > 0) {
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(edge + 16, d + at, tail,
                                             cudaMemcpyDeviceToHost, stream),
                             "reading the digest's tail");
  }
  LinearDigest sum;
  if (blocks > 0) {
    // Synchronizes `stream`, so the edges have landed too.
    DCR_ASSIGN_OR_RETURN(LinearDigest body,
                         impl_->Body(d + head, blocks, stream));
    const uint64_t first_block = (offset + head) / 16;
    sum ^= first_block == 0
               ? body
               : GfMultiply(body, linear_digest::Power(first_block));
  } else {
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "the digest");
  }
  if (head > 0) {
    sum ^= dcr::LinearHash(offset, std::span<const std::byte>(edge, head));
  }
  if (tail > 0) {
    sum ^= dcr::LinearHash(offset + at,
                           std::span<const std::byte>(edge + 16, tail));
  }
  return sum;
}

Result<Digest128> Digester::TensorDigest(const void* d_data, uint64_t bytes,
                                         Stream stream) {
  DCR_ASSIGN_OR_RETURN(LinearDigest l, LinearHash(0, d_data, bytes, stream));
  return FinishTensorDigest(l, bytes);
}

}  // namespace dcr::cuda
