#include "coord/producer_feed.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"
#include "wire/signature.h"

namespace dcr {

Status SettleRootSession(WeightStore* baseline, bool commit,
                         const Version& target, const RefitId& refit,
                         ThreadPool* pool) {
  const std::string journal = JournalPath(baseline->record_path(), "");
  if (commit) {
    const Digest128 d = baseline->Digests(pool).version;
    if (d != target.digest) {
      return Status::Corruption(fmt::format(
          "root.baseline {} reads {}, not the committed target {} of refit "
          "{}; copy the tree's checkpoint there",
          baseline->describe(), d.ShortHex(), target.digest.ShortHex(),
          refit.ToHex()));
    }
    DCR_RETURN_IF_ERROR(baseline->Commit(target, refit));
    std::error_code ec;
    std::filesystem::remove(journal, ec);
    return Status::OK();
  }
  Result<std::string> boot = CurrentBootId();
  RefitSession::CrashRecovery r = RefitSession::RecoverAfterCrash(
      baseline, journal, boot.ok() ? *boot : std::string(), pool);
  using O = RefitSession::CrashRecovery::Outcome;
  if (r.outcome == O::kRestored || r.outcome == O::kNothing) {
    spdlog::info("root.baseline restored to its base from {} ({} spans)",
                 journal, r.spans);
    return Status::OK();
  }
  return Status::Corruption(fmt::format(
      "root.baseline {} could not be restored from its journal {}: {}",
      baseline->describe(), journal, r.detail));
}

ProducerFeed::ProducerFeed(ProducerHub* hub) : hub_(&hub->impl()) {}

ProducerFeed::~ProducerFeed() = default;

Status ProducerFeed::Gather(std::chrono::milliseconds wait) {
  DCR_ASSIGN_OR_RETURN(joined_, hub_->Gather(wait));
  step_ = joined_.empty() ? 0 : joined_[0].step;
  return Status::OK();
}

namespace {

// root.baseline's canonical tensors by name.
CanonicalBytes CanonicalOf(const Layout& layout, const WeightStore& baseline) {
  CanonicalBytes canonical;
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    canonical.emplace(layout.tensors[t].name, baseline.Tensor(t));
  }
  return canonical;
}

}  // namespace

namespace {

// Why root.baseline cannot give rank `j` its shards.
Status Unbuildable(const ProducerHub::Impl::Joined& j, const Status& why) {
  return Status::InvalidArgument(fmt::format(
      "producer rank {} {}, and root.baseline cannot give it the tree's: {}. "
      "Give that rank its baseline shards (Producer::SetBaseline)",
      j.rank,
      j.base_parts.empty() ? "has no baseline"
                           : "holds another version than the tree's",
      why.message()));
}

}  // namespace

Result<std::vector<LinearDigest>> ProducerFeed::TreeParts(
    const ProducerHub::Impl::Joined& j, const CanonicalBytes& canonical) const {
  auto parts = HashCanonicalRegions(hub_->layout(), j.rank, canonical);
  if (!parts.ok()) return Unbuildable(j, parts.status());
  return parts;
}

Status ProducerFeed::Serve(const Pending& p, const CanonicalBytes& canonical,
                           std::chrono::milliseconds stall) {
  const ProducerHub::Impl::Joined& j = joined_[p.joined];
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  size_t count = 0;
  Status sent;
  Status built =
      BuildShardsEach(hub_->layout(), j.rank, canonical,
                      [&](const std::string& name, std::vector<std::byte>&& b) {
                        sent = hub_->SendBaseline(j.rank, name, b, stall);
                        bytes += b.size();
                        ++count;
                        return sent;
                      });
  DCR_RETURN_IF_ERROR(sent);
  if (!built.ok()) return Unbuildable(j, built);
  spdlog::info(
      "producer rank {} {}: sent its {} shards ({:.1f} MB) from "
      "root.baseline in {:.3f} s",
      j.rank,
      p.had_none ? "had no baseline" : "held another version than the tree's",
      count, static_cast<double>(bytes) / 1e6,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return Status::OK();
}

Status ProducerFeed::CheckBaseline(const WeightStore& baseline,
                                   const Version& base, ThreadPool* pool,
                                   std::chrono::milliseconds stall) {
  const Layout& layout = hub_->layout();
  if (baseline.manifest().digest() != ManifestOf(layout)->digest()) {
    return Status::InvalidArgument(fmt::format(
        "the layout {} places other tensors than root.baseline {} holds: {}",
        layout.source, baseline.describe(),
        Manifest::Difference(baseline.manifest(), *ManifestOf(layout))));
  }
  // Whom root.baseline's bits will be sent to, once the check passes:
  // nothing is sent for a refit that is then refused.
  std::vector<Pending> pending;
  CanonicalBytes canonical;
  auto compose = [&] {
    std::vector<std::vector<LinearDigest>> parts;
    for (const auto& j : joined_) parts.push_back(j.base_parts);
    return DigestsFromParts(layout, parts);
  };
  // Ranks without a baseline: their parts are what they will be sent.
  for (size_t i = 0; i < joined_.size(); ++i) {
    if (!joined_[i].base_parts.empty()) continue;
    if (canonical.empty()) canonical = CanonicalOf(layout, baseline);
    DCR_ASSIGN_OR_RETURN(auto parts, TreeParts(joined_[i], canonical));
    joined_[i].base_parts = std::move(parts);
    pending.push_back(Pending{i, /*had_none=*/true});
  }
  CheckpointDigests d = compose();
  if (d.version != base.digest) {
    // Some ranks hold another version (they did not hear the last
    // decision: the coordinator stopped after it). Which ones: each rank's
    // regions of root.baseline hashed as the rank hashes its shards (a
    // pass over the model, on this path only). They are predicted to take
    // the tree's, and the check runs again; a rank whose shards cannot be
    // rebuilt keeps its parts, and the check names what differs.
    if (canonical.empty()) canonical = CanonicalOf(layout, baseline);
    std::vector<Pending> stale;
    std::vector<std::vector<LinearDigest>> want(joined_.size());
    for (size_t i = 0; i < joined_.size(); ++i) {
      auto parts = TreeParts(joined_[i], canonical);
      if (parts.ok() && *parts != joined_[i].base_parts) {
        want[i] = *std::move(parts);
        stale.push_back(Pending{i, /*had_none=*/false});
      }
    }
    if (!stale.empty()) {
      std::vector<std::vector<LinearDigest>> before(joined_.size());
      for (const Pending& p : stale) {
        before[p.joined] = std::move(joined_[p.joined].base_parts);
        joined_[p.joined].base_parts = std::move(want[p.joined]);
      }
      d = compose();
      if (d.version == base.digest) {
        pending.insert(pending.end(), stale.begin(), stale.end());
      } else {
        for (const Pending& p : stale) {
          joined_[p.joined].base_parts = std::move(before[p.joined]);
        }
        d = compose();
      }
    }
  }
  if (d.version == base.digest) {
    for (const Pending& p : pending) {
      DCR_RETURN_IF_ERROR(Serve(p, canonical, stall));
    }
    return Status::OK();
  }
  // Refused: the ranks without a baseline still have none.
  for (const Pending& p : pending) {
    if (p.had_none) joined_[p.joined].base_parts.clear();
  }
  // Name what differs: a pass over root.baseline, on this error path only.
  CheckpointDigests held = baseline.Digests(pool);
  std::vector<std::string> differ;
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    if (t < held.tensors.size() && held.tensors[t] != d.tensors[t]) {
      differ.push_back(layout.tensors[t].name);
    }
  }
  if (differ.empty()) {
    // The ranks agree with root.baseline's bits, which are not the version
    // its record names.
    return Status::BaseMismatch(fmt::format(
        "root.baseline {} does not hold its recorded step {} ({}): its bits "
        "hash to {}. Copy the tree's checkpoint of that step there",
        baseline.describe(), base.step, base.digest.ShortHex(),
        held.version.ShortHex()));
  }
  if (differ.size() > 4) {
    differ.resize(4);
    differ.push_back("...");
  }
  return Status::BaseMismatch(fmt::format(
      "the producers' baseline shards are not the tree's step {} "
      "(root.baseline {}): {} differ{}. Set each rank's baseline to the "
      "weights of the tree's version (Producer::SetBaseline)",
      base.step, baseline.describe(), fmt::join(differ, ", "),
      differ.size() == 1 ? "s" : ""));
}

Status ProducerFeed::Begin(WeightStore* baseline, const RefitId& refit,
                           const PlanMsg& plan, uint64_t held_bytes,
                           ThreadPool* pool) {
  NodeResult refusal;
  RefitSession::Options o;
  o.pool = pool;
  // Nobody asks root.baseline for a vote (Finish).
  o.hash_ahead = false;
  session_ =
      RefitSession::Begin(baseline, "root.baseline", refit, plan, &refusal, o);
  groups_ =
      std::make_unique<PartGroups>(hub_->layout(), plan.span_elems, held_bytes);
  ready_.clear();
  baseline_ = baseline;
  context_ = plan.context_coded;
  span_elems_ = plan.span_elems;
  if (!session_) {
    return Status::InvalidArgument(
        fmt::format("root.baseline cannot take the producers' refit: {} ({})",
                    refusal.detail, NodeCodeName(refusal.code)));
  }
  return Status::OK();
}

void ProducerFeed::Go(const ProducerGoMsg& go, uint64_t window) {
  hub_->Go(go, window);
}

ChunkJob ProducerFeed::Job(std::chrono::milliseconds idle, bool sign,
                           bool sign_plain, size_t workers) {
  ChunkJob job;
  job.prepare = [this, workers]() -> Status {
    decoders_.clear();
    encoders_.clear();
    merged_.assign(workers, DecodedChunk());
    for (size_t w = 0; w < workers; ++w) {
      DCR_ASSIGN_OR_RETURN(auto d, ChunkDecoder::Create());
      decoders_.push_back(std::move(d));
      DCR_ASSIGN_OR_RETURN(auto e, ChunkEncoder::Create(EncodeOptions()));
      encoders_.push_back(std::move(e));
    }
    return Status::OK();
  };
  job.fetch = [this, idle](size_t max) { return Fetch(max, idle); };
  job.interrupt = [this] { hub_->Cancel("the tree left the refit"); };
  job.encode = [this, sign, sign_plain](size_t i, size_t worker,
                                        EncodedChunk* out) {
    return Apply(i, worker, sign, sign_plain, out);
  };
  return job;
}

Result<size_t> ProducerFeed::Fetch(size_t max, std::chrono::milliseconds idle) {
  batch_begin_ = fetched_;
  batch_.clear();
  // Until some item is released, or every producer is done and all that
  // was held went out.
  std::vector<uint32_t> ended;
  while (ready_.empty()) {
    DCR_RETURN_IF_ERROR(hub_->Fetch(max, idle, &scratch_, &ended));
    const bool done = scratch_.empty() && ended.empty();
    for (ProducerChunk& c : scratch_) {
      const uint32_t rank = c.rank;
      auto h = PeekChunkHeader(c.chunk);
      if (!h.ok()) {
        return Status::Aborted(
            fmt::format("producer rank {}: {}", rank, h.status().ToString()));
      }
      if (h->id.part != PartOf(rank) || h->kind != ChunkKind::kXor ||
          h->encoding != ChunkEncoding::kSparse) {
        return Status::Aborted(fmt::format(
            "producer rank {} sent chunk ({}), {} {}: a producer's chunks are "
            "sparse XOR parts {}",
            rank, ChunkIdText(h->id),
            h->kind == ChunkKind::kXor ? "XOR" : "overwrite",
            h->encoding == ChunkEncoding::kSparse ? "sparse" : "not sparse",
            PartOf(rank)));
      }
      if (Status s = groups_->Add(std::move(c), h->id); !s.ok()) {
        return Status::Aborted(s.message());
      }
    }
    for (uint32_t rank : ended) groups_->Ended(rank);
    if (done) {
      groups_->Flush(&ready_);
      break;
    }
    groups_->Take(&ready_);
  }
  const size_t n = std::min(max, ready_.size());
  // With context, a span that goes whole is one whole-span chunk.
  for (size_t k = 0; context_ && k < n; ++k) {
    if (ready_[k].whole) ready_[k].id.part = 0;
  }
  std::move(ready_.begin(), ready_.begin() + n, std::back_inserter(batch_));
  ready_.erase(ready_.begin(), ready_.begin() + n);
  fetched_ += batch_.size();
  return batch_.size();
}

uint32_t ProducerFeed::CompleteBelow() const {
  uint32_t below = groups_->LowestOpen();
  for (const Item& item : ready_) below = std::min(below, item.id.tensor);
  return below;
}

const ChunkId& ProducerFeed::id(size_t i) const {
  return batch_[i - batch_begin_].id;
}

Status ProducerFeed::EncodeInContext(const Item& item, size_t worker,
                                     EncodedChunk* out) {
  std::vector<std::span<const std::byte>> parts;
  for (const ProducerChunk& c : item.parts) parts.push_back(c.chunk);
  DecodedChunk& merged = merged_[worker];
  DCR_RETURN_IF_ERROR(
      MergeParts(item.id, parts, decoders_[worker].get(), &merged));
  // The base bits are read before they are taken as such: the chunk must
  // be of this span of root.baseline (the session checks it again).
  const ChunkHeader& h = merged.header;
  const Manifest& m = baseline_->manifest();
  const uint64_t elems =
      h.id.tensor < m.size() ? m[h.id.tensor].NumElements() : 0;
  const uint64_t first = uint64_t{h.id.span} * span_elems_;
  if (first >= elems || h.span_elems != std::min(span_elems_, elems - first) ||
      h.elem_size != DTypeSize(m[h.id.tensor].dtype)) {
    return Status::Corruption(fmt::format(
        "chunk ({}) does not fit root.baseline's tensor", ChunkIdText(h.id)));
  }
  const TensorInfo& t = m[h.id.tensor];
  const size_t w = h.elem_size;
  // Nothing was applied to the span yet (it goes whole, once), and no
  // other item holds it: these are its base bits.
  const std::span<const std::byte> base =
      baseline_->Tensor(h.id.tensor).subspan(first * w, h.span_elems * w);
  return encoders_[worker]->EncodeChangesInContext(
      ChunkKind::kXor, item.id, w, ExponentFieldOf(t.dtype), base,
      merged.positions, merged.values, &out->bytes, &out->sizes,
      &out->base_independent);
}

Status ProducerFeed::Apply(size_t i, size_t worker, bool sign, bool sign_plain,
                           EncodedChunk* out) {
  const Item& item = batch_[i - batch_begin_];
  auto who = [&item] {  // for messages
    std::string ranks;
    for (const ProducerChunk& c : item.parts) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(c.rank);
    }
    return fmt::format("producer rank{} {}", item.parts.size() > 1 ? "s" : "",
                       ranks);
  };
  if (item.id.part == 0 && context_) {
    // (Fetch gave a span that goes whole part 0.)
    if (Status s = EncodeInContext(item, worker, out); !s.ok()) {
      return Status::Aborted(fmt::format("{}: {}", who(), s.ToString()));
    }
  } else if (item.parts.size() == 1) {
    const std::span<const std::byte> chunk = item.parts[0].chunk;
    out->bytes.assign(chunk.begin(), chunk.end());
    auto h = PeekChunkHeader(out->bytes);
    out->sizes.changed = h.ok() ? h->changed : 0;
    out->sizes.header = out->bytes.size();  // not split into sections here
  } else {
    std::vector<std::span<const std::byte>> parts;
    for (const ProducerChunk& c : item.parts) parts.push_back(c.chunk);
    Status s = ComposeParts(item.id, parts, decoders_[worker].get(),
                            encoders_[worker].get(), &out->bytes, &out->sizes);
    if (!s.ok()) {
      return Status::Aborted(fmt::format("{}: {}", who(), s.ToString()));
    }
  }
  // root.baseline takes the base-independent copy of a context-coded
  // chunk: the same changes, decoded without a pass over the span.
  auto applied = session_->Apply(
      out->base_independent.empty() ? out->bytes : out->base_independent,
      decoders_[worker].get());
  if (!applied.ok()) {
    return Status::Aborted(
        fmt::format("{}: {}", who(), applied.status().ToString()));
  }
  if (*applied == RefitSession::ApplyOutcome::kDuplicate) {
    return Status::Aborted(
        fmt::format("{} sent chunk ({}) twice", who(), ChunkIdText(item.id)));
  }
  if (sign) out->sha256 = Sha256(out->bytes);
  if (sign_plain && !out->base_independent.empty()) {
    out->base_independent_sha256 = Sha256(out->base_independent);
  }
  return Status::OK();
}

CheckpointDigests ProducerFeed::Finish() {
  std::vector<ProducerDoneMsg> done = hub_->Done();
  std::vector<std::vector<LinearDigest>> parts;
  changed_ = 0;
  for (ProducerDoneMsg& d : done) {
    changed_ += d.changed;
    parts.push_back(std::move(d.target_parts));
  }
  CheckpointDigests d = DigestsFromParts(hub_->layout(), parts);
  Version target = session_->plan().target;
  target.digest = d.version;
  session_->LearnTarget(target, d.tensors);
  return d;
}

Status ProducerFeed::Commit() {
  if (!session_) return Status::OK();
  Status s = session_->Commit();
  session_.reset();
  return s;
}

Status ProducerFeed::Abort() {
  if (!session_) return Status::OK();
  Status s = session_->Abort(nullptr);
  session_.reset();
  return s;
}

void ProducerFeed::Decide(ProducerOutcome outcome, const RefitId& refit,
                          const Version& target, const std::string& reason) {
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(outcome);
  m.refit = refit;
  m.target = target;
  m.reason = reason;
  hub_->Decide(m);
}

}  // namespace dcr
