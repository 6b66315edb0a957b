// Affine pieces (dcr/placement.h): their checks, the exact tiling test and
// the maps between flat positions.
#include <algorithm>
#include <numeric>
#include <string>

#include "dcr/placement.h"

namespace dcr {
namespace {

__extension__ using u128 = unsigned __int128;
__extension__ using i128 = __int128;

std::string Where(const std::string& tensor, const AffinePiece& p) {
  return "tensor '" + tensor + "', rank " + std::to_string(p.rank) +
         " shard '" + p.shard + "'";
}

// Elements of `s`, or false if the count overflows 64 bits.
bool Volume(const Shape& s, uint64_t* n) {
  if (std::find(s.begin(), s.end(), uint64_t{0}) != s.end()) {
    *n = 0;
    return true;
  }
  u128 v = 1;
  for (uint64_t d : s) {
    v *= d;
    if (v > UINT64_MAX) return false;
  }
  *n = static_cast<uint64_t>(v);
  return true;
}

Shape RowMajorStrides(const Shape& s) {
  Shape stride(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) stride[i - 1] = stride[i] * s[i];
  return stride;
}

// The progression {a + s*i : 0 <= i < n}'s last element.
u128 Last(uint64_t a, uint64_t s, uint64_t n) {
  return u128{a} + u128{s} * (n - 1);
}

// Inverse of x modulo m (gcd(x, m) = 1, 1 <= m < 2^64). The extended
// Euclid's coefficients stay below m in magnitude: they fit in i128.
u128 InverseMod(u128 x, u128 m) {
  i128 r0 = static_cast<i128>(m), r1 = static_cast<i128>(x % m);
  i128 t0 = 0, t1 = 1;
  while (r1 != 0) {
    const i128 q = r0 / r1;
    std::swap(r0, r1);
    r1 -= q * r0;
    std::swap(t0, t1);
    t1 -= q * t0;
  }
  const i128 mm = static_cast<i128>(m);
  return static_cast<u128>(((t0 % mm) + mm) % mm);
}

// True iff {a + s*i : i < n} and {b + t*j : j < m} share an element
// (s, t >= 1; n, m >= 1). Every operand is below 2^64, so each product
// below fits in u128.
bool ProgressionsMeet(uint64_t a, uint64_t s, uint64_t n, uint64_t b,
                      uint64_t t, uint64_t m) {
  const u128 lo = std::max<u128>(a, b);
  const u128 hi = std::min(Last(a, s, n), Last(b, t, m));
  if (lo > hi) return false;
  const uint64_t g = std::gcd(s, t);
  // x = a (mod s) and x = b (mod t) have a solution iff g divides b - a.
  const uint64_t gap = a <= b ? b - a : a - b;
  if (gap % g != 0) return false;
  // x = a + s*k with s*k = b - a (mod t), i.e. k = ((b-a)/g) * inv(s/g)
  // (mod t/g); (b - a)/g taken modulo t/g first, so it is non-negative.
  const u128 tg = t / g;
  const u128 d = a <= b ? (gap / g) % tg : (tg - (gap / g) % tg) % tg;
  const u128 k = d * InverseMod(s / g, tg) % tg;
  const u128 x = u128{a} + u128{s} * k;  // the first common element >= a
  const u128 lcm = u128{s / g} * t;      // common elements are x + lcm*i
  if (x >= lo) return x <= hi;
  // The first common element at or above lo, without overflowing.
  const u128 r = (lo - x) % lcm;
  const u128 up = r == 0 ? 0 : lcm - r;
  return up <= hi - lo;
}

}  // namespace

std::string ShapeText(const Shape& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    out += (d ? ", " : "") + std::to_string(shape[d]);
  }
  return out + "]";
}

AffinePiece AffinePiece::Block(uint32_t rank, std::string shard, Shape shape,
                               Shape to) {
  AffinePiece p;
  p.rank = rank;
  p.shard = std::move(shard);
  p.from.assign(shape.size(), 0);
  p.extent = shape;
  p.shard_shape = std::move(shape);
  p.to = std::move(to);
  p.axis.resize(p.extent.size());
  std::iota(p.axis.begin(), p.axis.end(), 0u);
  p.step.assign(p.extent.size(), 1);
  return p;
}

Status CheckPiece(const std::string& tensor, const Shape& canonical_shape,
                  const AffinePiece& p) {
  const size_t dims = canonical_shape.size();
  auto bad = [&](const std::string& msg) {
    return Status::InvalidArgument(Where(tensor, p) + ": " + msg);
  };
  if (p.shard_shape.size() != dims || p.from.size() != dims ||
      p.extent.size() != dims || p.to.size() != dims || p.axis.size() != dims ||
      p.step.size() != dims) {
    return bad("the piece's shapes must all have the canonical tensor's " +
               std::to_string(dims) + " dimensions");
  }
  std::vector<bool> seen(dims, false);
  for (uint32_t k : p.axis) {
    if (k >= dims || seen[k]) {
      return bad("axis must be a permutation of the shard's dimensions");
    }
    seen[k] = true;
  }
  uint64_t n;
  if (!Volume(p.shard_shape, &n)) return bad("the shard's size overflows");
  if (!Volume(canonical_shape, &n)) {
    return bad("the canonical tensor's size overflows");
  }
  for (size_t k = 0; k < dims; ++k) {
    if (p.extent[k] == 0)
      return bad("the box is empty along dimension " + std::to_string(k));
    if (p.from[k] > p.shard_shape[k] ||
        p.extent[k] > p.shard_shape[k] - p.from[k]) {
      return bad("the box " + ShapeText(p.from) + " + " + ShapeText(p.extent) +
                 " leaves the shard's shape " + ShapeText(p.shard_shape));
    }
  }
  for (size_t d = 0; d < dims; ++d) {
    if (p.step[d] == 0) return bad("step must be at least 1");
    if (Last(p.to[d], p.step[d], p.extent[p.axis[d]]) >= canonical_shape[d]) {
      return bad("its image leaves the canonical shape " +
                 ShapeText(canonical_shape) + " along dimension " +
                 std::to_string(d));
    }
  }
  return Status::OK();
}

Status CheckTiling(const std::string& tensor, const Shape& canonical_shape,
                   std::span<const AffinePiece> pieces) {
  uint64_t total;
  if (!Volume(canonical_shape, &total)) {
    return Status::InvalidArgument("tensor '" + tensor +
                                   "': its size overflows");
  }
  u128 held = 0;
  for (const AffinePiece& p : pieces) {
    DCR_RETURN_IF_ERROR(CheckPiece(tensor, canonical_shape, p));
    uint64_t v = 0;
    if (!Volume(p.extent, &v)) {  // inside the canonical tensor: cannot be
      return Status::InvalidArgument(Where(tensor, p) + ": size overflows");
    }
    held += v;
  }
  const size_t dims = canonical_shape.size();
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (size_t j = i + 1; j < pieces.size(); ++j) {
      const AffinePiece& a = pieces[i];
      const AffinePiece& b = pieces[j];
      bool meet = true;
      for (size_t d = 0; d < dims && meet; ++d) {
        meet = ProgressionsMeet(a.to[d], a.step[d], a.extent[a.axis[d]],
                                b.to[d], b.step[d], b.extent[b.axis[d]]);
      }
      if (meet) {
        return Status::InvalidArgument(
            "tensor '" + tensor + "': the pieces of rank " +
            std::to_string(a.rank) + " (shard '" + a.shard + "') and rank " +
            std::to_string(b.rank) + " (shard '" + b.shard +
            "') hold the same elements");
      }
    }
  }
  if (held != total) {
    // Disjoint and inside the bounds, so held < total: a gap.
    return Status::InvalidArgument(
        "tensor '" + tensor +
        "': " + std::to_string(total - static_cast<uint64_t>(held)) +
        " of its " + std::to_string(total) + " elements are held by no rank");
  }
  return Status::OK();
}

PieceMap::PieceMap(const AffinePiece& p, const Shape& canonical_shape)
    : dims_(canonical_shape.size()),
      shard_shape_(p.shard_shape),
      canonical_shape_(canonical_shape),
      shard_stride_(RowMajorStrides(p.shard_shape)),
      canonical_stride_(RowMajorStrides(canonical_shape)),
      from_(p.from),
      extent_(p.extent),
      to_(p.to),
      step_(p.step),
      axis_(p.axis),
      delta_(dims_, 0) {
  Volume(p.extent, &elements_);
  for (size_t d = 0; d < dims_; ++d) {
    origin_ += canonical_stride_[d] * to_[d];
    delta_[axis_[d]] = canonical_stride_[d] * step_[d];
  }
  // Row-major order in the box is canonical order iff no dimension is
  // moved ahead of a slower one.
  for (size_t d = 0; d < dims_; ++d) ascending_ &= axis_[d] == d;
}

uint64_t PieceMap::last() const {
  // Every step is at least 1 and every stride positive: the box's last
  // element lands last.
  uint64_t c = origin_;
  for (size_t k = 0; k < dims_; ++k) c += delta_[k] * (extent_[k] - 1);
  return c;
}

bool PieceMap::Holds(uint64_t s) const {
  if (dims_ == 0) return s == 0;  // a scalar
  if (s / shard_stride_[0] >= shard_shape_[0]) return false;
  for (size_t k = 0; k < dims_; ++k) {
    const uint64_t c = (s / shard_stride_[k]) % shard_shape_[k];
    if (c < from_[k] || c - from_[k] >= extent_[k]) return false;
  }
  return true;
}

uint64_t PieceMap::ToCanonical(uint64_t s) const {
  uint64_t c = origin_;
  for (size_t k = 0; k < dims_; ++k) {
    c += delta_[k] * ((s / shard_stride_[k]) % shard_shape_[k] - from_[k]);
  }
  return c;
}

bool PieceMap::ToShard(uint64_t c, uint64_t* s) const {
  if (dims_ == 0) {
    *s = 0;
    return c == 0;
  }
  if (c / canonical_stride_[0] >= canonical_shape_[0]) return false;
  uint64_t out = 0;
  for (size_t d = 0; d < dims_; ++d) {
    const uint64_t coord = (c / canonical_stride_[d]) % canonical_shape_[d];
    if (coord < to_[d]) return false;
    const uint64_t off = coord - to_[d];
    if (off % step_[d] != 0) return false;
    const uint32_t k = axis_[d];
    const uint64_t i = off / step_[d];
    if (i >= extent_[k]) return false;
    out += shard_stride_[k] * (from_[k] + i);
  }
  *s = out;
  return true;
}

size_t PieceMap::Project(std::span<const uint64_t> changed,
                         std::vector<uint64_t>* out) const {
  const size_t start = out->size();
  for (uint64_t s : changed) {
    if (Holds(s)) out->push_back(ToCanonical(s));
  }
  if (!ascending_)
    std::sort(out->begin() + static_cast<ptrdiff_t>(start), out->end());
  return out->size() - start;
}

}  // namespace dcr
