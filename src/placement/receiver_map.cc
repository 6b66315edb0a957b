// A serving rank's view of the layout (dcr/receiver_map.h).
#include "dcr/receiver_map.h"

#include <cstring>
#include <string>

#include "dcr/dtype.h"

namespace dcr {
namespace {

// Whether rank `holder` holds a copy of piece `p` of tensor `t`: same
// stage, and the same tensor-parallel rank unless every one holds it, and
// the same expert-parallel group unless every one holds it.
bool HoldsCopy(const Layout& l, const LayoutTensor& t, const AffinePiece& p,
               uint32_t holder) {
  if (p.rank == holder) return false;  // its own piece, not a copy
  const uint32_t per_stage = l.tp * l.ep;
  if (p.rank / per_stage != holder / per_stage) return false;
  const uint32_t tp_p = p.rank % l.tp, tp_h = holder % l.tp;
  const uint32_t ep_p = p.rank / l.tp % l.ep, ep_h = holder / l.tp % l.ep;
  return (tp_p == tp_h || t.copies_tp) && (ep_p == ep_h || t.copies_ep);
}

uint64_t ShapeElements(const Shape& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// Whether the shard boxes of two pieces of one shard share an element.
bool BoxesMeet(const AffinePiece& a, const AffinePiece& b) {
  for (size_t d = 0; d < a.from.size() && d < b.from.size(); ++d) {
    if (a.from[d] >= b.from[d] + b.extent[d] ||
        b.from[d] >= a.from[d] + a.extent[d]) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<ReceiverMap> ReceiverMap::Create(const Layout& layout, uint32_t rank) {
  if (rank >= layout.ranks()) {
    return Status::InvalidArgument(
        "serving rank " + std::to_string(rank) + " is not below the " +
        std::to_string(layout.ranks()) + " ranks of " + layout.source);
  }
  ReceiverMap m;
  m.rank_ = rank;
  m.held_ = layout;
  m.tensors_.resize(layout.tensors.size());
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const LayoutTensor& t = layout.tensors[i];
    std::vector<AffinePiece> held;
    for (const AffinePiece& p : t.pieces) {
      if (p.rank == rank) {
        held.push_back(p);
      } else if (HoldsCopy(layout, t, p, rank)) {
        // A copy of another rank's piece: held as this rank's own, unless
        // the rank holds that box of the shard already (a tensor replicated
        // and owned here).
        AffinePiece c = p;
        c.rank = rank;
        bool dup = false;
        for (const AffinePiece& h : held) {
          dup |= h.shard == c.shard && h.from == c.from && h.to == c.to &&
                 h.extent == c.extent && h.axis == c.axis && h.step == c.step;
        }
        if (!dup) held.push_back(std::move(c));
      }
    }
    if (!held.empty() && !t.conversion.identity(t.dtype)) {
      return Status::InvalidArgument(
          "serving rank " + std::to_string(rank) + " holds tensor '" + t.name +
          "' converted from " +
          std::string(DTypeName(t.conversion.shard_dtype)) +
          (t.conversion.add != 0 ? " with 'add'" : "") +
          ": a serving layout holds canonical bits (declare the shard dtype "
          "as the tensor's, and no 'add')");
    }
    for (const AffinePiece& p : held) {
      // A box of a shard an earlier tensor holds too (a tied head reading
      // its embedding's shard) takes that tensor's changes only: the two
      // carry the same bits, and the second XOR would undo the first.
      bool tied = false;
      for (size_t j = 0; j < i && !tied; ++j) {
        for (const AffinePiece& q : m.held_.tensors[j].pieces) {
          tied |= q.shard == p.shard && BoxesMeet(p, q);
        }
      }
      m.tensors_[i].push_back(Held{PieceMap(p, t.shape), p.shard, !tied});
    }
    m.held_.tensors[i].pieces = std::move(held);
  }
  m.shards_ = m.held_.ShardsOf(rank);
  return m;
}

Result<uint64_t> ReceiverMap::Apply(uint32_t tensor, uint64_t first,
                                    const DecodedChunk& c,
                                    const MutableShardBytes& shards) const {
  if (tensor >= tensors_.size()) {
    return Status::InvalidArgument(
        "a chunk names tensor " + std::to_string(tensor) + " past the " +
        std::to_string(tensors_.size()) + " of the layout");
  }
  const LayoutTensor& t = held_.tensors[tensor];
  const size_t w = DTypeSize(t.dtype);
  const uint64_t n = ShapeElements(t.shape);
  // A dense chunk carries every element of its span, a sparse one those
  // at its positions.
  const bool dense = c.header.encoding == ChunkEncoding::kDense;
  const size_t count = dense ? c.header.span_elems : c.positions.size();
  if (c.header.elem_size != w || first > n || c.header.span_elems > n - first ||
      c.values.size() != count * w || (dense && !c.positions.empty())) {
    return Status::InvalidArgument("chunk (" + ChunkIdText(c.header.id) +
                                   ") does not fit tensor '" + t.name + "'");
  }
  const bool is_xor = c.header.kind == ChunkKind::kXor;
  uint64_t wrote = 0;
  for (const Held& h : tensors_[tensor]) {
    if (!h.apply) continue;
    auto it = shards.find(h.shard);
    const LayoutShard& ls = shards_.at(h.shard);
    if (it == shards.end() ||
        it->second.size() != ShapeElements(ls.shape) * w) {
      return Status::InvalidArgument(
          "serving rank " + std::to_string(rank_) + ": shard '" + h.shard +
          (it == shards.end() ? "' is missing" : "' is not its layout size"));
    }
    std::byte* out = it->second.data();
    for (size_t i = 0; i < count; ++i) {
      const uint64_t p = dense ? i : c.positions[i];
      uint64_t s;
      if (p >= c.header.span_elems || !h.map.ToShard(first + p, &s)) {
        continue;
      }
      const std::byte* v = c.values.data() + i * w;
      std::byte* e = out + s * w;
      if (is_xor) {
        for (size_t b = 0; b < w; ++b) e[b] ^= v[b];
      } else {
        std::memcpy(e, v, w);
      }
      ++wrote;
    }
  }
  return wrote;
}

Result<std::map<std::string, std::vector<std::byte>>> ReceiverMap::Build(
    const CanonicalBytes& canonical) const {
  return BuildShards(held_, rank_, canonical);
}

Result<std::vector<LinearDigest>> ReceiverMap::HashRegions(
    const ShardBytes& shards) const {
  return HashShardRegions(held_, rank_, shards);
}

Result<std::vector<LinearDigest>> ReceiverMap::ExpectedRegions(
    const CanonicalBytes& canonical) const {
  return HashCanonicalRegions(held_, rank_, canonical);
}

Result<Layout> ServingView(const Layout& layout) {
  Layout out = layout;
  for (LayoutTensor& t : out.tensors) t.pieces.clear();
  for (uint32_t r = 0; r < layout.ranks(); ++r) {
    DCR_ASSIGN_OR_RETURN(ReceiverMap m, ReceiverMap::Create(layout, r));
    for (size_t i = 0; i < out.tensors.size(); ++i) {
      const auto& held = m.held().tensors[i].pieces;
      out.tensors[i].pieces.insert(out.tensors[i].pieces.end(), held.begin(),
                                   held.end());
    }
  }
  return out;
}

}  // namespace dcr
