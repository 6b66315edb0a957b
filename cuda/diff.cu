// dcr/cuda.h Differ: changed elements of two device spans, by stream
// compaction in two passes over 16 KiB tiles.
//
//   1. count: each block counts the changed elements of its tile;
//   2. scan: an exclusive sum of the counts gives each tile's first output
//      slot (and, one past the last tile, the total);
//   3. write: each block reads its tile again and writes the positions and
//      values of its changes from that slot, in element order.
//
// A tile is kVecs 16-byte vectors per thread, read so that a warp's loads
// are contiguous (vector u * kThreads + thread), and scanned one vector
// round at a time, so positions come out ascending. A tile with no change
// is not read twice. Elements compare as unsigned integers: NaN payloads,
// signed zeros and denormals are bits like any other.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <memory>
#include <string>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kVecs = 4;
constexpr uint64_t kTileBytes = 16ull * kThreads * kVecs;

// 16-byte aligned: loaded and stored whole as a uint4.
template <typename T>
struct alignas(16) Lanes {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

// Loads the elements [first, first + kCount) that are < n; the rest read as
// zero in both spans, so they never count as changed.
template <typename T, bool kAligned>
__device__ __forceinline__ void LoadLanes(const T* p, uint64_t first,
                                          uint64_t n, Lanes<T>* out) {
  constexpr int kCount = Lanes<T>::kCount;
  if (kAligned && first + kCount <= n) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p + first));
    *reinterpret_cast<uint4*>(out->v) = u;
    return;
  }
#pragma unroll
  for (int e = 0; e < kCount; ++e) {
    out->v[e] = first + e < n ? p[first + e] : T(0);
  }
}

template <typename T>
__device__ __forceinline__ int CountLanes(const Lanes<T>& b,
                                          const Lanes<T>& t) {
  int c = 0;
#pragma unroll
  for (int e = 0; e < Lanes<T>::kCount; ++e) c += b.v[e] != t.v[e];
  return c;
}

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    CountKernel(const T* base, const T* target, uint64_t n, uint32_t* counts) {
  constexpr uint64_t kTileElems = kTileBytes / sizeof(T);
  const uint64_t tile_first = blockIdx.x * kTileElems;
  int c = 0;
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const uint64_t first =
        tile_first + (uint64_t(u) * kThreads + threadIdx.x) * Lanes<T>::kCount;
    if (first < n) {
      Lanes<T> b, t;
      LoadLanes<T, kAligned>(base, first, n, &b);
      LoadLanes<T, kAligned>(target, first, n, &t);
      c += CountLanes(b, t);
    }
  }
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) counts[blockIdx.x] = static_cast<uint32_t>(total);
}

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    WriteKernel(const T* base, const T* target, uint64_t n,
                const uint32_t* offsets, bool xor_values, uint32_t* positions,
                T* values) {
  uint32_t out = offsets[blockIdx.x];
  if (offsets[blockIdx.x + 1] == out) return;  // nothing changed here
  constexpr uint64_t kTileElems = kTileBytes / sizeof(T);
  constexpr int kCount = Lanes<T>::kCount;
  const uint64_t tile_first = blockIdx.x * kTileElems;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  for (int u = 0; u < kVecs; ++u) {
    const uint64_t first =
        tile_first + (uint64_t(u) * kThreads + threadIdx.x) * kCount;
    Lanes<T> b, t;
    int c = 0;
    if (first < n) {
      LoadLanes<T, kAligned>(base, first, n, &b);
      LoadLanes<T, kAligned>(target, first, n, &t);
      c = CountLanes(b, t);
    }
    int offset = 0, total = 0;
    Scan(tmp).ExclusiveSum(c, offset, total);
    if (c > 0) {
      uint32_t k = out + static_cast<uint32_t>(offset);
#pragma unroll
      for (int e = 0; e < kCount; ++e) {
        if (b.v[e] != t.v[e]) {
          positions[k] = static_cast<uint32_t>(first + e);
          values[k] = xor_values ? T(b.v[e] ^ t.v[e]) : t.v[e];
          ++k;
        }
      }
    }
    out += static_cast<uint32_t>(total);
    __syncthreads();  // tmp is reused by the next round
  }
}

uint64_t Tiles(uint64_t n, size_t elem_size) {
  const uint64_t tile_elems = kTileBytes / elem_size;
  return (n + tile_elems - 1) / tile_elems;
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

struct Differ::Impl {
  uint64_t max_elems = 0;
  uint64_t max_tiles = 0;
  DeviceBuffer counts;   // max_tiles + 1
  DeviceBuffer offsets;  // max_tiles + 1
  DeviceBuffer scan_tmp;
  uint32_t* host_total = nullptr;  // pinned

  ~Impl() {
    if (host_total != nullptr) cudaFreeHost(host_total);
  }

  template <typename T>
  Status Run(const void* base, const void* target, uint64_t n, bool xor_values,
             uint32_t* positions, void* values, Stream s) {
    const uint64_t tiles = Tiles(n, sizeof(T));
    auto* c = static_cast<uint32_t*>(counts.data());
    auto* o = static_cast<uint32_t*>(offsets.data());
    const T* b = static_cast<const T*>(base);
    const T* t = static_cast<const T*>(target);
    const bool aligned = Aligned16(base) && Aligned16(target);
    DCR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c + tiles, 0, sizeof(uint32_t), s),
                             "cudaMemsetAsync");
    if (aligned) {
      CountKernel<T, true><<<tiles, kThreads, 0, s>>>(b, t, n, c);
    } else {
      CountKernel<T, false><<<tiles, kThreads, 0, s>>>(b, t, n, c);
    }
    DCR_RETURN_IF_ERROR(LaunchStatus("the diff count kernel"));
    size_t tmp_bytes = scan_tmp.size();
    DCR_CUDA_RETURN_IF_ERROR(
        cub::DeviceScan::ExclusiveSum(scan_tmp.data(), tmp_bytes, c, o,
                                      static_cast<int>(tiles + 1), s),
        "the diff scan");
    if (aligned) {
      WriteKernel<T, true><<<tiles, kThreads, 0, s>>>(
          b, t, n, o, xor_values, positions, static_cast<T*>(values));
    } else {
      WriteKernel<T, false><<<tiles, kThreads, 0, s>>>(
          b, t, n, o, xor_values, positions, static_cast<T*>(values));
    }
    DCR_RETURN_IF_ERROR(LaunchStatus("the diff write kernel"));
    DCR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_total, o + tiles, sizeof(uint32_t),
                        cudaMemcpyDeviceToHost, s),
        "reading the change count");
    return CudaStatus(cudaStreamSynchronize(s), "the diff");
  }
};

Differ::Differ(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Differ::~Differ() = default;

Result<std::unique_ptr<Differ>> Differ::Create(uint64_t max_elems) {
  if (max_elems == 0 || max_elems > kMaxDiffElems) {
    return Status::InvalidArgument(
        "a CUDA differ takes 1 to 2^32 - 1 elements, not " +
        std::to_string(max_elems));
  }
  DCR_RETURN_IF_ERROR(RequireDevice());
  auto impl = std::make_unique<Impl>();
  impl->max_elems = max_elems;
  // Tiles are 16 KiB, so the widest elements make the most of them.
  impl->max_tiles = Tiles(max_elems, 8);
  const uint64_t slots = impl->max_tiles + 1;
  DCR_ASSIGN_OR_RETURN(impl->counts,
                       DeviceBuffer::Allocate(slots * sizeof(uint32_t)));
  DCR_ASSIGN_OR_RETURN(impl->offsets,
                       DeviceBuffer::Allocate(slots * sizeof(uint32_t)));
  size_t tmp_bytes = 0;
  DCR_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::ExclusiveSum(
          nullptr, tmp_bytes, static_cast<uint32_t*>(nullptr),
          static_cast<uint32_t*>(nullptr), static_cast<int>(slots)),
      "sizing the diff scan");
  DCR_ASSIGN_OR_RETURN(impl->scan_tmp,
                       DeviceBuffer::Allocate(tmp_bytes > 0 ? tmp_bytes : 1));
  DCR_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&impl->host_total),
                     sizeof(uint32_t)),
      "cudaMallocHost");
  return std::unique_ptr<Differ>(new Differ(std::move(impl)));
}

Result<uint64_t> Differ::FindChanges(size_t elem_size, const void* d_base,
                                     const void* d_target, uint64_t n,
                                     bool xor_values, uint32_t* d_positions,
                                     void* d_values, Stream stream) {
  Impl& m = *impl_;
  if (n > m.max_elems) {
    return Status::InvalidArgument("CUDA diff of " + std::to_string(n) +
                                   " elements; this differ takes " +
                                   std::to_string(m.max_elems));
  }
  if (n == 0) return uint64_t{0};
  const auto misaligned = [&](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % elem_size != 0;
  };
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) {
    return Status::InvalidArgument("element size must be 1, 2, 4 or 8, got " +
                                   std::to_string(elem_size));
  }
  if (misaligned(d_base) || misaligned(d_target) || misaligned(d_values)) {
    return Status::InvalidArgument(
        "CUDA diff: spans and values must be aligned to the element size (" +
        std::to_string(elem_size) + " bytes)");
  }
  auto run = [&]<typename T>(T*) {
    return m.Run<T>(d_base, d_target, n, xor_values, d_positions, d_values,
                    stream);
  };
  DCR_RETURN_IF_ERROR(elem_size == 1   ? run(static_cast<uint8_t*>(nullptr))
                      : elem_size == 2 ? run(static_cast<uint16_t*>(nullptr))
                      : elem_size == 4 ? run(static_cast<uint32_t*>(nullptr))
                                       : run(static_cast<uint64_t*>(nullptr)));
  return uint64_t{*m.host_total};
}

}  // namespace dcr::cuda
