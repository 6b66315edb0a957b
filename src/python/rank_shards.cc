// A rank's shards from Python (python/rank_shards.h).
#include "python/rank_shards.h"

#include <pybind11/stl.h>

#include <map>

namespace dcr::python {
namespace {

// The safetensors spelling of a torch dtype ("" if dcr has none).
std::string DTypeOfTorch(const py::handle& t) {
  static const std::map<std::string, std::string> kNames = {
      {"torch.bfloat16", "BF16"}, {"torch.float16", "F16"},
      {"torch.float32", "F32"},   {"torch.float64", "F64"},
      {"torch.int8", "I8"},       {"torch.uint8", "U8"},
      {"torch.int16", "I16"},     {"torch.int32", "I32"},
      {"torch.int64", "I64"},     {"torch.bool", "BOOL"}};
  auto it = kNames.find(py::str(t.attr("dtype")).cast<std::string>());
  return it == kNames.end() ? "" : it->second;
}

// The CUDA device a torch tensor is on, or -1 for the CPU (and for
// anything that is not a torch tensor).
int DeviceOf(const py::handle& v) {
  if (!py::hasattr(v, "is_cuda") || !py::hasattr(v, "device") ||
      !v.attr("is_cuda").cast<bool>()) {
    return -1;
  }
  py::object index = v.attr("device").attr("index");
  if (index.is_none()) {
    return py::module_::import("torch.cuda")
        .attr("current_device")()
        .cast<int>();
  }
  return index.cast<int>();
}

}  // namespace

std::string Where(int device) {
  return device < 0 ? std::string("the CPU") : "cuda:" + std::to_string(device);
}

Placed ShardsOf(const Layout& layout, uint32_t rank, const py::dict& named) {
  const auto shards = layout.ShardsOf(rank);
  Placed out;
  out.held.reserve(named.size());
  std::string first;  // the first shard's name, for the error
  for (auto [k, v] : named) {
    const std::string name = k.cast<std::string>();
    auto it = shards.find(name);
    if (it == shards.end()) continue;
    if (py::hasattr(v, "dtype") && py::hasattr(v, "is_cuda")) {
      const auto shape = v.attr("shape").cast<std::vector<uint64_t>>();
      const std::string dtype = DTypeOfTorch(v);
      if (shape != it->second.shape || dtype != DTypeName(it->second.dtype)) {
        throw py::value_error(
            "rank " + std::to_string(rank) + ": shard '" + name + "' is " +
            (dtype.empty() ? "of another dtype" : dtype) + " " +
            ShapeText(shape) + ", but layout " + layout.source + " gives it " +
            std::string(DTypeName(it->second.dtype)) + " " +
            ShapeText(it->second.shape) +
            "; a step that changes a tensor's shape needs a new layout and "
            "a full refit");
      }
    }
    const int device = DeviceOf(v);
    if (first.empty()) {
      first = name;
      out.device = device;
    } else if (device != out.device) {
      throw py::value_error("rank " + std::to_string(rank) + ": shard '" +
                            name + "' is on " + Where(device) + " and '" +
                            first + "' on " + Where(out.device) +
                            "; hand a producer all of its rank's shards "
                            "from one device");
    }
    if (device < 0) {
      out.held.push_back(BytesOf(v, false, name));
      out.shards.emplace(name, out.held.back().span());
      continue;
    }
    if (!v.attr("is_contiguous")().cast<bool>()) {
      throw py::value_error("rank " + std::to_string(rank) + ": shard '" +
                            name + "' is not contiguous (.contiguous())");
    }
    py::object view = out.tensors.emplace_back(v.attr("detach")());
    const auto ptr = view.attr("data_ptr")().cast<uintptr_t>();
    const auto bytes = view.attr("numel")().cast<uint64_t>() *
                       view.attr("element_size")().cast<uint64_t>();
    out.shards.emplace(name, std::span<const std::byte>(
                                 reinterpret_cast<const std::byte*>(ptr),
                                 static_cast<size_t>(bytes)));
  }
  if (out.device >= 0) {
    py::object torch_cuda = py::module_::import("torch.cuda");
    // Torch without CUDA (a stand-in tensor): the producer's memory says
    // there is no GPU.
    if (torch_cuda.attr("is_available")().cast<bool>()) {
      torch_cuda.attr("current_stream")(out.device).attr("synchronize")();
    }
  }
  return out;
}

std::string DigestPartHex(const LinearDigest& d) {
  return Digest128{d.high, d.low}.ToHex();
}

LinearDigest DigestPartFromHex(const std::string& s) {
  Digest128 d = Take(Digest128::FromHex(s));
  return LinearDigest{d.low, d.high};
}

}  // namespace dcr::python
