// AttachCudaIpcWeights: the DeviceWeights of a serving process's CUDA IPC
// exports, over dcr/cuda.h (whose calls return Unsupported in a build
// without CUDA, so this file builds in every configuration).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dcr/cuda.h"
#include "relay/device_weights.h"

namespace dcr {
namespace {

constexpr int kFetchTimeoutMs = 500;

class CudaIpcWeights final : public DeviceWeights {
 public:
  CudaIpcWeights(int device, std::vector<TensorInfo> tensors,
                 std::vector<void*> ptrs,
                 std::unique_ptr<cuda::IpcImport> import,
                 std::unique_ptr<cuda::Digester> digester,
                 std::unique_ptr<cuda::ChunkApplier> applier)
      : device_(device),
        tensors_(std::move(tensors)),
        ptrs_(std::move(ptrs)),
        import_(std::move(import)),
        digester_(std::move(digester)),
        applier_(std::move(applier)) {}

  // The members free their memory, streams and mappings on the device
  // current at the time: theirs.
  ~CudaIpcWeights() override { (void)OnItsDevice(); }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }

  Result<Digest128> Digest(size_t i) override {
    DCR_RETURN_IF_ERROR(OnItsDevice());
    return digester_->TensorDigest(ptrs_[i], tensors_[i].NumBytes());
  }

  Status Write(size_t i, std::span<const std::byte> bytes) override {
    if (bytes.size() != tensors_[i].NumBytes()) {
      return Status::InvalidArgument(
          fmt::format("writing {} bytes to the GPU tensor '{}' of {}",
                      bytes.size(), tensors_[i].name, tensors_[i].NumBytes()));
    }
    if (bytes.empty()) return Status::OK();
    DCR_RETURN_IF_ERROR(OnItsDevice());
    return cuda::CopyToDevice(ptrs_[i], bytes);
  }

  Status Patch(size_t i, uint64_t first, std::span<const uint32_t> positions,
               std::span<const std::byte> values) override {
    const TensorInfo& t = tensors_[i];
    const uint64_t n = t.NumElements();
    const size_t w = DTypeSize(t.dtype);
    const bool fits = first <= n && values.size() == positions.size() * w &&
                      std::all_of(positions.begin(), positions.end(),
                                  [&](uint32_t p) { return p < n - first; });
    if (!fits) {
      return Status::InvalidArgument(fmt::format(
          "a patch of {} elements from element {} of the GPU tensor '{}' ({} "
          "elements) with {} bytes of values does not fit it",
          positions.size(), first, t.name, n, values.size()));
    }
    if (positions.empty()) return Status::OK();
    DCR_RETURN_IF_ERROR(OnItsDevice());
    return applier_->ApplyDecoded(ChunkKind::kOverwrite, w,
                                  static_cast<std::byte*>(ptrs_[i]) + first * w,
                                  n - first, positions, values);
  }

  Status Flush() override {
    DCR_RETURN_IF_ERROR(OnItsDevice());
    DCR_RETURN_IF_ERROR(applier_->Flush());
    return cuda::Synchronize(nullptr);
  }

 private:
  // The relay calls from its loop and from the attach's sync thread
  // (relay/serving_images.h), and a thread's current device is its own:
  // each call makes the buffers' device (the one the import, the
  // digester and the staging were made on) current first.
  Status OnItsDevice() {
    DCR_ASSIGN_OR_RETURN(int current, cuda::CurrentDevice());
    return current == device_ ? Status::OK() : cuda::UseDevice(device_);
  }

  const int device_;
  const std::vector<TensorInfo> tensors_;
  const std::vector<void*> ptrs_;
  std::unique_ptr<cuda::IpcImport> import_;  // keeps ptrs_ mapped
  std::unique_ptr<cuda::Digester> digester_;
  std::unique_ptr<cuda::ChunkApplier> applier_;  // Patch's staging
};

}  // namespace

Result<std::unique_ptr<DeviceWeights>> AttachCudaIpcWeights(
    const std::string& socket, std::vector<TensorInfo> want,
    const std::string& whose, const std::string& source) {
  if (!cuda::Built()) {
    return Status::Unsupported(
        "this dcr-relay was built without CUDA, so it cannot apply into a "
        "serving process's GPU buffers; build with -DDCR_CUDA=ON (nvcc on "
        "the build host)");
  }
  DCR_RETURN_IF_ERROR(cuda::Probe().status());
  // The server serves its manifest before it says hello: a short wait,
  // since the relay's loop waits with it.
  DCR_ASSIGN_OR_RETURN(cuda::IpcManifest manifest,
                       cuda::FetchIpcManifest(socket, kFetchTimeoutMs));
  DCR_RETURN_IF_ERROR(cuda::CheckIpcManifest(manifest, want, whose, source));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::IpcImport> import,
                       cuda::IpcImport::Open(manifest));
  // Open made the exporting process's GPU current on this thread.
  DCR_ASSIGN_OR_RETURN(int device, cuda::CurrentDevice());
  std::map<std::string, size_t, std::less<>> index;
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    index.emplace(manifest.tensors[i].name, i);
  }
  std::vector<void*> ptrs;
  for (const TensorInfo& t : want)
    ptrs.push_back(import->Tensor(index[t.name]));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Digester> digester,
                       cuda::Digester::Create());
  // At attach, not in the first pause: a GPU too full for the staging is
  // refused now, with the reason, rather than at a commit.
  cuda::ChunkApplier::Options staging;
  staging.staging_bytes = kPatchStagingBytes;
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::ChunkApplier> applier,
                       cuda::ChunkApplier::Create(staging));
  return std::unique_ptr<DeviceWeights>(new CudaIpcWeights(
      device, std::move(want), std::move(ptrs), std::move(import),
      std::move(digester), std::move(applier)));
}

}  // namespace dcr
