// A serving rank's FP8 shards (dcr/receiver_map.h, docs/PLACEMENT.md
// §"FP8 serving"): which boxes each one holds, and their requantization
// after a refit, per block or with one scale per tensor.
#include <algorithm>
#include <cstring>
#include <string>

#include "dcr/receiver_map.h"

namespace dcr {

Fp8Tensor ReceiverMap::Fp8Shard::marks() const {
  if (!view.per_tensor()) return view;
  Fp8Tensor m = view;
  m.rows = 1;
  m.cols = parts.size();
  m.block_rows = m.block_cols = 1;
  return m;
}

Shape ReceiverMap::Fp8Shard::scales_shape() const {
  if (view.per_tensor()) return {parts.size()};
  return {view.blocks_down(), view.blocks_across()};
}

Status ReceiverMap::AddFp8(uint32_t tensor, const LayoutTensor& t,
                           const std::vector<AffinePiece>& held) {
  const Fp8Serving& f = *t.fp8;
  auto refuse = [&](const AffinePiece& p, const std::string& why) {
    return Status::InvalidArgument("serving rank " + std::to_string(rank_) +
                                   ": FP8 tensor '" + t.name + "' in shard '" +
                                   p.shard + "': " + why);
  };
  for (const AffinePiece& p : held) {
    if (t.shape.size() != 2 || p.shard_shape.size() != 2) {
      return refuse(p, "FP8 serving takes 2-dimensional weights");
    }
    if (p.axis != std::vector<uint32_t>{0, 1} || p.step != Shape{1, 1}) {
      return refuse(p, "an FP8 box cannot be transposed or interleaved");
    }
    const uint64_t block[2] = {f.block_rows, f.block_cols};
    for (size_t d = 0; d < 2 && !f.per_tensor(); ++d) {
      const bool ends_both = p.from[d] + p.extent[d] == p.shard_shape[d] &&
                             p.to[d] + p.extent[d] == t.shape[d];
      if (p.from[d] % block[d] != 0 || p.to[d] % block[d] != 0 ||
          (p.extent[d] % block[d] != 0 && !ends_both)) {
        return refuse(
            p, "its box of " + std::to_string(p.extent[0]) + "x" +
                   std::to_string(p.extent[1]) + " from [" +
                   std::to_string(p.from[0]) + ", " +
                   std::to_string(p.from[1]) + "] at [" +
                   std::to_string(p.to[0]) + ", " + std::to_string(p.to[1]) +
                   "] cuts " + std::to_string(f.block_rows) + "x" +
                   std::to_string(f.block_cols) +
                   " blocks (a box starts on a block boundary in the shard "
                   "and in the tensor, and ends on one unless it ends both)");
      }
    }
    Fp8Shard shard;
    shard.view.dtype = t.dtype;
    shard.view.rows = p.shard_shape[0];
    shard.view.cols = p.shard_shape[1];
    shard.view.block_rows = f.block_rows;
    shard.view.block_cols = f.block_cols;
    shard.scales = f.scale_shard;
    auto [it, fresh] = fp8_.emplace(p.shard, shard);
    const Fp8Tensor& v = it->second.view;
    if (!fresh &&
        (v.block_rows != f.block_rows || v.block_cols != f.block_cols ||
         v.dtype != t.dtype || it->second.scales != f.scale_shard ||
         v.rows != shard.view.rows || v.cols != shard.view.cols)) {
      return refuse(p,
                    "the shard's FP8 tensors must share one shape, block "
                    "shape, dtype and scale name");
    }
    if (f.per_tensor()) {
      std::vector<uint32_t>& parts = it->second.parts;
      if (std::find(parts.begin(), parts.end(), tensor) == parts.end()) {
        parts.push_back(tensor);
      }
      fp8_boxes_[tensor].push_back(p);
    }
  }
  return Status::OK();
}

Status ReceiverMap::OrderFp8Parts() {
  // Where a part's first element lies in shard `name`.
  auto first = [&](uint32_t tensor, const std::string& name) {
    uint64_t at = UINT64_MAX;
    for (const AffinePiece& b : fp8_boxes_.at(tensor)) {
      if (b.shard == name) {
        at = std::min(at, b.from[0] * b.shard_shape[1] + b.from[1]);
      }
    }
    return at;
  };
  for (auto& entry : fp8_) {
    // Not a structured binding: clang before 16 cannot capture one.
    const std::string& name = entry.first;
    Fp8Shard& f = entry.second;
    if (!f.view.per_tensor()) continue;
    std::sort(f.parts.begin(), f.parts.end(), [&](uint32_t a, uint32_t b) {
      return first(a, name) < first(b, name);
    });
    // Each code is one tensor's: two parts' boxes must not meet.
    for (size_t a = 0; a < f.parts.size(); ++a) {
      fp8_parts_[f.parts[a]].emplace_back(name, static_cast<uint32_t>(a));
      for (size_t b = 0; b < a; ++b) {
        for (const AffinePiece& x : fp8_boxes_.at(f.parts[a])) {
          for (const AffinePiece& y : fp8_boxes_.at(f.parts[b])) {
            if (x.shard == name && y.shard == name && BoxesMeet(x, y)) {
              return Status::InvalidArgument(
                  "serving rank " + std::to_string(rank_) +
                  ": per-tensor FP8 tensors '" +
                  held_.tensors[f.parts[b]].name + "' and '" +
                  held_.tensors[f.parts[a]].name +
                  "' share elements of shard '" + name + "'");
            }
          }
        }
      }
    }
  }
  return Status::OK();
}

Status ReceiverMap::Requantize(const MutableShardBytes& shards,
                               Fp8Dirty* dirty) const {
  if (dirty == nullptr) {
    return Status::InvalidArgument("Requantize needs the dirty blocks");
  }
  for (auto& [name, marks] : *dirty) {
    const auto f = fp8_.find(name);
    if (f == fp8_.end()) {
      return Status::InvalidArgument("serving rank " + std::to_string(rank_) +
                                     ": '" + name + "' is no FP8 shard of it");
    }
    if (f->second.view.per_tensor()) {
      DCR_RETURN_IF_ERROR(RequantizePerTensor(name, f->second, shards, marks));
      marks.Clear();
      continue;
    }
    const Fp8Tensor& v = f->second.view;
    auto codes = shards.find(name);
    auto shadow = shards.find(ShadowName(name));
    auto scales = shards.find(f->second.scales);
    for (auto it : {codes, shadow, scales}) {
      if (it == shards.end()) {
        return Status::InvalidArgument("serving rank " + std::to_string(rank_) +
                                       ": FP8 shard '" + name +
                                       "' needs its codes, shadow and scales");
      }
    }
    if (scales->second.size() != v.blocks() * sizeof(float)) {
      return Status::InvalidArgument("serving rank " + std::to_string(rank_) +
                                     ": scales '" + f->second.scales +
                                     "' are not its layout size");
    }
    // The scales through an aligned copy: a mapped file need not place an
    // F32 tensor on a 4-byte boundary.
    std::vector<float> s(v.blocks());
    std::memcpy(s.data(), scales->second.data(), scales->second.size());
    DCR_RETURN_IF_ERROR(RequantizeFp8(
        v, shadow->second, marks,
        std::span(reinterpret_cast<uint8_t*>(codes->second.data()),
                  codes->second.size()),
        s));
    std::memcpy(scales->second.data(), s.data(), scales->second.size());
    marks.Clear();
  }
  return Status::OK();
}

Status ReceiverMap::RequantizePerTensor(const std::string& name,
                                        const Fp8Shard& f,
                                        const MutableShardBytes& shards,
                                        const Fp8BlockSet& marks) const {
  auto refuse = [&](const std::string& what) {
    return Status::InvalidArgument("serving rank " + std::to_string(rank_) +
                                   ": FP8 shard '" + name + "': " + what);
  };
  auto codes = shards.find(name);
  auto scales = shards.find(f.scales);
  if (codes == shards.end() || scales == shards.end()) {
    return refuse("needs its codes and scales");
  }
  if (codes->second.size() != f.view.elements() ||
      scales->second.size() != f.parts.size() * sizeof(float) ||
      marks.size() != f.parts.size()) {
    return refuse("its codes, scales or marks are not its layout size");
  }
  std::vector<float> s(f.parts.size());
  std::memcpy(s.data(), scales->second.data(), scales->second.size());
  const std::span q(reinterpret_cast<uint8_t*>(codes->second.data()),
                    codes->second.size());
  for (size_t k = 0; k < f.parts.size(); ++k) {
    if (!marks.marked(k)) continue;
    const LayoutTensor& t = held_.tensors[f.parts[k]];
    auto shadow = shards.find(ShadowName(t.name));
    if (shadow == shards.end()) {
      return refuse("no shadow '" + ShadowName(t.name) + "'");
    }
    const Fp8Tensor whole{t.dtype, t.shape[0], t.shape[1],
                          0,       0,          f.view.min_amax};
    DCR_ASSIGN_OR_RETURN(const Fp8Scale scale,
                         Fp8TensorScale(whole, shadow->second));
    for (const AffinePiece& b : fp8_boxes_.at(f.parts[k])) {
      if (b.shard != name) continue;
      const uint64_t at = b.from[0] * f.view.cols + b.from[1];
      DCR_RETURN_IF_ERROR(QuantizeFp8Box(whole, shadow->second, scale, b.to[0],
                                         b.to[1], b.extent[0], b.extent[1],
                                         q.subspan(at), f.view.cols));
    }
    // Each part's scale with its codes: an error in a later part leaves
    // this one whole.
    s[k] = scale.scale_inv;
    std::memcpy(scales->second.data() + k * sizeof(float), &s[k],
                sizeof(float));
  }
  return Status::OK();
}

}  // namespace dcr
