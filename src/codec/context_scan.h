// The per-element loops of context coding (codec/context.h): the exponent
// ranges of 64 elements at a time as bit masks, the range-local indices
// the encoder codes, and the decoder's scan from those indices back to
// positions. They are compiled four times: generic, with POPCNT, BMI2 and
// AVX2 (context_scan_fast.cc), with AVX-512BW too (context_scan_avx512.cc),
// and with AVX-512 VBMI and VBMI2 too (context_scan_vbmi2.cc); ContextScan()
// picks one at run time.
//
// Internal to the codec.
#ifndef DCR_CODEC_CONTEXT_SCAN_H_
#define DCR_CODEC_CONTEXT_SCAN_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "dcr/dtype.h"
#include "dcr/status.h"

namespace dcr {

inline constexpr size_t kMaxContextRanges = 16;

// The ranges of one chunk: range r holds the elements whose exponent e has
// upper[r-1] <= e < upper[r] (upper[-1] = 0, upper[k-1] = 2^bits).
struct Ranges {
  ExponentField field;
  size_t k = 1;
  std::array<uint16_t, kMaxContextRanges> upper{};
  std::array<uint8_t, kMaxContextRanges> group{};
  std::array<uint8_t, kMaxContextRanges> inverted{};
  std::array<uint8_t, 256> lut{};  // exponent -> range

  void BuildLut() {
    size_t r = 0;
    for (size_t e = 0; e < (size_t{1} << field.bits); ++e) {
      while (e >= upper[r]) ++r;
      lut[e] = static_cast<uint8_t>(r);
    }
  }
};

template <size_t W>
using Uint = std::conditional_t<W == 1, uint8_t,
                                std::conditional_t<W == 2, uint16_t, uint32_t>>;

template <size_t W>
inline uint32_t ExponentAt(const std::byte* base, size_t i, ExponentField f) {
  return static_cast<uint32_t>(LoadLE<Uint<W>>(base + i * W) >> f.shift) &
         ((1u << f.bits) - 1);
}

using RangeLocals = std::array<std::vector<uint32_t>, kMaxContextRanges>;

// One compilation of the loops.
struct ContextScanOps {
  // Appends to (*locals)[q] the range-local index of every element range q
  // codes: its changed elements (`positions`, ascending; rng[i] the range
  // of positions[i]), or its unchanged ones where r.inverted[q].
  void (*local_indices)(size_t elem_size, const std::byte* base, size_t n,
                        const Ranges& r, std::span<const uint32_t> positions,
                        const uint8_t* rng, RangeLocals* locals);
  // The inverse: the positions (ascending) `locals` name in `base`, each
  // range's indices strictly ascending (as RiceDecode gives them);
  // Corruption unless they are exactly `expect` and every index is inside
  // its range.
  // (*groups)[i] is the value group of positions[i]'s range.
  Status (*scan_positions)(size_t elem_size, const std::byte* base, size_t n,
                           const Ranges& r, const RangeLocals& locals,
                           std::vector<uint32_t>* positions,
                           std::vector<uint8_t>* groups, size_t expect,
                           const std::string& name);
  // counts[g] = how many of group[0, n) are g, for g < groups (<= 4).
  void (*count_groups)(const uint8_t* group, size_t n, size_t groups,
                       size_t* counts);
  // GatherGroups (codec/value_groups.h) for groups >= 2.
  void (*gather_groups)(size_t elem_size, const uint8_t* group, size_t n,
                        size_t groups, const uint8_t* const* gp,
                        std::byte* out);
  // FindChanges (codec/diff.h).
  size_t (*find_changes)(size_t elem_size, const std::byte* base,
                         const std::byte* target, size_t n, bool xor_values,
                         uint32_t* positions, uint8_t* const* planes);
};

// The fastest compilation this CPU runs.
const ContextScanOps& ContextScan();

// Every compilation this CPU runs, slowest first, by name ("generic",
// "avx2", "avx512", "avx512vbmi2"): the tests hold them to one another.
std::vector<std::pair<std::string, const ContextScanOps*>> ContextScans();

}  // namespace dcr

#endif  // DCR_CODEC_CONTEXT_SCAN_H_
