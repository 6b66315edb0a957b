// The canonical delta between two versions as decoded chunks, for the
// receiver map's tests (receiver_map_test.cc, receiver_map_fp8_test.cc).
#ifndef DCR_TESTS_UNIT_PLACEMENT_CANONICAL_CHUNKS_H_
#define DCR_TESTS_UNIT_PLACEMENT_CANONICAL_CHUNKS_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dcr/codec.h"
#include "dcr/layout.h"
#include "unit/placement/versions.h"

namespace dcr::placement_testing {

// The canonical delta from `base` to `target`, as decoded chunks of spans
// of `span` elements: XOR masks, or the new values where `overwrite`;
// sparse, or every element of the span where `dense`.
inline std::vector<std::pair<uint32_t, DecodedChunk>> Chunks(
    const Layout& l, const Tensors& base, const Tensors& target, uint64_t span,
    bool overwrite, bool dense = false) {
  std::vector<std::pair<uint32_t, DecodedChunk>> out;
  for (uint32_t i = 0; i < l.tensors.size(); ++i) {
    const LayoutTensor& t = l.tensors[i];
    const size_t w = DTypeSize(t.dtype);
    const auto& b = base.at(t.name);
    const auto& g = target.at(t.name);
    const uint64_t n = Volume(t.shape);
    for (uint64_t s = 0; s * span < n; ++s) {
      DecodedChunk c;
      c.header.kind = overwrite ? ChunkKind::kOverwrite : ChunkKind::kXor;
      c.header.encoding =
          dense ? ChunkEncoding::kDense : ChunkEncoding::kSparse;
      c.header.id = ChunkId{i, static_cast<uint32_t>(s), 0};
      c.header.elem_size = static_cast<uint8_t>(w);
      c.header.span_elems = static_cast<uint32_t>(std::min(span, n - s * span));
      for (uint64_t e = 0; e < c.header.span_elems; ++e) {
        const uint64_t at = (s * span + e) * w;
        if (!dense && std::equal(&b[at], &b[at] + w, &g[at])) continue;
        if (!dense) c.positions.push_back(static_cast<uint32_t>(e));
        for (size_t k = 0; k < w; ++k) {
          c.values.push_back(overwrite ? g[at + k] : b[at + k] ^ g[at + k]);
        }
      }
      c.header.changed = static_cast<uint32_t>(dense ? c.header.span_elems
                                                     : c.positions.size());
      if (!c.values.empty()) out.emplace_back(i, std::move(c));
    }
  }
  return out;
}

}  // namespace dcr::placement_testing

#endif  // DCR_TESTS_UNIT_PLACEMENT_CANONICAL_CHUNKS_H_
