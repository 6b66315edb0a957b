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

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/failpoint.h"
#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"
#include "dcr/thread_pool.h"
#include "python/fp8_functions.h"
#include "python/module_common.h"
#include "wire/hmac_authenticator.h"

namespace py = pybind11;

namespace dcr {
namespace {

using python::Bytes;
using python::BytesOf;
using python::Check;
using python::Take;
using python::TorchDeviceGuard;

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

// A rank's shards as handed from Python: their bytes in host memory, or
// spans of one GPU's memory (torch CUDA tensors).
struct Placed {
  ShardBytes shards;
  int device = -1;          // CUDA device index; -1: host memory
  std::vector<Bytes> held;  // keeps host buffers alive
  // Views (detach) that hold the CUDA tensors' storage while the GIL is
  // released (another thread may repoint a tensor); freed with the GIL.
  std::vector<py::object> tensors;
};

std::string Where(int device) {
  return device < 0 ? std::string("the CPU") : "cuda:" + std::to_string(device);
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

// A name -> tensor dict as rank `rank`'s shards (the others the layout
// does not give it are ignored). A torch tensor must have the layout's
// shape and dtype; sizes are checked for any buffer. CUDA tensors are
// taken as spans of their device's memory, all on one device and
// contiguous; torch's current stream there is synchronized first, so the
// optimizer step's kernels have finished.
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

// A ShardProducer or Producer is used by one thread at a time; Python
// threads may share one, so each call takes this lock, GIL released. Its
// shards live where the first tensors handed to it do (host or a GPU:
// cuda::CreateShardMemory); others are refused while it holds a baseline.
template <typename P>
struct Locked {
  template <typename... Args>
  explicit Locked(Args&&... args) : producer(std::forward<Args>(args)...) {}
  // Calls fn(producer, shards) for `named`'s shards, holding the lock and
  // not the GIL, their device current through torch's guard (so the
  // memory's own leaves it be).
  template <typename Fn>
  auto With(const py::dict& named, Fn fn) {
    Placed placed = ShardsOf(producer.layout(), producer.rank(), named);
    TorchDeviceGuard on_device(placed.device);
    py::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> lock(mu);
    if (placed.device != device && !placed.shards.empty()) {
      if (producer.has_baseline()) {
        throw py::value_error(
            "rank " + std::to_string(producer.rank()) +
            ": the producer's baseline is on " + Where(device) +
            ", these shards on " + Where(placed.device) +
            "; hand it shards where its baseline is (or use a new producer)");
      }
      std::unique_ptr<ShardMemory> memory;
      if (placed.device >= 0) {
        memory = Take(cuda::CreateShardMemory({.device = placed.device}));
      }
      Check(producer.UseMemory(std::move(memory)));
      device = placed.device;
    }
    return fn(producer, placed.shards);
  }
  P producer;
  std::mutex mu;
  int device = -1;  // where the producer's shards live; -1: host memory
};
using PyProducer = Locked<ShardProducer>;
using PyLiveProducer = Locked<Producer>;

py::dict DecisionDict(const ProducerDecision& d) {
  py::dict out;
  out["outcome"] = std::string(ProducerOutcomeName(d.outcome));
  out["committed"] = Advanced(d.outcome);
  out["refit"] = d.refit.ToHex();
  out["target_step"] = d.target.step;
  out["target_digest"] = d.target.digest.ToHex();
  out["reason"] = d.reason;
  out["baseline_dropped"] = d.baseline_dropped;
  out["chunks"] = d.chunks;
  out["payload_bytes"] = d.payload_bytes;
  out["changed"] = d.changed_elements;
  out["log_bytes"] = d.log_bytes;
  out["diff_seconds"] = d.diff_seconds;
  out["total_seconds"] = d.total_seconds;
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
  out["logged"] = step.logged;
  out["log_bytes"] = step.log_bytes;
  return out;
}

}  // namespace
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

  py::class_<PyProducer>(
      m, "ShardProducer",
      "A trainer rank's producer: keeps its baseline shards and diffs each "
      "step's shards against them")
      .def(py::init([](const Layout& l, uint32_t rank, uint64_t span_elems,
                       int64_t step_log_bytes) {
             if (step_log_bytes < -1) {
               throw py::value_error(
                   "step_log_bytes: -1 (the default bound), 0 (none) or a "
                   "number of bytes");
             }
             auto p = std::make_unique<PyProducer>(l, rank, span_elems);
             if (step_log_bytes >= 0) {
               p->producer.set_step_log_bytes(
                   static_cast<uint64_t>(step_log_bytes));
             }
             return p;
           }),
           "layout"_a, "rank"_a, "span_elems"_a = kDefaultSpanElems,
           "step_log_bytes"_a = -1,
           "step_log_bytes: the bound on a step's change log, by which a diff "
           "moves the baseline to the diffed bits at once (advance then reads "
           "nothing); -1: a quarter of the shards' bytes; 0: none (advance "
           "checks and copies the shards)")
      .def_property_readonly(
          "rank", [](const PyProducer& p) { return p.producer.rank(); })
      .def_property_readonly("baseline_bytes",
                             [](PyProducer& p) {
                               py::gil_scoped_release unlocked;
                               std::lock_guard<std::mutex> lock(p.mu);
                               return p.producer.baseline_bytes();
                             })
      .def(
          "set_baseline",
          [](PyProducer& p, const py::dict& named) {
            Check(p.With(named, [](ShardProducer& sp, const ShardBytes& b) {
              return sp.SetBaseline(b);
            }));
          },
          "shards"_a,
          "copy the rank's shards (name -> tensor) as the committed baseline")
      .def(
          "diff",
          [](PyProducer& p, const py::dict& named) {
            return StepDict(
                Take(p.With(named, [](ShardProducer& sp, const ShardBytes& b) {
                  return sp.Diff(b);
                })));
          },
          "shards"_a,
          "diff this step's shards against the baseline: {'chunks': [(tensor, "
          "span, part, bytes)], 'base_digests', 'target_digests', 'changed', "
          "'payload_bytes', 'logged' (the baseline holds the diffed bits "
          "until advance or rewind), 'log_bytes'}")
      .def(
          "advance",
          [](PyProducer& p, const py::dict& named) {
            Check(p.With(named, [](ShardProducer& sp, const ShardBytes& b) {
              return sp.Advance(b);
            }));
          },
          "shards"_a,
          "the refit committed: the bits last diffed become the baseline "
          "(with the step's change log, done at the diff and `shards` not "
          "read; without it, `shards` must still hold them)")
      .def(
          "rewind",
          [](PyProducer& p) {
            py::gil_scoped_release unlocked;
            std::lock_guard<std::mutex> lock(p.mu);
            p.producer.Rewind();
          },
          "the refit of the last diff did not commit: the baseline goes back "
          "to the base");

  py::class_<PyLiveProducer>(
      m, "Producer",
      "A trainer rank's producer for dcr refit --producers: after each "
      "optimizer step, refit(step, shards) streams the rank's changes to the "
      "coordinator and returns its decision")
      .def(
          py::init([](const Layout& l, uint32_t rank,
                      const std::string& coordinator, double timeout_s,
                      double connect_timeout_s, double heartbeat_s,
                      const std::string& auth_key_file,
                      const std::string& tls_ca_file,
                      const std::string& tls_cert_file,
                      const std::string& tls_key_file, int64_t step_log_bytes) {
            if (rank >= l.ranks()) {
              throw py::value_error("rank " + std::to_string(rank) +
                                    " is not below the layout's " +
                                    std::to_string(l.ranks()) + " ranks");
            }
            auto ms = [](double s) {
              return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
            };
            ProducerOptions o;
            o.coordinator = coordinator;
            o.timeout = ms(timeout_s);
            o.connect_timeout = ms(connect_timeout_s);
            o.heartbeat = ms(heartbeat_s);
            if (step_log_bytes < -1) {
              throw py::value_error(
                  "step_log_bytes: -1 (the default bound), 0 (none) or a "
                  "number of bytes");
            }
            if (step_log_bytes >= 0) {
              o.step_log_bytes = static_cast<uint64_t>(step_log_bytes);
            }
            // The coordinator's links are keyed and encrypted as its
            // topology's defaults say: the same files here.
            if (!auth_key_file.empty()) {
              auto key = LoadFrameKey(auth_key_file);
              if (!key.ok()) {
                throw py::value_error("auth_key_file: " +
                                      key.status().ToString());
              }
              o.transport.frames.authenticator = *std::move(key);
            }
            o.transport.tls =
                TlsOptions{tls_ca_file, tls_cert_file, tls_key_file};
            if (o.transport.tls.enabled() &&
                (tls_ca_file.empty() || tls_cert_file.empty() ||
                 tls_key_file.empty())) {
              throw py::value_error(
                  "TLS needs tls_ca_file, tls_cert_file and tls_key_file "
                  "together (the topology's defaults.tls_* of the "
                  "coordinator's tree)");
            }
            return std::make_unique<PyLiveProducer>(l, rank, std::move(o));
          }),
          "layout"_a, "rank"_a, "coordinator"_a, "timeout_s"_a = 600.0,
          "connect_timeout_s"_a = 10.0, "heartbeat_s"_a = 1.0,
          "auth_key_file"_a = "", "tls_ca_file"_a = "", "tls_cert_file"_a = "",
          "tls_key_file"_a = "", "step_log_bytes"_a = -1)
      .def_property_readonly(
          "rank", [](const PyLiveProducer& p) { return p.producer.rank(); })
      .def(
          "set_baseline",
          [](PyLiveProducer& p, const py::dict& named) {
            Check(p.With(named, [](Producer& pr, const ShardBytes& b) {
              return pr.SetBaseline(b);
            }));
          },
          "shards"_a,
          "copy the rank's shards (name -> tensor) at the version the tree "
          "holds now")
      .def(
          "refit",
          [](PyLiveProducer& p, uint64_t step, const py::dict& named) {
            return DecisionDict(
                Take(p.With(named, [step](Producer& pr, const ShardBytes& b) {
                  return pr.Refit(step, b);
                })));
          },
          "step"_a, "shards"_a,
          "one refit of this step's shards; blocks until the coordinator "
          "decided: {'outcome', 'committed', 'refit', 'target_step', "
          "'target_digest', 'reason', 'baseline_dropped', 'chunks', "
          "'payload_bytes', 'changed', 'log_bytes', 'diff_seconds', "
          "'total_seconds'}. On a commit the bits it diffed become the "
          "baseline (with the step's change log, whatever the shards hold "
          "by then); without a log, if they changed before the decision "
          "came, baseline_dropped is set and the next refit fetches the "
          "tree's");

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
