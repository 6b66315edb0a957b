// Context-coded chunks: byte layout in docs/FORMAT.md §context; in short
// (little-endian, after the 28-byte prefix every chunk shares):
//
//   28 u8 exponent shift   29 u8 exponent bits   30 u8 ranges K
//   31 u8 value groups G   32 u64 checksum of the decoded changes
//   40 K x {u16 upper, u8 flags, u8 rice_k, u8 group, u32 coded, u32 bytes}
//   .. G x elem_size plane entries {u8 encoding, u32 bytes}
//   .. K Rice streams  .. G x elem_size planes  .. u64 XXH3-64 of the chunk
#include "codec/context.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/bit_io.h"
#include "codec/chunk_layout.h"
#include "codec/diff.h"
#include "codec/value_groups.h"
#include "common/bytes.h"
#include "common/scratch.h"

namespace dcr {

static_assert(std::endian::native == std::endian::little,
              "the decoded-changes checksum hashes positions in memory order");

namespace {

// Below this many elements a span's contexts cost more than they gain.
constexpr size_t kMinContextElems = 4096;
// Ranges the encoder tries at most (the format allows kMaxContextRanges).
constexpr size_t kEncoderRanges = 8;
// The share of a span's (order-0) position bits a range must save.
constexpr double kRangeDecodeCost = 0.001;
// Classes the range search considers; more are merged pairwise first.
constexpr size_t kMaxClasses = 64;

double BinaryEntropyBits(double n, double k) {
  if (n <= 0 || k <= 0 || k >= n) return 0.0;
  double p = k / n;
  return n * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

// Estimated bits of one plane from its histogram: order-0 entropy plus
// its table entry and Huffman's code-length table.
double PlaneBits(const uint32_t* hist, double total) {
  if (total <= 0) return 0;
  double bits = 0;
  int present = 0;
  for (int s = 0; s < 256; ++s) {
    if (hist[s] == 0) continue;
    ++present;
    bits -= hist[s] * std::log2(hist[s] / total);
  }
  if (present <= 1) return 8.0 * (kPlaneEntryBytes + 1);
  return bits + 8.0 * kPlaneEntryBytes + 14.0 * present;
}

template <size_t W>
void CountClasses(const std::byte* base, size_t n, ExponentField f,
                  std::span<const uint32_t> positions, uint8_t* exps,
                  std::array<double, 256>* all, std::array<double, 256>* chg) {
  // One sample per 256 elements: the ranges need the classes' sizes only
  // roughly (every 64th costs a second pass over the span's memory and
  // gains 0.1-0.2% of payload on the traingen pairs).
  constexpr size_t kStride = 256;
  std::array<uint32_t, 256> a{}, b{};
  for (size_t i = 0; i < n; i += kStride) ++a[ExponentAt<W>(base, i, f)];
  for (size_t i = 0; i < positions.size(); ++i) {
    const uint32_t e = ExponentAt<W>(base, positions[i], f);
    exps[i] = static_cast<uint8_t>(e);
    ++b[e];
  }
  for (size_t e = 0; e < 256; ++e) {
    (*all)[e] = double{kStride} * a[e];
    (*chg)[e] = b[e];
  }
}

// The checksum of decoded changes: XXH3-64 of the values (element-major,
// as DecodedChunk holds them) seeded with XXH3-64 of the positions (u32).
uint64_t DecodedChecksum(const uint32_t* positions, size_t n,
                         const std::byte* values, size_t w) {
  return XXH3_64bits_withSeed(values, n * w,
                              XXH3_64bits(positions, n * sizeof(uint32_t)));
}

}  // namespace

bool ContextUsable(size_t elem_size, ExponentField field) {
  return (elem_size == 1 || elem_size == 2 || elem_size == 4) &&
         field.bits >= 1 && field.bits <= 8 &&
         field.shift + field.bits <= 8 * elem_size;
}

// ---------------------------------------------------------------- encoder

struct ContextEncoder::Scratch {
  std::vector<uint8_t> rng;  // range of each changed element
  RangeLocals locals;
  std::vector<uint32_t> hist;  // [range][plane][256] changed values
  std::array<ScratchVector<uint8_t>, kMaxContextGroups * 4> gplanes;
  std::vector<std::byte> values;  // the changes' values, element-major
  std::vector<uint8_t> exps;      // each change's base exponent
};

Result<bool> ContextEncoder::Encode(const Changes& c, double gain,
                                    PlaneCoder* plane_coder,
                                    std::vector<std::byte>* out,
                                    ChunkSizes* sizes) {
  const size_t w = c.elem_size;
  const size_t n = c.base.size() / w;
  const size_t changed = c.positions.size();
  if (!ContextUsable(w, c.field) || n < kMinContextElems || changed == 0) {
    return false;
  }
  if (!s_) s_ = std::make_shared<Scratch>();
  Scratch& s = *s_;
  const std::byte* base = c.base.data();
  const size_t classes = size_t{1} << c.field.bits;

  // Per-class element counts (every 64th element, scaled) and exact
  // changed counts; each change's exponent, kept for the ranges below.
  std::array<double, 256> all{}, chg{};
  s.exps.resize(changed);
  switch (w) {
    case 1:
      CountClasses<1>(base, n, c.field, c.positions, s.exps.data(), &all, &chg);
      break;
    case 2:
      CountClasses<2>(base, n, c.field, c.positions, s.exps.data(), &all, &chg);
      break;
    default:
      CountClasses<4>(base, n, c.field, c.positions, s.exps.data(), &all, &chg);
      break;
  }

  // The classes present, merged pairwise while too many.
  struct Class {
    uint32_t first;  // lowest exponent of the class
    double n, k;
  };
  std::vector<Class> cls;
  for (size_t e = 0; e < classes; ++e) {
    if (all[e] > 0 || chg[e] > 0) {
      cls.push_back(
          {static_cast<uint32_t>(e), std::max(all[e], chg[e]), chg[e]});
    }
  }
  while (cls.size() > kMaxClasses) {
    std::vector<Class> merged;
    for (size_t i = 0; i < cls.size(); i += 2) {
      Class m = cls[i];
      if (i + 1 < cls.size()) {
        m.n += cls[i + 1].n;
        m.k += cls[i + 1].k;
      }
      merged.push_back(m);
    }
    cls.swap(merged);
  }
  const size_t m = cls.size();

  // Ranges: the partition of the classes into at most kEncoderRanges
  // contiguous runs minimizing the estimated position bits.
  std::vector<double> pn(m + 1, 0), pk(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    pn[i + 1] = pn[i] + cls[i].n;
    pk[i + 1] = pk[i] + cls[i].k;
  }
  // A range costs its table entry and its Rice parameter's slack, and the
  // decoder a step per 64 elements: it must save kRangeDecodeCost of the
  // span's position bits to be worth that. On the traingen pairs 0.001
  // costs 0.1-0.2% of payload (0.002 cost 0.2-0.4% and decoded 15-25%
  // faster at 1-3%, a gain this 2-core VM measures only roughly).
  const double range_overhead =
      8.0 * kRangeEntryBytes + 4 +
      kRangeDecodeCost * BinaryEntropyBits(static_cast<double>(n),
                                           static_cast<double>(changed));
  auto cost = [&](size_t i, size_t j) {
    return BinaryEntropyBits(pn[j] - pn[i], pk[j] - pk[i]) + range_overhead;
  };
  const size_t kmax = std::min(kEncoderRanges, m);
  std::vector<double> dp((kmax + 1) * (m + 1), 1e300);
  std::vector<uint16_t> from((kmax + 1) * (m + 1), 0);
  auto D = [&](size_t k, size_t j) -> double& { return dp[k * (m + 1) + j]; };
  D(0, 0) = 0;
  for (size_t k = 1; k <= kmax; ++k) {
    for (size_t j = k; j <= m; ++j) {
      for (size_t i = k - 1; i < j; ++i) {
        double v = D(k - 1, i) + cost(i, j);
        if (v < D(k, j)) {
          D(k, j) = v;
          from[k * (m + 1) + j] = static_cast<uint16_t>(i);
        }
      }
    }
  }
  size_t best_k = 1;
  for (size_t k = 2; k <= kmax; ++k) {
    if (D(k, m) < D(best_k, m)) best_k = k;
  }
  Ranges r;
  r.field = c.field;
  r.k = best_k;
  std::array<size_t, kMaxContextRanges + 1> cut{};  // class index bounds
  cut[best_k] = m;
  for (size_t k = best_k, j = m; k >= 1; --k) {
    j = from[k * (m + 1) + j];
    cut[k - 1] = j;
  }
  for (size_t q = 0; q < best_k; ++q) {
    r.upper[q] = q + 1 < best_k ? static_cast<uint16_t>(cls[cut[q + 1]].first)
                                : static_cast<uint16_t>(classes);
    double rn = pn[cut[q + 1]] - pn[cut[q]];
    double rk = pk[cut[q + 1]] - pk[cut[q]];
    r.inverted[q] = rk > rn / 2 ? 1 : 0;
  }
  r.BuildLut();
  double position_bits = D(best_k, m);

  // Each changed element's range, and the value histograms per range.
  s.rng.resize(changed);
  s.hist.assign(best_k * w * 256, 0);
  for (size_t i = 0; i < changed; ++i) {
    uint8_t q = r.lut[s.exps[i]];
    s.rng[i] = q;
    uint32_t* h = s.hist.data() + q * w * 256;
    for (size_t j = 0; j < w; ++j) ++h[j * 256 + c.planes[j][i]];
  }
  // Value groups: adjacent ranges merged into at most kMaxContextGroups,
  // minimizing the estimated plane bits.
  auto group_bits = [&](size_t i, size_t j) {
    double bits = 0;
    for (size_t p = 0; p < w; ++p) {
      uint32_t h[256] = {};
      double total = 0;
      for (size_t q = i; q < j; ++q) {
        const uint32_t* src = s.hist.data() + (q * w + p) * 256;
        for (int v = 0; v < 256; ++v) h[v] += src[v];
      }
      for (int v = 0; v < 256; ++v) total += h[v];
      bits += PlaneBits(h, total);
    }
    return bits;
  };
  const size_t gmax = std::min(kMaxContextGroups, best_k);
  std::vector<double> gd((gmax + 1) * (best_k + 1), 1e300);
  std::vector<uint8_t> gfrom((gmax + 1) * (best_k + 1), 0);
  std::vector<double> gc(best_k * (best_k + 1), 0);
  for (size_t i = 0; i < best_k; ++i) {
    for (size_t j = i + 1; j <= best_k; ++j)
      gc[i * (best_k + 1) + j] = group_bits(i, j);
  }
  gd[0] = 0;
  for (size_t g = 1; g <= gmax; ++g) {
    for (size_t j = g; j <= best_k; ++j) {
      for (size_t i = g - 1; i < j; ++i) {
        double v = gd[(g - 1) * (best_k + 1) + i] + gc[i * (best_k + 1) + j];
        if (v < gd[g * (best_k + 1) + j]) {
          gd[g * (best_k + 1) + j] = v;
          gfrom[g * (best_k + 1) + j] = static_cast<uint8_t>(i);
        }
      }
    }
  }
  size_t groups = 1;
  for (size_t g = 2; g <= gmax; ++g) {
    if (gd[g * (best_k + 1) + best_k] < gd[groups * (best_k + 1) + best_k]) {
      groups = g;
    }
  }
  double value_bits = gd[groups * (best_k + 1) + best_k];
  for (size_t g = groups, j = best_k; g >= 1; --g) {
    size_t i = gfrom[g * (best_k + 1) + j];
    for (size_t q = i; q < j; ++q) r.group[q] = static_cast<uint8_t>(g - 1);
    j = i;
  }

  // The base-independent estimate, by the same measure.
  double plain_bits =
      BinaryEntropyBits(static_cast<double>(n), static_cast<double>(changed));
  for (size_t p = 0; p < w; ++p) {
    uint32_t h[256] = {};
    for (size_t q = 0; q < best_k; ++q) {
      const uint32_t* src = s.hist.data() + (q * w + p) * 256;
      for (int v = 0; v < 256; ++v) h[v] += src[v];
    }
    plain_bits += PlaneBits(h, static_cast<double>(changed));
  }
  double context_bits = position_bits + value_bits +
                        8.0 * (kContextFixedBytes - 36) +
                        8.0 * kPlaneEntryBytes * w * (groups - 1);
  if (context_bits > gain * plain_bits) return false;

  // Range-local indices of what each range codes: its changed elements,
  // or its unchanged ones where it is inverted.
  for (size_t q = 0; q < best_k; ++q) s.locals[q].clear();
  ContextScan().local_indices(w, base, n, r, c.positions, s.rng.data(),
                              &s.locals);

  // Group planes, in position order within each group.
  std::array<size_t, kMaxContextGroups> gcount{};
  for (size_t q = 0; q < best_k; ++q) {
    const uint32_t* h = s.hist.data() + q * w * 256;
    size_t in_range = 0;
    for (int v = 0; v < 256; ++v) in_range += h[v];
    gcount[r.group[q]] += in_range;
  }
  std::array<uint8_t*, kMaxContextGroups * 4> gp{};
  for (size_t g = 0; g < groups; ++g) {
    for (size_t j = 0; j < w; ++j) {
      // One byte of slack: GatherByGroup writes every group's next slot.
      gp[g * w + j] = Reserve(&s.gplanes[g * w + j], gcount[g] + 1);
    }
  }
  // s.rng from here on holds each change's value group.
  for (size_t i = 0; i < changed; ++i) s.rng[i] = r.group[s.rng[i]];
  GatherByGroup(w, groups, s.rng.data(), changed, c.planes, gp.data());

  // The chunk.
  const size_t start = out->size();
  const size_t header = kContextFixedBytes + r.k * kRangeEntryBytes +
                        groups * w * kPlaneEntryBytes;
  out->resize(start + header, std::byte{0});
  size_t position_bytes = 0;
  for (size_t q = 0; q < r.k; ++q) {
    const uint32_t k = ChooseRiceK(s.locals[q]);
    const size_t len = RiceEncode(s.locals[q], k, out);
    position_bytes += len;
    std::byte* e =
        out->data() + start + kContextFixedBytes + q * kRangeEntryBytes;
    StoreLE<uint16_t>(e, r.upper[q]);
    e[2] = std::byte{r.inverted[q]};
    e[3] = static_cast<std::byte>(k);
    e[4] = std::byte{r.group[q]};
    StoreLE<uint32_t>(e + 5, static_cast<uint32_t>(s.locals[q].size()));
    StoreLE<uint32_t>(e + 9, static_cast<uint32_t>(len));
  }
  const size_t values_start = out->size();
  const size_t table = kContextFixedBytes + r.k * kRangeEntryBytes;
  for (size_t g = 0; g < groups; ++g) {
    for (size_t j = 0; j < w; ++j) {
      Status st =
          plane_coder->Put(gp[g * w + j], gcount[g], out,
                           start + table + (g * w + j) * kPlaneEntryBytes,
                           /*rans=*/true);
      if (!st.ok()) {
        out->resize(start);
        return st;
      }
    }
  }
  const size_t values_bytes = out->size() - values_start;
  const size_t total = out->size() - start + kChecksumBytes;
  if (total > UINT32_MAX) {
    out->resize(start);
    return Status::ResourceExhausted(ChunkName(c.id) +
                                     " would exceed 4 GiB; use smaller spans");
  }
  s.values.resize(changed * w);
  JoinPlanes(w, c.planes, changed, s.values.data());
  const uint64_t decoded_sum =
      DecodedChecksum(c.positions.data(), changed, s.values.data(), w);

  std::byte* h = out->data() + start;
  h[28] = std::byte{c.field.shift};
  h[29] = std::byte{c.field.bits};
  h[30] = static_cast<std::byte>(r.k);
  h[31] = static_cast<std::byte>(groups);
  StoreLE<uint64_t>(h + 32, decoded_sum);
  SealChunk({kContextChunkVersion, c.kind, ChunkEncoding::kContext, w, c.id,
             static_cast<uint32_t>(n), static_cast<uint32_t>(changed)},
            start, out);
  if (sizes != nullptr) {
    ChunkSizes z;
    z.header = header + kChecksumBytes;
    z.positions = position_bytes;
    z.values = values_bytes;
    z.changed = changed;
    *sizes += z;
  }
  return true;
}

// ---------------------------------------------------------------- decoder

namespace {

struct DecodeScratch {
  RangeLocals locals;
  std::vector<uint8_t> rng;  // each change's value group
};

}  // namespace

Status DecodeContextChunk(std::span<const std::byte> bytes,
                          const ChunkHeader& c, std::span<const std::byte> base,
                          PlaneDecoder* plane_decoder, DecodedChunk* out,
                          ChunkSizes* sizes) {
  const std::string name = ChunkName(c.id);
  const std::byte* h = bytes.data();
  const size_t w = c.elem_size;
  Ranges r;
  r.field = c.context;
  r.k = static_cast<uint8_t>(h[30]);
  const size_t groups = static_cast<uint8_t>(h[31]);
  if (!ContextUsable(w, r.field)) {
    return Status::Corruption(name + ": exponent field outside the element");
  }
  if (r.k == 0 || r.k > kMaxContextRanges || groups == 0 ||
      groups > kMaxContextGroups || groups > r.k) {
    return Status::Corruption(name + ": bad range or group count");
  }
  const size_t table = kContextFixedBytes + r.k * kRangeEntryBytes;
  const size_t header = table + groups * w * kPlaneEntryBytes;
  const size_t body = c.total_bytes - kChecksumBytes;
  if (header > body) {
    return Status::Corruption(name + ": length shorter than its header");
  }
  std::array<uint8_t, kMaxContextRanges> rice_k{};
  std::array<uint32_t, kMaxContextRanges> coded{};
  std::array<uint32_t, kMaxContextRanges> stream{};
  uint64_t payload = 0;
  const size_t classes = size_t{1} << r.field.bits;
  for (size_t q = 0; q < r.k; ++q) {
    const std::byte* e = h + kContextFixedBytes + q * kRangeEntryBytes;
    r.upper[q] = LoadLE<uint16_t>(e);
    const uint8_t flags = static_cast<uint8_t>(e[2]);
    rice_k[q] = static_cast<uint8_t>(e[3]);
    r.group[q] = static_cast<uint8_t>(e[4]);
    coded[q] = LoadLE<uint32_t>(e + 5);
    stream[q] = LoadLE<uint32_t>(e + 9);
    const bool last = q + 1 == r.k;
    if ((q > 0 && r.upper[q] <= r.upper[q - 1]) || r.upper[q] == 0 ||
        (last ? r.upper[q] != classes : r.upper[q] >= classes)) {
      return Status::Corruption(name + ": range bounds not ascending inside " +
                                "the exponent field");
    }
    if (flags > 1 || rice_k[q] > kMaxRiceK || coded[q] > c.span_elems) {
      return Status::Corruption(name + ": bad range entry " +
                                std::to_string(q));
    }
    r.inverted[q] = flags;
    const uint8_t prev = q == 0 ? 0 : r.group[q - 1];
    if ((q == 0 && r.group[q] != 0) ||
        (q > 0 && r.group[q] != prev && r.group[q] != prev + 1) ||
        (last && r.group[q] + 1u != groups)) {
      return Status::Corruption(name + ": value groups not contiguous");
    }
    payload += stream[q];
  }
  for (size_t e = 0; e < groups * w; ++e) {
    payload += LoadLE<uint32_t>(h + table + e * kPlaneEntryBytes + 1);
  }
  if (header + payload != body) {
    return Status::Corruption(name + ": section sizes do not add up");
  }
  if (base.empty()) {
    return Status::InvalidArgument(
        name + " is context-coded: it decodes only against the span's base");
  }
  if (base.size() != uint64_t{c.span_elems} * w) {
    return Status::InvalidArgument(name + ": base span of " +
                                   std::to_string(base.size()) +
                                   " bytes where the chunk expects " +
                                   std::to_string(uint64_t{c.span_elems} * w));
  }
  r.BuildLut();
  thread_local DecodeScratch s;
  size_t at = header;
  for (size_t q = 0; q < r.k; ++q) {
    // The checksum trailer guarantees 8 readable bytes after each stream.
    DCR_RETURN_IF_ERROR(RiceDecode(bytes.subspan(at, stream[q]), rice_k[q],
                                   coded[q], c.span_elems, &s.locals[q])
                            .WithContext(name));
    at += stream[q];
  }
  DCR_RETURN_IF_ERROR(ContextScan().scan_positions(w, base.data(), c.span_elems,
                                                   r, s.locals, &out->positions,
                                                   &s.rng, c.changed, name));

  // The group planes, then each change's value from its group's planes.
  const size_t n = c.changed;
  std::array<size_t, kMaxContextGroups> gcount{};
  ContextScan().count_groups(s.rng.data(), n, groups, gcount.data());
  std::array<const uint8_t*, kMaxContextGroups * 4> gp{};
  for (size_t g = 0; g < groups; ++g) {
    for (size_t j = 0; j < w; ++j) {
      const std::byte* entry = h + table + (g * w + j) * kPlaneEntryBytes;
      const uint32_t len = LoadLE<uint32_t>(entry + 1);
      DCR_ASSIGN_OR_RETURN(
          gp[g * w + j],
          plane_decoder->Get(entry, h + at, gcount[g], g * w + j,
                             name + ": value plane " + std::to_string(j) +
                                 " of group " + std::to_string(g),
                             /*rans=*/true));
      at += len;
    }
  }
  out->values.resize(n * w);
  GatherGroups(w, groups, s.rng.data(), n, gp.data(), out->values.data());
  const uint64_t decoded_sum =
      DecodedChecksum(out->positions.data(), n, out->values.data(), w);
  if (decoded_sum != LoadLE<uint64_t>(h + 32)) {
    return Status::Corruption(
        name + ": its decoded changes fail their checksum (the span does " +
        "not hold the bits the chunk was coded against)");
  }
  out->header = c;
  if (sizes != nullptr) {
    ChunkSizes z;
    z.header = header + kChecksumBytes;
    for (size_t q = 0; q < r.k; ++q) z.positions += stream[q];
    z.values = payload - z.positions;
    z.changed = n;
    *sizes += z;
  }
  return Status::OK();
}

}  // namespace dcr
