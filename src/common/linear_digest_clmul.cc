// LinearHash's kernels with PCLMULQDQ (x86-64; picked at run time only
// where the CPU has it). Products are accumulated unreduced, 256 bits as
// three 128-bit words, and reduced once per group of 8 blocks.
#include "common/linear_digest.h"

// Compiled with -mpclmul -msse4.1: it calls no inline function of a header,
// whose out-of-line copy the linker could pick for callers on other CPUs.
#if defined(__x86_64__) && defined(__PCLMUL__) && defined(__SSE4_1__)
#include <immintrin.h>

namespace dcr::linear_digest {
namespace {

__m128i Load(const LinearDigest& d) {
  return _mm_set_epi64x(static_cast<long long>(d.high),
                        static_cast<long long>(d.low));
}

LinearDigest Store(__m128i v) {
  return {static_cast<uint64_t>(_mm_cvtsi128_si64(v)),
          static_cast<uint64_t>(_mm_extract_epi64(v, 1))};
}

struct Acc {
  __m128i lo = _mm_setzero_si128();
  __m128i mid = _mm_setzero_si128();
  __m128i hi = _mm_setzero_si128();

  void Add(__m128i a, __m128i b) {
    lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(a, b, 0x00));
    hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(a, b, 0x11));
    mid = _mm_xor_si128(mid, _mm_clmulepi64_si128(a, b, 0x01));
    mid = _mm_xor_si128(mid, _mm_clmulepi64_si128(a, b, 0x10));
  }
  // The sum reduced modulo x^128 + x^7 + x^2 + x + 1.
  __m128i Reduce() const {
    const __m128i r = _mm_set_epi64x(0, 0x87);
    __m128i l = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    __m128i h = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    // x^192 * h.high = x^64 * x^128 * h.high: fold it 64 bits down.
    __m128i q = _mm_clmulepi64_si128(h, r, 0x01);
    h = _mm_xor_si128(h, _mm_srli_si128(q, 8));
    l = _mm_xor_si128(l, _mm_slli_si128(q, 8));
    // x^128 * h.low.
    return _mm_xor_si128(l, _mm_clmulepi64_si128(h, r, 0x00));
  }
};

LinearDigest Multiply(const LinearDigest& a, const LinearDigest& b) {
  Acc acc;
  acc.Add(Load(a), Load(b));
  return Store(acc.Reduce());
}

LinearDigest Body(const std::byte* p, uint64_t blocks, const Powers& k) {
  __m128i w[kGroup];
  for (size_t j = 0; j < kGroup; ++j) w[j] = Load(k.k[j]);
  const __m128i step = w[kGroup - 1];  // K^8
  // Horner over groups from the last: acc = acc * K^8 + t_g, where t_g is
  // the group's sum of X_j K^(j+1).
  const uint64_t groups = (blocks + kGroup - 1) / kGroup;
  __m128i acc = _mm_setzero_si128();
  for (uint64_t g = groups; g-- > 0;) {
    const std::byte* q = p + 16 * kGroup * g;
    const uint64_t left = blocks - kGroup * g;
    const uint64_t n = left < kGroup ? left : kGroup;
    Acc s;
    if (g + 1 != groups) s.Add(acc, step);
    if (n == kGroup) {
#pragma GCC unroll 8
      for (size_t j = 0; j < kGroup; ++j) {
        s.Add(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * j)),
              w[j]);
      }
    } else {
      for (size_t j = 0; j < n; ++j) {
        s.Add(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * j)),
              w[j]);
      }
    }
    acc = s.Reduce();
  }
  return Store(acc);
}

const Kernels kKernels = {Multiply, Body};

}  // namespace

const Kernels* const kClmul = &kKernels;

}  // namespace dcr::linear_digest

#else

namespace dcr::linear_digest {
const Kernels* const kClmul = nullptr;
}  // namespace dcr::linear_digest

#endif
