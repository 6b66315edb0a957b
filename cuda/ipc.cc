// dcr/cuda.h: exporting device tensors through CUDA IPC and mapping them
// in another process.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

std::string ToHex(const cudaIpcMemHandle_t& h) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(2 * sizeof(h.reserved), '0');
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    const auto b = static_cast<unsigned char>(h.reserved[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 15];
  }
  return out;
}

cudaIpcMemHandle_t FromHex(const std::string& hex) {  // validated by Parse
  cudaIpcMemHandle_t h;
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    h.reserved[i] =
        static_cast<char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return h;
}

// The start and size of the allocation holding `p`: the driver's
// cuMemGetAddressRange, reached through the runtime so that dcr does not
// link libcuda (a machine without a driver still runs dcr).
Status AllocationOf(const void* p, uintptr_t* base, size_t* size) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static Fn fn = nullptr;
  if (fn == nullptr) {
    void* sym = nullptr;
    cudaDriverEntryPointQueryResult q;
    DCR_CUDA_RETURN_IF_ERROR(
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &sym, 12000,
                                         cudaEnableDefault, &q),
        "finding cuMemGetAddressRange");
    if (q != cudaDriverEntryPointSuccess || sym == nullptr) {
      return Status::Unsupported("the driver has no cuMemGetAddressRange");
    }
    fn = reinterpret_cast<Fn>(sym);
  }
  CUdeviceptr b = 0;
  const CUresult r = fn(&b, size, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) {
    return Status::InvalidArgument(
        "not a device pointer of this process (cuMemGetAddressRange error " +
        std::to_string(static_cast<int>(r)) + ")");
  }
  *base = static_cast<uintptr_t>(b);
  return Status::OK();
}

}  // namespace

Result<IpcTensor> ExportIpcTensor(std::string name, DType dtype,
                                  std::vector<uint64_t> shape,
                                  const void* d_ptr) {
  uint64_t elems = 1;
  for (uint64_t d : shape) elems *= d;
  const uint64_t bytes = elems * DTypeSize(dtype);
  uintptr_t base = 0;
  size_t size = 0;
  DCR_RETURN_IF_ERROR(AllocationOf(d_ptr, &base, &size));
  const uint64_t offset = reinterpret_cast<uintptr_t>(d_ptr) - base;
  if (offset + bytes > size) {
    return Status::InvalidArgument(
        "tensor '" + name + "' of " + std::to_string(bytes) +
        " bytes runs past the end of its allocation");
  }
  cudaIpcMemHandle_t h;
  DCR_CUDA_RETURN_IF_ERROR(
      cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)),
      "cudaIpcGetMemHandle for tensor '" + name + "'");
  IpcTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.handle = ToHex(h);
  t.offset = offset;
  t.bytes = bytes;
  return t;
}

struct IpcImport::Impl {
  IpcManifest manifest;
  std::map<std::string, void*> mapped;  // handle -> base
  std::vector<void*> tensors;

  ~Impl() {
    for (auto& [handle, base] : mapped) cudaIpcCloseMemHandle(base);
  }
};

IpcImport::IpcImport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IpcImport::~IpcImport() = default;

Result<std::unique_ptr<IpcImport>> IpcImport::Open(
    const IpcManifest& manifest) {
  auto impl = std::make_unique<Impl>();
  impl->manifest = manifest;
  if (!manifest.device.empty()) {
    int dev = 0;
    const cudaError_t e =
        cudaDeviceGetByPCIBusId(&dev, manifest.device.c_str());
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::InvalidArgument(
          "the serving process's GPU " + manifest.device +
          " is not visible here (CUDA_VISIBLE_DEVICES?): " +
          cudaGetErrorString(e));
    }
    DCR_CUDA_RETURN_IF_ERROR(cudaSetDevice(dev), "cudaSetDevice");
  }
  std::map<std::string, size_t> sizes;  // handle -> mapped bytes
  for (const IpcTensor& t : manifest.tensors) {
    if (t.handle.size() != 2 * sizeof(cudaIpcMemHandle_t::reserved) ||
        t.handle.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return Status::InvalidArgument("tensor '" + t.name +
                                     "': the IPC handle is not 128 "
                                     "lower-case hex digits");
    }
    auto it = impl->mapped.find(t.handle);
    if (it == impl->mapped.end()) {
      void* base = nullptr;
      const cudaIpcMemHandle_t h = FromHex(t.handle);
      DCR_CUDA_RETURN_IF_ERROR(
          cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
          "mapping tensor '" + t.name + "' (cudaIpcOpenMemHandle)");
      it = impl->mapped.emplace(t.handle, base).first;
      // The mapping's size, where the driver reports it for IPC mappings
      // (0 where it does not: the manifest's word is all there is then).
      uintptr_t b = 0;
      size_t size = 0;
      sizes[t.handle] = AllocationOf(base, &b, &size).ok() ? size : 0;
    }
    // Every byte the relay may write lies inside the mapping.
    const size_t size = sizes[t.handle];
    if (size > 0 && (t.offset > size || t.bytes > size - t.offset)) {
      return Status::InvalidArgument(
          "tensor '" + t.name + "' (" + std::to_string(t.bytes) +
          " bytes at offset " + std::to_string(t.offset) +
          ") runs past the end of its exported allocation (" +
          std::to_string(size) + " bytes)");
    }
    impl->tensors.push_back(static_cast<char*>(it->second) + t.offset);
  }
  return std::unique_ptr<IpcImport>(new IpcImport(std::move(impl)));
}

const IpcManifest& IpcImport::manifest() const { return impl_->manifest; }

void* IpcImport::Tensor(size_t i) const { return impl_->tensors[i]; }

}  // namespace dcr::cuda
