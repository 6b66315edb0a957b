// The resolved layout's own queries: the shards a rank holds, and the
// fingerprint producers and the coordinator compare.
#include "dcr/layout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dcr/digest.h"

namespace dcr {

std::map<std::string, LayoutShard> Layout::ShardsOf(uint32_t rank) const {
  std::map<std::string, LayoutShard> out;
  for (const LayoutTensor& t : tensors) {
    for (const AffinePiece& p : t.pieces) {
      if (p.rank != rank) continue;
      out.emplace(p.shard, LayoutShard{p.shard, p.shard_shape,
                                       t.conversion.shard_dtype});
    }
  }
  return out;
}

Digest128 Layout::Fingerprint() const {
  // A text form of everything resolved, in canonical name order (the
  // order ResolveLayout leaves) and with each tensor's pieces sorted:
  // independent of how the file spelled or ordered it. Names are length
  // prefixed, so no name can imitate the separators.
  auto text = [](const std::string& name) {
    return std::to_string(name.size()) + ":" + name;
  };
  auto dims = [](const char* tag, const auto& v) {
    std::string out = tag;
    for (auto d : v) out += " " + std::to_string(d);
    return out + ";";
  };
  std::string s = "dcr-layout-1 " + std::to_string(tp) + " " +
                  std::to_string(pp) + " " + std::to_string(ep) + "\n";
  for (const LayoutTensor& t : tensors) {
    uint64_t add_bits;
    std::memcpy(&add_bits, &t.conversion.add, sizeof add_bits);
    s += text(t.name) + " " + std::string(DTypeName(t.dtype)) + " " +
         std::string(DTypeName(t.conversion.shard_dtype)) + " " +
         std::to_string(add_bits) + dims(" shape", t.shape);
    // Who holds copies: what a serving rank holds beyond the pieces.
    if (t.copies_tp || t.copies_ep) {
      s += std::string(" copies") + (t.copies_tp ? " tp" : "") +
           (t.copies_ep ? " ep" : "");
    }
    if (t.fp8) {
      s += " fp8 " + std::to_string(t.fp8->block_rows) + " " +
           std::to_string(t.fp8->block_cols) + " " + text(t.fp8->scale_shard);
    }
    std::vector<std::string> pieces;
    for (const AffinePiece& p : t.pieces) {
      pieces.push_back(std::to_string(p.rank) + " " + text(p.shard) +
                       dims(" s", p.shard_shape) + dims(" f", p.from) +
                       dims(" e", p.extent) + dims(" t", p.to) +
                       dims(" a", p.axis) + dims(" d", p.step));
    }
    std::sort(pieces.begin(), pieces.end());
    for (const std::string& x : pieces) s += "\n  " + x;
    s += "\n";
  }
  return Hash128(std::as_bytes(std::span(s)));
}

}  // namespace dcr
