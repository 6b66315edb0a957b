#include "codec/diff.h"

#include <bit>
#include <cstring>

#include "common/bytes.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dcr {
namespace {

// Bit i of the result is set iff element (start + i) differs, for 64
// elements of W bytes.
template <size_t W>
inline uint64_t ChangeMask64(const std::byte* a, const std::byte* b) {
#if defined(__SSE2__)
  if constexpr (W <= 4) {
    uint64_t equal = 0;
    // 16 elements per step, one movemask bit each.
    for (int step = 0; step < 4; ++step) {
      const std::byte* pa = a + step * 16 * W;
      const std::byte* pb = b + step * 16 * W;
      __m128i packed;
      if constexpr (W == 1) {
        packed = _mm_cmpeq_epi8(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(pa)),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb)));
      } else {
        __m128i e[W];
        for (size_t v = 0; v < W; ++v) {
          e[v] = _mm_cmpeq_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + 16 * v)),
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 16 * v)));
        }
        if constexpr (W == 2) {
          packed = _mm_packs_epi16(e[0], e[1]);
        } else {
          // 32-bit lanes are equal iff both 16-bit halves are: AND the
          // halves, then narrow 32 -> 16 -> 8.
          __m128i w[4];
          for (size_t v = 0; v < 4; ++v) {
            __m128i swapped =
                _mm_shufflelo_epi16(_mm_shufflehi_epi16(e[v], 0xb1), 0xb1);
            w[v] = _mm_and_si128(e[v], swapped);
          }
          packed = _mm_packs_epi16(_mm_packs_epi32(w[0], w[1]),
                                   _mm_packs_epi32(w[2], w[3]));
        }
      }
      equal |= static_cast<uint64_t>(
                   static_cast<uint32_t>(_mm_movemask_epi8(packed)))
               << (16 * step);
    }
    return ~equal;
  }
#endif
  uint64_t mask = 0;
  for (size_t i = 0; i < 64; ++i) {
    bool differs = std::memcmp(a + i * W, b + i * W, W) != 0;
    mask |= static_cast<uint64_t>(differs) << i;
  }
  return mask;
}

template <size_t W>
inline void Emit(const std::byte* a, const std::byte* b, size_t i,
                 bool xor_values, uint8_t* const* planes, size_t k) {
  if constexpr (W == 1) {
    uint8_t x = static_cast<uint8_t>(b[i]);
    if (xor_values) x ^= static_cast<uint8_t>(a[i]);
    planes[0][k] = x;
  } else {
    using U =
        std::conditional_t<W == 2, uint16_t,
                           std::conditional_t<W == 4, uint32_t, uint64_t>>;
    U x = LoadLE<U>(b + i * W);
    if (xor_values) x ^= LoadLE<U>(a + i * W);
    for (size_t j = 0; j < W; ++j)
      planes[j][k] = static_cast<uint8_t>(x >> (8 * j));
  }
}

template <size_t W>
size_t FindChangesW(const std::byte* a, const std::byte* b, size_t n,
                    bool xor_values, uint32_t* positions,
                    uint8_t* const* planes) {
  size_t k = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t mask = ChangeMask64<W>(a + i * W, b + i * W);
    while (mask != 0) {
      size_t e = i + static_cast<size_t>(std::countr_zero(mask));
      mask &= mask - 1;
      positions[k] = static_cast<uint32_t>(e);
      Emit<W>(a, b, e, xor_values, planes, k);
      ++k;
    }
  }
  for (; i < n; ++i) {
    if (std::memcmp(a + i * W, b + i * W, W) != 0) {
      positions[k] = static_cast<uint32_t>(i);
      Emit<W>(a, b, i, xor_values, planes, k);
      ++k;
    }
  }
  return k;
}

template <size_t W>
void SplitW(const std::byte* a, const std::byte* b, size_t n,
            uint8_t* const* planes) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) {
      uint8_t x = static_cast<uint8_t>(a[i * W + j]);
      if (b != nullptr) x ^= static_cast<uint8_t>(b[i * W + j]);
      planes[j][i] = x;
    }
  }
}

template <size_t W>
void JoinW(const uint8_t* const* planes, size_t n, std::byte* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) out[i * W + j] = std::byte{planes[j][i]};
  }
}

}  // namespace

size_t FindChanges(size_t elem_size, const std::byte* base,
                   const std::byte* target, size_t n, bool xor_values,
                   uint32_t* positions, uint8_t* const* planes) {
  switch (elem_size) {
    case 1:
      return FindChangesW<1>(base, target, n, xor_values, positions, planes);
    case 2:
      return FindChangesW<2>(base, target, n, xor_values, positions, planes);
    case 4:
      return FindChangesW<4>(base, target, n, xor_values, positions, planes);
    default:
      return FindChangesW<8>(base, target, n, xor_values, positions, planes);
  }
}

void SplitPlanes(size_t elem_size, const std::byte* a, const std::byte* b,
                 size_t n, uint8_t* const* planes) {
  switch (elem_size) {
    case 1:
      return SplitW<1>(a, b, n, planes);
    case 2:
      return SplitW<2>(a, b, n, planes);
    case 4:
      return SplitW<4>(a, b, n, planes);
    default:
      return SplitW<8>(a, b, n, planes);
  }
}

void JoinPlanes(size_t elem_size, const uint8_t* const* planes, size_t n,
                std::byte* out) {
  switch (elem_size) {
    case 1:
      return JoinW<1>(planes, n, out);
    case 2:
      return JoinW<2>(planes, n, out);
    case 4:
      return JoinW<4>(planes, n, out);
    default:
      return JoinW<8>(planes, n, out);
  }
}

}  // namespace dcr
