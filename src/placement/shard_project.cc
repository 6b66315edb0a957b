// Projection of a shard memory's changes (dcr/shard_diff.h,
// ProjectShardChanges): what DiffShardsEach finds by comparing shards,
// built from the changed elements the memory reports, shard by shard.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "dcr/shard_diff.h"
#include "placement/shard_runs.h"
#include "placement/tensor_changes.h"

namespace dcr {

using shard_runs::Bytes;
using shard_runs::CheckRank;
using shard_runs::EachTensorsChanges;
using shard_runs::ForEachRun;
using shard_runs::TensorChanges;

namespace {

// The first of the ascending [first, last) at or above `v`, searched from
// `first` in steps that double: the next run's changes start near the
// last run's end, which a binary search over all of them would reach
// through a cache miss per probe.
template <typename It>
It Gallop(It first, It last, uint64_t v) {
  for (size_t step = 1;; step *= 2) {
    const size_t left = static_cast<size_t>(last - first);
    const size_t k = std::min(step, left);
    if (k == left || *(first + (k - 1)) >= v) {
      return std::lower_bound(first, first + k, v);
    }
    first += k;  // all below v
  }
}

}  // namespace

Status ProjectShardChanges(
    const Layout& layout, uint32_t rank, const ShardChangesFetch& fetch,
    const std::function<Status(CanonicalChanges&&)>& each,
    ShardDiffStats* stats) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  ShardDiffStats st;
  const auto shards = layout.ShardsOf(rank);
  // The last tensor that reads each shard: its changes are freed after.
  std::map<std::string, size_t, std::less<>> last_use;
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    for (const AffinePiece& p : layout.tensors[ti].pieces) {
      if (p.rank == rank) last_use[p.shard] = ti;
    }
  }
  std::map<std::string, ShardChanges, std::less<>> held;
  // The buffers of a shard done with, handed to the next fetch: memory
  // faulted in once, not per shard.
  ShardChanges spare;
  auto get = [&](const AffinePiece& p,
                 size_t sw) -> Result<const ShardChanges*> {
    if (auto it = held.find(p.shard); it != held.end()) return &it->second;
    ShardChanges c = std::move(spare);
    c.positions.clear();
    c.base.clear();
    c.target.clear();
    DCR_RETURN_IF_ERROR(fetch(p.shard, &c));
    // What the memory returned is checked as input: a position out of
    // order or past the shard would misplace a change.
    const uint64_t elems =
        Bytes(shards.at(p.shard).shape, shards.at(p.shard).dtype) / sw;
    const size_t k = c.positions.size();
    if (c.base.size() != k * sw || c.target.size() != k * sw) {
      return Status::Internal("rank " + std::to_string(rank) + ": shard '" +
                              p.shard + "': " + std::to_string(k) +
                              " changed positions with values of another size");
    }
    for (size_t i = 0; i < k; ++i) {
      if (c.positions[i] >= elems ||
          (i > 0 && c.positions[i] <= c.positions[i - 1])) {
        return Status::Internal("rank " + std::to_string(rank) + ": shard '" +
                                p.shard + "': changed position " +
                                std::to_string(c.positions[i]) +
                                " is out of order or past the shard's " +
                                std::to_string(elems) + " elements");
      }
    }
    return &held.emplace(p.shard, std::move(c)).first->second;
  };
  auto scan_piece = [&](const AffinePiece& p, const LayoutTensor& tensor,
                        TensorChanges* changes) -> Status {
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    DCR_ASSIGN_OR_RETURN(const ShardChanges* sc, get(p, sw));
    const std::vector<uint64_t>& pos = sc->positions;
    auto cursor = pos.begin();
    // Room for the changes between the piece's first and last shard
    // elements, once (not grown run by run): exact for a block of the
    // shard, such as one expert of a fused [experts, ...] shard.
    if (!p.extent.empty()) {
      const Shape ss = shard_runs::Strides(p.shard_shape);
      uint64_t first = 0, last = 0;
      bool empty = false;
      for (size_t d = 0; d < ss.size(); ++d) {
        empty |= p.extent[d] == 0;
        first += ss[d] * p.from[d];
        last += ss[d] * (p.from[d] + p.extent[d] - 1);
      }
      if (!empty) {
        auto lo = std::lower_bound(pos.begin(), pos.end(), first);
        auto hi = std::upper_bound(lo, pos.end(), last);
        changes->Reserve(static_cast<size_t>(hi - lo));
      }
    }
    ForEachRun(p, tensor.shape,
               [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
                 st.compared += n;
                 // Runs ascend in the shard: the cursor only moves on.
                 auto lo = Gallop(cursor, pos.end(), s);
                 auto hi = Gallop(lo, pos.end(), s + n);
                 cursor = hi;
                 changes->Reserve(static_cast<size_t>(hi - lo));
                 for (auto it = lo; it != hi; ++it) {
                   const size_t i = static_cast<size_t>(it - pos.begin());
                   changes->Add(c + (*it - s) * step, &sc->base[i * sw],
                                &sc->target[i * sw]);
                 }
               });
    return Status::OK();
  };
  auto done = [&](size_t ti) {
    for (auto it = held.begin(); it != held.end();) {
      if (last_use.at(it->first) != ti) {
        ++it;
        continue;
      }
      if (it->second.positions.capacity() > spare.positions.capacity()) {
        spare = std::move(it->second);
      }
      it = held.erase(it);
    }
  };
  Status s = EachTensorsChanges(layout, rank, scan_piece, done, each, &st);
  if (stats) *stats = st;
  return s;
}

}  // namespace dcr
