// Shard diff, comparison and region hashes (dcr/shard_diff.h): each piece's box
// is walked as runs along its last shard dimension, where shard elements are
// contiguous and canonical positions advance by a fixed step.
#include "dcr/shard_diff.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "codec/diff.h"
#include "placement/shard_runs.h"
#include "placement/tensor_changes.h"

namespace dcr {

using shard_runs::Bytes;
using shard_runs::CheckCanonical;
using shard_runs::CheckRank;
using shard_runs::EachTensorsChanges;
using shard_runs::ForEachRun;
using shard_runs::HashPiece;
using shard_runs::TensorChanges;

namespace {

// Elements FindChanges scans at a time: its outputs fit in the L1 cache.
constexpr uint64_t kScanBlock = 4096;

// FindChanges' outputs for one block (the value planes are not used).
struct Scan {
  uint32_t positions[kScanBlock];
  uint8_t plane_bytes[8][kScanBlock];
  uint8_t* planes[8];
  Scan() {
    for (int j = 0; j < 8; ++j) planes[j] = plane_bytes[j];
  }
};

uint32_t Load32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in F32
    float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) {  // infinity or NaN, payload kept
    return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float v) {
  const uint32_t x = std::bit_cast<uint32_t>(v);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // inf
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal half. |v| * 2^24 is exact and below 2^10;
    // rounding it to an integer (to nearest even, the default mode) is
    // the half's mantissa, 1024 meaning the smallest normal.
    float m = std::nearbyint(std::bit_cast<float>(a) * 0x1p24f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(m));
  }
  uint32_t h = (((a >> 23) - 112) << 10) | ((a >> 13) & 0x3FFu);
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // may carry to inf
  return static_cast<uint16_t>(sign | h);
}

namespace {

// The F32 value of one element of a floating dtype (exact).
float Widen(DType d, const std::byte* p) {
  switch (d) {
    case DType::kF32:
      return std::bit_cast<float>(Load32(p));
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return std::bit_cast<float>(uint32_t{h} << 16);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    default:
      return 0;  // refused by the layout's checks
  }
}

void Narrow(DType d, float v, std::byte* out) {
  switch (d) {
    case DType::kF32:
      std::memcpy(out, &v, 4);
      return;
    case DType::kBF16: {
      // As PyTorch's c10::BFloat16: every NaN becomes 0x7FC0.
      uint32_t b = std::bit_cast<uint32_t>(v);
      uint16_t h =
          (b & 0x7FFFFFFFu) > 0x7F800000u
              ? uint16_t{0x7FC0}
              : static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kF16: {
      uint16_t h = FloatToHalf(v);
      std::memcpy(out, &h, 2);
      return;
    }
    default:
      return;
  }
}

Status CheckSize(const Layout& layout, uint32_t rank, const LayoutShard& s,
                 const ShardBytes& bytes, const char* which,
                 std::span<const std::byte>* out) {
  auto it = bytes.find(s.name);
  if (it == bytes.end()) {
    return Status::NotFound("rank " + std::to_string(rank) + ": the " + which +
                            " shards lack '" + s.name + "', which layout " +
                            layout.source + " gives this rank");
  }
  uint64_t want = Bytes(s.shape, s.dtype);
  if (it->second.size() != want) {
    std::string shape;
    for (uint64_t d : s.shape)
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return Status::InvalidArgument(
        "rank " + std::to_string(rank) + ": " + which + " shard '" + s.name +
        "' has " + std::to_string(it->second.size()) + " bytes, but layout " +
        layout.source + " gives it shape [" + shape + "] of " +
        std::string(DTypeName(s.dtype)) + " (" + std::to_string(want) +
        " bytes); a step that changes a tensor's shape needs a new layout "
        "and a full refit");
  }
  *out = it->second;
  return Status::OK();
}

// Every shard the layout gives `rank`, found in `bytes` at its size
// (CheckSize), by name: checked once, before any work.
Result<ShardBytes> CheckedShards(const Layout& layout, uint32_t rank,
                                 const ShardBytes& bytes, const char* which) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  ShardBytes out;
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    std::span<const std::byte> b;
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, bytes, which, &b));
    out.emplace(name, b);
  }
  return out;
}

std::string Hex(const std::byte* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "0x";
  for (size_t i = n; i-- > 0;) {  // most significant byte first
    auto b = static_cast<unsigned>(p[i]);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

}  // namespace

void ConvertElement(const Conversion& c, DType canonical,
                    const std::byte* shard, std::byte* out) {
  float v = Widen(c.shard_dtype, shard);
  if (c.add != 0) v += static_cast<float>(c.add);
  Narrow(canonical, v, out);
}

Status CheckShards(const Layout& layout, uint32_t rank,
                   const ShardBytes& shards) {
  return CheckedShards(layout, rank, shards, "given").status();
}

Result<std::vector<CanonicalChanges>> DiffShards(const Layout& layout,
                                                 uint32_t rank,
                                                 const ShardBytes& base,
                                                 const ShardBytes& target,
                                                 ShardDiffStats* stats) {
  std::vector<CanonicalChanges> out;
  DCR_RETURN_IF_ERROR(DiffShardsEach(
      layout, rank, base, target,
      [&](CanonicalChanges&& ch) {
        out.push_back(std::move(ch));
        return Status::OK();
      },
      stats));
  return out;
}

ShardChangeLog::Shard* ShardChangeLog::For(const std::string& name,
                                           size_t elem_size) {
  Shard& s = shards_[name];
  if (s.elem_size != elem_size) {
    // Blocks sized for other elements (a layout whose dtype changed):
    // kept ones are freed.
    for (const Block& b : s.blocks) {
      bytes_ -= b.capacity * (4 + 2 * uint64_t{s.elem_size});
    }
    s = Shard();
    s.elem_size = elem_size;
  }
  return &s;
}

bool ShardChangeLog::Grow(Shard* shard, size_t k) {
  const uint64_t per = 4 + 2 * uint64_t{shard->elem_size};
  const size_t w = shard->elem_size;
  bool reclaimed = false;
  while (shard->room < k) {
    // The first block small (a shard of few changes stays small), each
    // next one twice the last, up to kBlockElems.
    const size_t last =
        shard->blocks.empty() ? 0 : shard->blocks.back().capacity;
    size_t cap = std::clamp<size_t>(2 * last, 16, kBlockElems);
    if (bytes_ + cap * per > limit_ && !reclaimed) {
      // Blocks other shards kept from an earlier step and this diff has
      // not filled: the bound is this step's, whichever shards change.
      Reclaim(shard);
      reclaimed = true;
    }
    if (bytes_ + cap * per > limit_) {
      // What is left of the bound, if it holds what this batch needs.
      const uint64_t left = limit_ > bytes_ ? (limit_ - bytes_) / per : 0;
      if (left < k - shard->room) return false;
      cap = static_cast<size_t>(left);
    }
    Block b;
    b.capacity = cap;
    b.index = std::make_unique_for_overwrite<uint32_t[]>(cap);
    b.base = std::make_unique_for_overwrite<std::byte[]>(cap * w);
    b.target = std::make_unique_for_overwrite<std::byte[]>(cap * w);
    shard->blocks.push_back(std::move(b));
    shard->room += cap;
    bytes_ += cap * per;
  }
  return true;
}

void ShardChangeLog::Reclaim(const Shard* keep) {
  for (auto& [name, s] : shards_) {
    if (&s == keep) continue;
    const uint64_t per = 4 + 2 * uint64_t{s.elem_size};
    // Blocks past the one it fills now (all of them before its first
    // element).
    const size_t used_blocks = s.count == 0 ? 0 : s.at + 1;
    while (s.blocks.size() > used_blocks) {
      const size_t cap = s.blocks.back().capacity;
      bytes_ -= cap * per;
      s.room -= cap;
      s.blocks.pop_back();
    }
  }
}

void ShardChangeLog::Clear() {
  for (auto& [name, s] : shards_) {
    s.count = 0;
    s.at = s.used = 0;
    s.room = 0;
    for (const Block& b : s.blocks) s.room += b.capacity;
  }
  overflowed_ = false;
}

void ShardChangeLog::Clear(uint64_t limit) {
  limit_ = limit;
  if (bytes_ > limit_) Free();
  Clear();
}

void ShardChangeLog::Free() {
  shards_.clear();
  bytes_ = 0;
  overflowed_ = false;
}

Status ShardChangeLog::Write(Buffers* shards, bool forward) const {
  // Each kept element's block and place in it, in the order kept.
  auto each = [](const Shard& s, auto fn) {
    uint64_t left = s.count;
    for (const Block& b : s.blocks) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(left, b.capacity));
      fn(b, n);
      left -= n;
      if (left == 0) break;
    }
  };
  for (const auto& [name, entry] : shards_) {
    const Shard& s = entry;
    if (s.count == 0) continue;
    auto it = shards->find(name);
    uint64_t need = 0;  // indices ascend per piece, not across pieces
    each(s, [&](const Block& b, size_t n) {
      for (size_t k = 0; k < n; ++k)
        need = std::max<uint64_t>(need, b.index[k]);
    });
    if (it == shards->end() || it->second.size() < (need + 1) * s.elem_size) {
      return Status::InvalidArgument("shard change log: shard '" + name +
                                     "' is missing or too short");
    }
  }
  for (const auto& [name, entry] : shards_) {
    // (A named reference: clang does not let the lambda capture a
    // structured binding.)
    const Shard& s = entry;
    if (s.count == 0) continue;
    std::byte* out = shards->find(name)->second.data();
    const size_t w = s.elem_size;
    each(s, [&](const Block& b, size_t n) {
      const std::byte* from = forward ? b.target.get() : b.base.get();
      auto move = [&]<size_t W>() {
        for (size_t k = 0; k < n; ++k) {
          std::memcpy(out + uint64_t{b.index[k]} * W, from + k * W, W);
        }
      };
      switch (w) {
        case 1:
          move.operator()<1>();
          break;
        case 2:
          move.operator()<2>();
          break;
        case 4:
          move.operator()<4>();
          break;
        default:
          for (size_t k = 0; k < n; ++k) {
            std::memcpy(out + uint64_t{b.index[k]} * w, from + k * w, w);
          }
      }
    });
  }
  return Status::OK();
}

Status DiffShardsEach(const Layout& layout, uint32_t rank,
                      const ShardBytes& base, const ShardBytes& target,
                      const std::function<Status(CanonicalChanges&&)>& each,
                      ShardDiffStats* stats, ShardChangeLog* log) {
  DCR_ASSIGN_OR_RETURN(ShardBytes b, CheckedShards(layout, rank, base, "base"));
  DCR_ASSIGN_OR_RETURN(ShardBytes t,
                       CheckedShards(layout, rank, target, "target"));
  ShardDiffStats st;
  for (const auto& [name, bytes] : b) {
    st.shard_bytes_read += bytes.size() + t.at(name).size();
  }

  Scan scan;
  auto scan_piece = [&](const AffinePiece& p, const LayoutTensor& tensor,
                        TensorChanges* changes) {
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const std::byte* bp0 = b.at(p.shard).data();
    const std::byte* tp0 = t.at(p.shard).data();
    ShardChangeLog::Shard* logged =
        log != nullptr ? log->For(p.shard, sw) : nullptr;
    ForEachRun(p, tensor.shape,
               [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
                 st.compared += n;
                 const std::byte* bp = bp0 + s * sw;
                 const std::byte* tp = tp0 + s * sw;
                 // The codec's vectorized scan finds the changed elements
                 // of a block of the run.
                 for (uint64_t off = 0; off < n; off += kScanBlock) {
                   const size_t m =
                       static_cast<size_t>(std::min(kScanBlock, n - off));
                   const size_t k = FindChanges(
                       sw, bp + off * sw, tp + off * sw, m,
                       /*xor_values=*/false, scan.positions, scan.planes);
                   changes->Reserve(k);
                   if (logged != nullptr && !log->Reserve(logged, k)) {
                     logged = nullptr;  // overflowed: it keeps no more
                   }
                   for (size_t i = 0; i < k; ++i) {
                     const uint64_t j = off + scan.positions[i];
                     changes->Add(c + j * step, bp + j * sw, tp + j * sw);
                     if (logged != nullptr) {
                       log->Add(logged, s + j, bp + j * sw, tp + j * sw);
                     }
                   }
                 }
               });
    return Status::OK();
  };
  Status s = EachTensorsChanges(
      layout, rank, scan_piece, [](size_t) {}, each, &st);
  if (stats) *stats = st;
  return s;
}

Result<std::vector<ShardMismatch>> CompareShards(
    const Layout& layout, uint32_t rank, const ShardBytes& shards,
    const CanonicalBytes& canonical) {
  DCR_ASSIGN_OR_RETURN(ShardBytes data,
                       CheckedShards(layout, rank, shards, "given"));
  std::map<std::string, ShardMismatch> found;  // by shard
  for (const LayoutTensor& tensor : layout.tensors) {
    const size_t cw = DTypeSize(tensor.dtype);
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const bool identity = tensor.conversion.identity(tensor.dtype);
    bool held = false;
    for (const AffinePiece& p : tensor.pieces) held |= p.rank == rank;
    if (!held) continue;
    auto it = canonical.find(tensor.name);
    DCR_RETURN_IF_ERROR(CheckCanonical(tensor, canonical, it));
    const std::byte* canon = it->second.data();
    std::byte conv[8];
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      const std::byte* shard = data.at(p.shard).data();
      ForEachRun(p, tensor.shape,
                 [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
                   for (uint64_t j = 0; j < n; ++j) {
                     const std::byte* x = shard + (s + j) * sw;
                     if (!identity) {
                       ConvertElement(tensor.conversion, tensor.dtype, x, conv);
                       x = conv;
                     }
                     const std::byte* y = canon + (c + j * step) * cw;
                     if (std::memcmp(x, y, cw) == 0) continue;
                     ShardMismatch& m = found[p.shard];
                     if (m.differing++ == 0) {
                       m.shard = p.shard;
                       m.shard_element = s + j;
                       m.tensor = tensor.name;
                       m.element = c + j * step;
                       m.shard_hex = Hex(x, cw);
                       m.canonical_hex = Hex(y, cw);
                     }
                   }
                 });
    }
  }
  std::vector<ShardMismatch> out;
  for (auto& [name, m] : found) out.push_back(std::move(m));
  return out;
}

namespace {

// HashShardRegions' pass over the regions of the rank's pieces that read
// the shards in `data` (all of them, or one), XORed into `sum`.
void HashRegionsOf(const Layout& layout, uint32_t rank, const ShardBytes& data,
                   std::vector<LinearDigest>* sums) {
  std::vector<std::byte> converted;
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& tensor = layout.tensors[ti];
    const size_t cw = DTypeSize(tensor.dtype);
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const bool identity = tensor.conversion.identity(tensor.dtype);
    LinearDigest& sum = (*sums)[ti];
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      auto it = data.find(p.shard);
      if (it == data.end()) continue;
      const std::byte* shard = it->second.data();
      if (identity) {
        HashPiece(p, tensor, shard, /*in_shard=*/true, &sum);
        continue;
      }
      ForEachRun(p, tensor.shape,
                 [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
                   // Converted to canonical bits first, run by run.
                   converted.resize(n * cw);
                   for (uint64_t j = 0; j < n; ++j) {
                     ConvertElement(tensor.conversion, tensor.dtype,
                                    shard + (s + j) * sw, &converted[j * cw]);
                   }
                   const std::byte* run = converted.data();
                   if (step == 1) {  // contiguous in the canonical tensor
                     sum ^= LinearHash(c * cw, {run, n * cw});
                     return;
                   }
                   // Strided (a transpose): element by element, each at
                   // its own offset.
                   for (uint64_t j = 0; j < n; ++j) {
                     sum ^= LinearHash((c + j * step) * cw, {run + j * cw, cw});
                   }
                 });
    }
  }
}

}  // namespace

Result<std::vector<LinearDigest>> HashShardRegions(const Layout& layout,
                                                   uint32_t rank,
                                                   const ShardBytes& shards) {
  DCR_ASSIGN_OR_RETURN(ShardBytes data,
                       CheckedShards(layout, rank, shards, "given"));
  std::vector<LinearDigest> out(layout.tensors.size());
  HashRegionsOf(layout, rank, data, &out);
  return out;
}

Status AddShardRegions(const Layout& layout, uint32_t rank,
                       std::string_view shard, std::span<const std::byte> bytes,
                       std::vector<LinearDigest>* sums) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  const auto shards = layout.ShardsOf(rank);
  auto it = shards.find(std::string(shard));
  if (it == shards.end()) {
    return Status::NotFound("rank " + std::to_string(rank) + ": layout " +
                            layout.source + " gives this rank no shard '" +
                            std::string(shard) + "'");
  }
  const ShardBytes one = {{it->first, bytes}};
  std::span<const std::byte> b;
  DCR_RETURN_IF_ERROR(CheckSize(layout, rank, it->second, one, "given", &b));
  sums->resize(layout.tensors.size());
  HashRegionsOf(layout, rank, one, sums);
  return Status::OK();
}

}  // namespace dcr
