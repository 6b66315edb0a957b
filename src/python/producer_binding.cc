// dcr.ShardProducer and dcr.Producer: a trainer rank's producer
// (include/dcr/shard_delta.h, include/dcr/producer.h; docs/PYTHON.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "dcr/cuda.h"
#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/shard_delta.h"
#include "python/module_common.h"
#include "python/rank_shards.h"
#include "wire/hmac_authenticator.h"

namespace py = pybind11;

namespace dcr::python {
namespace {

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

py::dict StepDict(const ShardProducer::Step& step) {
  py::list chunks;
  for (const auto& [id, bytes] : step.chunks) {
    chunks.append(py::make_tuple(
        id.tensor, id.span, id.part,
        py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  }
  py::list base, target;
  for (const auto& d : step.base_digests) base.append(DigestPartHex(d));
  for (const auto& d : step.target_digests) target.append(DigestPartHex(d));
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

void AddProducers(py::module_& m) {
  using namespace pybind11::literals;
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
}

}  // namespace dcr::python
