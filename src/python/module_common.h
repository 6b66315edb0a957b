// What the `dcr` Python module's files share (src/python): statuses as
// Python exceptions, and tensors as bytes.
#ifndef DCR_PYTHON_MODULE_COMMON_H_
#define DCR_PYTHON_MODULE_COMMON_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <span>
#include <string>

#include "dcr/status.h"

namespace dcr::python {

namespace py = pybind11;

// NotFound -> KeyError, InvalidArgument -> ValueError, else RuntimeError.
[[noreturn]] void Throw(const Status& s);

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

// A tensor's bytes, kept alive by the buffer's owner.
struct Bytes {
  py::buffer_info info;
  std::span<std::byte> span() {
    return {static_cast<std::byte*>(info.ptr),
            static_cast<size_t>(info.size * info.itemsize)};
  }
};

// `obj` as bytes: a CPU torch tensor through a uint8 view of it (no copy
// when contiguous), or anything with the buffer protocol.
Bytes BytesOf(const py::handle& obj, bool writable, const std::string& name);

// Makes CUDA device `index` current for its scope through torch's own
// guard (torch.cuda.device), so that torch's record of the thread's device
// stays true: at the end torch makes the device that was current again,
// and where that device has no context yet (a thread that never chose
// one reads as on device 0) it records it without creating one. Nothing
// for a negative index or a torch without CUDA. Made and destroyed with
// the GIL held.
class TorchDeviceGuard {
 public:
  explicit TorchDeviceGuard(int index);
  ~TorchDeviceGuard();
  TorchDeviceGuard(const TorchDeviceGuard&) = delete;
  TorchDeviceGuard& operator=(const TorchDeviceGuard&) = delete;

 private:
  py::object guard_;
};

// dcr.Receiver (receiver_binding.cc).
void AddReceiver(py::module_& m);
// dcr.ShardProducer and dcr.Producer (producer_binding.cc).
void AddProducers(py::module_& m);

}  // namespace dcr::python

#endif  // DCR_PYTHON_MODULE_COMMON_H_
