// dcr.Receiver: a serving process's view of its relay's store
// (include/dcr/serving.h, docs/PYTHON.md §"Serving processes"). Tensors
// are torch views of the shared mapping, no copy; each holds the mapping
// it views, so a view never faults. After a move the relay rewrites the
// old image (catch-up, then the next refit): views of it must be dropped.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "dcr/serving.h"
#include "python/module_common.h"

namespace py = pybind11;

namespace dcr::python {
namespace {

// One tensor's bytes, read-only, with the mapping they live in.
struct PinnedBytes {
  std::shared_ptr<const void> pin;
  std::span<const std::byte> bytes;
};

// The torch dtype a safetensors dtype is viewed as: FP8 codes as uint8
// (torch 1.13 has no float8); the rest as themselves.
const char* TorchDType(DType d) {
  switch (d) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kI8:
      return "int8";
    case DType::kI16:
      return "int16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kBool:
      return "bool";
    default:
      return "uint8";
  }
}

py::dict TensorsOf(const ServingReceiver& r) {
  py::module_ torch = py::module_::import("torch");
  py::module_ warnings = py::module_::import("warnings");
  py::dict out;
  py::object guard = warnings.attr("catch_warnings")();
  guard.attr("__enter__")();
  // torch warns that the buffer is not writable: it is not, by design.
  warnings.attr("simplefilter")("ignore");
  try {
    const Manifest& m = r.manifest();
    for (size_t i = 0; i < m.size(); ++i) {
      const TensorInfo& info = m[i];
      py::list shape;
      for (uint64_t d : info.shape) shape.append(d);
      py::object dtype = torch.attr(TorchDType(info.dtype));
      py::object t;
      const std::span<const std::byte> bytes = r.Tensor(i);
      if (bytes.empty()) {
        t = torch.attr("empty")(shape, py::arg("dtype") = dtype);
      } else {
        py::object buf = py::cast(PinnedBytes{r.Pin(), bytes});
        t = torch
                .attr("frombuffer")(buf, py::arg("dtype") = torch.attr("uint8"))
                .attr("view")(dtype)
                .attr("reshape")(shape);
      }
      out[py::str(info.name)] = t;
    }
  } catch (...) {
    guard.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
  guard.attr("__exit__")(py::none(), py::none(), py::none());
  return out;
}

}  // namespace

void AddReceiver(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<PinnedBytes>(m, "_PinnedBytes", py::buffer_protocol())
      .def_buffer([](PinnedBytes& b) {
        return py::buffer_info(const_cast<std::byte*>(b.bytes.data()), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {b.bytes.size()}, {1}, /*readonly=*/true);
      });
  py::class_<ServingReceiver>(
      m, "Receiver",
      "A serving process's view of its relay's store: the tensors of the "
      "live image (torch views, no copy) and the pause protocol. Call "
      "poll() between two steps; when it returns True, take tensors() "
      "again and point the model's parameters at them.")
      .def(py::init([](const std::string& store, const std::string& socket,
                       double wait) {
             ServingReceiver::Options o;
             // "shm:NAME", "shm:/NAME" or "/NAME", as the relay was given.
             std::string name =
                 store.starts_with("shm:") ? store.substr(4) : store;
             if (name.empty() || name.find('/', 1) != std::string::npos ||
                 name == "/") {
               throw py::value_error("store '" + store +
                                     "': expected shm:NAME, the relay's store");
             }
             o.store.kind = StoreSpec::Kind::kShm;
             o.store.path = name.starts_with('/') ? name : "/" + name;
             o.socket = socket;
             o.wait =
                 std::chrono::milliseconds(static_cast<int64_t>(wait * 1000.0));
             // Open waits up to `wait` for the relay's first commit: let
             // the process's other Python threads run meanwhile.
             Result<std::unique_ptr<ServingReceiver>> r =
                 Status::Internal("not opened");
             {
               py::gil_scoped_release release;
               r = ServingReceiver::Open(o);
             }
             return Take(std::move(r));
           }),
           "store"_a, "socket"_a = "", "wait"_a = 0.0,
           "maps the relay's store (shm:NAME, as the relay was given); "
           "socket: the relay's serving socket (empty: none); wait: seconds "
           "to wait for the relay's first commit")
      .def("tensors", &TensorsOf,
           "name -> torch tensor of the live image (FP8 codes as uint8)")
      .def(
          "poll",
          [](ServingReceiver& r, bool move) { return Take(r.Poll(move)); },
          "move"_a = true,
          "answers the relay and moves to the live image if it changed; "
          "True iff it moved (take tensors() again). move=False: answer "
          "only (tensor-parallel ranks agree on pending_step() first)")
      .def(
          "pending_step",
          [](const ServingReceiver& r) -> py::object {
            std::optional<LiveState> p = Take(r.Pending());
            if (!p) return py::none();
            return py::int_(p->version.step);
          },
          "the step a move would go to, or None when the tensors are of "
          "the live image")
      .def_property_readonly(
          "step",
          [](const ServingReceiver& r) { return r.live().version.step; })
      .def_property_readonly("digest",
                             [](const ServingReceiver& r) {
                               return r.live().version.digest.ToHex();
                             })
      .def_property_readonly(
          "image", [](const ServingReceiver& r) { return r.live().image; })
      .def_property_readonly(
          "flips", [](const ServingReceiver& r) { return r.live().flips; })
      .def_property_readonly("attached", &ServingReceiver::attached)
      .def_property_readonly("prepares", &ServingReceiver::prepares);

  py::class_<GpuReceiver>(
      m, "GpuReceiver",
      "The pause protocol for a server whose weights are CUDA tensors it "
      "exported (dcr_cuda.Exporter): the relay writes them in place. Call "
      "poll() between two steps and compute only while usable is True "
      "(docs/PROTOCOL.md, GPU servers).")
      .def(py::init([](const std::string& socket, const std::string& cuda_ipc,
                       double wait, double pause_wait, py::object quiesce) {
             GpuReceiver::Options o;
             o.socket = socket;
             o.cuda_ipc = cuda_ipc;
             if (!quiesce.is_none()) {
               // Called from poll(), which runs without the GIL.
               auto fn = std::make_shared<py::object>(std::move(quiesce));
               o.quiesce = [fn]() -> Status {
                 py::gil_scoped_acquire gil;
                 try {
                   (*fn)();
                 } catch (py::error_already_set& e) {
                   return Status::Internal(std::string("quiesce raised: ") +
                                           e.what());
                 }
                 return Status::OK();
               };
             }
             o.wait =
                 std::chrono::milliseconds(static_cast<int64_t>(wait * 1000.0));
             o.pause_wait = std::chrono::milliseconds(
                 static_cast<int64_t>(pause_wait * 1000.0));
             Result<std::unique_ptr<GpuReceiver>> r =
                 Status::Internal("not opened");
             {
               py::gil_scoped_release release;
               r = GpuReceiver::Open(o);
             }
             return Take(std::move(r));
           }),
           "socket"_a, "cuda_ipc"_a, "wait"_a = 0.0, "pause_wait"_a = 30.0,
           "quiesce"_a = py::none(),
           "attaches to the relay's serving socket, naming the socket "
           "the Exporter serves its manifest on (cuda_ipc, absolute); "
           "wait: seconds to wait for the relay to attach the buffers; "
           "quiesce: called at a pause before the relay may write, must "
           "return once no queued GPU work reads the weights (e.g. "
           "torch.cuda.synchronize)")
      .def(
          "poll",
          [](GpuReceiver& r) {
            Result<bool> changed = Status::Internal("not polled");
            {
              // A pause blocks here while the relay writes the buffers.
              py::gil_scoped_release release;
              changed = r.Poll();
            }
            return Take(std::move(changed));
          },
          "answers the relay; at a pause, waits for the relay to write "
          "the buffers; True iff they now hold another version")
      .def_property_readonly("usable", &GpuReceiver::usable)
      .def_property_readonly(
          "step", [](const GpuReceiver& r) { return r.version().step; })
      .def_property_readonly(
          "digest",
          [](const GpuReceiver& r) { return r.version().digest.ToHex(); })
      .def_property_readonly("attached", &GpuReceiver::attached)
      .def_property_readonly("last_error", &GpuReceiver::last_error)
      .def_property_readonly("pauses", &GpuReceiver::pauses);
}

}  // namespace dcr::python
