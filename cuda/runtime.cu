// dcr/cuda.h: the runtime side (probe, device buffers, copies).
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "cuda/cuda_status.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

bool Built() { return true; }

namespace {

// Whether an allocation of the current device can be exported through
// CUDA IPC: what a relay needs to apply into a serving process's buffers.
void ProbeIpc(DeviceInfo* d) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, 2 << 20);
  if (e != cudaSuccess) {
    d->ipc_detail = std::string("cudaMalloc: ") + cudaGetErrorString(e);
    return;
  }
  cudaIpcMemHandle_t h;
  e = cudaIpcGetMemHandle(&h, p);
  if (e == cudaSuccess) {
    d->ipc = true;
  } else {
    d->ipc_detail = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorName(e) +
                    ": " + cudaGetErrorString(e);
    cudaGetLastError();  // not sticky; clear it
  }
  cudaFree(p);
}

}  // namespace

Result<Runtime> Probe() {
  Runtime rt;
  cudaDriverGetVersion(&rt.driver_version);
  cudaRuntimeGetVersion(&rt.runtime_version);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::string why =
        std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();
    return Status::Unsupported(
        "no usable CUDA device (" + why + "; this dcr's CUDA runtime is " +
        std::to_string(rt.runtime_version / 1000) + "." +
        std::to_string(rt.runtime_version % 1000 / 10) + ", the driver's is " +
        (rt.driver_version == 0
             ? std::string("none")
             : std::to_string(rt.driver_version / 1000) + "." +
                   std::to_string(rt.driver_version % 1000 / 10)) +
        ")");
  }
  if (count == 0) return Status::Unsupported("no CUDA device");
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    DCR_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, i),
                             "cudaGetDeviceProperties");
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.memory_bytes = p.totalGlobalMem;
    d.multiprocessors = p.multiProcessorCount;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess) {
      d.pci_bus_id = bus;
    }
    if (cudaSetDevice(i) == cudaSuccess) ProbeIpc(&d);
    rt.devices.push_back(std::move(d));
  }
  cudaSetDevice(current);
  return rt;
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("device buffer of 0 bytes");
  void* p = nullptr;
  DCR_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes),
                           "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return DeviceBuffer(p, bytes);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Status CopyToDevice(void* d_dst, std::span<const std::byte> src) {
  if (src.empty()) return Status::OK();
  DCR_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_dst, src.data(), src.size(), cudaMemcpyHostToDevice),
      "cudaMemcpy to device");
  // From pageable memory cudaMemcpy may return before the DMA landed.
  return CudaStatus(cudaStreamSynchronize(nullptr), "cudaMemcpy to device");
}

Status CopyToHost(std::span<std::byte> dst, const void* d_src) {
  if (dst.empty()) return Status::OK();
  return CudaStatus(
      cudaMemcpy(dst.data(), d_src, dst.size(), cudaMemcpyDeviceToHost),
      "cudaMemcpy to host");
}

Status CopyOnDevice(void* d_dst, const void* d_src, size_t bytes,
                    Stream stream) {
  if (bytes == 0) return Status::OK();
  return CudaStatus(
      cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync on the device");
}

Status Fill(void* d_dst, uint8_t value, size_t bytes) {
  if (bytes == 0) return Status::OK();
  DCR_CUDA_RETURN_IF_ERROR(cudaMemset(d_dst, value, bytes), "cudaMemset");
  return CudaStatus(cudaDeviceSynchronize(), "cudaMemset");
}

Result<OwnedStream> OwnedStream::Create() {
  cudaStream_t s = nullptr;
  DCR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                           "cudaStreamCreate");
  return OwnedStream(s);
}

OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

OwnedStream::OwnedStream(OwnedStream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)) {}

OwnedStream& OwnedStream::operator=(OwnedStream&& o) noexcept {
  if (this != &o) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

Status UseDevice(int index) {
  // No driver or no device: say so (Unsupported), not which call failed.
  DCR_RETURN_IF_ERROR(RequireDevice());
  return CudaStatus(cudaSetDevice(index),
                    "cudaSetDevice(" + std::to_string(index) + ")");
}

Result<int> CurrentDevice() {
  int index = 0;
  DCR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&index), "cudaGetDevice");
  return index;
}

Result<int> DeviceOfPointer(const void* p) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the trainer's next launch
    return CudaStatus(e, "cudaPointerGetAttributes");
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    return a.device;
  }
  return -1;
}

Result<std::string> PciBusId(int index) {
  char bus[32] = {};
  DCR_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), index),
                           "cudaDeviceGetPCIBusId");
  return std::string(bus);
}

Status Synchronize(Stream stream) {
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace dcr::cuda
