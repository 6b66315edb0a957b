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
// Thread safety: a DeviceWeights is used by one thread at a time (the
// relay's actor).
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
  // Waits for every Write so far; reports an error the device raised.
  virtual Status Flush() = 0;
};

struct DeviceSync {
  uint64_t tensors = 0;          // compared
  uint64_t rewritten = 0;        // differed from the host: rewritten
  uint64_t rewritten_bytes = 0;  // their bytes
  double hash_seconds = 0;       // both sides' digests, before the writes
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
// `host_digests`, if given, are HostDigests(device, host) computed
// earlier (the relay hashes while the server finishes its step); the host
// must not have changed since.
Result<DeviceSync> SyncDeviceWeights(
    DeviceWeights& device, const WeightStore& host, ThreadPool* pool,
    const std::vector<Digest128>* host_digests = nullptr);

// The TensorDigest of each of the device's tensors in `host` (found by
// name, checked as above), hashed on `pool` if given.
Result<std::vector<Digest128>> HostDigests(const DeviceWeights& device,
                                           const WeightStore& host,
                                           ThreadPool* pool);

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
