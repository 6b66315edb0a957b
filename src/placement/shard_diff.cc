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

namespace dcr {
namespace {

Shape Strides(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// BuildShards allocates shards; beyond this it refuses.
constexpr uint64_t kMaxShardBytes = 1ull << 46;

// Bytes of `s` elements of `d`, or UINT64_MAX where that overflows (a
// Layout built by hand; ResolveLayout refuses such shapes).
uint64_t Bytes(const Shape& s, DType d) {
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

Status CheckRank(const Layout& layout, uint32_t rank) {
  if (rank >= layout.ranks()) {
    return Status::InvalidArgument(
        "rank " + std::to_string(rank) + " is not below layout " +
        layout.source + "'s " + std::to_string(layout.ranks()) + " ranks");
  }
  return Status::OK();
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

Status CheckCanonical(const LayoutTensor& tensor,
                      const CanonicalBytes& canonical,
                      CanonicalBytes::const_iterator it) {
  if (it == canonical.end()) {
    return Status::NotFound("the canonical checkpoint has no tensor '" +
                            tensor.name + "'");
  }
  const uint64_t want = Bytes(tensor.shape, tensor.dtype);
  if (it->second.size() != want) {
    return Status::InvalidArgument(
        "canonical tensor '" + tensor.name + "' has " +
        std::to_string(it->second.size()) + " bytes, but the layout gives it " +
        std::to_string(want) + " (" + std::string(DTypeName(tensor.dtype)) +
        ")");
  }
  return Status::OK();
}

// Contiguous runs (ForEachRun's with step 1) of equal length at fixed
// strides in the shard and in the canonical tensor, hashed together by
// LinearHashRuns: a column split's rows cost a product each, not a power
// of K. Run (s, c) is read at data + (in_shard ? s : c) * width and lies
// at canonical byte c * cw.
class RunBatch {
 public:
  RunBatch(const std::byte* data, size_t width, bool in_shard, size_t cw)
      : data_(data), width_(width), in_shard_(in_shard), cw_(cw) {}

  void Add(uint64_t s, uint64_t c, uint64_t n, LinearDigest* sum) {
    if (count_ == 1 && n == n_ && s > s_ && c > c_) {
      s_stride_ = s - s_;
      c_stride_ = c - c_;
      count_ = 2;
      return;
    }
    if (count_ > 1 && n == n_ && s == s_ + count_ * s_stride_ &&
        c == c_ + count_ * c_stride_) {
      ++count_;
      return;
    }
    Flush(sum);
    s_ = s;
    c_ = c;
    n_ = n;
    count_ = 1;
    s_stride_ = c_stride_ = 0;
  }

  void Flush(LinearDigest* sum) {
    if (count_ == 0) return;
    const uint64_t at = in_shard_ ? s_ : c_;
    const uint64_t stride = in_shard_ ? s_stride_ : c_stride_;
    *sum ^= LinearHashRuns(c_ * cw_, c_stride_ * cw_, n_ * cw_, count_,
                           data_ + at * width_, stride * width_);
    count_ = 0;
  }

 private:
  const std::byte* data_;
  size_t width_;
  bool in_shard_;
  size_t cw_;
  uint64_t s_ = 0, c_ = 0, n_ = 0, count_ = 0, s_stride_ = 0, c_stride_ = 0;
};

// BuildShards' refusal of a tensor whose shard bits are not its canonical
// bits.
Status CheckRebuildable(const LayoutTensor& tensor) {
  if (tensor.conversion.identity(tensor.dtype)) return Status::OK();
  return Status::InvalidArgument(
      "tensor '" + tensor.name +
      "' is converted from its shard (shard_dtype or add), so its shard "
      "cannot be built from canonical bits");
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
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& tensor = layout.tensors[ti];
    const size_t cw = DTypeSize(tensor.dtype);
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const bool identity = tensor.conversion.identity(tensor.dtype);
    CanonicalChanges ch;
    ch.tensor = ti;
    bool sorted = true;
    std::byte cb[8], ct[8];
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      // Not a structured binding: lambdas may not capture those in C++20.
      const std::span<const std::byte> b = data.at(p.shard).first;
      const std::span<const std::byte> t = data.at(p.shard).second;
      ForEachRun(
          p, tensor.shape,
          [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
            st.compared += n;
            const std::byte* bp = b.data() + s * sw;
            const std::byte* tp = t.data() + s * sw;
            // The codec's vectorized scan finds the changed elements of a
            // block of the run; they are then appended in bulk.
            for (uint64_t off = 0; off < n; off += kScanBlock) {
              const size_t m =
                  static_cast<size_t>(std::min(kScanBlock, n - off));
              const size_t k = FindChanges(sw, bp + off * sw, tp + off * sw, m,
                                           /*xor_values=*/false, scan.positions,
                                           scan.planes);
              if (k == 0) continue;
              const size_t at = ch.positions.size();
              ch.positions.resize(at + k);
              ch.base.resize((at + k) * cw);
              ch.target.resize((at + k) * cw);
              size_t kept = 0;
              for (size_t i = 0; i < k; ++i) {
                const uint64_t j = off + scan.positions[i];
                const std::byte* ob = bp + j * sw;
                const std::byte* ot = tp + j * sw;
                if (!identity) {
                  ConvertElement(tensor.conversion, tensor.dtype, ob, cb);
                  ConvertElement(tensor.conversion, tensor.dtype, ot, ct);
                  if (std::memcmp(cb, ct, cw) == 0) continue;
                  ob = cb, ot = ct;
                }
                ch.positions[at + kept] = c + j * step;
                std::memcpy(&ch.base[(at + kept) * cw], ob, cw);
                std::memcpy(&ch.target[(at + kept) * cw], ot, cw);
                ++kept;
              }
              if (at > 0 && kept > 0 &&
                  ch.positions[at] < ch.positions[at - 1]) {
                sorted = false;  // runs ascend; pieces may not
              }
              ch.positions.resize(at + kept);
              ch.base.resize((at + kept) * cw);
              ch.target.resize((at + kept) * cw);
            }
          });
    }
    if (ch.positions.empty()) continue;
    if (!sorted) {
      // A transposed piece, or several pieces of this rank that interleave
      // (a row split's columns): order by canonical position.
      std::vector<size_t> order(ch.positions.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        return ch.positions[x] < ch.positions[y];
      });
      CanonicalChanges s;
      s.tensor = ti;
      s.positions.reserve(order.size());
      s.base.resize(ch.base.size());
      s.target.resize(ch.target.size());
      for (size_t k = 0; k < order.size(); ++k) {
        s.positions.push_back(ch.positions[order[k]]);
        std::memcpy(&s.base[k * cw], &ch.base[order[k] * cw], cw);
        std::memcpy(&s.target[k * cw], &ch.target[order[k] * cw], cw);
      }
      ch = std::move(s);
    }
    st.changed += ch.positions.size();
    if (Status s = each(std::move(ch)); !s.ok()) {
      if (stats) *stats = st;
      return s;
    }
  }
  if (stats) *stats = st;
  return Status::OK();
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
  std::vector<std::byte> converted;
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& tensor = layout.tensors[ti];
    const size_t cw = DTypeSize(tensor.dtype);
    const size_t sw = DTypeSize(tensor.conversion.shard_dtype);
    const bool identity = tensor.conversion.identity(tensor.dtype);
    LinearDigest& sum = out[ti];
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      const std::byte* shard = data.at(p.shard).data();
      RunBatch batch(shard, sw, /*in_shard=*/true, cw);
      ForEachRun(p, tensor.shape,
                 [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
                   if (identity && step == 1) {
                     batch.Add(s, c, n, &sum);
                     return;
                   }
                   batch.Flush(&sum);
                   const std::byte* run = shard + s * sw;
                   if (!identity) {
                     converted.resize(n * cw);
                     for (uint64_t j = 0; j < n; ++j) {
                       ConvertElement(tensor.conversion, tensor.dtype,
                                      run + j * sw, &converted[j * cw]);
                     }
                     run = converted.data();
                   }
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
      batch.Flush(&sum);
    }
  }
  return out;
}

namespace {

// Copies the canonical bits piece `p` of `tensor` maps (at `src`) into
// its shard (at `dst`).
void FillFromCanonical(const AffinePiece& p, const LayoutTensor& tensor,
                       const std::byte* src, std::byte* dst) {
  const size_t w = DTypeSize(tensor.dtype);
  ForEachRun(p, tensor.shape,
             [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
               if (step == 1) {
                 std::memcpy(dst + s * w, src + c * w, n * w);
                 return;
               }
               for (uint64_t j = 0; j < n; ++j) {
                 std::memcpy(dst + (s + j) * w, src + (c + j * step) * w, w);
               }
             });
}

// The pieces of one rank's shards, by shard, each with its tensor.
struct ShardPieces {
  const LayoutShard* shard = nullptr;
  std::vector<std::pair<const LayoutTensor*, const AffinePiece*>> pieces;

  // Whether pieces of two tensors read the same shard element (a tied
  // head reads its embedding's; the parts of a fused tensor do not).
  bool Shared() const {
    for (size_t i = 0; i < pieces.size(); ++i) {
      for (size_t j = i + 1; j < pieces.size(); ++j) {
        if (pieces[i].first != pieces[j].first &&
            Overlap(*pieces[i].second, *pieces[j].second)) {
          return true;
        }
      }
    }
    return false;
  }
  static bool Overlap(const AffinePiece& a, const AffinePiece& b) {
    for (size_t d = 0; d < a.from.size() && d < b.from.size(); ++d) {
      if (a.from[d] >= b.from[d] + b.extent[d] ||
          b.from[d] >= a.from[d] + a.extent[d]) {
        return false;
      }
    }
    return true;
  }
};

// Indexes rank `rank`'s pieces by shard (one pass over the layout) and
// checks what BuildShards needs: every shard small enough to build, every
// tensor it reads present in `canonical` with its size and not converted.
Result<std::map<std::string, ShardPieces>> IndexShards(
    const Layout& layout, uint32_t rank,
    const std::map<std::string, LayoutShard>& shards,
    const CanonicalBytes& canonical) {
  std::map<std::string, ShardPieces> out;
  for (const auto& [name, shard] : shards) {
    if (Bytes(shard.shape, shard.dtype) > kMaxShardBytes) {
      return Status::InvalidArgument("shard '" + shard.name +
                                     "' is too large to build");
    }
    out[name].shard = &shard;
  }
  for (const LayoutTensor& tensor : layout.tensors) {
    bool checked = false;
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      if (!checked) {
        DCR_RETURN_IF_ERROR(CheckRebuildable(tensor));
        DCR_RETURN_IF_ERROR(
            CheckCanonical(tensor, canonical, canonical.find(tensor.name)));
        checked = true;
      }
      out.at(p.shard).pieces.emplace_back(&tensor, &p);
    }
  }
  return out;
}

std::vector<std::byte> BuildIndexed(const ShardPieces& sp,
                                    const CanonicalBytes& canonical) {
  std::vector<std::byte> out(Bytes(sp.shard->shape, sp.shard->dtype),
                             std::byte{0});
  for (const auto& [tensor, p] : sp.pieces) {
    FillFromCanonical(*p, *tensor, canonical.at(tensor->name).data(),
                      out.data());
  }
  return out;
}

// Adds piece `p`'s contribution to `sum`, its bits read at `data`: the
// shard's bytes (in_shard) or the canonical tensor's. Identity
// conversions only (the shard's bits are the canonical bits).
void HashPiece(const AffinePiece& p, const LayoutTensor& tensor,
               const std::byte* data, bool in_shard, LinearDigest* sum) {
  const size_t cw = DTypeSize(tensor.dtype);
  RunBatch batch(data, cw, in_shard, cw);
  ForEachRun(
      p, tensor.shape, [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
        if (step == 1) {
          batch.Add(s, c, n, sum);
          return;
        }
        batch.Flush(sum);
        for (uint64_t j = 0; j < n; ++j) {
          const uint64_t at = (c + j * step) * cw;
          *sum ^= LinearHash(at, {data + (in_shard ? (s + j) * cw : at), cw});
        }
      });
  batch.Flush(sum);
}

}  // namespace

Status BuildShardsEach(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical,
    const std::function<Status(const std::string&, std::vector<std::byte>&&)>&
        each) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  const auto shards = layout.ShardsOf(rank);
  DCR_ASSIGN_OR_RETURN(auto index,
                       IndexShards(layout, rank, shards, canonical));
  for (const auto& [name, sp] : index) {
    DCR_RETURN_IF_ERROR(each(name, BuildIndexed(sp, canonical)));
  }
  return Status::OK();
}

Result<std::map<std::string, std::vector<std::byte>>> BuildShards(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical) {
  std::map<std::string, std::vector<std::byte>> out;
  DCR_RETURN_IF_ERROR(BuildShardsEach(
      layout, rank, canonical,
      [&](const std::string& name, std::vector<std::byte>&& bytes) {
        out.emplace(name, std::move(bytes));
        return Status::OK();
      }));
  return out;
}

Result<std::vector<LinearDigest>> HashCanonicalRegions(
    const Layout& layout, uint32_t rank, const CanonicalBytes& canonical) {
  DCR_RETURN_IF_ERROR(CheckRank(layout, rank));
  const auto shards = layout.ShardsOf(rank);
  DCR_ASSIGN_OR_RETURN(auto index,
                       IndexShards(layout, rank, shards, canonical));
  std::map<const LayoutTensor*, size_t> at;
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    at[&layout.tensors[ti]] = ti;
  }
  std::vector<LinearDigest> out(layout.tensors.size());
  for (const auto& [name, sp] : index) {
    if (sp.Shared()) {
      // Where two tensors' regions overlap the built shard holds one
      // tensor's bits: it is built (this one only) and hashed as the rank
      // would hash it.
      const std::vector<std::byte> built = BuildIndexed(sp, canonical);
      for (const auto& [tensor, p] : sp.pieces) {
        HashPiece(*p, *tensor, built.data(), /*in_shard=*/true,
                  &out[at.at(tensor)]);
      }
      continue;
    }
    for (const auto& [tensor, p] : sp.pieces) {
      HashPiece(*p, *tensor, canonical.at(tensor->name).data(),
                /*in_shard=*/false, &out[at.at(tensor)]);
    }
  }
  return out;
}

}  // namespace dcr
