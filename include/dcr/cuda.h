// The codec's hot loops on an NVIDIA GPU (cuda/, built with -DDCR_CUDA):
// finding the changed elements of two device-resident spans, applying
// decoded changes to a device-resident span in place, and the tensor
// digest of device memory. Each result is bit-identical to its CPU
// counterpart (codec/diff.h FindChanges, ApplyChunk, dcr/digest.h), so a
// producer can diff where the trainer's shard lives and a relay can apply
// where the server reads, and the chunks and digests they exchange with
// CPU peers are the same bytes.
//
// A build without CUDA has the same functions: Built() is false and every
// call returns Unsupported saying how to build with it. With CUDA but no
// usable GPU, calls return Unsupported naming the driver's reason.
//
// Pointers named `d_*` are device pointers (cudaMalloc, or a CUDA IPC
// mapping) of the current device; `stream` is a cudaStream_t (null: the
// legacy default stream). Calls that return a count or a digest
// synchronize `stream` before they return; the others only enqueue work.
//
// Thread safety: a Differ or Digester is used by one thread at a time.
// The free functions are thread-safe.
#ifndef DCR_CUDA_H_
#define DCR_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"
#include "dcr/fp8.h"
#include "dcr/shard_memory.h"
#include "dcr/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace dcr {
class ReceiverMap;  // dcr/receiver_map.h
}  // namespace dcr

namespace dcr::cuda {

using Stream = CUstream_st*;

// True iff this build compiled the CUDA kernels.
bool Built();

struct DeviceInfo {
  int index = 0;
  std::string name;  // "NVIDIA H200"
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  uint64_t memory_bytes = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;  // "0000:19:00.0"
  // Whether cudaIpcGetMemHandle works on an allocation of this device (the
  // prerequisite for a relay applying into a serving process's buffers);
  // `ipc_detail` gives the driver's error when not.
  bool ipc = false;
  std::string ipc_detail;
};

struct Runtime {
  int driver_version = 0;   // 13000 for CUDA 13.0 (cudaDriverGetVersion)
  int runtime_version = 0;  // of the runtime dcr was built with
  std::vector<DeviceInfo> devices;
};

// The driver and every visible device. Unsupported when this build has no
// CUDA, or when the driver reports no usable device (the message says why:
// no driver, no device, a driver older than the runtime).
Result<Runtime> Probe();

// Device memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // cudaMalloc of `bytes` (> 0) on the current device.
  static Result<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  DeviceBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Synchronous copies between host and device memory (tests, tools).
Status CopyToDevice(void* d_dst, std::span<const std::byte> src);
Status CopyToHost(std::span<std::byte> dst, const void* d_src);
// Device-to-device copy of `bytes` bytes (cudaMemcpyAsync; enqueues).
Status CopyOnDevice(void* d_dst, const void* d_src, size_t bytes,
                    Stream stream = nullptr);
// Sets `bytes` bytes at d_dst to `value` (poisoning outputs in tests).
Status Fill(void* d_dst, uint8_t value, size_t bytes);
Status Synchronize(Stream stream);
// A non-blocking stream of the current device, destroyed with the object
// (after the work queued on it).
class OwnedStream {
 public:
  static Result<OwnedStream> Create();
  OwnedStream() = default;
  ~OwnedStream();
  OwnedStream(OwnedStream&& o) noexcept;
  OwnedStream& operator=(OwnedStream&& o) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  explicit OwnedStream(Stream s) : stream_(s) {}
  Stream stream_ = nullptr;
};

// Makes device `index` current for this thread (cudaSetDevice).
// Unsupported where no device is usable (no driver, an old one, none).
Status UseDevice(int index);
// The PCI bus id of device `index` ("0000:19:00.0"), without creating a
// context on it.
Result<std::string> PciBusId(int index);
// The device current for this thread (cudaGetDevice).
Result<int> CurrentDevice();
// The device whose memory holds `p` (device or managed memory), or -1 for
// host memory, pinned or not (cudaPointerGetAttributes).
Result<int> DeviceOfPointer(const void* p);

// The most elements one FindChanges call takes: positions are 32-bit.
inline constexpr uint64_t kMaxDiffElems = (1ull << 32) - 1;

// Finds changed elements on the GPU (stream compaction). Holds scratch
// sized for `max_elems` elements.
class Differ {
 public:
  static Result<std::unique_ptr<Differ>> Create(uint64_t max_elems);
  ~Differ();
  Differ(const Differ&) = delete;
  Differ& operator=(const Differ&) = delete;

  // Scans `n` (<= max_elems) elements of `elem_size` (1, 2, 4 or 8) bytes at
  // d_base and d_target. For every element whose bits differ, in ascending
  // order, writes its index to d_positions[k] and its value to
  // d_values[k * elem_size ..]: base ^ target when `xor_values`, else
  // target. d_positions must have room for n entries and d_values for
  // n * elem_size bytes. Returns the number of changed elements (and
  // synchronizes `stream`). The same positions and values, split into byte
  // planes, as codec/diff.h FindChanges on the same bits. Any alignment
  // works; 16-byte-aligned spans take the fast path.
  Result<uint64_t> FindChanges(size_t elem_size, const void* d_base,
                               const void* d_target, uint64_t n,
                               bool xor_values, uint32_t* d_positions,
                               void* d_values, Stream stream = nullptr);

 private:
  struct Impl;
  explicit Differ(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Applies `count` changes to the span at d_span (`span_elems` elements of
// `elem_size` bytes), in place: element d_positions[k] becomes
// (old ^ value) for ChunkKind::kXor or value for kOverwrite, with value at
// d_values[k * elem_size ..]. Positions must be distinct and < span_elems
// (a DecodedChunk's are: ChunkDecoder validated them); out-of-range
// positions are skipped, never written. Enqueues on `stream`.
Status ApplyChanges(ChunkKind kind, size_t elem_size, void* d_span,
                    uint64_t span_elems, const uint32_t* d_positions,
                    const void* d_values, uint64_t count,
                    Stream stream = nullptr);

// Applies a dense chunk's values to every element of the span (XOR or
// overwrite): `span_elems * elem_size` bytes at d_values.
Status ApplyDense(ChunkKind kind, size_t elem_size, void* d_span,
                  uint64_t span_elems, const void* d_values,
                  Stream stream = nullptr);

// Applies encoded chunks to device-resident spans: decodes each on the
// calling thread (dcr/codec.h ChunkDecoder, with all its validation),
// stages the changes through pinned host buffers and applies them on the
// GPU, so that the copy of one chunk's changes and the apply of the last
// overlap the decode of the next. Memory: `staging_bytes` of pinned host
// memory and as much device memory, whatever the chunk sizes (a chunk
// whose changes do not fit one slot goes in pieces).
//
// Order: applies run in the order Apply() was called (each waits on the
// one before), so a repair's overwrite after a chunk's XOR lands after it.
// A chunk that fails to decode or validate changes nothing and leaves the
// applier usable; an error the GPU raises leaves the span's bits unknown
// (as a failed write to a host store does: the refit repairs the span
// with an overwrite). Apply() returns once the changes are staged; Flush()
// waits for everything enqueued and reports an error the GPU raised since the
// last Flush(). One thread at a time; use one applier per decoding thread.
class ChunkApplier {
 public:
  struct Options {
    size_t staging_bytes = 64 << 20;  // pinned host, and as much on device
    int slots = 4;                    // staging buffers in flight
  };
  struct Stats {
    uint64_t chunks = 0;
    uint64_t pieces = 0;        // staging slots used
    uint64_t staged_bytes = 0;  // positions and values copied to the GPU
    double decode_s = 0;        // decoding on the calling thread
    double slot_wait_s = 0;     // waiting for a free staging slot
  };

  static Result<std::unique_ptr<ChunkApplier>> Create(Options options);
  ~ChunkApplier();
  ChunkApplier(const ChunkApplier&) = delete;
  ChunkApplier& operator=(const ChunkApplier&) = delete;

  // Decodes `chunk` and enqueues its application to the span at d_span,
  // which holds `span_elems` elements of the chunk's element size (its
  // header's span_elems must match: InvalidArgument otherwise, nothing
  // written). The apply runs after the work `stream` holds now (whatever
  // wrote the span: a framework's kernels, a copy), on the applier's own
  // streams. A context-coded chunk is decoded against a host copy of the
  // span, read back first (it decodes only against the base bits). The
  // applier uses the device that was current at Create().
  Status Apply(std::span<const std::byte> chunk, void* d_span,
               uint64_t span_elems, Stream stream = nullptr);
  // Enqueues changes decoded elsewhere (a relay's diff of two host
  // images) the way Apply enqueues a chunk's: element positions[k] of the
  // span becomes (old ^ value) or value, the k-th `elem_size`-byte value
  // of `values`. Positions must be distinct; positions at or past
  // span_elems are skipped, never written (ApplyChanges). InvalidArgument,
  // nothing enqueued, if the counts disagree or elem_size is not 1, 2, 4
  // or 8.
  Status ApplyDecoded(ChunkKind kind, size_t elem_size, void* d_span,
                      uint64_t span_elems, std::span<const uint32_t> positions,
                      std::span<const std::byte> values,
                      Stream stream = nullptr);
  Status Flush();
  const Stats& stats() const;

 private:
  struct Impl;
  explicit ChunkApplier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// LinearHash (dcr/digest.h) of device memory: the contribution of the
// `bytes` bytes at d_data lying at byte `offset` of a longer string.
// Bit-identical to LinearHash(offset, host copy of the same bytes).
class Digester {
 public:
  static Result<std::unique_ptr<Digester>> Create();
  ~Digester();
  Digester(const Digester&) = delete;
  Digester& operator=(const Digester&) = delete;

  Result<LinearDigest> LinearHash(uint64_t offset, const void* d_data,
                                  uint64_t bytes, Stream stream = nullptr);
  // TensorDigest of the `bytes` bytes at d_data.
  Result<Digest128> TensorDigest(const void* d_data, uint64_t bytes,
                                 Stream stream = nullptr);

 private:
  struct Impl;
  explicit Digester(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// RequantizeFp8 (dcr/fp8.h) on the GPU: requantizes the blocks `blocks`
// marks, and only those, from the canonical bits at d_src (t.elements()
// elements of t.dtype) into the codes at d_q (t.elements() bytes) and the
// scales at d_scale_inv (t.blocks() F32), bit-identical to the CPU's.
// Block-wise scales only (Unsupported for a per-tensor scale). Synchronizes
// `stream`.
Status RequantizeFp8(const Fp8Tensor& t, const void* d_src,
                     const Fp8BlockSet& blocks, uint8_t* d_q,
                     float* d_scale_inv, Stream stream = nullptr);

// ------------------------------------------------------------ producers
// A trainer rank's shards on a GPU: the ShardMemory (dcr/shard_memory.h)
// through which a producer (dcr/producer.h Producer::UseMemory) keeps its
// baseline on that device, as a copy of the rank's shards (as much device
// memory again), diffs there with Differ and copies back only the changed
// elements' positions and bits (8 bytes per changed BF16 element over
// PCIe, a 4-byte position and both values: a 3% step of a 1 GB shard is
// some 130 MB, held on the host as 12 bytes each). Scratch on the
// device: `piece_elems` positions and values of up to 8 bytes (192 MiB at
// the default), used piece by piece. Fingerprints are TensorDigests on the
// device; each call makes its device current and then the caller's again;
// the copies to and from the baseline run on the legacy default
// stream and are synchronized before each call returns, so the caller
// makes its own work on the shards finish first (torch:
// torch.cuda.current_stream().synchronize()).
//
// Unsupported without CUDA or without a usable GPU (the message says
// why); IOError if the device cannot hold the scratch.
struct ShardMemoryOptions {
  int device = 0;                     // CUDA device index
  uint64_t piece_elems = 1ull << 24;  // elements diffed at a time
};
Result<std::unique_ptr<ShardMemory>> CreateShardMemory(
    const ShardMemoryOptions& options);

// ------------------------------------------------------------ CUDA IPC
// A serving process keeps its weights in its own device buffers; a relay
// on the same node applies chunks into them through CUDA IPC. The server
// exports each tensor (ExportIpcTensor) and serves the list, an IPC
// manifest, on a Unix socket (IpcServer); the relay fetches it
// (FetchIpcManifest) and maps the buffers (IpcImport). Nothing but the
// manifest crosses the socket: the handles name the allocations, which the
// driver maps into the relay's address space.

// One exported tensor: the allocation holding it and where it starts.
struct IpcTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> shape;
  std::string handle;   // cudaIpcMemHandle_t, 128 lower-case hex digits
  uint64_t offset = 0;  // bytes from the allocation's start
  uint64_t bytes = 0;   // product of shape times the dtype's size
};

struct IpcManifest {
  std::string device;  // PCI bus id of the exporting device
  std::vector<IpcTensor> tensors;
};

// The manifest as one line of JSON (docs/FORMAT.md §"CUDA IPC manifest"):
//   {"format": 1, "device": "0000:19:00.0",
//    "tensors": [{"name": ..., "dtype": "BF16", "shape": [..],
//                 "handle": "<128 hex>", "offset": N, "bytes": N}, ...]}
std::string EncodeIpcManifest(const IpcManifest& manifest);
// Strict: every key required, no others, names unique and non-empty,
// bytes = elements * dtype size, offset + bytes without overflow, at most
// kMaxIpcManifestBytes. Corruption naming the field otherwise. Works in
// builds without CUDA (it is only text).
inline constexpr size_t kMaxIpcManifestBytes = 64 << 20;
Result<IpcManifest> ParseIpcManifest(std::string_view text);

// What a relay checks when a serving process attaches its GPU buffers
// (docs/design/gpu-serving.md §2, step 1): `manifest` exports every tensor
// serving rank `map` computes with (ReceiverMap::DeviceShards: FP8 codes
// and scales, not their shadows), each with the map's dtype and shape.
// Tensors the map does not name are allowed and left alone (a server may
// export more than its weights). InvalidArgument otherwise, naming the
// rank and every tensor that is missing or differs (the first
// kMaxAttachErrors, then how many more). No device is touched: it works in
// builds without CUDA.
inline constexpr size_t kMaxAttachErrors = 16;
Status CheckIpcManifest(const IpcManifest& manifest, const ReceiverMap& map);
// The same check against a list of tensors (a relay without a serving
// layout: its store's tensors); `whose` names the holder in the message
// ("serving rank 3", "the store shm:/w") and `source` what declares the
// tensors ("the layout", "the store").
Status CheckIpcManifest(const IpcManifest& manifest,
                        std::span<const TensorInfo> want,
                        std::string_view whose, std::string_view source);

// The entry for a tensor of `dtype` and `shape` at d_ptr (anywhere inside
// a cudaMalloc allocation, as a framework's caching allocator hands out).
Result<IpcTensor> ExportIpcTensor(std::string name, DType dtype,
                                  std::vector<uint64_t> shape,
                                  const void* d_ptr);

// Serves `manifest` on a Unix socket at `path`: each connection receives
// the encoded manifest and is closed. Runs a thread. A socket left at
// `path` by a server that died is replaced; one a live server answers on
// is not (InvalidArgument), nor is any other file. Destroying the server
// removes the socket, unless another has been bound at `path` since.
class IpcServer {
 public:
  static Result<std::unique_ptr<IpcServer>> Start(const std::string& path,
                                                  IpcManifest manifest);
  ~IpcServer();
  IpcServer(const IpcServer&) = delete;
  IpcServer& operator=(const IpcServer&) = delete;

 private:
  struct Impl;
  explicit IpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Connects to `path` and reads the manifest (IOError if nothing answers
// within `timeout_ms`, Corruption if what comes is not a manifest).
Result<IpcManifest> FetchIpcManifest(const std::string& path,
                                     int timeout_ms = 5000);

// The manifest's allocations mapped into this process (each distinct
// handle once); unmapped on destruction. The exporter must keep them
// allocated meanwhile. A tensor that does not lie inside its mapped
// allocation (offset + bytes past its end, where the driver reports the
// mapping's size), or a malformed handle, is InvalidArgument and nothing
// stays mapped.
class IpcImport {
 public:
  static Result<std::unique_ptr<IpcImport>> Open(const IpcManifest& manifest);
  ~IpcImport();
  IpcImport(const IpcImport&) = delete;
  IpcImport& operator=(const IpcImport&) = delete;

  const IpcManifest& manifest() const;
  // Device pointer to tensor i's first byte.
  void* Tensor(size_t i) const;

 private:
  struct Impl;
  explicit IpcImport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcr::cuda

#endif  // DCR_CUDA_H_
