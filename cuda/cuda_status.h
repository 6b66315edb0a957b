// CUDA runtime errors as dcr Statuses. Internal to cuda/.
#ifndef DCR_CUDA_CUDA_STATUS_H_
#define DCR_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr::cuda {

// IOError "<what>: <cudaGetErrorName>: <cudaGetErrorString>", or OK.
inline Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::IOError(std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                         cudaGetErrorString(e));
}

// The error of the last launch (a bad configuration), as a Status.
inline Status LaunchStatus(std::string_view kernel) {
  return CudaStatus(cudaGetLastError(),
                    std::string("launch of ") + std::string(kernel));
}

// Unsupported, naming the driver's reason, where no device is usable:
// what the classes' Create() return first, rather than the error of
// whichever allocation would fail.
inline Status RequireDevice() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unsupported(std::string("no usable CUDA device (") +
                               cudaGetErrorName(e) + ": " +
                               cudaGetErrorString(e) + ")");
  }
  if (count == 0) return Status::Unsupported("no CUDA device");
  return Status::OK();
}

}  // namespace dcr::cuda

#define DCR_CUDA_RETURN_IF_ERROR(call, what)                              \
  do {                                                                    \
    ::dcr::Status _dcr_cuda_st = ::dcr::cuda::CudaStatus((call), (what)); \
    if (!_dcr_cuda_st.ok()) return _dcr_cuda_st;                          \
  } while (0)

#endif  // DCR_CUDA_CUDA_STATUS_H_
