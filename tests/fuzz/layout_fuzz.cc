// Fuzzes the layout loader: YAML text in, a resolved Layout or an error
// out, never a crash. A layout that resolves must tile every canonical
// tensor: within a budget per input, the pieces' inverse maps are walked
// element by element, independently of the resolver's own arithmetic check.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "dcr/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // bounded: yaml-cpp is recursive
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto layout = dcr::ParseLayout(text, "fuzz.yaml");
  if (!layout.ok()) return 0;
  size_t pieces = 0;
  for (const dcr::LayoutTensor& t : layout->tensors) pieces += t.pieces.size();
  if (pieces <= (1u << 16)) (void)layout->Fingerprint();
  // Element x piece checks per input: bounded, so that no input is slow.
  uint64_t budget = 1 << 22;
  for (const dcr::LayoutTensor& t : layout->tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n = d > (1u << 22) / n ? (1u << 22) + 1 : n * d;
    const uint64_t cost = n * std::max<uint64_t>(1, t.pieces.size());
    if (n > (1u << 22) || cost > budget) continue;
    budget -= cost;
    std::vector<dcr::PieceMap> maps;
    for (const dcr::AffinePiece& p : t.pieces) maps.emplace_back(p, t.shape);
    for (uint64_t c = 0; c < n; ++c) {
      int owners = 0;
      for (const dcr::PieceMap& m : maps) {
        uint64_t s;
        if (!m.ToShard(c, &s)) continue;
        if (!m.Holds(s) || m.ToCanonical(s) != c) std::abort();
        ++owners;
      }
      if (owners != 1) std::abort();
    }
  }
  for (uint32_t r = 0; r < layout->ranks() && r < 4; ++r) {
    (void)layout->ShardsOf(r);
  }
  return 0;
}
