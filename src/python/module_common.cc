// The `dcr` Python module's shared helpers (python/module_common.h).
#include "python/module_common.h"

#include <stdexcept>

namespace dcr::python {

[[noreturn]] void Throw(const Status& s) {
  if (s.IsNotFound()) throw py::key_error(s.ToString());
  if (s.IsInvalidArgument()) throw py::value_error(s.ToString());
  throw std::runtime_error(s.ToString());
}

Bytes BytesOf(const py::handle& obj, bool writable, const std::string& name) {
  py::object o = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(o, "is_cuda") && py::hasattr(o, "view")) {
    if (o.attr("is_cuda").cast<bool>()) {
      throw py::value_error("tensor '" + name +
                            "' is on a GPU; hand the producer CPU tensors");
    }
    if (!o.attr("is_contiguous")().cast<bool>()) {
      if (writable) {
        throw py::value_error("tensor '" + name +
                              "' is not contiguous; it cannot be updated "
                              "in place");
      }
      o = o.attr("contiguous")();
    }
    py::object torch = py::module_::import("torch");
    o = o.attr("detach")()
            .attr("reshape")(-1)
            .attr("view")(torch.attr("uint8"))
            .attr("numpy")();
  }
  if (!py::isinstance<py::buffer>(o)) {
    throw py::type_error("tensor '" + name +
                         "' is neither a torch tensor nor a buffer");
  }
  py::buffer_info info =
      py::reinterpret_borrow<py::buffer>(o).request(writable);
  // Row-major and dense, or refused: the bytes are read (and written) as
  // one block.
  py::ssize_t stride = info.itemsize;
  for (size_t d = info.ndim; d-- > 0;) {
    if (info.shape[d] > 1 && info.strides[d] != stride) {
      throw py::value_error("tensor '" + name +
                            "' is not a contiguous row-major buffer");
    }
    stride *= info.shape[d];
  }
  return Bytes{std::move(info)};
}

TorchDeviceGuard::TorchDeviceGuard(int index) {
  if (index < 0) return;
  py::object cuda = py::module_::import("torch.cuda");
  if (!cuda.attr("is_available")().cast<bool>()) return;
  py::object guard = cuda.attr("device")(index);
  guard.attr("__enter__")();
  guard_ = std::move(guard);
}

TorchDeviceGuard::~TorchDeviceGuard() {
  if (!guard_) return;
  try {
    guard_.attr("__exit__")(py::none(), py::none(), py::none());
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable(__func__);  // a destructor does not throw
  }
}

}  // namespace dcr::python
