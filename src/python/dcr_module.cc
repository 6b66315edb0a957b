// The `dcr` Python module (pybind11): what a trainer rank calls after each
// optimizer step to diff its own shards and get its chunk parts and digest
// parts (dcr/shard_delta.h), plus the helpers a test needs to check them
// (apply parts to canonical tensors, tensor digests). docs/PYTHON.md. The
// producers' classes are in producer_binding.cc, dcr.Receiver in
// receiver_binding.cc.
//
// Tensors cross without a copy: a torch tensor (CPU, contiguous or made
// so) is viewed as bytes (`t.reshape(-1).view(torch.uint8).numpy()`),
// which works for BF16, which NumPy cannot hold; any object with the
// buffer protocol (NumPy arrays, bytes) is taken as it is.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/failpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"
#include "dcr/thread_pool.h"
#include "python/fp8_functions.h"
#include "python/module_common.h"
#include "python/rank_shards.h"

namespace py = pybind11;

namespace dcr {
using python::Bytes;
using python::BytesOf;
using python::Check;
using python::DigestPartFromHex;
using python::Placed;
using python::ShardsOf;
using python::Take;
}  // namespace dcr

PYBIND11_MODULE(dcr, m) {
  using namespace dcr;
  using namespace pybind11::literals;
  m.doc() =
      "dcr for trainer ranks: diff a rank's shards into chunk parts and "
      "digest parts, and stream them to dcr refit --producers "
      "(docs/PYTHON.md)";
  // Tests make a rank fail on purpose (docs/TESTING.md §"Failpoints"): the
  // module is the process's entry to dcr, as main is for the binaries.
  if (Status s = InitFailpointsFromEnv(); !s.ok()) {
    throw py::value_error("DCR_FAILPOINTS: " + s.ToString());
  }

  py::class_<Layout>(m, "Layout",
                     "A placement layout (docs/PLACEMENT.md), resolved")
      .def(py::init([](const std::string& path) {
             auto l = LoadLayout(path);
             if (l.status().IsNotFound()) {
               PyErr_SetString(PyExc_FileNotFoundError,
                               l.status().ToString().c_str());
               throw py::error_already_set();
             }
             return Take(std::move(l));
           }),
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

  m.def(
      "write_delta",
      [](const Layout& l, const std::string& base_dir,
         const std::string& target_dir, const std::string& path,
         uint64_t span_elems, uint64_t base_step, uint64_t target_step) {
        if (span_elems == 0 || span_elems > kMaxSpanElems) {
          throw py::value_error("span_elems must be 1 to " +
                                std::to_string(kMaxSpanElems));
        }
        DiffOptions o;
        o.span_elems = span_elems;
        o.base_step = base_step;
        o.target_step = target_step;
        // Each rank's shards: DIR/rank-RRRRR.pt (torch.save of a name ->
        // tensor dict), read under the GIL one rank at a time; or the
        // safetensors files dcr diff --layout reads.
        auto pt = [](const std::string& dir, uint32_t rank) {
          std::string p = ShardFilePath(dir, rank);
          return p.substr(0, p.size() - std::string(".safetensors").size()) +
                 ".pt";
        };
        RankShardsSource source = [&](uint32_t rank,
                                      const RankShardsUse& use) -> Status {
          py::gil_scoped_acquire gil;
          Placed shards[2];
          std::vector<py::object> files;
          const std::string dirs[2] = {base_dir, target_dir};
          // (Python errors become a Status here: they must not cross the
          // pool's worker.)
          try {
            py::object torch = py::module_::import("torch");
            for (int k = 0; k < 2; ++k) {
              files.push_back(torch.attr("load")(pt(dirs[k], rank),
                                                 "map_location"_a = "cpu",
                                                 "weights_only"_a = true));
              if (!py::isinstance<py::dict>(files.back())) {
                return Status::InvalidArgument(pt(dirs[k], rank) +
                                               ": not a dict of tensors");
              }
              // map_location: the CPU, so host memory.
              shards[k] = ShardsOf(l, rank, files.back());
            }
          } catch (const std::exception& e) {
            return Status::InvalidArgument(
                pt(dirs[files.size() < 2 ? files.size() : 1], rank) + ": " +
                e.what());
          }
          py::gil_scoped_release released;
          return use(shards[0].shards, shards[1].shards);
        };
        const bool torch_files = std::filesystem::exists(pt(base_dir, 0)) &&
                                 std::filesystem::exists(pt(target_dir, 0));
        DeltaStats stats;
        {
          py::gil_scoped_release released;
          ThreadPool pool(1);
          stats =
              Take(torch_files ? WriteDeltaFromRanks(l, source, path, o, &pool)
                               : WriteDeltaFromShards(l, base_dir, target_dir,
                                                      path, o, &pool));
        }
        py::dict out;
        out["chunks"] = stats.chunks;
        out["changed"] = stats.header.changed_elements;
        out["file_bytes"] = stats.file_bytes;
        out["base_digest"] = stats.header.base.digest.ToHex();
        out["target_digest"] = stats.header.target.digest.ToHex();
        return out;
      },
      "layout"_a, "base"_a, "target"_a, "path"_a,
      "span_elems"_a = kDefaultSpanElems, "base_step"_a = 0,
      "target_step"_a = 1,
      "dcr diff --layout from Python: the delta from the shards in directory "
      "`base` to those in `target` (each rank's rank-RRRRR.pt, torch.save of "
      "a name -> tensor dict, or rank-RRRRR.safetensors), written to `path`; "
      "no canonical tensor is gathered");

  m.def(
      "apply_chunks",
      [](const Layout& l, const py::dict& canonical, const py::list& chunks,
         uint64_t span_elems) {
        if (span_elems == 0 || span_elems > kMaxSpanElems) {
          throw py::value_error("span_elems must be 1 to " +
                                std::to_string(kMaxSpanElems));
        }
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
          // The chunk must fit the tensor as the layout gives it, cut in
          // spans of `span_elems`.
          const LayoutTensor& lt = l.tensors[id.tensor];
          uint64_t n = 1;
          for (uint64_t d : lt.shape) n *= d;
          const uint64_t w = DTypeSize(lt.dtype);
          auto t = it->second.span();
          if (t.size() != n * w || c.header.elem_size != w ||
              id.span >= SpanCount(n, span_elems) ||
              c.header.span_elems !=
                  std::min<uint64_t>(span_elems,
                                     n - uint64_t{id.span} * span_elems)) {
            throw py::value_error("chunk (" + ChunkIdText(id) +
                                  ") does not fit tensor '" + it->first +
                                  "' in spans of " +
                                  std::to_string(span_elems) + " elements");
          }
          const uint64_t first = uint64_t{id.span} * span_elems * w;
          Check(ApplyChunk(c, t.subspan(first, c.header.span_elems * w)));
        }
      },
      "layout"_a, "canonical"_a, "chunks"_a, "span_elems"_a = kDefaultSpanElems,
      "apply chunk parts (as diff returns them) to canonical tensors in "
      "place");

  python::AddProducers(m);
  python::AddFp8Functions(m);
  python::AddReceiver(m);

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
        if (parts.size() != l.ranks()) {
          throw py::value_error(
              "digest parts of " + std::to_string(parts.size()) +
              " ranks; the layout has " + std::to_string(l.ranks()));
        }
        std::vector<std::vector<LinearDigest>> ranks;
        for (const auto& r : parts) {
          if (r.size() != l.tensors.size()) {
            throw py::value_error(
                "a rank's digest parts do not number the "
                "layout's tensors");
          }
          std::vector<LinearDigest> d;
          for (const auto& h : r) d.push_back(DigestPartFromHex(h));
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
