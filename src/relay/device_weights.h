// A serving process's weights in GPU memory, as the relay on its node
// reaches them (docs/design/gpu-serving.md; docs/PROTOCOL.md §"GPU
// servers"). The server exports its buffers over CUDA IPC and names the
// manifest's socket in its hello; the relay maps them and keeps them equal
// to its live image. They are one image, which the server computes on, so
// the relay writes them only while the server is paused between two steps
// (or before it computed at all: at attach).
//
// The relay's host store stays what it is without a GPU: refits apply,
// journal, hash and vote there. The GPU buffers follow the live image:
// SyncDeviceWeights compares every tensor's digest on both sides and
// rewrites the ones that differ, which makes the same call the commit's
// apply, the repair of buffers changed behind the relay's back, and the
// recovery after either process crashed.
//
// At a commit most of a tensor is unchanged (1-5% of its elements at an RL
// step), so rewriting it whole would make the server's pause a copy of the
// rank. At the flip, while the server finishes its step, the relay diffs
// the old live image (the base the GPU holds) against the new one
// (StageDeviceChanges) and keeps the changed elements; inside the pause
// SyncDeviceWeights writes those first (Patch), so the digest comparison
// that follows finds the tensors equal and rewrites only what the patches
// did not cover (a tensor too dense or over the budget, or buffers that
// were not at the base).
//
// Thread safety: a DeviceWeights is used by one thread at a time (the
// relay's actor, or the attach's sync thread while the actor leaves it
// alone: relay/serving_images.h).
#ifndef DCR_RELAY_DEVICE_WEIGHTS_H_
#define DCR_RELAY_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"

namespace dcr {

class DeviceWeights {
 public:
  virtual ~DeviceWeights() = default;
  // The tensors kept in step with the live image, in a fixed order.
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // TensorDigest (dcr/digest.h) of tensor i's bytes on the device.
  virtual Result<Digest128> Digest(size_t i) = 0;
  // Overwrites tensor i with `bytes` (host memory, tensors()[i].NumBytes()
  // of them). May return before the copy is done: Flush waits.
  virtual Status Write(size_t i, std::span<const std::byte> bytes) = 0;
  // Overwrites elements of tensor i: element first + positions[k] takes
  // the k-th value of `values` (host memory, positions.size() values of
  // the tensor's element size, back to back). Positions are distinct and
  // first + positions[k] is below the tensor's element count
  // (InvalidArgument otherwise, nothing written). May return before the
  // writes are done: Flush waits.
  virtual Status Patch(size_t i, uint64_t first,
                       std::span<const uint32_t> positions,
                       std::span<const std::byte> values) = 0;
  // Waits for every Write and Patch so far; reports an error the device
  // raised.
  virtual Status Flush() = 0;
};

// A patch: the changed elements of one stretch of a device tensor, as
// DeviceWeights::Patch takes them.
struct DevicePatch {
  size_t tensor = 0;   // index in DeviceWeights::tensors()
  uint64_t first = 0;  // the stretch's first element
  std::vector<uint32_t> positions;
  std::vector<std::byte> values;
};

// What a flip changes in the device's tensors, found on the host.
struct DeviceChanges {
  // TensorDigest of each device tensor in the target: what the device
  // must hold once synced.
  std::vector<Digest128> target;
  std::vector<DevicePatch> patches;  // by tensor, then by first
  // Tensors whose bits differ from the base's, or that have no base twin.
  uint64_t changed = 0;
  uint64_t patched = 0;  // of those, the ones `patches` covers
  uint64_t bytes = 0;    // positions and values `patches` holds
  double seconds = 0;
};

// A tensor is diffed and patched in stretches of this many elements:
// positions within a stretch fit 32 bits, a stretch is one task of the
// pool, and the density rule below holds per stretch.
inline constexpr uint64_t kPatchStretchElems = uint64_t{1} << 24;
// The scratch each of StageDeviceChanges' threads holds (positions and
// byte planes for 2^18 elements of up to 8 bytes).
inline constexpr uint64_t kPatchScratchPerThread = uint64_t{3} << 20;
// What a GPU's patches go through (pinned host memory, and as much device
// memory on the server's GPU): DeviceWeights::Patch's staging slots.
inline constexpr uint64_t kPatchStagingBytes = uint64_t{32} << 20;

// Finds, for each device tensor (`tensors`), the elements `target` changed from
// `base` (each found by name, checked as in SyncDeviceWeights) and hashes
// the target in the same pass, on `pool` if given. A changed tensor is
// patched only where its patches take at most half the bytes of each of
// its stretches (a denser one costs less copied whole), and only while
// all the patches together stay within `budget` bytes (what their vectors
// allocate: up to 1.5 times the positions and values; besides, each of
// `pool`'s threads holds kPatchScratchPerThread); the others are left to
// SyncDeviceWeights' rewrite. A tensor that `base` is null for, lacks or
// holds with another dtype or shape is not patched. InvalidArgument if
// `target` lacks a device tensor or holds it differently.
//
// Reads only the stores (and `tensors`, DeviceWeights::tensors()), so it
// may run on a thread of its own while the device is in use.
Result<DeviceChanges> StageDeviceChanges(const std::vector<TensorInfo>& tensors,
                                         const WeightStore* base,
                                         const WeightStore& target,
                                         ThreadPool* pool, uint64_t budget);

struct DeviceSync {
  uint64_t tensors = 0;          // compared
  uint64_t patched = 0;          // patched from DeviceChanges
  uint64_t patched_bytes = 0;    // positions and values written
  uint64_t rewritten = 0;        // differed from the host: rewritten
  uint64_t rewritten_bytes = 0;  // their bytes
  double patch_seconds = 0;      // writing the patches, flushed
  double hash_seconds = 0;       // both sides' digests, before the rewrites
  double seconds = 0;            // the whole call
};

// Makes `device` hold the bits of `host` (the relay's live image). Each
// device tensor is found in `host` by name; both sides are hashed (the
// host's on `pool`, if given); every tensor that differs is written from
// the host, and hashed again once the writes are flushed.
// InvalidArgument if a tensor is missing from `host` or has another dtype
// or shape there; Corruption if a rewritten tensor still differs (the
// device took the write but does not hold it). After an error the
// device's bits are unknown: a caller must not let the server compute on
// them.
//
// `staged`, if given, is StageDeviceChanges(device.tensors(), base, host,
// ...),
// computed earlier (the relay diffs while the server finishes its step;
// the host must not have changed since): its patches are written first,
// and its digests stand for the host's. Patches applied to buffers that
// did not hold the base leave them wrong in the unchanged elements, which
// the digest comparison then finds and rewrites.
Result<DeviceSync> SyncDeviceWeights(DeviceWeights& device,
                                     const WeightStore& host, ThreadPool* pool,
                                     const DeviceChanges* staged = nullptr);

// Attaches the GPU buffers a serving process exported (dcr/cuda.h "CUDA
// IPC"): fetches the IPC manifest served on `socket`, checks it against
// `want` (cuda::CheckIpcManifest: every tensor of `want` exported with its
// dtype and shape; `whose` and `source` word the message), maps the
// buffers and keeps the tensors of `want`, in its order; other exports are
// left alone. Unsupported in a build without CUDA, or on a host whose
// driver has no usable GPU (the message says which).
Result<std::unique_ptr<DeviceWeights>> AttachCudaIpcWeights(
    const std::string& socket, std::vector<TensorInfo> want,
    const std::string& whose, const std::string& source);

}  // namespace dcr

#endif  // DCR_RELAY_DEVICE_WEIGHTS_H_
