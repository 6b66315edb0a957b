#include "coord/coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "common/failpoint.h"
#include "common/file.h"
#include "coord/history.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "protocol/epoch_file.h"
#include "protocol/fanout.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/refit_manifest.h"
#include "wire/signature.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

RefitId NewRefitId() {
  std::random_device rd;
  RefitId id;
  for (size_t i = 0; i < id.bytes.size(); i += 4) {
    uint32_t v = rd();
    for (size_t k = 0; k < 4; ++k) id.bytes[i + k] = uint8_t(v >> (8 * k));
  }
  return id;
}

std::string NowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status WriteText(const std::string& path, const std::string& text) {
  return WriteFileAtomic(
      path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

// The tree as PLAN nodes (each after its parent, as BuildTree orders them).
std::vector<PlanNode> PlanNodes(const Tree& tree) {
  std::vector<PlanNode> out;
  for (const TreeNode& n : tree.nodes) {
    PlanNode p;
    p.name = n.name;
    p.host = n.host;
    p.port = n.port;
    p.transport = std::string(TransportKindName(n.transport));
    p.parent = n.parent;
    p.link_bps = n.link_bandwidth_bps;
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json VersionJson(const Version& v) {
  return {{"step", v.step}, {"digest", v.digest.ToHex()}};
}

// The reason of a partial commit: who was left out, and why.
std::string ExcludedReason(const RefitReport& report) {
  std::vector<std::string> excluded;
  for (const NodeOutcome& n : report.nodes) {
    if (n.committed) continue;
    excluded.push_back(n.phase.empty()
                           ? n.node
                           : fmt::format("{} ({} at {})", n.node,
                                         NodeCodeName(n.code), n.phase));
  }
  return fmt::format("excluded, now stale: {}", fmt::join(excluded, ", "));
}

// How catch-up brings a relay whose PLAN_REPLY named version `v` to the
// tree's version: with the history chain from `v` to `reached` (the
// baseline before the commit, the target after; *chain gets it), or with a
// dense copy if `v` is an older step of this tree (its record says so).
// kNone for a store without a record of this tree, unfinished or missing.
enum class CatchUpBy { kNone, kHistory, kDense };
CatchUpBy HowToCatchUp(const DeltaHistory& history, const Version& v,
                       const Version& reached, uint64_t target_step,
                       std::vector<std::string>* chain = nullptr) {
  if (v.digest == Digest128{}) return CatchUpBy::kNone;
  auto c = history.Chain(v, reached);
  if (c.ok()) {
    if (chain) *chain = *std::move(c);
    return CatchUpBy::kHistory;
  }
  if (v.step > 0 && v.step < target_step) return CatchUpBy::kDense;
  return CatchUpBy::kNone;
}

// One encoded chunk framed and waiting to be sent.
struct Outgoing {
  FrameBuffer frame;
  uint64_t payload = 0;
};

// Encoded chunks between the encoder thread and the sender; Push blocks
// while more than `capacity` bytes wait (construction runs at most one
// window ahead of transfer).
class ChunkQueue {
 public:
  explicit ChunkQueue(uint64_t capacity) : capacity_(capacity) {}
  // False when cancelled.
  bool Push(Outgoing o) {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return cancelled_ || bytes_ < capacity_; });
    if (cancelled_) return false;
    bytes_ += o.frame->size();
    items_.push_back(std::move(o));
    return true;
  }
  std::optional<Outgoing> Pop() {
    std::lock_guard lock(mu_);
    if (items_.empty()) return std::nullopt;
    Outgoing o = std::move(items_.front());
    items_.pop_front();
    bytes_ -= o.frame->size();
    space_.notify_one();
    return o;
  }
  void Cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    space_.notify_all();
  }

 private:
  uint64_t capacity_;
  std::mutex mu_;
  std::condition_variable space_;
  std::deque<Outgoing> items_;  // guarded by mu_
  uint64_t bytes_ = 0;          // guarded by mu_
  bool cancelled_ = false;      // guarded by mu_
};

class RefitRun {
 public:
  // With `catch_up_chain` (history delta files, options.only_nodes set):
  // feeds the named relays the chain's composition, from its base to the
  // baseline's version.
  explicit RefitRun(const RefitOptions& options,
                    std::vector<std::string> catch_up_chain = {})
      : options_(options), chain_(std::move(catch_up_chain)) {}
  Result<RefitReport> Run();
  // After Run: the PLAN_REPLY of every receiver that needs catch-up.
  const std::vector<NodeResult>& behind() const { return behind_; }
  // dcr refit --resume: finishes the refit state_dir/current.json names.
  Result<RefitReport> Resume();

 private:
  // Sends COMMIT (commit_set) or ABORT down, collects the replies, advances
  // the baseline on commit, and writes the report.
  Result<RefitReport> Conclude(bool commit, std::set<std::string> commit_set,
                               const std::vector<NodeResult>& plan_results,
                               const std::vector<NodeResult>& votes,
                               Clock::time_point t0,
                               Clock::time_point t_decide);
  Status WriteCurrent();
  // The root's side of the tree links for this run's epoch and refit.
  Fanout::Options FanoutOptions(bool resume);
  Status Prepare();
  // Runs the mailbox until `done` or the fanout's deadline.
  void WaitPhase(const std::function<bool()>& done);
  Status SendDown(FrameType type, const std::vector<std::byte>& payload);
  // Streams chunks down the tree: the delta (or every span for --full),
  // or, with `repair` set, overwrite chunks of every span of
  // repair_tensors_.
  void Stream(bool repair = false);
  void Produce(bool repair);
  // END, then the votes of every receiver; repair rounds while some
  // receivers name tensors that differ and the budget lasts. Returns
  // whether END went out.
  bool Vote(std::vector<NodeResult>* votes);
  // With a signing key: puts the signed manifest of every chunk sent into
  // `end`. ResourceExhausted if it would not fit in one frame.
  Status SignEnd(EndMsg* end);
  Status CheckManifestFits(uint64_t chunks) const;
  void Finish(FrameType type, const std::vector<std::byte>& payload,
              FrameType reply);
  // The baseline takes the target's bits and is checked against the target
  // digest, with the refit recorded in progress in its record; the caller
  // commits it (baseline_->Commit). OK without doing anything when no
  // root.baseline is configured (baseline_ stays null).
  Status UpdateBaseline();
  void Summarize(const std::vector<NodeResult>& plan,
                 const std::vector<NodeResult>& votes,
                 const std::vector<NodeResult>& final_replies,
                 const std::set<std::string>& commit_set);
  std::map<std::string, NodeResult> ByNode(const std::vector<NodeResult>& v);

  const RefitOptions& options_;
  Tree tree_;
  std::string state_dir_;
  std::unique_ptr<Checkpoint> target_;
  std::unique_ptr<WeightStore> baseline_;
  StoreSpec baseline_spec_;
  RefitReport report_;
  PlanMsg plan_;
  uint64_t window_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<TransportSet> transports_;
  Mailbox mailbox_;
  std::shared_ptr<Fanout> fanout_;
  std::optional<FrameSender> sender_;  // once the epoch is known
  // Filled by the encoder thread; read after it joined.
  std::vector<std::pair<uint32_t, uint32_t>> ids_;
  // Chunks of repair rounds (overwrites), and what they repair.
  std::vector<std::pair<uint32_t, uint32_t>> repair_ids_;
  std::vector<uint32_t> repair_tensors_;
  std::string target_path_;  // the target checkpoint (resume: as recorded)
  bool copy_all_ = false;    // the baseline takes every tensor of the target
  // With a signing key: every chunk sent and its SHA-256, for the signed
  // manifest in END.
  std::vector<ManifestEntry> sent_;
  std::atomic<uint64_t> scanned_{0};
  Status produce_error_;
  ChunkSizes sizes_;
  std::unique_ptr<ChunkQueue> queue_;
  std::atomic<bool> produce_done_{false};
  // root.signing_key_file, loaded once in Prepare; null: END is unsigned.
  std::unique_ptr<Ed25519PrivateKey> signing_key_;
  // Catch-up: the history chain and its composition.
  std::vector<std::string> chain_;
  std::unique_ptr<ComposedDelta> composed_;
  // A delta refit of the whole tree records its chunks for the history;
  // kept if it commits.
  std::unique_ptr<DeltaWriter> record_;
  std::vector<NodeResult> behind_;
  // Makes the history record of this refit durable, once committed;
  // returns its path (nullopt, with a warning, if there is none or it
  // failed).
  std::optional<std::string> FinishRecord();
  // Removes history files beyond root.keep_deltas.
  void PruneHistory();
};

Status RefitRun::Prepare() {
  const Topology& topo = options_.topology;
  DCR_ASSIGN_OR_RETURN(tree_, BuildTree(topo));
  if (!options_.only_nodes.empty()) {
    if (options_.mode != RefitMode::kFull && chain_.empty()) {
      return Status::InvalidArgument(
          "refitting named nodes needs a full refit (--full)");
    }
    // The root feeds each named relay directly.
    Tree star;
    star.nodes.push_back(tree_.nodes[0]);
    star.nodes[0].children.clear();
    for (const std::string& name : options_.only_nodes) {
      int i = tree_.Find(name);
      if (i <= 0) {
        std::vector<std::string> names;
        for (size_t k = 1; k < tree_.nodes.size(); ++k) {
          names.push_back(tree_.nodes[k].name);
        }
        return Status::InvalidArgument(
            fmt::format("{}: no relay named '{}' (relays: {})", topo.source,
                        name, fmt::join(names, ", ")));
      }
      if (star.Find(name) >= 0) continue;
      TreeNode n = tree_.nodes[static_cast<size_t>(i)];
      n.parent = 0;
      n.children.clear();
      n.depth = 1;
      star.nodes[0].children.push_back(static_cast<int>(star.nodes.size()));
      star.nodes.push_back(std::move(n));
    }
    tree_ = std::move(star);
  }
  if (tree_.nodes.size() < 2) {
    return Status::InvalidArgument(topo.source +
                                   ": the topology has no relays to refit");
  }
  state_dir_ = topo.root.state_dir;
  if (state_dir_.empty()) {
    return Status::InvalidArgument(
        topo.source +
        ": root.state_dir is required for a refit (the coordinator keeps its "
        "epoch and commit decisions there)");
  }
  std::error_code ec;
  std::filesystem::create_directories(state_dir_ + "/decisions", ec);
  if (ec) {
    return Status::IOError(fmt::format("cannot create state_dir {}: {}",
                                       state_dir_, ec.message()));
  }
  if (!options_.signing_key_file.empty()) {
    auto key = Ed25519PrivateKey::Load(options_.signing_key_file);
    if (!key.ok()) {
      return key.status().WithContext(topo.source + ": root.signing_key_file");
    }
    signing_key_ = *std::move(key);
  }
  DCR_ASSIGN_OR_RETURN(
      target_, Checkpoint::Open(options_.target, Checkpoint::Mode::kReadOnly));
  if (topo.root.baseline.empty()) {
    if (options_.mode == RefitMode::kDelta) {
      return Status::InvalidArgument(
          topo.source +
          ": root.baseline is required for a delta refit (the checkpoint "
          "every relay holds now)");
    }
  } else {
    baseline_spec_.kind = StoreSpec::Kind::kFile;
    baseline_spec_.path = topo.root.baseline;
    baseline_spec_.data_sync = options_.baseline_data_sync;
    auto store = OpenStore(baseline_spec_);
    if (store.ok()) {
      baseline_ = *std::move(store);
      // This process ends with the refit: the next one settles the
      // write-back (dcr/store.h, DetachDataSync).
      baseline_->DetachDataSync();
    } else if (!store.status().IsNotFound() ||
               options_.mode == RefitMode::kDelta) {
      const Status& e = store.status();
      std::string msg = fmt::format(
          "root.baseline: {}{}", e.message(),
          e.IsNotFound() ? " (copy the checkpoint the relays hold there, or "
                           "seed the tree with dcr refit --full)"
                         : "");
      return e.IsNotFound()     ? Status::NotFound(msg)
             : e.IsCorruption() ? Status::Corruption(msg)
                                : Status::IOError(msg);
    }
  }
  if (baseline_ &&
      baseline_->manifest().digest() != target_->manifest().digest()) {
    return Status::InvalidArgument(fmt::format(
        "the target {} does not have the baseline's tensors: {}",
        options_.target,
        Manifest::Difference(baseline_->manifest(), target_->manifest())));
  }
  if (baseline_ && baseline_->InProgress()) {
    return Status::InvalidArgument(fmt::format(
        "root.baseline {} holds an unfinished update (refit {}); restore it "
        "from the last committed checkpoint",
        baseline_->describe(), baseline_->InProgress()->refit.ToHex()));
  }
  pool_ = std::make_unique<ThreadPool>(options_.threads);
  report_.mode = options_.mode;
  report_.refit = NewRefitId();
  report_.checkpoint_bytes = target_->manifest().TotalBytes();
  report_.total_elements = target_->manifest().TotalElements();
  if (baseline_) {
    if (auto c = baseline_->committed()) {
      report_.base = *c;
    } else {
      report_.base = Version{0, baseline_->Digests(pool_.get()).version};
    }
  }
  CheckpointDigests target_digests = target_->ComputeDigests(pool_.get());
  report_.target = Version{report_.base.step + 1, target_digests.version};
  if (!options_.only_nodes.empty()) {
    if (!baseline_ || target_digests.version != report_.base.digest) {
      return Status::InvalidArgument(fmt::format(
          "refitting named nodes seeds them with the tree's current version: "
          "the target {} must hold the bits of root.baseline (step {}); "
          "refit the whole tree to move to another version",
          options_.target, report_.base.step));
    }
    report_.target = report_.base;
    if (!chain_.empty()) {
      DCR_ASSIGN_OR_RETURN(
          composed_, ComposedDelta::Open(chain_, target_->manifest().digest(),
                                         topo.defaults.span_elems));
      if (composed_->target() != report_.target) {
        return Status::InvalidArgument(fmt::format(
            "the history chain ends at step {}, the baseline is step {}",
            composed_->target().step, report_.target.step));
      }
      report_.base = composed_->base();
    }
  }
  if (options_.mode == RefitMode::kDelta && baseline_ &&
      report_.target.digest == report_.base.digest) {
    return Status::InvalidArgument(fmt::format(
        "the target {} holds the same bits as the baseline (step {}): "
        "nothing to refit",
        options_.target, report_.base.step));
  }
  if (signing_key_) {
    // END carries a manifest entry per chunk: refuse now, before any relay
    // is asked, a refit whose manifest could not fit in one frame.
    uint64_t spans = 0;
    for (const TensorInfo& t : target_->manifest().tensors()) {
      spans += SpanCount(t.NumElements(), topo.defaults.span_elems);
    }
    if (Status s = CheckManifestFits(spans); !s.ok()) {
      return Status::InvalidArgument(topo.source + ": " +
                                     std::string(s.message()));
    }
  }
  if (std::error_code e2;
      std::filesystem::exists(state_dir_ + "/current.json", e2)) {
    return Status::InvalidArgument(fmt::format(
        "{}/current.json names a refit that did not finish (the coordinator "
        "stopped); run dcr refit --resume to commit or abort it first",
        state_dir_));
  }
  DCR_ASSIGN_OR_RETURN(report_.epoch, EpochFile(state_dir_ + "/epoch").Next());
  // PLAN is frame 0 (the fan-out's); everything after it is numbered from 1.
  sender_.emplace(options_.transport_options.frames,
                  FrameContext{report_.epoch, report_.refit}, 1);
  if (options_.mode == RefitMode::kDelta && options_.only_nodes.empty() &&
      baseline_) {
    DeltaHistory history(state_dir_ + "/history", topo.root.keep_deltas);
    auto record = history.Record(report_.target);
    if (record.ok()) {
      record_ = *std::move(record);
    } else {
      spdlog::warn("not recording this delta for catch-up: {}",
                   record.status().ToString());
    }
  }

  window_ = std::max<uint64_t>(topo.defaults.window_bytes, 1u << 20);
  plan_.mode = options_.mode;
  plan_.base = report_.base;
  plan_.target = report_.target;
  plan_.manifest = target_->manifest().digest();
  plan_.span_elems = topo.defaults.span_elems;
  plan_.chunk_window_bytes = window_;
  plan_.phase_timeout_ms =
      static_cast<uint32_t>(options_.phase_timeout.count());
  if (options_.mode == RefitMode::kFull) {
    plan_.tensors = target_->manifest().tensors();
  }
  plan_.target_tensor_digests = std::move(target_digests.tensors);
  plan_.heartbeat_ms = static_cast<uint32_t>(options_.heartbeat.count());
  plan_.nodes = PlanNodes(tree_);
  TransportOptions to = options_.transport_options;
  to.name = topo.root.name;
  transports_ = std::make_unique<TransportSet>(to, options_.transport);
  return Status::OK();
}

void RefitRun::WaitPhase(const std::function<bool()>& done) {
  while (!done()) {
    Clock::time_point next = std::min(
        fanout_->deadline(), Clock::now() + std::chrono::milliseconds(50));
    mailbox_.RunUntil(next);
    fanout_->ExpireIfDue(Clock::now());
    fanout_->Tick(Clock::now());
  }
}

Status RefitRun::SendDown(FrameType type,
                          const std::vector<std::byte>& payload) {
  DCR_ASSIGN_OR_RETURN(FrameBuffer frame, sender_->Next(type, payload));
  report_.stream_bytes += frame->size();
  fanout_->Forward(frame);
  return Status::OK();
}

Status RefitRun::CheckManifestFits(uint64_t chunks) const {
  // END: version, chunk count, ids digest, manifest length (varint), the
  // manifest, the signature.
  constexpr uint64_t kOverhead =
      1 + 8 + 16 + 10 + kManifestFixedBytes + kEd25519SignatureSize;
  uint64_t limit = std::min<uint64_t>(
      options_.transport_options.frames.max_payload, kMaxEndManifestBytes);
  uint64_t max_chunks = std::min<uint64_t>(
      kMaxManifestChunks,
      limit > kOverhead ? (limit - kOverhead) / kManifestEntryBytes : 0);
  if (chunks > max_chunks) {
    return Status::ResourceExhausted(fmt::format(
        "a signed refit of {} chunks needs an END of about {} bytes, above "
        "the frame payload limit of {} bytes ({} chunks at most); raise "
        "defaults.span_elems (now {})",
        chunks, kOverhead + chunks * kManifestEntryBytes, limit, max_chunks,
        options_.topology.defaults.span_elems));
  }
  return Status::OK();
}

Status RefitRun::SignEnd(EndMsg* end) {
  if (!signing_key_) return Status::OK();
  DCR_RETURN_IF_ERROR(CheckManifestFits(sent_.size()));
  RefitManifest m;
  m.refit = report_.refit;
  m.epoch = report_.epoch;
  m.mode = plan_.mode;
  m.base = plan_.base;
  m.target = plan_.target;
  m.chunks = sent_;
  end->manifest = EncodeManifest(m);
  DCR_ASSIGN_OR_RETURN(Ed25519Signature sig,
                       SignManifest(end->manifest, *signing_key_));
  end->signature.assign(sig.begin(), sig.end());
  return Status::OK();
}

// The encoder thread: spans in canonical order, a batch at a time in
// parallel, queued in order.
void RefitRun::Produce(bool repair) {
  const Manifest& m = target_->manifest();
  uint64_t span_elems = plan_.span_elems;
  struct Item {
    uint32_t tensor, span;
  };
  std::vector<Item> items;
  // Catch-up from the history: the composed chunks, in order.
  const bool compose = composed_ && !repair;
  if (compose) {
    for (const ChunkId& id : composed_->ids()) {
      items.push_back({id.tensor, id.span});
    }
  } else {
    std::vector<uint32_t> all;
    if (!repair) {
      all.resize(m.size());
      for (size_t t = 0; t < m.size(); ++t) all[t] = static_cast<uint32_t>(t);
    }
    for (uint32_t t : repair ? repair_tensors_ : all) {
      uint64_t spans = SpanCount(m[t].NumElements(), span_elems);
      for (uint64_t s = 0; s < spans; ++s) {
        items.push_back({t, static_cast<uint32_t>(s)});
      }
    }
  }
  std::vector<std::unique_ptr<ChunkEncoder>> encoders(pool_->size());
  std::vector<std::unique_ptr<ChunkDecoder>> decoders(compose ? pool_->size()
                                                              : 0);
  std::vector<std::vector<std::byte>> scratch(decoders.size());
  for (auto& e : encoders) {
    EncodeOptions eo;
    eo.compress = options_.mode != RefitMode::kFull || options_.compress_full;
    auto enc = ChunkEncoder::Create(eo);
    if (!enc.ok()) {
      produce_error_ = enc.status();
      produce_done_ = true;
      mailbox_.Wake();
      return;
    }
    e = *std::move(enc);
  }
  for (auto& d : decoders) {
    auto dec = ChunkDecoder::Create();
    if (!dec.ok()) {
      produce_error_ = dec.status();
      produce_done_ = true;
      mailbox_.Wake();
      return;
    }
    d = *std::move(dec);
  }
  const size_t batch = std::max<size_t>(4, pool_->size() * 4);
  std::vector<std::vector<std::byte>> out(batch);
  std::vector<ChunkSizes> sizes(batch);
  std::vector<Status> errors(batch);
  std::vector<Sha256Digest> hashes(batch);
  for (size_t begin = 0; begin < items.size(); begin += batch) {
    size_t n = std::min(batch, items.size() - begin);
    pool_->ParallelFor(n, [&](size_t i, size_t worker) {
      const Item& it = items[begin + i];
      const TensorInfo& info = m[it.tensor];
      size_t es = DTypeSize(info.dtype);
      uint64_t first = uint64_t{it.span} * span_elems;
      uint64_t count = std::min(span_elems, info.NumElements() - first);
      auto target =
          target_->TensorData(it.tensor).subspan(first * es, count * es);
      out[i].clear();
      sizes[i] = ChunkSizes();
      ChunkId id{it.tensor, it.span};
      if (compose) {
        auto changed = composed_->Encode(
            begin + i, es, target, encoders[worker].get(),
            decoders[worker].get(), &scratch[worker], &out[i], &sizes[i]);
        errors[i] = changed.ok() ? Status::OK() : changed.status();
      } else if (options_.mode == RefitMode::kFull || repair) {
        errors[i] =
            encoders[worker]->EncodeFull(id, es, target, &out[i], &sizes[i]);
      } else {
        auto base =
            baseline_->Tensor(it.tensor).subspan(first * es, count * es);
        auto changed = encoders[worker]->EncodeDiff(
            ChunkKind::kXor, id, es, base, target, &out[i], &sizes[i]);
        errors[i] = changed.ok() ? Status::OK() : changed.status();
      }
      if (signing_key_ && errors[i].ok() && !out[i].empty()) {
        hashes[i] = Sha256(out[i]);
      }
      if (!repair) scanned_ += count * es;
    });
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].ok()) {
        produce_error_ = errors[i];
        produce_done_ = true;
        mailbox_.Wake();
        return;
      }
      if (out[i].empty()) continue;
      // Numbered in the order queued: the coordinator thread sends nothing
      // else while the encoder runs.
      auto frame = sender_->Next(FrameType::kChunk, out[i]);
      if (!frame.ok()) {
        produce_error_ = frame.status();
        produce_done_ = true;
        mailbox_.Wake();
        return;
      }
      (repair ? repair_ids_ : ids_)
          .emplace_back(items[begin + i].tensor, items[begin + i].span);
      if (signing_key_) {
        sent_.push_back(
            {ChunkId{items[begin + i].tensor, items[begin + i].span},
             hashes[i]});
      }
      if (!repair) sizes_ += sizes[i];
      if (record_ && !repair) {
        if (Status s = record_->Append(out[i]); !s.ok()) {
          spdlog::warn("not recording this delta for catch-up: {}",
                       s.ToString());
          record_.reset();
        }
      }
      if (!queue_->Push(Outgoing{*std::move(frame), out[i].size()})) {
        produce_done_ = true;
        return;
      }
      mailbox_.Wake();
    }
  }
  produce_done_ = true;
  mailbox_.Wake();
}

void RefitRun::Stream(bool repair) {
  queue_ = std::make_unique<ChunkQueue>(window_);
  produce_done_ = false;
  std::thread producer([this, repair] { Produce(repair); });
  auto last_progress = Clock::now();
  uint64_t payload = 0, chunks = 0;
  for (;;) {
    bool idle = true;
    while (fanout_->MaxQueuedBytes() <= window_) {
      auto o = queue_->Pop();
      if (!o) break;
      idle = false;
      report_.stream_bytes += o->frame->size();
      payload += o->payload;
      ++chunks;
      fanout_->Forward(o->frame, /*chunk=*/true);
    }
    mailbox_.RunUntil(Clock::now() + std::chrono::milliseconds(idle ? 20 : 0));
    fanout_->ExpireIfDue(Clock::now());  // adoptions: no phase deadline here
    fanout_->Tick(Clock::now());
    if (fanout_->live_children() == 0) {
      queue_->Cancel();
      spdlog::error("every cluster head left the refit; stopping the stream");
      break;
    }
    if (produce_done_) {
      // Drain what the encoder queued after its last wake-up.
      bool empty = false;
      while (fanout_->MaxQueuedBytes() <= window_) {
        auto o = queue_->Pop();
        if (!o) {
          empty = true;
          break;
        }
        report_.stream_bytes += o->frame->size();
        payload += o->payload;
        ++chunks;
        fanout_->Forward(o->frame, /*chunk=*/true);
      }
      if (empty) break;
    }
    if (options_.on_progress &&
        Clock::now() - last_progress > std::chrono::milliseconds(100)) {
      last_progress = Clock::now();
      RefitOptions::Progress p;
      p.scanned_bytes = scanned_;
      p.total_bytes = report_.checkpoint_bytes;
      p.payload_bytes = payload;
      p.chunks = chunks;
      for (auto& [name, bytes] : fanout_->QueueDepths()) {
        if (bytes >= p.slowest_queue_bytes) {
          p.slowest = name;
          p.slowest_queue_bytes = bytes;
        }
      }
      options_.on_progress(p);
    }
  }
  producer.join();
  if (repair) {
    report_.repair_chunks += chunks;
    report_.repair_bytes += payload;
    return;
  }
  report_.chunks = chunks;
  report_.payload_bytes = payload;
  report_.changed_elements = sizes_.changed;
  if (options_.on_progress) {
    RefitOptions::Progress p;
    p.scanned_bytes = scanned_;
    p.total_bytes = report_.checkpoint_bytes;
    p.payload_bytes = payload;
    p.chunks = chunks;
    options_.on_progress(p);
  }
}

bool RefitRun::Vote(std::vector<NodeResult>* votes) {
  for (int round = 0;; ++round) {
    // END names every distinct chunk id sent so far.
    std::vector<std::pair<uint32_t, uint32_t>> ids = ids_;
    ids.insert(ids.end(), repair_ids_.begin(), repair_ids_.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    EndMsg end{ids.size(), ChunkIdsDigest(ids)};
    fanout_->Expect(FrameType::kVote, Clock::now() + options_.phase_timeout);
    Status s = SignEnd(&end);
    if (s.ok()) s = SendDown(FrameType::kEnd, EncodeEnd(end));
    if (!s.ok()) {
      report_.reason = s.ToString();
      *votes = fanout_->Results();
      return false;  // no END went down: no vote will come
    }
    WaitPhase([&] { return fanout_->Complete(); });
    *votes = fanout_->Results();
    // Receivers whose bits differ name the tensors; overwrite chunks of
    // those tensors (idempotent, whatever each receiver applied before)
    // go down the whole tree, and everyone votes again.
    std::set<uint32_t> tensors;
    std::vector<std::string> needy;
    for (const NodeResult& r : *votes) {
      if ((r.code == NodeCode::kIncomplete ||
           r.code == NodeCode::kDigestMismatch) &&
          !r.repair.empty()) {
        tensors.insert(r.repair.begin(), r.repair.end());
        needy.push_back(r.node);
      }
    }
    if (tensors.empty()) return true;
    if (round >= options_.repair_rounds) {
      spdlog::warn("{} still differ after {} repair rounds; excluding them",
                   fmt::join(needy, ", "), round);
      return true;
    }
    repair_tensors_.assign(tensors.begin(), tensors.end());
    report_.repair_rounds = round + 1;
    spdlog::warn(
        "repair round {}: {} tensors differ on {}; resending them as "
        "overwrites",
        round + 1, repair_tensors_.size(), fmt::join(needy, ", "));
    Stream(/*repair=*/true);
    if (fanout_->live_children() == 0) return true;
  }
}

Fanout::Options RefitRun::FanoutOptions(bool resume) {
  Fanout::Options fo;
  fo.transports = transports_.get();
  fo.mailbox = &mailbox_;
  fo.connect_timeout = options_.connect_timeout;
  fo.hello = HelloMsg{options_.topology.root.name, kRoleRoot, report_.epoch};
  fo.frames = options_.transport_options.frames;
  fo.header.epoch = report_.epoch;
  fo.header.refit_id = report_.refit;
  fo.header.sequence = 0;
  fo.resume = resume;
  return fo;
}

// state_dir/current.json: the refit in progress, written durably before
// its PLAN and removed once its report is written; dcr refit --resume
// reads it.
Status RefitRun::WriteCurrent() {
  std::error_code ec;
  std::string target = std::filesystem::absolute(options_.target, ec);
  nlohmann::json j = {
      {"refit", report_.refit.ToHex()},
      {"epoch", report_.epoch},
      {"mode", options_.mode == RefitMode::kFull ? "full" : "delta"},
      {"base", VersionJson(report_.base)},
      {"target", VersionJson(report_.target)},
      {"target_path", ec ? options_.target : target},
      {"started_at", NowIso8601()}};
  return WriteText(
      state_dir_ + "/current.json",
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::map<std::string, NodeResult> RefitRun::ByNode(
    const std::vector<NodeResult>& v) {
  std::map<std::string, NodeResult> out;
  for (const NodeResult& r : v) out.emplace(r.node, r);
  return out;
}

Status RefitRun::UpdateBaseline() {
  if (baseline_spec_.path.empty()) {
    spdlog::warn("no root.baseline configured; the next delta refit needs one");
    return Status::OK();
  }
  if (!baseline_) {
    DCR_ASSIGN_OR_RETURN(
        baseline_,
        CreateStore(baseline_spec_, target_->manifest(), target_->metadata()));
    baseline_->DetachDataSync();
  }
  const auto t0 = Clock::now();
  DCR_RETURN_IF_ERROR(
      baseline_->BeginRefit(report_.refit, report_.base, report_.target));
  const auto t_begun = Clock::now();
  // One pass per tensor, span by span: a span the refit changed (every
  // span of a full refit) is written from the target, then hashed from the
  // baseline while it is still in cache; an unchanged span is hashed as it
  // is. The digest is of the baseline's own bits, as a separate hash would
  // be, for one read of the memory instead of two; the writes go by
  // WriteTensor (pwrite on a disk filesystem, where rewriting a mapped
  // page faults).
  const Manifest& m = target_->manifest();
  const bool all = options_.mode == RefitMode::kFull || copy_all_;
  std::vector<std::pair<uint32_t, uint32_t>> ids;
  if (!all) {
    ids = ids_;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  const uint64_t span = std::max<uint64_t>(plan_.span_elems, 1);
  std::vector<Digest128> digests(m.size());
  std::vector<Status> errors(m.size());
  uint64_t written = 0;
  std::mutex written_mu;
  pool_->ParallelFor(m.size(), [&](size_t ti, size_t) {
    const auto t = static_cast<uint32_t>(ti);
    const size_t es = DTypeSize(m[t].dtype);
    const uint64_t n = m[t].NumElements();
    std::span<const std::byte> src = target_->TensorData(t);
    std::span<const std::byte> dst = baseline_->Tensor(t);
    auto next = std::lower_bound(ids.begin(), ids.end(),
                                 std::pair<uint32_t, uint32_t>{t, 0});
    Hasher128 h;
    uint64_t mine = 0;
    uint32_t s = 0;
    for (uint64_t first = 0; first < n; first += span, ++s) {
      const uint64_t bytes = std::min(span, n - first) * es;
      const uint64_t at = first * es;
      bool changed = all;
      if (next != ids.end() && next->first == t && next->second == s) {
        changed = true;
        ++next;
      }
      if (changed) {
        Status w = baseline_->WriteTensor(t, at, src.subspan(at, bytes));
        if (!w.ok()) {
          errors[t] = std::move(w);
          return;
        }
        mine += bytes;
      }
      h.Update(dst.subspan(at, bytes));
    }
    digests[t] = h.Finish();
    std::lock_guard lock(written_mu);
    written += mine;
  });
  for (const Status& e : errors) DCR_RETURN_IF_ERROR(e);
  Digest128 digest = VersionDigest(m.digest(), digests);
  const auto t_done = Clock::now();
  spdlog::debug(
      "root.baseline: record {:.3f} s, {:.1f} MB written and hashed in "
      "{:.3f} s",
      Seconds(t0, t_begun), static_cast<double>(written) / 1e6,
      Seconds(t_begun, t_done));
  if (digest != report_.target.digest) {
    std::string which;
    for (size_t t = 0; t < m.size() && t < plan_.target_tensor_digests.size();
         ++t) {
      if (digests[t] != plan_.target_tensor_digests[t]) {
        which = fmt::format(" (first differing tensor: '{}')", m[t].name);
        break;
      }
    }
    return Status::Internal(fmt::format(
        "the baseline does not have the target digest after the update ({} "
        "vs {}){}; did the target file change during the refit?",
        digest.ShortHex(), report_.target.digest.ShortHex(), which));
  }
  return Status::OK();
}

std::optional<std::string> RefitRun::FinishRecord() {
  if (!record_) return std::nullopt;
  DeltaHeader h;
  h.base = report_.base;
  h.target = report_.target;
  h.manifest = target_->manifest().digest();
  h.span_elems = plan_.span_elems;
  h.tensor_count = target_->manifest().size();
  h.total_elements = report_.total_elements;
  h.total_bytes = report_.checkpoint_bytes;
  h.changed_elements = sizes_.changed;
  Status s = record_->Finish(h);
  record_.reset();
  if (!s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    return std::nullopt;
  }
  return DeltaHistory(state_dir_ + "/history",
                      options_.topology.root.keep_deltas)
      .PathFor(report_.target);
}

void RefitRun::PruneHistory() {
  DeltaHistory history(state_dir_ + "/history",
                       options_.topology.root.keep_deltas);
  if (Status s = history.Prune(); !s.ok()) {
    spdlog::warn("cannot prune the delta history: {}", s.ToString());
  }
}

void RefitRun::Summarize(const std::vector<NodeResult>& plan,
                         const std::vector<NodeResult>& votes,
                         const std::vector<NodeResult>& final_replies,
                         const std::set<std::string>& commit_set) {
  auto p = ByNode(plan), v = ByNode(votes), f = ByNode(final_replies);
  uint64_t per_edge = report_.stream_bytes;
  for (size_t i = 1; i < tree_.nodes.size(); ++i) {
    const TreeNode& n = tree_.nodes[i];
    NodeOutcome o;
    o.node = n.name;
    o.cluster = n.cluster;
    o.committed = commit_set.count(n.name) && f.count(n.name) &&
                  f[n.name].code == NodeCode::kOk &&
                  f[n.name].version == report_.target;
    auto first_failure = [&](std::map<std::string, NodeResult>& m,
                             const char* phase) {
      if (!o.phase.empty()) return;
      auto it = m.find(n.name);
      if (it == m.end()) return;
      if (it->second.code != NodeCode::kOk) {
        o.code = it->second.code;
        o.phase = phase;
        o.detail = it->second.detail;
      }
    };
    first_failure(p, "plan");
    first_failure(v, "vote");
    first_failure(
        f, report_.outcome == RefitOutcome::kAborted ? "abort" : "commit");
    if (f.count(n.name)) o.chunks_applied = f[n.name].chunks_applied;
    if (!o.committed && o.phase.empty() &&
        report_.outcome != RefitOutcome::kAborted) {
      o.phase = "commit";
      o.detail = commit_set.count(n.name) ? "no commit reply"
                                          : "not in the commit set";
    }
    report_.nodes.push_back(std::move(o));
    // The stream crossed this node's link if a node of its subtree took
    // the plan (a parent sends chunks only towards such subtrees).
    bool carried = false;
    for (int k : tree_.Subtree(static_cast<int>(i))) {
      auto it = p.find(tree_.nodes[k].name);
      carried |= it != p.end() && it->second.code == NodeCode::kOk;
    }
    if (carried) {
      report_.link_class_bytes[std::string(LinkClassName(n.link))] += per_edge;
    }
  }
}

Result<RefitReport> RefitRun::Run() {
  auto t0 = Clock::now();
  DCR_RETURN_IF_ERROR(Prepare());
  DCR_RETURN_IF_ERROR(WriteCurrent());
  auto t_prepared = Clock::now();
  report_.prepare_seconds = Seconds(t0, t_prepared);
  spdlog::info("refit {} (epoch {}): {} step {} -> {} ({}), {} receivers",
               report_.refit.ToHex(), report_.epoch,
               options_.mode == RefitMode::kFull ? "full" : "delta",
               report_.base.step, report_.target.step,
               report_.target.digest.ShortHex(), tree_.nodes.size() - 1);

  fanout_ = Fanout::Create(FanoutOptions(/*resume=*/false), plan_);
  auto deadline = [&] { return Clock::now() + options_.phase_timeout; };

  // 1. Plan.
  DCR_FAILPOINT("coord.before_plan");
  fanout_->Start(deadline());
  WaitPhase([&] { return fanout_->Complete(); });
  fanout_->Stream();
  std::vector<NodeResult> plan_results = fanout_->Results();
  for (const NodeResult& r : plan_results) {
    if (r.code == NodeCode::kNeedsCatchUp) behind_.push_back(r);
  }
  auto t_plan = Clock::now();
  report_.plan_seconds = Seconds(t_prepared, t_plan);
  size_t receivers = tree_.nodes.size() - 1;
  // Named nodes are all required; min_commit is about the whole tree.
  size_t required =
      options_.topology.defaults.min_commit == 0 || !options_.only_nodes.empty()
          ? receivers
          : options_.topology.defaults.min_commit;
  size_t planned = std::count_if(
      plan_results.begin(), plan_results.end(),
      [](const NodeResult& r) { return r.code == NodeCode::kOk; });
  // Relays behind at an older step of this tree are brought to the target
  // after the commit (RunRefit's catch-up): they count towards min_commit.
  size_t catching_up = 0;
  if (options_.catch_up && options_.only_nodes.empty()) {
    DeltaHistory history(state_dir_ + "/history",
                         options_.topology.root.keep_deltas);
    catching_up =
        std::count_if(behind_.begin(), behind_.end(), [&](const NodeResult& r) {
          return HowToCatchUp(history, r.version, report_.base,
                              report_.target.step) != CatchUpBy::kNone;
        });
  }
  std::vector<NodeResult> votes;
  std::set<std::string> commit_set;
  bool commit = false;
  if (planned + catching_up < required) {
    report_.reason =
        fmt::format("{} of {} receivers took the plan; min_commit needs {}",
                    planned, receivers, required);
  } else {
    // 2. Stream.
    Stream();
    DCR_FAILPOINT("coord.after_stream");
    auto t_stream = Clock::now();
    report_.stream_seconds = Seconds(t_plan, t_stream);
    if (!produce_error_.ok()) {
      report_.reason = "encoding failed: " + produce_error_.ToString();
    } else {
      // 3. Vote (and repair).
      bool sent = Vote(&votes);
      report_.vote_seconds = Seconds(t_stream, Clock::now());
      for (const NodeResult& r : votes) {
        if (r.code == NodeCode::kOk && r.version == report_.target) {
          commit_set.insert(r.node);
        }
      }
      commit = sent && !commit_set.empty() &&
               commit_set.size() + catching_up >= required;
      if (!commit && report_.reason.empty()) {
        report_.reason = fmt::format(
            "{} of {} receivers verified the target; min_commit needs {}",
            commit_set.size(), receivers, required);
      }
    }
  }

  // 4. Decide, durably, then tell the tree.
  auto t_decide = Clock::now();
  if (commit) {
    nlohmann::json d = {
        {"refit", report_.refit.ToHex()},
        {"epoch", report_.epoch},
        {"decision", "commit"},
        {"base", VersionJson(report_.base)},
        {"target", VersionJson(report_.target)},
        {"commit_set",
         std::vector<std::string>(commit_set.begin(), commit_set.end())},
        {"decided_at", NowIso8601()}};
    Status s = WriteText(
        state_dir_ + "/decisions/" + report_.refit.ToHex() + ".json",
        d.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!s.ok()) {
      commit = false;
      report_.reason = "cannot record the commit decision: " + s.ToString();
    }
  }
  if (commit && options_.crash_after_decision) {
    // Tests: the coordinator "dies" with its decision durable.
    transports_->Stop();
    mailbox_.Close();
    report_.reason = "stopped after the decision (crash_after_decision)";
    return report_;
  }
  return Conclude(commit, std::move(commit_set), plan_results, votes, t0,
                  t_decide);
}

Result<RefitReport> RefitRun::Conclude(
    bool commit, std::set<std::string> commit_set,
    const std::vector<NodeResult>& plan_results,
    const std::vector<NodeResult>& votes, Clock::time_point t0,
    Clock::time_point t_decide) {
  size_t receivers = tree_.nodes.size() - 1;
  auto deadline = [&] { return Clock::now() + options_.phase_timeout; };
  std::vector<NodeResult> final_replies;
  if (commit) {
    CommitMsg msg{report_.target, std::vector<std::string>(commit_set.begin(),
                                                           commit_set.end())};
    DCR_FAILPOINT("coord.before_commit");
    fanout_->Expect(FrameType::kCommitReply, deadline());
    const auto t_sent = Clock::now();
    Status s = SendDown(FrameType::kCommit, EncodeCommit(msg));
    // The decision is durable: the baseline takes the target's bits while
    // the relays commit. (Named nodes only: the baseline already holds the
    // target, and the history does not change.)
    const bool whole_tree = options_.only_nodes.empty();
    Status b;
    std::thread baseline([&] {
      if (whole_tree && target_) b = UpdateBaseline();
    });
    if (s.ok()) WaitPhase([&] { return fanout_->Complete(); });
    const auto t_replies = Clock::now();
    // The history file is made durable while the baseline pass runs: once
    // the baseline commits, its write-back (a checkpoint's worth of dirty
    // pages on a disk) would hold the fsync up behind it.
    std::optional<std::string> recorded;
    if (whole_tree) recorded = FinishRecord();
    record_.reset();
    const auto t_recorded = Clock::now();
    baseline.join();
    if (b.ok() && whole_tree && target_ && baseline_) {
      b = baseline_->Commit(report_.target, report_.refit);
    }
    if (!b.ok() && recorded) {
      // The history must end at the baseline's version.
      std::error_code ec;
      std::filesystem::remove(*recorded, ec);
      if (ec) {
        spdlog::warn("cannot remove {} (the baseline is not at its target): {}",
                     *recorded, ec.message());
      }
    }
    if (whole_tree) PruneHistory();
    spdlog::debug(
        "commit phase: decision recorded {:.3f} s, replies {:.3f} s, delta "
        "history {:.3f} s, baseline done {:.3f} s later",
        Seconds(t_decide, t_sent), Seconds(t_sent, t_replies),
        Seconds(t_replies, t_recorded), Seconds(t_recorded, Clock::now()));
    DCR_FAILPOINT("coord.after_commit");
    final_replies = fanout_->Results();
    // Committed everywhere only if every receiver confirmed it: a node that
    // voted yes and then vanished before its COMMIT_REPLY is stale.
    size_t confirmed = std::count_if(
        final_replies.begin(), final_replies.end(), [&](const NodeResult& r) {
          return commit_set.count(r.node) && r.code == NodeCode::kOk &&
                 r.version == report_.target;
        });
    report_.outcome = confirmed == receivers ? RefitOutcome::kCommitted
                                             : RefitOutcome::kPartial;
    if (!b.ok()) {
      spdlog::error("the refit committed but the baseline was not advanced: {}",
                    b.ToString());
      report_.reason = "baseline not advanced: " + b.ToString();
    }
  } else {
    fanout_->Expect(FrameType::kAbortReply, deadline());
    Status s =
        SendDown(FrameType::kAbort, EncodeAbort(AbortMsg{report_.reason}));
    if (s.ok()) WaitPhase([&] { return fanout_->Complete(); });
    final_replies = fanout_->Results();
    report_.outcome = RefitOutcome::kAborted;
    commit_set.clear();
    record_.reset();  // removes the temporary file
  }
  report_.commit_seconds = Seconds(t_decide, Clock::now());
  report_.adoptions = fanout_->adoptions();
  report_.resent_chunks = fanout_->resent_chunks();
  report_.resent_bytes = fanout_->resent_bytes();
  report_.resend_misses = fanout_->resend_misses();
  fanout_->Close();
  Summarize(plan_results, votes, final_replies, commit_set);
  if (report_.outcome == RefitOutcome::kPartial && report_.reason.empty()) {
    report_.reason = ExcludedReason(report_);
  }
  report_.total_seconds = Seconds(t0, Clock::now());
  // Let the last frames leave before the links go.
  auto flush_until = Clock::now() + std::chrono::seconds(2);
  while (fanout_->MaxQueuedBytes() > 0 && Clock::now() < flush_until) {
    mailbox_.RunUntil(Clock::now() + std::chrono::milliseconds(5));
  }
  transports_->Stop();
  mailbox_.Close();
  Status w =
      WriteText(state_dir_ + "/last-refit.json", report_.ToJson() + "\n");
  if (!w.ok()) spdlog::warn("cannot write last-refit.json: {}", w.ToString());
  std::error_code ec;
  std::filesystem::remove(state_dir_ + "/current.json", ec);
  return report_;
}

}  // namespace

std::string_view RefitOutcomeName(RefitOutcome o) {
  switch (o) {
    case RefitOutcome::kCommitted:
      return "committed";
    case RefitOutcome::kPartial:
      return "committed-partial";
    case RefitOutcome::kAborted:
      return "aborted";
  }
  return "?";
}

std::string RefitReport::ToJson() const {
  nlohmann::json nodes_json = nlohmann::json::array();
  for (const NodeOutcome& n : nodes) {
    nodes_json.push_back({{"node", n.node},
                          {"cluster", n.cluster},
                          {"committed", n.committed},
                          {"code", std::string(NodeCodeName(n.code))},
                          {"phase", n.phase},
                          {"detail", n.detail},
                          {"chunks_applied", n.chunks_applied}});
  }
  nlohmann::json j = {
      {"refit", refit.ToHex()},
      {"epoch", epoch},
      {"mode", mode == RefitMode::kFull ? "full" : "delta"},
      {"outcome", std::string(RefitOutcomeName(outcome))},
      {"reason", reason},
      {"base", VersionJson(base)},
      {"target", VersionJson(target)},
      {"checkpoint_bytes", checkpoint_bytes},
      {"total_elements", total_elements},
      {"changed_elements", changed_elements},
      {"change_rate",
       total_elements ? double(changed_elements) / total_elements : 0.0},
      {"chunks", chunks},
      {"payload_bytes", payload_bytes},
      {"stream_bytes", stream_bytes},
      {"repair_rounds", repair_rounds},
      {"repair_chunks", repair_chunks},
      {"repair_bytes", repair_bytes},
      {"adoptions", adoptions},
      {"resent_chunks", resent_chunks},
      {"resent_bytes", resent_bytes},
      {"resend_misses", resend_misses},
      {"link_class_bytes", link_class_bytes},
      {"seconds",
       {{"prepare", prepare_seconds},
        {"plan", plan_seconds},
        {"stream", stream_seconds},
        {"vote", vote_seconds},
        {"commit", commit_seconds},
        {"total", total_seconds}}},
      {"nodes", nodes_json}};
  nlohmann::json catch_up_json = nlohmann::json::array();
  for (const CatchUpReport& c : catch_up) {
    catch_up_json.push_back(
        {{"refit", c.refit.ToHex()},
         {"epoch", c.epoch},
         {"nodes", c.nodes},
         {"method", c.method},
         {"from", VersionJson(c.from)},
         {"deltas", c.deltas},
         {"chunks", c.chunks},
         {"payload_bytes", c.payload_bytes},
         {"seconds", c.seconds},
         {"outcome", std::string(RefitOutcomeName(c.outcome))},
         {"reason", c.reason}});
  }
  j["catch_up"] = std::move(catch_up_json);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<RefitReport> RefitRun::Resume() {
  auto t0 = Clock::now();
  const Topology& topo = options_.topology;
  DCR_ASSIGN_OR_RETURN(tree_, BuildTree(topo));
  state_dir_ = topo.root.state_dir;
  if (state_dir_.empty()) {
    return Status::InvalidArgument(topo.source +
                                   ": root.state_dir is required to resume");
  }
  std::string current_path = state_dir_ + "/current.json";
  std::error_code ec;
  if (!std::filesystem::exists(current_path, ec)) {
    return Status::NotFound(fmt::format(
        "{} does not exist: no interrupted refit to resume", current_path));
  }
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(current_path));
  auto bad = [&](const std::string& why) {
    return Status::Corruption(current_path + ": " + why);
  };
  nlohmann::json cur = nlohmann::json::parse(text, nullptr, false);
  if (cur.is_discarded() || !cur.is_object()) return bad("not JSON");
  auto version = [&](const char* key) -> Result<Version> {
    if (!cur.contains(key) || !cur[key].is_object()) {
      return bad(std::string("no ") + key);
    }
    const auto& v = cur[key];
    if (!v.contains("step") || !v["step"].is_number_unsigned() ||
        !v.contains("digest") || !v["digest"].is_string()) {
      return bad(std::string("bad ") + key);
    }
    auto d = Digest128::FromHex(v["digest"].get<std::string>());
    if (!d.ok()) return bad(std::string("bad ") + key + " digest");
    return Version{v["step"].get<uint64_t>(), *d};
  };
  if (!cur.contains("refit") || !cur["refit"].is_string() ||
      !cur.contains("mode") || !cur["mode"].is_string() ||
      !cur.contains("target_path") || !cur["target_path"].is_string()) {
    return bad("refit, mode or target_path missing");
  }
  auto id = RefitId::FromHex(cur["refit"].get<std::string>());
  if (!id.ok()) return bad("bad refit id");
  report_.refit = *id;
  report_.mode = cur["mode"] == "full" ? RefitMode::kFull : RefitMode::kDelta;
  DCR_ASSIGN_OR_RETURN(report_.base, version("base"));
  DCR_ASSIGN_OR_RETURN(report_.target, version("target"));
  target_path_ = cur["target_path"].get<std::string>();

  // The decision, if the interrupted run reached one.
  std::set<std::string> commit_set;
  bool commit = false;
  std::string decision_path =
      state_dir_ + "/decisions/" + report_.refit.ToHex() + ".json";
  if (std::filesystem::exists(decision_path, ec)) {
    DCR_ASSIGN_OR_RETURN(std::string dtext, ReadFileToString(decision_path));
    nlohmann::json d = nlohmann::json::parse(dtext, nullptr, false);
    if (d.is_discarded() || !d.is_object() || !d.contains("decision") ||
        !d.contains("commit_set") || !d["commit_set"].is_array()) {
      return Status::Corruption(decision_path + ": not a decision");
    }
    commit = d["decision"] == "commit";
    for (const auto& n : d["commit_set"]) {
      if (n.is_string()) commit_set.insert(n.get<std::string>());
    }
  }

  pool_ = std::make_unique<ThreadPool>(options_.threads);
  if (!topo.root.baseline.empty()) {
    baseline_spec_.kind = StoreSpec::Kind::kFile;
    baseline_spec_.path = topo.root.baseline;
    baseline_spec_.data_sync = options_.baseline_data_sync;
    auto store = OpenStore(baseline_spec_);
    if (store.ok()) {
      baseline_ = *std::move(store);
      baseline_->DetachDataSync();
    }
  }
  // The baseline moves to the target on commit, from the target file.
  bool baseline_done = baseline_ && baseline_->committed() == report_.target;
  if (commit && !baseline_done && !topo.root.baseline.empty()) {
    auto t = Checkpoint::Open(target_path_, Checkpoint::Mode::kReadOnly);
    if (!t.ok()) {
      return t.status().WithContext(
          "the interrupted refit's target (needed to advance root.baseline)");
    }
    target_ = *std::move(t);
    copy_all_ = true;
    if (baseline_ && baseline_->InProgress()) {
      // An update the interrupted run began: it is redone whole.
      if (Status s = baseline_->EndRefit(); !s.ok()) return s;
    }
  }
  DCR_ASSIGN_OR_RETURN(report_.epoch, EpochFile(state_dir_ + "/epoch").Next());
  // PLAN is frame 0 (the fan-out's); everything after it is numbered from 1.
  sender_.emplace(options_.transport_options.frames,
                  FrameContext{report_.epoch, report_.refit}, 1);

  plan_.mode = report_.mode;
  plan_.base = report_.base;
  plan_.target = report_.target;
  if (baseline_) {
    plan_.manifest = baseline_->manifest().digest();
  } else if (target_) {
    plan_.manifest = target_->manifest().digest();
  }
  plan_.span_elems = topo.defaults.span_elems;
  plan_.chunk_window_bytes =
      std::max<uint64_t>(topo.defaults.window_bytes, 1u << 20);
  plan_.phase_timeout_ms =
      static_cast<uint32_t>(options_.phase_timeout.count());
  plan_.heartbeat_ms = static_cast<uint32_t>(options_.heartbeat.count());
  plan_.nodes = PlanNodes(tree_);
  TransportOptions to = options_.transport_options;
  to.name = topo.root.name;
  transports_ = std::make_unique<TransportSet>(to, options_.transport);
  spdlog::info("resuming refit {} (epoch {}): {} step {} -> {}",
               report_.refit.ToHex(), report_.epoch,
               commit ? "commit" : "abort (no decision was recorded)",
               report_.base.step, report_.target.step);
  report_.prepare_seconds = Seconds(t0, Clock::now());

  fanout_ = Fanout::Create(FanoutOptions(/*resume=*/true), plan_);
  // Every relay that holds the refit takes this run as its parent (an
  // adoption at the new epoch) and says where it is; then the decision.
  auto t_plan = Clock::now();
  fanout_->Start(Clock::now() + options_.phase_timeout);
  WaitPhase([&] { return fanout_->Complete(); });
  std::vector<NodeResult> plan_results = fanout_->Results();
  report_.plan_seconds = Seconds(t_plan, Clock::now());
  if (!commit) {
    report_.reason =
        "the coordinator stopped before deciding; aborted by dcr refit "
        "--resume";
  }
  if (baseline_done) target_.reset();
  return Conclude(commit, std::move(commit_set), plan_results, {}, t0,
                  Clock::now());
}

Result<RefitReport> ResumeRefit(const RefitOptions& options) {
  RefitRun run(options);
  return run.Resume();
}

namespace {

// Runs one catch-up (a refit of `nodes` only, from the root) and folds its
// outcome into `report`. Returns the nodes it did not bring up to date
// that a dense copy may still help (they answered, with other bits).
std::vector<std::string> RunCatchUp(const RefitOptions& options,
                                    std::vector<std::string> nodes,
                                    std::vector<std::string> chain,
                                    const Version& from, RefitReport* report) {
  RefitOptions o = options;
  o.only_nodes = nodes;
  o.mode = chain.empty() ? RefitMode::kFull : RefitMode::kDelta;
  o.catch_up = false;
  CatchUpReport c;
  c.nodes = nodes;
  c.method = chain.empty() ? "dense" : "history";
  c.from = from;
  c.deltas = chain.size();
  spdlog::info("catching up {} from {}", fmt::join(nodes, ", "),
               chain.empty() ? std::string("nothing (a dense copy)")
                             : fmt::format("step {} ({} deltas)", from.step,
                                           chain.size()));
  RefitRun run(o, std::move(chain));
  auto sub = run.Run();
  std::vector<std::string> retry;
  if (!sub.ok()) {
    c.reason = sub.status().ToString();
    spdlog::warn("catch-up of {} failed: {}", fmt::join(nodes, ", "), c.reason);
    for (NodeOutcome& n : report->nodes) {
      if (std::count(nodes.begin(), nodes.end(), n.node)) {
        n.detail += "; catch-up failed: " + c.reason;
      }
    }
    if (c.method == "history") retry = nodes;
    report->catch_up.push_back(std::move(c));
    return retry;
  }
  c.refit = sub->refit;
  c.epoch = sub->epoch;
  c.chunks = sub->chunks;
  c.payload_bytes = sub->payload_bytes + sub->repair_bytes;
  c.seconds = sub->total_seconds;
  c.outcome = sub->outcome;
  c.reason = sub->reason;
  report->total_seconds += sub->total_seconds;
  for (const NodeOutcome& s : sub->nodes) {
    for (NodeOutcome& n : report->nodes) {
      if (n.node != s.node) continue;
      if (s.committed) {
        n.committed = true;
        n.code = NodeCode::kOk;
        n.phase.clear();
        n.chunks_applied = s.chunks_applied;
        n.detail =
            c.method == "history"
                ? fmt::format("caught up from step {} with {} composed deltas",
                              from.step, c.deltas)
                : std::string("caught up with a dense copy");
      } else {
        n.detail += fmt::format("; catch-up: {} at {}: {}",
                                NodeCodeName(s.code), s.phase, s.detail);
        if (c.method == "history" && s.code != NodeCode::kUnreachable &&
            s.code != NodeCode::kTimeout) {
          retry.push_back(s.node);
        }
      }
    }
  }
  report->catch_up.push_back(std::move(c));
  return retry;
}

}  // namespace

Result<RefitReport> RunRefit(const RefitOptions& options) {
  std::vector<NodeResult> behind;
  auto report = [&] {
    // (The run's baseline store is closed before a catch-up opens it.)
    RefitRun run(options);
    auto r = run.Run();
    behind = run.behind();
    return r;
  }();
  if (!report.ok() || !options.catch_up || !options.only_nodes.empty() ||
      options.crash_after_decision || behind.empty() ||
      report->outcome == RefitOutcome::kAborted) {
    return report;
  }
  // Group the relays behind by the chain that brings them up. Those whose
  // record names an older step of this tree that the history no longer
  // reaches get a dense copy. A store without a record (seeded offline with
  // other bits), left unfinished, or missing is left alone: the operator
  // seeds or repairs it with dcr refit --full --node.
  const std::string state_dir = options.topology.root.state_dir;
  DeltaHistory history(state_dir + "/history",
                       options.topology.root.keep_deltas);
  std::map<std::vector<std::string>,
           std::pair<Version, std::vector<std::string>>>
      groups;
  std::vector<std::string> dense;
  for (const NodeResult& r : behind) {
    std::vector<std::string> chain;
    switch (HowToCatchUp(history, r.version, report->target,
                         report->target.step, &chain)) {
      case CatchUpBy::kHistory: {
        auto& g = groups[chain];
        g.first = r.version;
        g.second.push_back(r.node);
        break;
      }
      case CatchUpBy::kDense:
        spdlog::info("{}: the history does not reach step {}; a dense copy",
                     r.node, r.version.step);
        dense.push_back(r.node);
        break;
      case CatchUpBy::kNone:
        break;
    }
  }
  for (auto& [chain, group] : groups) {
    for (std::string& n :
         RunCatchUp(options, group.second, chain, group.first, &*report)) {
      dense.push_back(std::move(n));
    }
  }
  if (!dense.empty()) RunCatchUp(options, dense, {}, Version{}, &*report);
  bool all = std::all_of(report->nodes.begin(), report->nodes.end(),
                         [](const NodeOutcome& n) { return n.committed; });
  report->outcome = all ? RefitOutcome::kCommitted : RefitOutcome::kPartial;
  report->reason = all ? std::string() : ExcludedReason(*report);
  Status w = WriteText(state_dir + "/last-refit.json", report->ToJson() + "\n");
  if (!w.ok()) spdlog::warn("cannot write last-refit.json: {}", w.ToString());
  return report;
}

// ------------------------------------------------------------------ status

namespace {

class StatusHandler : public LinkHandler {
 public:
  StatusHandler(Mailbox* mailbox, NodeStatus* out, bool* done)
      : mailbox_(mailbox), out_(out), done_(done) {}
  void OnFrame(Link&, const Frame& frame, const FrameBuffer& buffer) override {
    if (frame.type() != FrameType::kStatusReply &&
        frame.type() != FrameType::kError) {
      return;
    }
    mailbox_->Post([out_ = out_, done_ = done_, frame, buffer] {
      if (*done_) return;
      *done_ = true;
      if (frame.type() == FrameType::kError) {
        out_->error =
            std::string(reinterpret_cast<const char*>(frame.payload.data()),
                        frame.payload.size());
        return;
      }
      auto r = DecodeResults(frame.payload);
      if (!r.ok() || r->nodes.empty()) {
        out_->error = r.ok() ? "empty STATUS_REPLY" : r.status().ToString();
        return;
      }
      const NodeResult& n = r->nodes[0];
      out_->reachable = true;
      out_->code = n.code;
      if (n.version.step != 0 || n.version.digest != Digest128()) {
        out_->committed = n.version;
      }
      out_->detail = n.detail;
      if (n.node != out_->node) {
        out_->error = fmt::format("answered as '{}'", n.node);
      }
    });
  }
  void OnClosed(Link&, const Status& why) override {
    mailbox_->Post([out_ = out_, done_ = done_, why] {
      if (*done_) return;
      *done_ = true;
      out_->error = why.ok() ? "closed" : std::string(why.message());
    });
  }

 private:
  Mailbox* mailbox_;
  NodeStatus* out_;
  bool* done_;
};

}  // namespace

std::vector<NodeStatus> QueryStatus(const Topology& topology,
                                    std::chrono::milliseconds timeout,
                                    const std::string& transport_kind,
                                    const TransportOptions& options) {
  std::vector<NodeStatus> out;
  for (const ClusterSpec& c : topology.clusters) {
    for (const NodeSpec& n : c.nodes) {
      NodeStatus s;
      s.node = n.name;
      s.cluster = c.name;
      s.address = fmt::format("{}:{}", n.host, n.port);
      out.push_back(std::move(s));
    }
  }
  // The kind of the link into each relay, as a refit's parent uses it.
  auto tree = BuildTree(topology);
  auto kind_of = [&](const NodeSpec& n) -> std::string {
    if (!transport_kind.empty()) return transport_kind;
    int k = tree.ok() ? tree->Find(n.name) : -1;
    return std::string(
        TransportKindName(k > 0 ? tree->nodes[static_cast<size_t>(k)].transport
                                : topology.defaults.transport));
  };
  TransportSet transports(options, transport_kind);
  Mailbox mailbox;
  // deque: stable addresses for the handlers.
  std::deque<bool> done(out.size(), false);
  std::vector<std::shared_ptr<Link>> links(out.size());
  auto deadline = Clock::now() + timeout;
  size_t i = 0;
  for (const ClusterSpec& c : topology.clusters) {
    for (const NodeSpec& n : c.nodes) {
      auto handler =
          std::make_shared<StatusHandler>(&mailbox, &out[i], &done[i]);
      auto transport = transports.Get(kind_of(n));
      if (!transport.ok()) {
        done[i] = true;
        out[i].error = transport.status().ToString();
        ++i;
        continue;
      }
      (*transport)
          ->AsyncConnect(n.host, n.port, handler, timeout,
                         [&mailbox, &out, &done, &links, &options,
                          i](Result<std::shared_ptr<Link>> l) {
                           mailbox.Post([&, i, l = std::move(l)] {
                             if (!l.ok()) {
                               done[i] = true;
                               out[i].error = std::string(l.status().message());
                               return;
                             }
                             links[i] = *l;
                             FrameSender sender(options.frames);
                             auto hello = sender.Next(
                                 FrameType::kHello,
                                 EncodeHello(HelloMsg{"", kRoleClient, 0}));
                             auto req =
                                 sender.Next(FrameType::kStatusRequest, {});
                             if (hello.ok() && req.ok()) {
                               links[i]->Send(*hello);
                               links[i]->Send(*req);
                             }
                           });
                         });
      ++i;
    }
  }
  while (Clock::now() < deadline &&
         !std::all_of(done.begin(), done.end(), [](bool d) { return d; })) {
    mailbox.RunUntil(
        std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (!done[k]) out[k].error = "no answer within the timeout";
  }
  transports.Stop();
  mailbox.Close();
  return out;
}

}  // namespace dcr
