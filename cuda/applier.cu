// dcr/cuda.h ChunkApplier: decode on the CPU, stage through pinned
// buffers, apply on the GPU, each stage overlapping the others.
//
// Each staging slot has a pinned host buffer, a device buffer, its own
// stream and an event marking its apply done. A piece of a chunk's changes
// takes the next slot (waiting for that slot's previous apply), is copied
// into its pinned buffer and then to the device on the slot's stream; its
// apply waits on the previous piece's event, so applies keep the order of
// Apply() calls while the copies of later pieces run beside them.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Slot {
  void* host = nullptr;  // pinned
  DeviceBuffer device;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  bool used = false;
};

}  // namespace

struct ChunkApplier::Impl {
  Options options;
  size_t slot_bytes = 0;
  std::vector<Slot> slots;
  size_t next = 0;
  cudaEvent_t last = nullptr;   // the previous piece's apply
  cudaEvent_t input = nullptr;  // the caller's stream at Apply()
  std::unique_ptr<ChunkDecoder> decoder;
  DecodedChunk decoded;
  std::vector<std::byte> base;  // host copy of a span, for context chunks
  Stats stats;

  ~Impl() {
    if (input != nullptr) cudaEventDestroy(input);
    for (Slot& s : slots) {
      if (s.stream != nullptr) cudaStreamSynchronize(s.stream);
      if (s.done != nullptr) cudaEventDestroy(s.done);
      if (s.stream != nullptr) cudaStreamDestroy(s.stream);
      if (s.host != nullptr) cudaFreeHost(s.host);
    }
  }

  // Takes the next slot, lets `fill(host)` write `bytes` bytes into its
  // pinned buffer, copies them to the device and enqueues
  // `apply(device buffer, stream)` after the previous apply.
  template <typename Fill, typename F>
  Status Stage(size_t bytes, Fill&& fill, F&& apply) {
    Slot& s = slots[next];
    next = (next + 1) % slots.size();
    if (s.used) {
      const auto t0 = Clock::now();
      DCR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.done),
                               "waiting for a staging slot");
      stats.slot_wait_s += Since(t0);
    }
    fill(static_cast<std::byte*>(s.host));
    DCR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.device.data(), s.host, bytes,
                                             cudaMemcpyHostToDevice, s.stream),
                             "staging changes to the GPU");
    if (last != nullptr) {
      DCR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s.stream, last, 0),
                               "ordering applies");
    }
    // After what the caller's stream held at Apply(): the span's writers.
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s.stream, input, 0),
                             "ordering after the caller's stream");
    DCR_RETURN_IF_ERROR(
        apply(static_cast<std::byte*>(s.device.data()), s.stream));
    DCR_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.done, s.stream),
                             "cudaEventRecord");
    s.used = true;
    last = s.done;
    ++stats.pieces;
    stats.staged_bytes += bytes;
    return Status::OK();
  }
};

ChunkApplier::ChunkApplier(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ChunkApplier::~ChunkApplier() = default;

Result<std::unique_ptr<ChunkApplier>> ChunkApplier::Create(Options options) {
  if (options.slots < 1 || options.slots > 64) {
    return Status::InvalidArgument("a chunk applier takes 1 to 64 slots");
  }
  DCR_RETURN_IF_ERROR(RequireDevice());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->slot_bytes = options.staging_bytes / options.slots / 16 * 16;
  // A slot must hold at least one change of the widest element.
  if (impl->slot_bytes < 4096) {
    return Status::InvalidArgument(
        "a chunk applier needs at least 4 KiB of staging per slot, got " +
        std::to_string(options.staging_bytes) + " bytes for " +
        std::to_string(options.slots) + " slots");
  }
  DCR_ASSIGN_OR_RETURN(impl->decoder, ChunkDecoder::Create());
  DCR_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&impl->input, cudaEventDisableTiming),
      "cudaEventCreate");
  impl->slots.resize(options.slots);
  for (Slot& s : impl->slots) {
    DCR_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.host, impl->slot_bytes),
                             "cudaMallocHost of a staging slot");
    DCR_ASSIGN_OR_RETURN(s.device, DeviceBuffer::Allocate(impl->slot_bytes));
    DCR_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
        "cudaStreamCreate");
    DCR_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming),
        "cudaEventCreate");
  }
  return std::unique_ptr<ChunkApplier>(new ChunkApplier(std::move(impl)));
}

Status ChunkApplier::Apply(std::span<const std::byte> chunk, void* d_span,
                           uint64_t span_elems, Stream stream) {
  Impl& m = *impl_;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, PeekChunkHeader(chunk));
  if (h.span_elems != span_elems) {
    return Status::InvalidArgument(
        ChunkIdText(h.id) + ": the chunk is for a span of " +
        std::to_string(h.span_elems) + " elements, the device span has " +
        std::to_string(span_elems));
  }
  std::span<const std::byte> base;
  if (h.encoding == ChunkEncoding::kContext) {
    // Everything enqueued before must have landed, the caller's writes
    // and this applier's: the base is what the span holds once they have.
    DCR_RETURN_IF_ERROR(Flush());
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream),
                             "waiting for the caller's stream");
    m.base.resize(span_elems * h.elem_size);
    DCR_RETURN_IF_ERROR(CopyToHost(m.base, d_span));
    base = m.base;
  }
  const auto t0 = Clock::now();
  DCR_RETURN_IF_ERROR(m.decoder->Decode(chunk, &m.decoded, nullptr, base));
  m.stats.decode_s += Since(t0);
  const DecodedChunk& c = m.decoded;
  const size_t w = c.header.elem_size;
  const ChunkKind kind = c.header.kind;
  if (c.header.encoding != ChunkEncoding::kDense) {
    DCR_RETURN_IF_ERROR(ApplyDecoded(kind, w, d_span, span_elems, c.positions,
                                     c.values, stream));
    ++m.stats.chunks;
    return Status::OK();
  }
  DCR_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.input, stream),
                           "cudaEventRecord on the caller's stream");
  auto* span = static_cast<std::byte*>(d_span);
  const uint64_t per = m.slot_bytes / w;
  for (uint64_t at = 0; at < span_elems; at += per) {
    const uint64_t k = std::min<uint64_t>(per, span_elems - at);
    DCR_RETURN_IF_ERROR(m.Stage(
        k * w,
        [&](std::byte* h) { std::memcpy(h, c.values.data() + at * w, k * w); },
        [&](std::byte* d, cudaStream_t s) {
          return ApplyDense(kind, w, span + at * w, k, d, s);
        }));
  }
  ++m.stats.chunks;
  return Status::OK();
}

Status ChunkApplier::ApplyDecoded(ChunkKind kind, size_t elem_size,
                                  void* d_span, uint64_t span_elems,
                                  std::span<const uint32_t> positions,
                                  std::span<const std::byte> values,
                                  Stream stream) {
  Impl& m = *impl_;
  const size_t w = elem_size;
  if ((w != 1 && w != 2 && w != 4 && w != 8) ||
      values.size() != positions.size() * w) {
    return Status::InvalidArgument(
        "applying " + std::to_string(positions.size()) + " changes with " +
        std::to_string(values.size()) + " bytes of values of " +
        std::to_string(w) + " bytes each");
  }
  DCR_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.input, stream),
                           "cudaEventRecord on the caller's stream");
  // Room for the positions' padding to 16 bytes.
  const uint64_t per = (m.slot_bytes - 16) / (sizeof(uint32_t) + w);
  const uint64_t changes = positions.size();
  for (uint64_t at = 0; at < changes; at += per) {
    const uint64_t k = std::min<uint64_t>(per, changes - at);
    // Values start 16-byte aligned after the positions.
    const size_t values_at = (k * sizeof(uint32_t) + 15) / 16 * 16;
    DCR_RETURN_IF_ERROR(m.Stage(
        values_at + k * w,
        [&](std::byte* h) {
          std::memcpy(h, positions.data() + at, k * sizeof(uint32_t));
          std::memcpy(h + values_at, values.data() + at * w, k * w);
        },
        [&](std::byte* d, cudaStream_t s) {
          return ApplyChanges(kind, w, d_span, span_elems,
                              reinterpret_cast<const uint32_t*>(d),
                              d + values_at, k, s);
        }));
  }
  return Status::OK();
}

Status ChunkApplier::Flush() {
  Impl& m = *impl_;
  for (Slot& s : m.slots) {
    DCR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream),
                             "applying chunks on the GPU");
  }
  return CudaStatus(cudaGetLastError(), "applying chunks on the GPU");
}

const ChunkApplier::Stats& ChunkApplier::stats() const { return impl_->stats; }

}  // namespace dcr::cuda
