// What the shard diff (shard_diff.cc), the projection of a shard memory's
// changes (shard_project.cc) and the shards built from canonical tensors
// (shard_build.cc) share: the walk of a piece's box as runs, the checks of
// ranks and canonical tensors, and the hash of a piece's regions.
// Internal to the placement module.
//
// Thread safety: functions of their arguments.
#ifndef DCR_PLACEMENT_SHARD_RUNS_H_
#define DCR_PLACEMENT_SHARD_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dcr/digest.h"
#include "dcr/shard_diff.h"

namespace dcr::shard_runs {

inline Shape Strides(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// BuildShards allocates shards; beyond this it refuses.
inline constexpr uint64_t kMaxShardBytes = 1ull << 46;

// Bytes of `s` elements of `d`, or UINT64_MAX where that overflows (a
// Layout built by hand; ResolveLayout refuses such shapes).
inline uint64_t Bytes(const Shape& s, DType d) {
  uint64_t n = DTypeSize(d);
  for (uint64_t x : s) {
    if (__builtin_mul_overflow(n, x, &n)) return UINT64_MAX;
  }
  return n;
}

// Calls fn(shard_pos, canonical_pos, count, canonical_step) for each run of
// `p`'s box along its last shard dimension, in shard row-major order.
template <typename Fn>
void ForEachRun(const AffinePiece& p, const Shape& canonical_shape, Fn fn) {
  const size_t dims = p.shard_shape.size();
  if (dims == 0) {
    fn(uint64_t{0}, uint64_t{0}, uint64_t{1}, uint64_t{1});
    return;
  }
  const Shape ss = Strides(p.shard_shape);
  const Shape cs = Strides(canonical_shape);
  Shape delta(dims, 0);
  uint64_t origin = 0;
  for (size_t d = 0; d < dims; ++d) {
    origin += cs[d] * p.to[d];
    delta[p.axis[d]] = cs[d] * p.step[d];
  }
  const size_t last = dims - 1;
  std::vector<uint64_t> i(dims, 0);  // odometer over dims [0, last)
  while (true) {
    uint64_t s = ss[last] * p.from[last], c = origin;
    for (size_t k = 0; k < last; ++k) {
      s += ss[k] * (p.from[k] + i[k]);
      c += delta[k] * i[k];
    }
    fn(s, c, p.extent[last], delta[last]);
    size_t k = last;
    while (k > 0) {
      --k;
      if (++i[k] < p.extent[k]) break;
      i[k] = 0;
      if (k == 0) return;
    }
    if (last == 0) return;
  }
}

// InvalidArgument unless `rank` is one of the layout's.
Status CheckRank(const Layout& layout, uint32_t rank);
// CheckRank, and a chunk part id for every rank of the layout (producers'
// deltas: dcr/shard_delta.h).
Status CheckPartsRank(const Layout& layout, uint32_t rank);
// NotFound when `it` (found in `canonical`) is its end, InvalidArgument when
// the tensor there is not the layout's size.
Status CheckCanonical(const LayoutTensor& tensor,
                      const CanonicalBytes& canonical,
                      CanonicalBytes::const_iterator it);
// BuildShards' refusal of a tensor whose shard bits are not its canonical
// bits.
Status CheckRebuildable(const LayoutTensor& tensor);
// Adds piece `p`'s contribution to `sum`, its bits read at `data`: the
// shard's bytes (in_shard) or the canonical tensor's. Identity
// conversions only (the shard's bits are the canonical bits). Equal
// contiguous runs at a fixed stride (a column split's rows) are hashed
// together (LinearHashRuns).
void HashPiece(const AffinePiece& p, const LayoutTensor& tensor,
               const std::byte* data, bool in_shard, LinearDigest* sum);

}  // namespace dcr::shard_runs

#endif  // DCR_PLACEMENT_SHARD_RUNS_H_
