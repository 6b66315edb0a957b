// Shards built from canonical tensors, and the digest parts a rank would
// hold with them, without building them (dcr/shard_diff.h: BuildShards,
// BuildShardsEach, HashCanonicalRegions).
#include <cstring>
#include <map>
#include <string>

#include "dcr/shard_diff.h"
#include "placement/shard_runs.h"

namespace dcr {

using shard_runs::Bytes;
using shard_runs::CheckCanonical;
using shard_runs::CheckRank;
using shard_runs::CheckRebuildable;
using shard_runs::ForEachRun;
using shard_runs::HashPiece;
using shard_runs::kMaxShardBytes;

namespace {

// Copies the canonical bits piece `p` of `tensor` maps (at `src`) into
// its shard (at `dst`).
void FillFromCanonical(const AffinePiece& p, const LayoutTensor& tensor,
                       const std::byte* src, std::byte* dst) {
  const size_t w = DTypeSize(tensor.dtype);
  ForEachRun(p, tensor.shape,
             [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
               if (step == 1) {
                 std::memcpy(dst + s * w, src + c * w, n * w);
                 return;
               }
               for (uint64_t j = 0; j < n; ++j) {
                 std::memcpy(dst + (s + j) * w, src + (c + j * step) * w, w);
               }
             });
}

// The pieces of one rank's shards, by shard, each with its tensor.
struct ShardPieces {
  const LayoutShard* shard = nullptr;
  std::vector<std::pair<const LayoutTensor*, const AffinePiece*>> pieces;

  // Whether pieces of two tensors read the same shard element (a tied
  // head reads its embedding's; the parts of a fused tensor do not).
  bool Shared() const {
    for (size_t i = 0; i < pieces.size(); ++i) {
      for (size_t j = i + 1; j < pieces.size(); ++j) {
        if (pieces[i].first != pieces[j].first &&
            Overlap(*pieces[i].second, *pieces[j].second)) {
          return true;
        }
      }
    }
    return false;
  }
  static bool Overlap(const AffinePiece& a, const AffinePiece& b) {
    for (size_t d = 0; d < a.from.size() && d < b.from.size(); ++d) {
      if (a.from[d] >= b.from[d] + b.extent[d] ||
          b.from[d] >= a.from[d] + a.extent[d]) {
        return false;
      }
    }
    return true;
  }
};

// Indexes rank `rank`'s pieces by shard (one pass over the layout) and
// checks what BuildShards needs: every shard small enough to build, every
// tensor it reads present in `canonical` with its size and not converted.
Result<std::map<std::string, ShardPieces>> IndexShards(
    const Layout& layout, uint32_t rank,
    const std::map<std::string, LayoutShard>& shards,
    const CanonicalBytes& canonical) {
  std::map<std::string, ShardPieces> out;
  for (const auto& [name, shard] : shards) {
    if (Bytes(shard.shape, shard.dtype) > kMaxShardBytes) {
      return Status::InvalidArgument("shard '" + shard.name +
                                     "' is too large to build");
    }
    out[name].shard = &shard;
  }
  for (const LayoutTensor& tensor : layout.tensors) {
    bool checked = false;
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      if (!checked) {
        DCR_RETURN_IF_ERROR(CheckRebuildable(tensor));
        DCR_RETURN_IF_ERROR(
            CheckCanonical(tensor, canonical, canonical.find(tensor.name)));
        checked = true;
      }
      out.at(p.shard).pieces.emplace_back(&tensor, &p);
    }
  }
  return out;
}

std::vector<std::byte> BuildIndexed(const ShardPieces& sp,
                                    const CanonicalBytes& canonical) {
  std::vector<std::byte> out(Bytes(sp.shard->shape, sp.shard->dtype),
                             std::byte{0});
  for (const auto& [tensor, p] : sp.pieces) {
    FillFromCanonical(*p, *tensor, canonical.at(tensor->name).data(),
                      out.data());
  }
  return out;
}

}  // namespace

Status BuildShardsEach(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical,
    const std::function<Status(const std::string&, std::vector<std::byte>&&)>&
        each) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  const auto shards = layout.ShardsOf(rank);
  DCR_ASSIGN_OR_RETURN(auto index,
                       IndexShards(layout, rank, shards, canonical));
  for (const auto& [name, sp] : index) {
    DCR_RETURN_IF_ERROR(each(name, BuildIndexed(sp, canonical)));
  }
  return Status::OK();
}

Result<std::map<std::string, std::vector<std::byte>>> BuildShards(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical) {
  std::map<std::string, std::vector<std::byte>> out;
  DCR_RETURN_IF_ERROR(BuildShardsEach(
      layout, rank, canonical,
      [&](const std::string& name, std::vector<std::byte>&& bytes) {
        out.emplace(name, std::move(bytes));
        return Status::OK();
      }));
  return out;
}

Result<std::vector<LinearDigest>> HashCanonicalRegions(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  const auto shards = layout.ShardsOf(rank);
  DCR_ASSIGN_OR_RETURN(auto index,
                       IndexShards(layout, rank, shards, canonical));
  std::vector<LinearDigest> out(layout.tensors.size());
  auto sum_of = [&](const LayoutTensor* t) -> LinearDigest& {
    return out[static_cast<size_t>(t - layout.tensors.data())];
  };
  for (const auto& [name, sp] : index) {
    if (sp.Shared()) {
      // Where two tensors' regions overlap the built shard holds one
      // tensor's bits: it is built (this one only) and hashed as the rank
      // would hash it.
      const std::vector<std::byte> built = BuildIndexed(sp, canonical);
      for (const auto& [tensor, p] : sp.pieces) {
        HashPiece(*p, *tensor, built.data(), /*in_shard=*/true,
                  &sum_of(tensor));
      }
      continue;
    }
    for (const auto& [tensor, p] : sp.pieces) {
      HashPiece(*p, *tensor, canonical.at(tensor->name).data(),
                /*in_shard=*/false, &sum_of(tensor));
    }
  }
  return out;
}

}  // namespace dcr
