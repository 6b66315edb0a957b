// Deltas built from the ranks' shards (dcr/shard_delta.h).
#include "dcr/shard_delta.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "dcr/thread_pool.h"
#include "placement/shard_runs.h"

namespace dcr {

Status shard_runs::CheckPartsRank(const Layout& layout, uint32_t rank) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  if (layout.ranks() > kMaxChunkParts) {
    return Status::InvalidArgument(fmt::format(
        "layout {} has {} ranks; chunk parts name at most {} producers",
        layout.source, layout.ranks(), kMaxChunkParts));
  }
  return Status::OK();
}

namespace {

// One rank's share of a delta from shards.
struct RankDelta {
  Status status;
  std::vector<LinearDigest> base_parts, target_parts;
  std::vector<std::pair<ChunkId, std::vector<std::byte>>> chunks;
  ChunkSizes sizes;
  uint64_t dense_chunks = 0;
};

}  // namespace

std::string ShardFilePath(const std::string& dir, uint32_t rank) {
  return fmt::format("{}/rank-{:05d}.safetensors", dir, rank);
}

Result<RankShards> RankShards::Open(const Layout& layout, uint32_t rank,
                                    const std::string& dir) {
  DCR_RETURN_IF_ERROR(shard_runs::CheckPartsRank(layout, rank));
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
  DCR_RETURN_IF_ERROR(shard_runs::CheckPartsRank(layout, rank));
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
  DCR_RETURN_IF_ERROR(shard_runs::CheckPartsRank(layout, 0));
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
