// Deltas built from the ranks' shards (dcr/shard_delta.h).
#include "dcr/shard_delta.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "dcr/thread_pool.h"
#include "placement/shard_runs.h"

namespace dcr {
namespace {

// shard_runs::CheckRank, and a part id for every rank.
Status CheckRank(const Layout& layout, uint32_t rank) {
  DCR_RETURN_IF_ERROR(shard_runs::CheckRank(layout, rank));
  if (layout.ranks() > kMaxChunkParts) {
    return Status::InvalidArgument(fmt::format(
        "layout {} has {} ranks; chunk parts name at most {} producers",
        layout.source, layout.ranks(), kMaxChunkParts));
  }
  return Status::OK();
}

// One rank's share of a delta from shards.
struct RankDelta {
  Status status;
  std::vector<LinearDigest> base_parts, target_parts;
  std::vector<std::pair<ChunkId, std::vector<std::byte>>> chunks;
  ChunkSizes sizes;
  uint64_t dense_chunks = 0;
};

// Moves a tensor's digest part from the base to the target by `changes`
// (the digest is linear: the target's part is the base's XOR the hash of
// the changed elements' XOR masks at their positions), so that a diff
// needs no pass over the target to hash it. `mask`: scratch.
void MoveDigest(const Layout& layout, const CanonicalChanges& changes,
                std::vector<std::byte>* mask,
                std::vector<LinearDigest>* digests) {
  const size_t w = DTypeSize(layout.tensors[changes.tensor].dtype);
  mask->resize(changes.base.size());
  for (size_t i = 0; i < mask->size(); ++i) {
    (*mask)[i] = changes.base[i] ^ changes.target[i];
  }
  (*digests)[changes.tensor] ^= LinearHashElements(
      0, w, changes.positions.data(), changes.positions.size(), mask->data());
}

}  // namespace

std::string ShardFilePath(const std::string& dir, uint32_t rank) {
  return fmt::format("{}/rank-{:05d}.safetensors", dir, rank);
}

Result<RankShards> RankShards::Open(const Layout& layout, uint32_t rank,
                                    const std::string& dir) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  RankShards out;
  const std::string path = ShardFilePath(dir, rank);
  DCR_ASSIGN_OR_RETURN(out.file_,
                       Checkpoint::Open(path, Checkpoint::Mode::kReadOnly));
  const Manifest& m = out.file_->manifest();
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    int64_t i = m.Find(name);
    if (i < 0) {
      return Status::NotFound(
          fmt::format("{}: no tensor '{}', which layout {} gives rank {}", path,
                      name, layout.source, rank));
    }
    const TensorInfo& t = m[static_cast<size_t>(i)];
    if (t.dtype != shard.dtype || t.shape != shard.shape) {
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {} {}, but layout {} says {} {}; a step that "
          "changes a tensor's shape needs a new layout and a full refit",
          path, name, DTypeName(t.dtype), ShapeText(t.shape), layout.source,
          DTypeName(shard.dtype), ShapeText(shard.shape)));
    }
    out.bytes_.emplace(name, out.file_->TensorData(static_cast<size_t>(i)));
  }
  return out;
}

uint64_t RankShards::file_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, b] : bytes_) n += b.size();
  return n;
}

Status EncodeParts(const Layout& layout, uint32_t rank,
                   std::span<const CanonicalChanges> changes, ChunkKind kind,
                   uint64_t span_elems, ChunkEncoder* encoder,
                   const PartSink& sink, ChunkSizes* sizes) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  if (span_elems == 0 || span_elems > kMaxSpanElems) {
    return Status::InvalidArgument(
        fmt::format("span length must be between 1 and {} elements, got {}",
                    kMaxSpanElems, span_elems));
  }
  std::vector<uint32_t> positions;
  std::vector<std::byte> values, chunk;
  for (const CanonicalChanges& ch : changes) {
    if (ch.tensor >= layout.tensors.size()) {
      return Status::InvalidArgument(
          fmt::format("changes name tensor {} of a layout of {}", ch.tensor,
                      layout.tensors.size()));
    }
    const LayoutTensor& t = layout.tensors[ch.tensor];
    const size_t w = DTypeSize(t.dtype);
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    if (SpanCount(n, span_elems) > UINT32_MAX) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' would have more than 2^32 spans; use longer spans",
          t.name));
    }
    if (ch.base.size() != ch.positions.size() * w ||
        ch.target.size() != ch.base.size()) {
      return Status::InvalidArgument(fmt::format(
          "changes of tensor '{}' do not match its positions", t.name));
    }
    size_t i = 0;
    while (i < ch.positions.size()) {
      const uint64_t span = ch.positions[i] / span_elems;
      const uint64_t first = span * span_elems;
      const uint64_t end = std::min(first + span_elems, n);
      positions.clear();
      values.clear();
      for (; i < ch.positions.size() && ch.positions[i] < end; ++i) {
        if (ch.positions[i] < first ||
            (!positions.empty() &&
             ch.positions[i] - first <= positions.back())) {
          return Status::InvalidArgument(fmt::format(
              "changes of tensor '{}' are not ascending inside it", t.name));
        }
        positions.push_back(static_cast<uint32_t>(ch.positions[i] - first));
        const std::byte* b = &ch.base[i * w];
        const std::byte* g = &ch.target[i * w];
        for (size_t k = 0; k < w; ++k) {
          values.push_back(kind == ChunkKind::kXor ? (b[k] ^ g[k]) : g[k]);
        }
      }
      if (positions.empty()) {  // a position past the tensor's end
        return Status::InvalidArgument(
            fmt::format("changes of tensor '{}' lie outside it", t.name));
      }
      const ChunkId id{static_cast<uint32_t>(ch.tensor),
                       static_cast<uint32_t>(span), PartOf(rank)};
      chunk.clear();
      DCR_RETURN_IF_ERROR(encoder->EncodeChanges(
          kind, id, w, static_cast<uint32_t>(end - first), positions, values,
          &chunk, sizes));
      DCR_RETURN_IF_ERROR(sink(id, chunk));
    }
  }
  return Status::OK();
}

ShardProducer::ShardProducer(Layout layout, uint32_t rank, uint64_t span_elems,
                             EncodeOptions encode)
    : layout_(std::move(layout)), rank_(rank), span_elems_(span_elems) {
  auto e = ChunkEncoder::Create(encode);
  if (e.ok()) {
    encoder_ = std::move(*e);
  } else {
    encoder_status_ = e.status();
  }
}

ShardProducer::~ShardProducer() = default;

Status ShardProducer::CheckRank() const {
  DCR_RETURN_IF_ERROR(encoder_status_);
  return dcr::CheckRank(layout_, rank_);
}

Status ShardProducer::UseMemory(std::unique_ptr<ShardMemory> memory) {
  if (has_baseline_) {
    return Status::InvalidArgument(fmt::format(
        "rank {}: the producer holds its baseline in {}; drop it before "
        "handing shards in other memory",
        rank_, memory_ ? memory_->name() : std::string("host memory")));
  }
  memory_ = std::move(memory);
  return Status::OK();
}

uint64_t ShardProducer::baseline_bytes() const {
  if (memory_) return has_baseline_ ? memory_->baseline_bytes() : 0;
  uint64_t n = 0;
  for (const auto& [name, b] : baseline_) n += b.size();
  return n;
}

namespace {

// The rank's own shards of `shards` (others are ignored).
ShardBytes OwnShards(const Layout& layout, uint32_t rank,
                     const ShardBytes& shards) {
  ShardBytes own;
  for (const auto& [name, info] : layout.ShardsOf(rank)) {
    own.emplace(name, shards.at(name));
  }
  return own;
}

}  // namespace

Status ShardProducer::SetBaseline(const ShardBytes& shards) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (memory_) {
    DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, shards));
    // The shards cannot be read here before they are copied: a failure
    // from here on leaves no baseline.
    DropBaseline();
    const ShardBytes own = OwnShards(layout_, rank_, shards);
    Status s = memory_->SetBaseline(own);
    // Its regions hashed on the host, one shard at a time.
    std::vector<LinearDigest> digests(layout_.tensors.size());
    std::vector<std::byte> host;
    for (auto it = own.begin(); s.ok() && it != own.end(); ++it) {
      host.resize(it->second.size());
      s = memory_->ReadBaseline(it->first, 0, host);
      if (s.ok()) {
        s = AddShardRegions(layout_, rank_, it->first, host, &digests);
      }
    }
    if (!s.ok()) {
      DropBaseline();
      return s;
    }
    has_baseline_ = true;
    baseline_digests_ = std::move(digests);
    return Status::OK();
  }
  // Checked (presence and sizes) and hashed before anything is kept.
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, shards));
  std::map<std::string, std::vector<std::byte>, std::less<>> copy;
  for (const auto& [name, shard] : layout_.ShardsOf(rank_)) {
    auto b = shards.at(name);
    copy[name].assign(b.begin(), b.end());
  }
  baseline_ = std::move(copy);
  has_baseline_ = true;
  baseline_digests_ = std::move(digests);
  last_target_digests_.reset();
  step_log_.Clear();
  moved_ = false;
  return Status::OK();
}

Status ShardProducer::AdoptBaseline(
    std::map<std::string, std::vector<std::byte>, std::less<>> shards) {
  DCR_RETURN_IF_ERROR(CheckRank());
  ShardBytes view;
  for (const auto& [name, b] : shards) view.emplace(name, b);
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, view));
  if (memory_) {
    DropBaseline();
    if (Status s =
            memory_->SetBaselineFromHost(OwnShards(layout_, rank_, view));
        !s.ok()) {
      DropBaseline();
      return s;
    }
    has_baseline_ = true;
    baseline_digests_ = std::move(digests);
    return Status::OK();
  }
  // Only the rank's shards are kept.
  const auto held = layout_.ShardsOf(rank_);
  std::erase_if(shards, [&](const auto& kv) { return !held.count(kv.first); });
  baseline_ = std::move(shards);
  has_baseline_ = true;
  baseline_digests_ = std::move(digests);
  last_target_digests_.reset();
  step_log_.Clear();
  moved_ = false;
  return Status::OK();
}

void ShardProducer::DropBaseline() {
  if (memory_) memory_->DropBaseline();
  baseline_.clear();
  has_baseline_ = false;
  baseline_digests_.clear();
  last_target_digests_.reset();
  last_fingerprints_.clear();
  step_log_.Clear();
  moved_ = false;
}

void ShardProducer::Rewind() {
  if (moved_) {
    // (It wrote these very elements: they are there.)
    (void)step_log_.Back(&baseline_);
  }
  step_log_.Clear();
  moved_ = false;
  last_target_digests_.reset();
}

Result<ShardProducer::Step> ShardProducer::Diff(const ShardBytes& target,
                                                uint64_t span_elems,
                                                const PartSink& sink) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (!has_baseline()) {
    return Status::InvalidArgument(fmt::format(
        "rank {}: no baseline yet; set the committed shards first", rank_));
  }
  // A step not advanced: its diff is against the base.
  if (moved_) Rewind();
  Step step;
  step.base_digests = baseline_digests_;
  if (span_elems == 0) span_elems = span_elems_;
  if (memory_) {
    DCR_RETURN_IF_ERROR(DiffInMemory(target, span_elems, sink, &step));
    last_target_digests_ = step.target_digests;
    return step;
  }
  ShardBytes base;
  for (const auto& [name, b] : baseline_) base.emplace(name, b);
  // Hashed first: it checks every shard's presence and size before any
  // part goes out. (One pass over the target at memory speed costs less
  // than moving the baseline's digests by the changes, as the ShardMemory
  // path does, from about 1.5% of the elements changed on: the changed
  // elements' products form one serial chain.)
  DCR_ASSIGN_OR_RETURN(step.target_digests,
                       HashShardRegions(layout_, rank_, target));
  const PartSink keep = [&](const ChunkId& id, std::span<const std::byte> c) {
    step.chunks.emplace_back(id, std::vector<std::byte>(c.begin(), c.end()));
    return Status::OK();
  };
  ShardDiffStats stats;
  const uint64_t log_limit =
      step_log_bytes_ == kAutoStepLog ? baseline_bytes() / 4 : step_log_bytes_;
  step_log_ = ShardChangeLog(log_limit);
  Status diffed = DiffShardsEach(
      layout_, rank_, base, target,
      [&](CanonicalChanges&& changes) {
        return EncodeParts(layout_, rank_, std::span(&changes, 1),
                           ChunkKind::kXor, span_elems, encoder_.get(),
                           sink ? sink : keep, &step.sizes);
      },
      &stats, log_limit > 0 ? &step_log_ : nullptr);
  step.log_bytes = step_log_.peak_bytes();
  if (diffed.ok() && log_limit > 0 && !step_log_.overflowed()) {
    // The baseline takes the bits the diff read (the parts carry them);
    // their base bits stay for Rewind.
    diffed = step_log_.Forward(&baseline_);
    step_log_.DropTargets();
    moved_ = diffed.ok();
    step.logged = moved_;
  }
  if (!moved_) step_log_.Clear();
  DCR_RETURN_IF_ERROR(diffed);
  step.changed = stats.changed;
  last_target_digests_ = step.target_digests;
  return step;
}

Status ShardProducer::DiffInMemory(const ShardBytes& target,
                                   uint64_t span_elems, const PartSink& sink,
                                   Step* step) {
  // Every shard's presence and size checked before any part goes out.
  DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, target));
  const auto shards = layout_.ShardsOf(rank_);
  // What Advance compares: the bits diffed here.
  std::map<std::string, Digest128, std::less<>> fingerprints;
  for (const auto& [name, info] : shards) {
    DCR_ASSIGN_OR_RETURN(fingerprints[name],
                         memory_->Fingerprint(target.at(name)));
  }
  const PartSink keep = [&](const ChunkId& id, std::span<const std::byte> c) {
    step->chunks.emplace_back(id, std::vector<std::byte>(c.begin(), c.end()));
    return Status::OK();
  };
  // The target's digest parts are the baseline's moved by the XOR masks of
  // the changed canonical elements (the digest is linear): no pass over
  // the shards.
  step->target_digests = baseline_digests_;
  std::vector<std::byte> mask;
  ShardDiffStats stats;
  DCR_RETURN_IF_ERROR(ProjectShardChanges(
      layout_, rank_,
      [&](const std::string& shard, ShardChanges* out) {
        return memory_->FindChanges(shard, DTypeSize(shards.at(shard).dtype),
                                    target.at(shard), out);
      },
      [&](CanonicalChanges&& changes) {
        MoveDigest(layout_, changes, &mask, &step->target_digests);
        return EncodeParts(layout_, rank_, std::span(&changes, 1),
                           ChunkKind::kXor, span_elems, encoder_.get(),
                           sink ? sink : keep, &step->sizes);
      },
      &stats));
  // The memory finds a shard's changes in more than one pass (the GPU's
  // reads the changed positions, then the base bits there). A shard
  // written meanwhile, by a kernel on a stream the caller did not wait
  // for, may give positions and values of two moments, and the digest
  // parts, derived from the masks, would vouch for them: each shard is
  // fingerprinted again, and the step fails (before DONE, so the refit
  // aborts) if one moved.
  for (const auto& [name, before] : fingerprints) {
    DCR_ASSIGN_OR_RETURN(Digest128 after,
                         memory_->Fingerprint(target.at(name)));
    if (after != before) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: shard '{}' changed while it was diffed (is a kernel on "
          "another CUDA stream still writing it? synchronize the device "
          "before the refit); this step's parts must not commit",
          rank_, name));
    }
  }
  step->changed = stats.changed;
  last_fingerprints_ = std::move(fingerprints);
  return Status::OK();
}

Status ShardProducer::Advance(const ShardBytes& target) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (!last_target_digests_) {
    return Status::InvalidArgument(
        fmt::format("rank {}: nothing was diffed to advance to", rank_));
  }
  if (memory_) return AdvanceInMemory(target);
  if (moved_) {
    // The baseline holds the diffed bits already: what the tree got.
    baseline_digests_ = std::move(*last_target_digests_);
    last_target_digests_.reset();
    step_log_.Clear();
    moved_ = false;
    return Status::OK();
  }
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, target));
  for (size_t i = 0; i < digests.size(); ++i) {
    if (digests[i] != (*last_target_digests_)[i]) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: tensor '{}' is not what the last diff was given (did the "
          "trainer step again before the refit committed?)",
          rank_, layout_.tensors[i].name));
    }
  }
  for (auto& [name, b] : baseline_) {
    auto t = target.at(name);
    std::copy(t.begin(), t.end(), b.begin());
  }
  baseline_digests_ = std::move(digests);
  last_target_digests_.reset();
  return Status::OK();
}

Status ShardProducer::AdvanceInMemory(const ShardBytes& target) {
  DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, target));
  for (const auto& [name, fingerprint] : last_fingerprints_) {
    DCR_ASSIGN_OR_RETURN(Digest128 now, memory_->Fingerprint(target.at(name)));
    if (now != fingerprint) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: shard '{}' is not what the last diff was given (did the "
          "trainer step again before the refit committed?)",
          rank_, name));
    }
  }
  if (Status s = memory_->Advance(OwnShards(layout_, rank_, target)); !s.ok()) {
    DropBaseline();  // partly copied, perhaps
    return s;
  }
  baseline_digests_ = std::move(*last_target_digests_);
  last_target_digests_.reset();
  last_fingerprints_.clear();
  return Status::OK();
}

Result<Manifest> ManifestOf(const Layout& layout) {
  std::vector<TensorInfo> infos;
  infos.reserve(layout.tensors.size());
  for (const LayoutTensor& t : layout.tensors) {
    infos.push_back(TensorInfo{t.name, t.dtype, t.shape});
  }
  return Manifest::Create(std::move(infos));
}

CheckpointDigests DigestsFromParts(
    const Layout& layout, std::span<const std::vector<LinearDigest>> parts) {
  CheckpointDigests d;
  std::vector<TensorInfo> infos;
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& t = layout.tensors[ti];
    LinearDigest sum;
    for (const auto& rank : parts) {
      if (ti < rank.size()) sum ^= rank[ti];
    }
    TensorInfo info{t.name, t.dtype, t.shape};
    d.tensors.push_back(FinishTensorDigest(sum, info.NumBytes()));
    infos.push_back(std::move(info));
  }
  auto m = Manifest::Create(std::move(infos));
  d.manifest = m.ok() ? m->digest() : Digest128{};
  d.version = VersionDigest(d.manifest, d.tensors);
  return d;
}

Result<DeltaStats> WriteDeltaFromShards(const Layout& layout,
                                        const std::string& base_dir,
                                        const std::string& target_dir,
                                        const std::string& path,
                                        const DiffOptions& options,
                                        ThreadPool* pool) {
  auto files = [&](uint32_t rank, const RankShardsUse& use) -> Status {
    DCR_ASSIGN_OR_RETURN(RankShards base,
                         RankShards::Open(layout, rank, base_dir));
    DCR_ASSIGN_OR_RETURN(RankShards target,
                         RankShards::Open(layout, rank, target_dir));
    return use(base.bytes(), target.bytes());
  };
  return WriteDeltaFromRanks(layout, files, path, options, pool);
}

Result<DeltaStats> WriteDeltaFromRanks(const Layout& layout,
                                       const RankShardsSource& source,
                                       const std::string& path,
                                       const DiffOptions& options,
                                       ThreadPool* pool) {
  const auto start = std::chrono::steady_clock::now();
  DCR_ASSIGN_OR_RETURN(Manifest m, ManifestOf(layout));
  DCR_RETURN_IF_ERROR(CheckRank(layout, 0));
  std::optional<ThreadPool> local;
  if (pool == nullptr) pool = &local.emplace(1);

  // Each rank on its own: its two shard files, its diff, its parts and its
  // regions' hashes, as a producer on its own host would.
  std::vector<RankDelta> ranks(layout.ranks());
  pool->ParallelFor(ranks.size(), [&](size_t r, size_t /*worker*/) {
    RankDelta& out = ranks[r];
    const uint32_t rank = static_cast<uint32_t>(r);
    out.status = source(
        rank, [&](const ShardBytes& base, const ShardBytes& target) -> Status {
          DCR_ASSIGN_OR_RETURN(auto changes,
                               DiffShards(layout, rank, base, target));
          DCR_ASSIGN_OR_RETURN(out.base_parts,
                               HashShardRegions(layout, rank, base));
          DCR_ASSIGN_OR_RETURN(out.target_parts,
                               HashShardRegions(layout, rank, target));
          DCR_ASSIGN_OR_RETURN(auto encoder,
                               ChunkEncoder::Create(options.encode));
          DCR_RETURN_IF_ERROR(EncodeParts(
              layout, rank, changes, options.kind, options.span_elems,
              encoder.get(),
              [&](const ChunkId& id, std::span<const std::byte> c) {
                out.chunks.emplace_back(
                    id, std::vector<std::byte>(c.begin(), c.end()));
                return Status::OK();
              },
              &out.sizes));
          if (options.progress) {
            uint64_t bytes = 0;
            for (const auto& [name, b] : target) bytes += b.size();
            options.progress(bytes);
          }
          return Status::OK();
        });
  });
  for (const RankDelta& r : ranks) DCR_RETURN_IF_ERROR(r.status);

  // The parts of all ranks, in id order: a delta file's chunks ascend.
  std::vector<const std::pair<ChunkId, std::vector<std::byte>>*> order;
  std::vector<std::vector<LinearDigest>> base_parts, target_parts;
  DeltaStats stats;
  for (RankDelta& r : ranks) {
    for (const auto& c : r.chunks) order.push_back(&c);
    base_parts.push_back(std::move(r.base_parts));
    target_parts.push_back(std::move(r.target_parts));
    stats.sizes += r.sizes;
  }
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  DCR_ASSIGN_OR_RETURN(auto writer, DeltaWriter::Create(path));
  for (const auto* c : order) DCR_RETURN_IF_ERROR(writer->Append(c->second));
  stats.chunks = order.size();
  stats.sparse_chunks = order.size();  // parts are sparse
  stats.checkpoint_bytes = m.TotalBytes();

  const CheckpointDigests bd = DigestsFromParts(layout, base_parts);
  const CheckpointDigests td = DigestsFromParts(layout, target_parts);
  DeltaHeader& h = stats.header;
  h.base = Version{options.base_step, bd.version};
  h.target = Version{options.target_step, td.version};
  h.manifest = m.digest();
  h.span_elems = options.span_elems;
  h.chunk_count = stats.chunks;
  h.tensor_count = m.size();
  h.total_elements = m.TotalElements();
  h.total_bytes = m.TotalBytes();
  h.changed_elements = stats.sizes.changed;
  h.all_overwrite = options.kind == ChunkKind::kOverwrite;
  DCR_RETURN_IF_ERROR(writer->Finish(h));
  stats.file_bytes = writer->bytes_written();
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return stats;
}

}  // namespace dcr
