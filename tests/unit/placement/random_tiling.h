// Random tilings of canonical tensors by affine pieces, shared by the
// placement tests.
#ifndef DCR_TESTS_UNIT_PLACEMENT_RANDOM_TILING_H_
#define DCR_TESTS_UNIT_PLACEMENT_RANDOM_TILING_H_

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "dcr/placement.h"

namespace dcr::placement_testing {

inline uint64_t Volume(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), uint64_t{1}, std::multiplies<>());
}

// Cuts [0, n) into 1 to 3 segments.
inline std::vector<std::pair<uint64_t, uint64_t>> Segments(
    uint64_t n, std::mt19937_64& rng) {
  std::vector<uint64_t> cuts = {0, n};
  for (int i = 0; i < 2; ++i) {
    if (n > 1 && rng() % 2 == 0) cuts.push_back(1 + rng() % (n - 1));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
  }
  return out;
}

// A random tiling of `shape` (1 to 3 dimensions): a grid of cells, each
// cell one piece or, along dimension 0, an interleave of 2 or 3 pieces;
// pieces sometimes with their dimensions permuted in their shard; shards
// sometimes larger than their box.
inline std::vector<AffinePiece> RandomTiling(const Shape& shape,
                                             std::mt19937_64& rng) {
  const size_t dims = shape.size();
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> seg(dims);
  for (size_t d = 0; d < dims; ++d) seg[d] = Segments(shape[d], rng);
  std::vector<AffinePiece> out;
  std::vector<size_t> at(dims, 0);
  while (true) {
    Shape start(dims), len(dims);
    for (size_t d = 0; d < dims; ++d) {
      start[d] = seg[d][at[d]].first;
      len[d] = seg[d][at[d]].second;
    }
    const uint64_t ways = len[0] >= 3 && rng() % 3 == 0 ? 2 + rng() % 2 : 1;
    for (uint64_t r = 0; r < ways; ++r) {
      AffinePiece p;
      p.rank = static_cast<uint32_t>(rng() % 8);
      p.shard = "s" + std::to_string(out.size());
      p.to = start;
      p.to[0] += r;
      p.step.assign(dims, 1);
      p.step[0] = ways;
      // Canonical extent along each canonical dimension.
      Shape cext = len;
      cext[0] = (len[0] - r + ways - 1) / ways;
      p.axis.resize(dims);
      std::iota(p.axis.begin(), p.axis.end(), 0u);
      if (dims >= 2 && rng() % 3 == 0) {  // transposed or permuted
        std::shuffle(p.axis.begin(), p.axis.end(), rng);
      }
      p.extent.assign(dims, 0);
      for (size_t d = 0; d < dims; ++d) p.extent[p.axis[d]] = cext[d];
      p.from.assign(dims, 0);
      p.shard_shape = p.extent;
      if (rng() % 2 == 0) {  // the box inside a larger shard
        for (size_t k = 0; k < dims; ++k) {
          p.from[k] = rng() % 3;
          p.shard_shape[k] = p.from[k] + p.extent[k] + rng() % 3;
        }
      }
      out.push_back(std::move(p));
    }
    size_t d = 0;
    while (d < dims && ++at[d] == seg[d].size()) at[d++] = 0;
    if (d == dims) break;
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

inline Shape RandomShape(std::mt19937_64& rng) {
  Shape s(1 + rng() % 3);
  for (auto& d : s) d = 1 + rng() % 9;
  return s;
}

}  // namespace dcr::placement_testing

#endif  // DCR_TESTS_UNIT_PLACEMENT_RANDOM_TILING_H_
