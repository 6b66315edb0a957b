// The `dcr_cuda` Python module: dcr/cuda.h for torch CUDA tensors, in the
// serving process or the trainer (docs/PYTHON.md §"CUDA tensors"). It
// needs nothing of torch's C++ API: a tensor is read through its Python
// attributes (is_cuda, data_ptr, dtype, shape, contiguity), so the module
// builds against any torch, on a GPU machine's own Python too
// (bench/gpu_check.sh builds it there from the carried static libraries).
//
//   dcr_cuda.built() / devices()
//   dcr_cuda.tensor_digest(t)          device (or host) tensor digest, hex
//   dcr_cuda.find_changes(base, target)  positions and XOR values, on GPU
//   dcr_cuda.encode_diff(base, target, span_elems)  chunks (host tensors)
//   dcr_cuda.Applier(staging_bytes).apply(chunk, t, span_elems), flush()
//   dcr_cuda.Exporter(socket, {name: t})  CUDA IPC for a relay
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"

namespace py = pybind11;
namespace cu = dcr::cuda;

namespace {

[[noreturn]] void Throw(const dcr::Status& s) {
  if (s.code() == dcr::StatusCode::kInvalidArgument) {
    throw py::value_error(s.ToString());
  }
  throw std::runtime_error(s.ToString());
}

template <typename T>
T Take(dcr::Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

void Check(const dcr::Status& s) {
  if (!s.ok()) Throw(s);
}

// A torch tensor's memory as dcr sees it.
struct TensorRef {
  bool cuda = false;
  int device = -1;              // CUDA device index
  cu::Stream stream = nullptr;  // torch's current stream on that device
  std::byte* ptr = nullptr;
  uint64_t bytes = 0;
  dcr::DType dtype = dcr::DType::kBF16;
  size_t elem_size = 0;
  std::vector<uint64_t> shape;
};

dcr::DType DTypeOf(const py::handle& t, const std::string& name) {
  // "torch.bfloat16" -> the safetensors name.
  static const std::map<std::string, dcr::DType> kNames = {
      {"torch.bfloat16", dcr::DType::kBF16},
      {"torch.float16", dcr::DType::kF16},
      {"torch.float32", dcr::DType::kF32},
      {"torch.float64", dcr::DType::kF64},
      {"torch.int8", dcr::DType::kI8},
      {"torch.uint8", dcr::DType::kU8},
      {"torch.int16", dcr::DType::kI16},
      {"torch.int32", dcr::DType::kI32},
      {"torch.int64", dcr::DType::kI64},
      {"torch.bool", dcr::DType::kBool},
      {"torch.float8_e4m3fn", dcr::DType::kF8E4M3},
      {"torch.float8_e5m2", dcr::DType::kF8E5M2},
  };
  const std::string s = py::str(t.attr("dtype"));
  auto it = kNames.find(s);
  if (it == kNames.end()) {
    throw py::value_error("tensor '" + name + "' has dtype " + s +
                          ", which dcr does not carry");
  }
  return it->second;
}

TensorRef Ref(const py::handle& t, const std::string& name, bool need_cuda) {
  if (!py::hasattr(t, "data_ptr") || !py::hasattr(t, "is_cuda")) {
    throw py::value_error("'" + name + "' is not a torch tensor");
  }
  TensorRef r;
  const py::object device = t.attr("device");
  const std::string type = py::str(device.attr("type"));
  if (type != "cpu" && type != "cuda") {
    throw py::value_error("tensor '" + name + "' is on a " + type +
                          " device; dcr_cuda takes CPU and CUDA tensors");
  }
  r.cuda = type == "cuda";
  if (need_cuda && !r.cuda) {
    throw py::value_error("tensor '" + name +
                          "' is on the CPU; this call takes a CUDA tensor "
                          "(.cuda())");
  }
  if (r.cuda) {
    // The call runs on the tensor's device, after the work torch queued
    // on its current stream there.
    r.device = device.attr("index").cast<int>();
    Check(cu::UseDevice(r.device));
    const py::object torch_cuda = py::module_::import("torch.cuda");
    r.stream =
        reinterpret_cast<cu::Stream>(torch_cuda.attr("current_stream")(device)
                                         .attr("cuda_stream")
                                         .cast<uintptr_t>());
  }
  if (!t.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error("tensor '" + name +
                          "' is not contiguous (.contiguous())");
  }
  r.dtype = DTypeOf(t, name);
  r.elem_size = t.attr("element_size")().cast<size_t>();
  r.ptr = reinterpret_cast<std::byte*>(t.attr("data_ptr")().cast<uintptr_t>());
  r.bytes = t.attr("numel")().cast<uint64_t>() * r.elem_size;
  for (auto d : t.attr("shape")) r.shape.push_back(d.cast<uint64_t>());
  return r;
}

std::string TensorDigestHex(const py::handle& t) {
  TensorRef r = Ref(t, "tensor", false);
  if (!r.cuda) {
    return dcr::TensorDigest(std::span<const std::byte>(r.ptr, r.bytes))
        .ToHex();
  }
  // One digester per device (its tables live there).
  static std::map<int, std::unique_ptr<cu::Digester>> digesters;
  auto& digester = digesters[r.device];
  if (digester == nullptr) digester = Take(cu::Digester::Create());
  return Take(digester->TensorDigest(r.ptr, r.bytes, r.stream)).ToHex();
}

py::tuple FindChanges(const py::handle& base, const py::handle& target,
                      bool xor_values) {
  TensorRef t = Ref(target, "target", true), b = Ref(base, "base", true);
  if (b.bytes != t.bytes || b.elem_size != t.elem_size) {
    throw py::value_error("base and target differ in size or dtype");
  }
  if (b.device != t.device) {
    throw py::value_error("base and target are on different devices");
  }
  const uint64_t n = b.bytes / b.elem_size;
  if (n == 0) return py::make_tuple(py::bytes(), py::bytes());
  if (n > cu::kMaxDiffElems) {
    throw py::value_error("find_changes takes fewer than 2^32 elements");
  }
  auto differ = Take(cu::Differ::Create(n));
  auto pos = Take(cu::DeviceBuffer::Allocate(4 * n));
  auto val = Take(cu::DeviceBuffer::Allocate(b.bytes));
  uint64_t k = 0;
  {
    py::gil_scoped_release release;
    // After torch's work on the base's stream (the target's is made to
    // wait by the caller's usual stream discipline: both are on one).
    k = Take(differ->FindChanges(b.elem_size, b.ptr, t.ptr, n, xor_values,
                                 static_cast<uint32_t*>(pos.data()), val.data(),
                                 b.stream));
  }
  std::string p(4 * k, '\0'), v(k * b.elem_size, '\0');
  Check(cu::CopyToHost(std::as_writable_bytes(std::span(p.data(), p.size())),
                       pos.data()));
  Check(cu::CopyToHost(std::as_writable_bytes(std::span(v.data(), v.size())),
                       val.data()));
  return py::make_tuple(py::bytes(p), py::bytes(v));
}

py::list EncodeDiff(const py::handle& base, const py::handle& target,
                    uint64_t span_elems, bool overwrite) {
  TensorRef b = Ref(base, "base", false), t = Ref(target, "target", false);
  if (b.cuda || t.cuda) {
    throw py::value_error("encode_diff takes host tensors (.cpu())");
  }
  if (b.bytes != t.bytes || b.elem_size != t.elem_size || span_elems == 0) {
    throw py::value_error("base and target differ in size or dtype");
  }
  auto enc = Take(dcr::ChunkEncoder::Create(dcr::EncodeOptions{}));
  const uint64_t n = b.bytes / b.elem_size, w = b.elem_size;
  py::list out;
  for (uint64_t s = 0; s * span_elems < n; ++s) {
    const uint64_t k = std::min(span_elems, n - s * span_elems);
    std::vector<std::byte> chunk;
    const bool any = Take(enc->EncodeDiffInContext(
        overwrite ? dcr::ChunkKind::kOverwrite : dcr::ChunkKind::kXor,
        {0, static_cast<uint32_t>(s), 0}, w, dcr::ExponentFieldOf(b.dtype),
        std::span<const std::byte>(b.ptr + s * span_elems * w, k * w),
        std::span<const std::byte>(t.ptr + s * span_elems * w, k * w), &chunk));
    if (any) {
      out.append(
          py::bytes(reinterpret_cast<const char*>(chunk.data()), chunk.size()));
    }
  }
  return out;
}

class PyApplier {
 public:
  // On the current CUDA device (torch.cuda.current_device()).
  explicit PyApplier(size_t staging_bytes) {
    device_ =
        py::module_::import("torch.cuda").attr("current_device")().cast<int>();
    Check(cu::UseDevice(device_));
    applier_ = Take(cu::ChunkApplier::Create({staging_bytes, 4}));
  }

  // The chunk's own id names its span of `t` (spans of span_elems).
  void Apply(const py::bytes& chunk, const py::handle& t, uint64_t span_elems) {
    TensorRef r = Ref(t, "tensor", true);
    if (r.device != device_) {
      throw py::value_error(
          "the tensor is on cuda:" + std::to_string(r.device) +
          ", this applier on cuda:" + std::to_string(device_));
    }
    const std::string_view c = chunk;
    const auto bytes = std::as_bytes(std::span(c.data(), c.size()));
    const dcr::ChunkHeader h = Take(dcr::PeekChunkHeader(bytes));
    if (h.elem_size != r.elem_size) {
      throw py::value_error(
          "the chunk's elements are " + std::to_string(h.elem_size) +
          " bytes, the tensor's " + std::to_string(r.elem_size));
    }
    uint64_t at = 0;
    if (span_elems == 0 ||
        __builtin_mul_overflow(uint64_t{h.id.span}, span_elems, &at) ||
        __builtin_mul_overflow(at, uint64_t{r.elem_size}, &at) ||
        at >= r.bytes) {
      throw py::value_error("span " + std::to_string(h.id.span) + " of " +
                            std::to_string(span_elems) +
                            " elements lies past the tensor's end");
    }
    Check(applier_->Apply(bytes, r.ptr + at,
                          std::min(span_elems, (r.bytes - at) / r.elem_size),
                          r.stream));
    // The apply runs after this returns: the tensor's memory must not go
    // back to torch's allocator before flush().
    pending_.append(t);
  }
  void Flush() {
    {
      py::gil_scoped_release release;
      Check(applier_->Flush());
    }
    pending_ = py::list();
  }

 private:
  int device_ = 0;
  std::unique_ptr<cu::ChunkApplier> applier_;
  py::list pending_;  // tensors with applies in flight
};

// Exports CUDA tensors to a relay and serves the manifest until closed;
// holds the tensors so that their memory stays allocated meanwhile.
class PyExporter {
 public:
  PyExporter(const std::string& socket, const py::dict& tensors) {
    cu::IpcManifest m;
    int device = -1;
    for (auto [k, v] : tensors) {
      const std::string name = py::str(k);
      TensorRef r = Ref(v, name, true);
      if (device < 0) {
        device = r.device;
        m.device = Take(cu::PciBusId(device));
      } else if (r.device != device) {
        throw py::value_error("tensor '" + name +
                              "' is on cuda:" + std::to_string(r.device) +
                              ", the others on cuda:" + std::to_string(device) +
                              ": one Exporter per device");
      }
      m.tensors.push_back(
          Take(cu::ExportIpcTensor(name, r.dtype, r.shape, r.ptr)));
      held_.append(v);
    }
    manifest_ = cu::EncodeIpcManifest(m);
    server_ = Take(cu::IpcServer::Start(socket, std::move(m)));
  }
  void Close() {
    py::gil_scoped_release release;  // the server's thread may be sending
    server_.reset();
  }
  const std::string& manifest() const { return manifest_; }

 private:
  std::unique_ptr<cu::IpcServer> server_;
  std::string manifest_;
  py::list held_;
};

}  // namespace

PYBIND11_MODULE(dcr_cuda, m) {
  m.doc() = "dcr's CUDA kernels for torch CUDA tensors (docs/PYTHON.md)";
  m.def("built", &cu::Built, "Whether this dcr has its CUDA kernels.");
  m.def(
      "devices",
      [] {
        auto rt = cu::Probe();
        py::list out;
        if (!rt.ok()) return out;
        for (const auto& d : rt->devices) {
          py::dict e;
          e["index"] = d.index;
          e["name"] = d.name;
          e["compute_capability"] = py::make_tuple(d.cc_major, d.cc_minor);
          e["memory_bytes"] = d.memory_bytes;
          e["pci_bus_id"] = d.pci_bus_id;
          e["ipc"] = d.ipc;
          out.append(e);
        }
        return out;
      },
      "The CUDA devices dcr sees (empty without a usable one).");
  m.def("tensor_digest", &TensorDigestHex, py::arg("tensor"),
        "The tensor digest (32 hex digits) of a contiguous tensor's bits, "
        "computed where the tensor is; a CUDA tensor's equals its .cpu()'s.");
  m.def("find_changes", &FindChanges, py::arg("base"), py::arg("target"),
        py::arg("xor_values") = true,
        "(positions, values) of the elements whose bits differ, found on "
        "the GPU: positions as little-endian u32 bytes, values element-major "
        "(base ^ target, or target).");
  m.def("encode_diff", &EncodeDiff, py::arg("base"), py::arg("target"),
        py::arg("span_elems") = dcr::kDefaultSpanElems,
        py::arg("overwrite") = false,
        "The chunks of a delta from base to target (host tensors), span by "
        "span, as tensor 0 of a manifest.");
  py::class_<PyApplier>(m, "Applier",
                        "Applies encoded chunks to CUDA tensors in place.")
      .def(py::init<size_t>(), py::arg("staging_bytes") = 64 << 20)
      .def("apply", &PyApplier::Apply, py::arg("chunk"), py::arg("tensor"),
           py::arg("span_elems") = dcr::kDefaultSpanElems,
           "Decodes `chunk` and applies it to its span of `tensor`; returns "
           "once staged (flush() waits).")
      .def("flush", &PyApplier::Flush);
  py::class_<PyExporter>(
      m, "Exporter",
      "Serves CUDA IPC handles of tensors on a Unix socket for a relay.")
      .def(py::init<const std::string&, const py::dict&>(), py::arg("socket"),
           py::arg("tensors"))
      .def("close", &PyExporter::Close)
      .def_property_readonly("manifest", &PyExporter::manifest)
      .def("__enter__", [](PyExporter& e) -> PyExporter& { return e; })
      .def("__exit__", [](PyExporter& e, py::args) { e.Close(); });
}
