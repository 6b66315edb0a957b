// The `dcr` Python module (pybind11): what a trainer rank calls after each
// optimizer step to diff its own shards and get its chunk parts and digest
// parts (dcr/shard_delta.h), plus the helpers a test needs to check them
// (apply parts to canonical tensors, tensor digests). docs/PYTHON.md.
//
// Tensors cross without a copy: a torch tensor (CPU, contiguous or made
// so) is viewed as bytes (`t.reshape(-1).view(torch.uint8).numpy()`),
// which works for BF16, which NumPy cannot hold; any object with the
// buffer protocol (NumPy arrays, bytes) is taken as it is.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"

namespace py = pybind11;

namespace dcr {
namespace {

[[noreturn]] void Throw(const Status& s) {
  if (s.IsNotFound()) throw py::key_error(s.ToString());
  if (s.IsInvalidArgument()) throw py::value_error(s.ToString());
  throw std::runtime_error(s.ToString());
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

// A tensor's bytes, kept alive by `keep` (the buffer's owner).
struct Bytes {
  py::buffer_info info;
  std::span<std::byte> span() {
    return {static_cast<std::byte*>(info.ptr),
            static_cast<size_t>(info.size * info.itemsize)};
  }
};

// `obj` as bytes: a CPU torch tensor through a uint8 view of it (no copy
// when contiguous), or anything with the buffer protocol.
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
  return Bytes{std::move(info)};
}

// A name -> tensor dict as shard bytes; `held` keeps the buffers alive.
ShardBytes ShardsOf(const py::dict& named, std::vector<Bytes>* held) {
  ShardBytes out;
  held->reserve(named.size());
  for (auto [k, v] : named) {
    const std::string name = k.cast<std::string>();
    held->push_back(BytesOf(v, false, name));
    out.emplace(name, held->back().span());
  }
  return out;
}

std::string Hex(const LinearDigest& d) {
  return Digest128{d.high, d.low}.ToHex();
}

LinearDigest FromHex(const std::string& s) {
  Digest128 d = Take(Digest128::FromHex(s));
  return LinearDigest{d.low, d.high};
}

py::dict StepDict(const ShardProducer::Step& step) {
  py::list chunks;
  for (const auto& [id, bytes] : step.chunks) {
    chunks.append(py::make_tuple(
        id.tensor, id.span, id.part,
        py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  }
  py::list base, target;
  for (const auto& d : step.base_digests) base.append(Hex(d));
  for (const auto& d : step.target_digests) target.append(Hex(d));
  py::dict out;
  out["chunks"] = chunks;
  out["base_digests"] = base;
  out["target_digests"] = target;
  out["changed"] = step.changed;
  out["payload_bytes"] = step.sizes.total();
  return out;
}

}  // namespace
}  // namespace dcr

PYBIND11_MODULE(dcr, m) {
  using namespace dcr;
  using namespace pybind11::literals;
  m.doc() =
      "dcr for trainer ranks: diff a rank's shards into chunk parts and "
      "digest parts (docs/PYTHON.md)";

  py::class_<Layout>(m, "Layout",
                     "A placement layout (docs/PLACEMENT.md), resolved")
      .def(py::init(
               [](const std::string& path) { return Take(LoadLayout(path)); }),
           "path"_a)
      .def_property_readonly("ranks", &Layout::ranks)
      .def_property_readonly("source", [](const Layout& l) { return l.source; })
      .def_property_readonly(
          "fingerprint",
          [](const Layout& l) { return l.Fingerprint().ToHex(); })
      .def_property_readonly(
          "tensors",
          [](const Layout& l) {
            std::vector<std::string> names;
            for (const auto& t : l.tensors) {
              names.push_back(t.name);
            }
            return names;
          },
          "canonical tensor names, in canonical order")
      .def(
          "shards",
          [](const Layout& l, uint32_t rank) {
            py::dict out;
            for (const auto& [name, s] : l.ShardsOf(rank)) {
              out[py::str(name)] =
                  py::make_tuple(py::tuple(py::cast(s.shape)),
                                 std::string(DTypeName(s.dtype)));
            }
            return out;
          },
          "rank"_a,
          "the shards a rank hands its producer: name -> (shape, dtype)");

  py::class_<ShardProducer>(
      m, "ShardProducer",
      "A trainer rank's producer: keeps its baseline shards and diffs each "
      "step's shards against them")
      .def(py::init([](const Layout& l, uint32_t rank, uint64_t span_elems) {
             return std::make_unique<ShardProducer>(l, rank, span_elems);
           }),
           "layout"_a, "rank"_a, "span_elems"_a = kDefaultSpanElems)
      .def_property_readonly("rank", &ShardProducer::rank)
      .def_property_readonly("baseline_bytes", &ShardProducer::baseline_bytes)
      .def(
          "set_baseline",
          [](ShardProducer& p, const py::dict& named) {
            std::vector<Bytes> held;
            ShardBytes shards = ShardsOf(named, &held);
            Check(p.SetBaseline(shards));
          },
          "shards"_a,
          "copy the rank's shards (name -> tensor) as the committed baseline")
      .def(
          "diff",
          [](ShardProducer& p, const py::dict& named) {
            std::vector<Bytes> held;
            ShardBytes shards = ShardsOf(named, &held);
            ShardProducer::Step step;
            {
              py::gil_scoped_release unlocked;
              step = Take(p.Diff(shards));
            }
            return StepDict(step);
          },
          "shards"_a,
          "diff this step's shards against the baseline: {'chunks': [(tensor, "
          "span, part, bytes)], 'base_digests', 'target_digests', 'changed', "
          "'payload_bytes'}")
      .def(
          "advance",
          [](ShardProducer& p, const py::dict& named) {
            std::vector<Bytes> held;
            ShardBytes shards = ShardsOf(named, &held);
            Check(p.Advance(shards));
          },
          "shards"_a,
          "the refit committed: these shards (the ones last diffed) become "
          "the baseline");

  m.def(
      "apply_chunks",
      [](const Layout& l, const py::dict& canonical, const py::list& chunks,
         uint64_t span_elems) {
        auto decoder = Take(ChunkDecoder::Create());
        std::map<std::string, Bytes> held;
        for (auto [k, v] : canonical) {
          const std::string name = k.cast<std::string>();
          held.emplace(name, BytesOf(v, true, name));
        }
        DecodedChunk c;
        for (const py::handle item : chunks) {
          std::string bytes = item.cast<py::tuple>()[3].cast<std::string>();
          Check(decoder->Decode(
              std::as_bytes(std::span(bytes.data(), bytes.size())), &c));
          const ChunkId id = c.header.id;
          if (id.tensor >= l.tensors.size()) {
            throw py::value_error("a chunk names tensor " +
                                  std::to_string(id.tensor) +
                                  " past the layout");
          }
          auto it = held.find(l.tensors[id.tensor].name);
          if (it == held.end()) {
            throw py::key_error("no canonical tensor '" +
                                l.tensors[id.tensor].name + "' given");
          }
          const uint64_t w = c.header.elem_size;
          const uint64_t first = uint64_t{id.span} * span_elems * w;
          auto t = it->second.span();
          if (first + uint64_t{c.header.span_elems} * w > t.size()) {
            throw py::value_error("chunk (" + ChunkIdText(id) +
                                  ") does not fit tensor '" + it->first + "'");
          }
          Check(ApplyChunk(c, t.subspan(first, c.header.span_elems * w)));
        }
      },
      "layout"_a, "canonical"_a, "chunks"_a, "span_elems"_a = kDefaultSpanElems,
      "apply chunk parts (as diff returns them) to canonical tensors in "
      "place");

  m.def(
      "tensor_digest",
      [](const py::handle& t) {
        Bytes b = BytesOf(t, false, "tensor");
        return TensorDigest(b.span()).ToHex();
      },
      "tensor"_a, "the tensor digest of a tensor's bits (docs/FORMAT.md §1)");

  m.def(
      "finish_digests",
      [](const Layout& l, const std::vector<std::vector<std::string>>& parts) {
        std::vector<std::vector<LinearDigest>> ranks;
        for (const auto& r : parts) {
          if (r.size() != l.tensors.size()) {
            throw py::value_error(
                "a rank's digest parts do not number the "
                "layout's tensors");
          }
          std::vector<LinearDigest> d;
          for (const auto& h : r) d.push_back(FromHex(h));
          ranks.push_back(std::move(d));
        }
        CheckpointDigests d = DigestsFromParts(l, ranks);
        py::dict out;
        for (size_t i = 0; i < l.tensors.size(); ++i) {
          out[py::str(l.tensors[i].name)] = d.tensors[i].ToHex();
        }
        out["__version__"] = d.version.ToHex();
        return out;
      },
      "layout"_a, "parts"_a,
      "every rank's digest parts (diff's base_digests or target_digests) "
      "finished into tensor digests, and the version digest");
}
