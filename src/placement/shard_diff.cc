// Shard diff and projection (dcr/shard_diff.h): each piece's box is walked
// as runs along its last shard dimension, where shard elements are
// contiguous and canonical positions advance by a fixed step.
#include "dcr/shard_diff.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <string>

#include "codec/diff.h"
#include "placement/shard_runs.h"

namespace dcr {

using shard_runs::Bytes;
using shard_runs::CheckCanonical;
using shard_runs::CheckRank;
using shard_runs::ForEachRun;
using shard_runs::HashPiece;

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
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    std::span<const std::byte> b;
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, shards, "given", &b));
  }
  return Status::OK();
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

namespace {

// One element's bits: a fixed-size copy the compiler inlines (a memcpy of
// a runtime size is a call, most of the per-change cost).
inline void CopyElement(std::byte* to, const std::byte* from, size_t w) {
  switch (w) {
    case 1:
      *to = *from;
      return;
    case 2:
      std::memcpy(to, from, 2);
      return;
    case 4:
      std::memcpy(to, from, 4);
      return;
    case 8:
      std::memcpy(to, from, 8);
      return;
    default:
      std::memcpy(to, from, w);
  }
}

// One canonical tensor's changes as a rank's pieces find them: each
// changed shard element converted to canonical bits (an element whose
// canonical bits did not change is dropped), then ordered by canonical
// position. What DiffShardsEach and ProjectShardChanges share.
class TensorChanges {
 public:
  TensorChanges(const LayoutTensor& tensor, size_t index)
      : tensor_(tensor),
        cw_(DTypeSize(tensor.dtype)),
        identity_(tensor.conversion.identity(tensor.dtype)) {
    ch_.tensor = index;
  }
  // Room for `k` more.
  void Reserve(size_t k) {
    if (n_ + k <= ch_.positions.size()) return;
    const size_t m = std::max(n_ + k, ch_.positions.size() * 3 / 2);
    ch_.positions.resize(m);
    ch_.base.resize(m * cw_);
    ch_.target.resize(m * cw_);
  }
  // Canonical element `c` held the shard bits at `ob` and now those at
  // `ot` (which differ). Reserve first.
  void Add(uint64_t c, const std::byte* ob, const std::byte* ot) {
    std::byte cb[8], ct[8];
    if (!identity_) {
      ConvertElement(tensor_.conversion, tensor_.dtype, ob, cb);
      ConvertElement(tensor_.conversion, tensor_.dtype, ot, ct);
      if (std::memcmp(cb, ct, cw_) == 0) return;
      ob = cb, ot = ct;
    }
    if (n_ > 0 && c < ch_.positions[n_ - 1]) {
      sorted_ = false;  // runs ascend; pieces may not
    }
    ch_.positions[n_] = c;
    CopyElement(&ch_.base[n_ * cw_], ob, cw_);
    CopyElement(&ch_.target[n_ * cw_], ot, cw_);
    ++n_;
  }
  size_t size() const { return n_; }
  CanonicalChanges Finish() {
    ch_.positions.resize(n_);
    ch_.base.resize(n_ * cw_);
    ch_.target.resize(n_ * cw_);
    if (sorted_) return std::move(ch_);
    // A transposed piece, or several pieces of this rank that interleave
    // (a row split's columns): order by canonical position.
    std::vector<size_t> order(n_);
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return ch_.positions[x] < ch_.positions[y];
    });
    CanonicalChanges s;
    s.tensor = ch_.tensor;
    s.positions.reserve(n_);
    s.base.resize(ch_.base.size());
    s.target.resize(ch_.target.size());
    for (size_t k = 0; k < n_; ++k) {
      s.positions.push_back(ch_.positions[order[k]]);
      std::memcpy(&s.base[k * cw_], &ch_.base[order[k] * cw_], cw_);
      std::memcpy(&s.target[k * cw_], &ch_.target[order[k] * cw_], cw_);
    }
    return s;
  }

 private:
  const LayoutTensor& tensor_;
  const size_t cw_;
  const bool identity_;
  CanonicalChanges ch_;
  size_t n_ = 0;
  bool sorted_ = true;
};

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

// For each canonical tensor the rank holds, in order: scan(piece, tensor,
// &changes) for each of its pieces of the rank, then `each` with the
// tensor's changes (if any), then done(tensor index).
template <typename ScanPiece, typename Done>
Status EachTensorsChanges(const Layout& layout, uint32_t rank, ScanPiece scan,
                          Done done,
                          const std::function<Status(CanonicalChanges&&)>& each,
                          ShardDiffStats* st) {
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& tensor = layout.tensors[ti];
    TensorChanges changes(tensor, ti);
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      DCR_RETURN_IF_ERROR(scan(p, tensor, &changes));
    }
    done(ti);
    if (changes.size() == 0) continue;
    st->changed += changes.size();
    DCR_RETURN_IF_ERROR(each(changes.Finish()));
  }
  return Status::OK();
}

}  // namespace

Status DiffShardsEach(const Layout& layout, uint32_t rank,
                      const ShardBytes& base, const ShardBytes& target,
                      const std::function<Status(CanonicalChanges&&)>& each,
                      ShardDiffStats* stats) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  ShardDiffStats st;
  // Every shard checked once, before any work.
  std::map<std::string,
           std::pair<std::span<const std::byte>, std::span<const std::byte>>,
           std::less<>>
      data;
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    std::span<const std::byte> b, t;
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, base, "base", &b));
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, target, "target", &t));
    data.emplace(name, std::pair(b, t));
    st.shard_bytes_read += b.size() + t.size();
  }

  Scan scan;
  auto scan_piece = [&](const AffinePiece& p, const LayoutTensor& tensor,
                        TensorChanges* changes) {
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const std::byte* bp0 = data.at(p.shard).first.data();
    const std::byte* tp0 = data.at(p.shard).second.data();
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
                   for (size_t i = 0; i < k; ++i) {
                     const uint64_t j = off + scan.positions[i];
                     changes->Add(c + j * step, bp + j * sw, tp + j * sw);
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

Result<std::vector<ShardMismatch>> CompareShards(
    const Layout& layout, uint32_t rank, const ShardBytes& shards,
    const CanonicalBytes& canonical) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  std::map<std::string, std::span<const std::byte>, std::less<>> data;
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    std::span<const std::byte> b;
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, shards, "given", &b));
    data.emplace(name, b);
  }
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
void HashRegionsOf(
    const Layout& layout, uint32_t rank,
    const std::map<std::string, std::span<const std::byte>, std::less<>>& data,
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
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  std::map<std::string, std::span<const std::byte>, std::less<>> data;
  for (const auto& [name, shard] : layout.ShardsOf(rank)) {
    std::span<const std::byte> b;
    DCR_RETURN_IF_ERROR(CheckSize(layout, rank, shard, shards, "given", &b));
    data.emplace(name, b);
  }
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
