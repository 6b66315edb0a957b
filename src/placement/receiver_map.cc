// A serving rank's view of the layout (dcr/receiver_map.h).
#include "dcr/receiver_map.h"

#include <algorithm>
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

}  // namespace

bool ReceiverMap::BoxesMeet(const AffinePiece& a, const AffinePiece& b) {
  for (size_t d = 0; d < a.from.size() && d < b.from.size(); ++d) {
    if (a.from[d] >= b.from[d] + b.extent[d] ||
        b.from[d] >= a.from[d] + a.extent[d]) {
      return false;
    }
  }
  return true;
}

// The row-at-a-time form of piece p, if it has one (1-D or 2-D, placed
// as it lies).
ReceiverMap::Rows ReceiverMap::RowsOf(const AffinePiece& p,
                                      const Shape& shape) {
  ReceiverMap::Rows r;
  const size_t dims = shape.size();
  if (dims == 0 || dims > 2 || p.shard_shape.size() != dims) return r;
  for (size_t d = 0; d < dims; ++d) {
    if (p.axis[d] != d || p.step[d] != 1) return r;
  }
  r.ok = true;
  if (dims == 1) {
    r.cols = shape[0];
    r.rows = 1;
    r.to_col = p.to[0];
    r.width = p.extent[0];
    r.from_col = p.from[0];
    r.shard_cols = p.shard_shape[0];
  } else {
    r.cols = shape[1];
    r.to_row = p.to[0];
    r.rows = p.extent[0];
    r.to_col = p.to[1];
    r.width = p.extent[1];
    r.from_row = p.from[0];
    r.from_col = p.from[1];
    r.shard_cols = p.shard_shape[1];
  }
  return r;
}

Result<uint64_t> ReceiverMap::ApplyHeld(const Held& h, uint64_t first,
                                        const DecodedChunk& c, size_t count,
                                        size_t w, std::span<std::byte> out,
                                        Fp8BlockSet* marks, std::byte* gather) {
  const bool dense = c.header.encoding == ChunkEncoding::kDense;
  const bool is_xor = c.header.kind == ChunkKind::kXor;
  const Rows& b = h.rows;
  // The canonical row of the last position, its first element, and where
  // that row's part of the box lands in the shard (if the box has it).
  uint64_t row_first = 0, row_end = 0;
  bool row_in = false;
  uint64_t shard_row = 0;
  uint64_t wrote = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t p = dense ? i : c.positions[i];
    if (p >= c.header.span_elems) continue;
    const uint64_t e = first + p;
    uint64_t s;
    if (b.ok) {
      if (e < row_first || e >= row_end) {
        const uint64_t row = e / b.cols;
        row_first = row * b.cols;
        row_end = row_first + b.cols;
        row_in = row >= b.to_row && row - b.to_row < b.rows;
        shard_row = (row - b.to_row + b.from_row) * b.shard_cols;
      }
      const uint64_t col = e - row_first;
      if (!row_in || col < b.to_col || col - b.to_col >= b.width) continue;
      s = shard_row + (col - b.to_col + b.from_col);
    } else if (!h.map.ToShard(e, &s)) {
      continue;
    }
    // A map that a valid piece never gives; checked so that no bug in it
    // can write outside the shard.
    if (s >= out.size() / w) {
      return Status::Internal("serving map of shard '" + h.shard +
                              "' sends canonical element " + std::to_string(e) +
                              " outside it");
    }
    std::byte* x = out.data() + s * w;
    if (gather != nullptr) {
      std::memcpy(gather + i * w, x, w);
      ++wrote;
      continue;
    }
    const std::byte* v = c.values.data() + i * w;
    if (is_xor) {
      for (size_t k = 0; k < w; ++k) x[k] ^= v[k];
    } else {
      std::memcpy(x, v, w);
    }
    if (marks != nullptr) marks->MarkRange(s, 1);
    ++wrote;
  }
  return wrote;
}

Result<ReceiverMap> ReceiverMap::Create(const Layout& layout, uint32_t rank) {
  if (rank >= layout.ranks()) {
    return Status::InvalidArgument(
        "serving rank " + std::to_string(rank) + " is not below the " +
        std::to_string(layout.ranks()) + " ranks of " + layout.source);
  }
  ReceiverMap m;
  m.rank_ = rank;
  m.fingerprint_ = layout.Fingerprint();
  m.held_ = layout;
  m.tensors_.resize(layout.tensors.size());
  // The boxes of each shard held so far, with their tensors.
  std::map<std::string,
           std::vector<std::pair<const AffinePiece*, const LayoutTensor*>>>
      by_shard;
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
    // Per-tensor FP8: the rank keeps all of t as its shadow, one identity
    // piece; the codes of the boxes it holds come from it.
    const bool per_tensor = t.fp8 && t.fp8->per_tensor() && !held.empty();
    if (per_tensor) {
      DCR_RETURN_IF_ERROR(m.AddFp8(static_cast<uint32_t>(i), t, held));
      held = {AffinePiece::Block(rank, ShadowName(t.name), t.shape,
                                 Shape(t.shape.size(), 0))};
    }
    for (const AffinePiece& p : held) {
      // One shard, one shape and dtype: copies are pairs of rank and shard
      // the layout's own checks never saw.
      auto seen = by_shard.try_emplace(p.shard).first;
      if (!seen->second.empty()) {
        const auto& [q, qt] = seen->second.front();
        if (q->shard_shape != p.shard_shape ||
            qt->conversion.shard_dtype != t.conversion.shard_dtype) {
          return Status::InvalidArgument(
              "serving rank " + std::to_string(rank) + ": shard '" + p.shard +
              "' is " + ShapeText(q->shard_shape) + " " +
              std::string(DTypeName(qt->conversion.shard_dtype)) +
              " for tensor '" + qt->name + "' but " + ShapeText(p.shard_shape) +
              " " + std::string(DTypeName(t.conversion.shard_dtype)) +
              " for tensor '" + t.name + "'");
        }
      }
      // A box of a shard an earlier tensor holds too (a tied head reading
      // its embedding's shard) takes that tensor's changes only: the two
      // carry the same bits, and the second XOR would undo the first. It
      // must be the same box, or part of the later tensor would never be
      // written.
      bool tied = false;
      for (const auto& [q, qt] : seen->second) {
        if (qt == &t || !BoxesMeet(p, *q)) continue;
        if (q->from != p.from || q->extent != p.extent) {
          return Status::InvalidArgument(
              "serving rank " + std::to_string(rank) + ": tensors '" +
              qt->name + "' and '" + t.name +
              "' share part of a box of shard '" + p.shard +
              "'; tied tensors must hold the same box");
        }
        tied = true;
      }
      m.tensors_[i].push_back(
          Held{PieceMap(p, t.shape), RowsOf(p, t.shape), p.shard, !tied});
    }
    if (t.fp8 && !per_tensor && !held.empty()) {
      DCR_RETURN_IF_ERROR(m.AddFp8(static_cast<uint32_t>(i), t, held));
    }
    m.held_.tensors[i].pieces = std::move(held);
    m.held_.tensors[i].fp8.reset();  // held_ holds the shadows
    for (const AffinePiece& p : m.held_.tensors[i].pieces) {
      by_shard[p.shard].emplace_back(&p, &t);
    }
  }
  // A shard holds FP8 tensors only, or none; a per-tensor tensor's shadow
  // is its own.
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    for (const AffinePiece& p : m.held_.tensors[i].pieces) {
      const auto f = m.fp8_.find(p.shard);
      if (f != m.fp8_.end() &&
          (!layout.tensors[i].fp8 || f->second.view.per_tensor())) {
        return Status::InvalidArgument(
            "serving rank " + std::to_string(rank) + ": shard '" + p.shard +
            "' holds FP8 tensors and tensor '" + layout.tensors[i].name +
            (layout.tensors[i].fp8 ? "', which has per-block scales"
                                   : "', which is not FP8"));
      }
      for (const auto& [j, boxes] : m.fp8_boxes_) {
        if (j != i && p.shard == ShadowName(layout.tensors[j].name)) {
          return Status::InvalidArgument(
              "serving rank " + std::to_string(rank) + ": tensor '" +
              layout.tensors[i].name + "' is held in '" + p.shard +
              "', the name of tensor '" + layout.tensors[j].name +
              "''s FP8 shadow");
        }
      }
    }
  }
  DCR_RETURN_IF_ERROR(m.OrderFp8Parts());
  m.shards_ = m.held_.ShardsOf(rank);
  for (const auto& [name, f] : m.fp8_) {
    if (f.view.per_tensor()) {
      LayoutShard codes{name, {f.view.rows, f.view.cols}, DType::kF8E4M3};
      LayoutShard scales{f.scales, f.scales_shape(), DType::kF32};
      if (!m.shards_.emplace(name, codes).second ||
          !m.shards_.emplace(f.scales, scales).second) {
        return Status::InvalidArgument(
            "serving rank " + std::to_string(rank) + ": FP8 shard '" + name +
            "' or its scales '" + f.scales + "' is named like another tensor");
      }
      continue;
    }
    LayoutShard shadow = m.shards_.at(name);
    LayoutShard codes = shadow;
    codes.dtype = DType::kF8E4M3;
    m.shards_[name] = codes;
    shadow.name = ShadowName(name);
    if (!m.shards_.emplace(shadow.name, shadow).second) {
      return Status::InvalidArgument("serving rank " + std::to_string(rank) +
                                     ": the shadow of FP8 shard '" + name +
                                     "', '" + shadow.name +
                                     "', is named like another tensor");
    }
    LayoutShard scales{f.scales, f.scales_shape(), DType::kF32};
    if (!m.shards_.emplace(f.scales, scales).second) {
      return Status::InvalidArgument(
          "serving rank " + std::to_string(rank) + ": the scales of shard '" +
          name + "', '" + f.scales + "', are named like another tensor");
    }
  }
  return m;
}

Result<uint64_t> ReceiverMap::Apply(uint32_t tensor, uint64_t first,
                                    const DecodedChunk& c,
                                    const MutableShardBytes& shards,
                                    Fp8Dirty* dirty) const {
  return Visit(tensor, first, c, shards, dirty, {});
}

Result<uint64_t> ReceiverMap::Gather(uint32_t tensor, uint64_t first,
                                     const DecodedChunk& c,
                                     const MutableShardBytes& shards,
                                     std::span<std::byte> old) const {
  const size_t count = c.header.encoding == ChunkEncoding::kDense
                           ? c.header.span_elems
                           : c.positions.size();
  if (old.size() != uint64_t{count} * c.header.elem_size || old.empty()) {
    return Status::InvalidArgument(
        "chunk (" + ChunkIdText(c.header.id) +
        "): Gather needs one element of room per position");
  }
  return Visit(tensor, first, c, shards, nullptr, old);
}

Result<uint64_t> ReceiverMap::Visit(uint32_t tensor, uint64_t first,
                                    const DecodedChunk& c,
                                    const MutableShardBytes& shards,
                                    Fp8Dirty* dirty,
                                    std::span<std::byte> gather) const {
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
  // Every shard the chunk writes is found and checked before the first
  // write: a refused chunk leaves the shards as they were (an XOR retried
  // after a partial write would undo it).
  struct Target {
    const Held* held;
    std::span<std::byte> out;
    Fp8BlockSet* marks;
  };
  std::vector<Target> targets;
  const auto parts = fp8_parts_.find(tensor);
  if (parts != fp8_parts_.end() && dirty == nullptr && gather.empty()) {
    return Status::InvalidArgument(
        "serving rank " + std::to_string(rank_) + ": tensor '" + t.name +
        "' is served as FP8: Apply needs the dirty blocks to mark");
  }
  for (const Held& h : tensors_[tensor]) {
    if (!h.apply) continue;
    const auto f = fp8_.find(h.shard);
    const bool fp8 = f != fp8_.end();
    if (fp8 && dirty == nullptr && gather.empty()) {
      return Status::InvalidArgument(
          "serving rank " + std::to_string(rank_) + ": tensor '" + t.name +
          "' is served as FP8: Apply needs the dirty blocks to mark");
    }
    const std::string& name = fp8 ? ShadowName(h.shard) : h.shard;
    auto it = shards.find(name);
    const LayoutShard& ls = shards_.at(name);
    if (it == shards.end() ||
        it->second.size() != ShapeElements(ls.shape) * w) {
      return Status::InvalidArgument(
          "serving rank " + std::to_string(rank_) + ": shard '" + name +
          (it == shards.end() ? "' is missing" : "' is not its layout size"));
    }
    targets.push_back({&h, it->second, nullptr});
  }
  for (Target& x : targets) {
    const auto f = fp8_.find(x.held->shard);
    if (f != fp8_.end() && gather.empty()) {
      x.marks = &dirty->try_emplace(f->first, f->second.marks()).first->second;
    }
  }
  uint64_t wrote = 0;
  for (const Target& x : targets) {
    // An error here is a bug in the map (an element outside its shard),
    // found before that element is written; earlier boxes may be written.
    DCR_ASSIGN_OR_RETURN(const uint64_t held,
                         ApplyHeld(*x.held, first, c, count, w, x.out, x.marks,
                                   gather.empty() ? nullptr : gather.data()));
    wrote += held;
  }
  // A per-tensor FP8 tensor: any change moves its scale, so its codes in
  // every shard part are requantized.
  if (parts != fp8_parts_.end() && gather.empty() && wrote != 0) {
    for (const auto& [shard, part] : parts->second) {
      dirty->try_emplace(shard, fp8_.at(shard).marks())
          .first->second.MarkRange(part, 1);
    }
  }
  return wrote;
}

Result<std::map<std::string, std::vector<std::byte>>> ReceiverMap::Build(
    const CanonicalBytes& canonical) const {
  DCR_ASSIGN_OR_RETURN(auto out, BuildShards(held_, rank_, canonical));
  for (const auto& [name, f] : fp8_) {
    if (f.view.per_tensor()) {
      // Zero codes where no box lies (padding), as a block shard's.
      out[name].assign(f.view.elements(), std::byte{0});
      out[f.scales].assign(f.parts.size() * sizeof(float), std::byte{0});
      MutableShardBytes view;
      for (auto& [n, bytes] : out) view.emplace(n, bytes);
      Fp8BlockSet all(f.marks());
      all.MarkAll();
      DCR_RETURN_IF_ERROR(RequantizePerTensor(name, f, view, all));
      continue;
    }
    std::vector<std::byte> shadow = std::move(out.at(name));
    std::vector<std::byte> codes(f.view.elements());
    std::vector<float> scales(f.view.blocks());
    DCR_RETURN_IF_ERROR(QuantizeFp8(
        f.view, shadow,
        std::span(reinterpret_cast<uint8_t*>(codes.data()), codes.size()),
        scales));
    out[name] = std::move(codes);
    out[ShadowName(name)] = std::move(shadow);
    auto bytes = std::as_bytes(std::span(scales));
    out[f.scales].assign(bytes.begin(), bytes.end());
  }
  return out;
}

Result<ShardBytes> ReceiverMap::Shadows(const ShardBytes& shards) const {
  ShardBytes out = shards;
  for (const auto& [name, f] : fp8_) {
    if (f.view.per_tensor()) continue;
    auto it = shards.find(ShadowName(name));
    if (it == shards.end()) {
      return Status::NotFound("serving rank " + std::to_string(rank_) +
                              ": no shadow '" + ShadowName(name) + "'");
    }
    out[name] = it->second;
  }
  return out;
}

Result<std::vector<LinearDigest>> ReceiverMap::HashRegions(
    const ShardBytes& shards) const {
  DCR_ASSIGN_OR_RETURN(ShardBytes shadows, Shadows(shards));
  return HashShardRegions(held_, rank_, shadows);
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

Digest128 ReceiverMap::BitsDigest(
    const std::vector<LinearDigest>& regions) const {
  Hasher128 h;
  h.Update(std::string_view("dcr-serving-bits-1"));
  h.Update(fingerprint_);
  h.UpdateU64(rank_);
  h.UpdateU64(regions.size());
  for (const LinearDigest& d : regions) {
    h.UpdateU64(d.high);
    h.UpdateU64(d.low);
  }
  return h.Finish();
}

std::map<std::string, LayoutShard> ReceiverMap::DeviceShards() const {
  std::map<std::string, LayoutShard> out = shards_;
  for (const auto& [name, f] : fp8_) {
    if (!f.view.per_tensor()) out.erase(ShadowName(name));
  }
  // A per-tensor FP8 tensor's shadow is the whole canonical tensor.
  for (const auto& [tensor, boxes] : fp8_boxes_) {
    out.erase(ShadowName(held_.tensors[tensor].name));
  }
  return out;
}

Result<Manifest> ReceiverMap::StoreManifest() const {
  std::vector<TensorInfo> tensors;
  for (const auto& [name, s] : shards_) {
    tensors.push_back(TensorInfo{name, s.dtype, s.shape});
  }
  return Manifest::Create(std::move(tensors));
}

Result<Manifest> ReceiverMap::CanonicalManifest() const {
  std::vector<TensorInfo> tensors;
  for (const LayoutTensor& t : held_.tensors) {
    tensors.push_back(TensorInfo{t.name, t.dtype, t.shape});
  }
  return Manifest::Create(std::move(tensors));
}

}  // namespace dcr
