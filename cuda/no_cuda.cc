// dcr/cuda.h in a build without CUDA: every call says how to get it.
#include <utility>

#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

Status NotBuilt() {
  return Status::Unsupported(
      "this dcr was built without CUDA: install the CUDA toolkit (nvcc on "
      "PATH) and configure with -DDCR_CUDA=ON");
}

}  // namespace

bool Built() { return false; }

Result<Runtime> Probe() { return NotBuilt(); }

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t) { return NotBuilt(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  size_ = std::exchange(o.size_, 0);
  return *this;
}

Status CopyToDevice(void*, std::span<const std::byte>) { return NotBuilt(); }
Status CopyToHost(std::span<std::byte>, const void*) { return NotBuilt(); }
Status CopyOnDevice(void*, const void*, size_t, Stream) { return NotBuilt(); }
Status Fill(void*, uint8_t, size_t) { return NotBuilt(); }
Status Synchronize(Stream) { return NotBuilt(); }
Result<OwnedStream> OwnedStream::Create() { return NotBuilt(); }
OwnedStream::~OwnedStream() = default;
OwnedStream::OwnedStream(OwnedStream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)) {}
OwnedStream& OwnedStream::operator=(OwnedStream&& o) noexcept {
  stream_ = std::exchange(o.stream_, nullptr);
  return *this;
}
Status UseDevice(int) { return NotBuilt(); }
Result<std::string> PciBusId(int) { return NotBuilt(); }
Result<int> CurrentDevice() { return NotBuilt(); }
Result<int> DeviceOfPointer(const void*) { return NotBuilt(); }

struct Differ::Impl {};
Differ::Differ(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Differ::~Differ() = default;
Result<std::unique_ptr<Differ>> Differ::Create(uint64_t) { return NotBuilt(); }
Result<uint64_t> Differ::FindChanges(size_t, const void*, const void*, uint64_t,
                                     bool, uint32_t*, void*, Stream) {
  return NotBuilt();
}

Status ApplyChanges(ChunkKind, size_t, void*, uint64_t, const uint32_t*,
                    const void*, uint64_t, Stream) {
  return NotBuilt();
}
Status ApplyDense(ChunkKind, size_t, void*, uint64_t, const void*, Stream) {
  return NotBuilt();
}

struct ChunkApplier::Impl {
  Stats stats;
};
ChunkApplier::ChunkApplier(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ChunkApplier::~ChunkApplier() = default;
Result<std::unique_ptr<ChunkApplier>> ChunkApplier::Create(Options) {
  return NotBuilt();
}
Status ChunkApplier::Apply(std::span<const std::byte>, void*, uint64_t,
                           Stream) {
  return NotBuilt();
}
Status ChunkApplier::ApplyDecoded(ChunkKind, size_t, void*, uint64_t,
                                  std::span<const uint32_t>,
                                  std::span<const std::byte>, Stream) {
  return NotBuilt();
}
Status ChunkApplier::Flush() { return NotBuilt(); }
const ChunkApplier::Stats& ChunkApplier::stats() const { return impl_->stats; }

struct Digester::Impl {};
Digester::Digester(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Digester::~Digester() = default;
Result<std::unique_ptr<Digester>> Digester::Create() { return NotBuilt(); }
Result<LinearDigest> Digester::LinearHash(uint64_t, const void*, uint64_t,
                                          Stream) {
  return NotBuilt();
}
Result<Digest128> Digester::TensorDigest(const void*, uint64_t, Stream) {
  return NotBuilt();
}

Status RequantizeFp8(const Fp8Tensor&, const void*, const Fp8BlockSet&,
                     uint8_t*, float*, Stream) {
  return NotBuilt();
}

Result<IpcTensor> ExportIpcTensor(std::string, DType, std::vector<uint64_t>,
                                  const void*) {
  return NotBuilt();
}

struct IpcImport::Impl {
  IpcManifest manifest;
};
IpcImport::IpcImport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IpcImport::~IpcImport() = default;
Result<std::unique_ptr<IpcImport>> IpcImport::Open(const IpcManifest&) {
  return NotBuilt();
}
const IpcManifest& IpcImport::manifest() const { return impl_->manifest; }
void* IpcImport::Tensor(size_t) const { return nullptr; }

}  // namespace dcr::cuda
