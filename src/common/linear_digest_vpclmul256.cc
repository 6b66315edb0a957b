// LinearHash's body with VPCLMULQDQ on 256-bit registers (x86-64 with AVX2:
// Zen 3, Alder Lake and later cores without AVX-512; picked at run time
// only where the CPU has both). Two blocks per register, 32 per group; the
// Horner step over groups runs forward in every lane, as in the AVX-512
// kernel, and the lanes are added at the end.
#include "common/linear_digest.h"

// This file is compiled for AVX2: it calls no inline function of a header
// (LinearDigest's operators included), whose out-of-line copy the linker
// could pick for callers on other CPUs.
#if defined(__x86_64__) && defined(__AVX2__) && defined(__VPCLMULQDQ__)
#include <immintrin.h>

namespace dcr::linear_digest {
namespace {

constexpr size_t kBlocks = 32;  // per group: 16 registers
constexpr size_t kRegs = kBlocks / 2;
// How far ahead each group asks for its lines (the Horner step chains the
// groups, so every group's loads would be waited on; see the AVX-512
// kernel). A prefetch past the end is a hint that never faults.
constexpr size_t kPrefetchBytes = 2048;
// Bodies of up to this many groups are moved into place by a product with
// a power of K from a table, not by Power's up to 16 products: a 1 KiB
// row of a column split is 2 groups.
constexpr size_t kTabledGroups = 256;

__m256i Xor(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }

// Products a * b, two lanes at once, summed unreduced by Karatsuba: each
// costs lo * lo, hi * hi and (lo ^ hi) * (lo ^ hi), the last taken from
// the low qwords of `af` and `bf` (a and b folded: lo ^ hi).
struct Acc {
  __m256i lo = _mm256_setzero_si256();
  __m256i mid = _mm256_setzero_si256();  // sum of folded products
  __m256i hi = _mm256_setzero_si256();

  void Add(__m256i a, __m256i b, __m256i bf) {
    const __m256i af = Xor(a, _mm256_bsrli_epi128(a, 8));
    lo = Xor(lo, _mm256_clmulepi64_epi128(a, b, 0x00));
    hi = Xor(hi, _mm256_clmulepi64_epi128(a, b, 0x11));
    mid = Xor(mid, _mm256_clmulepi64_epi128(af, bf, 0x00));
  }
  // Each lane reduced modulo x^128 + x^7 + x^2 + x + 1 (as the PCLMUL
  // kernel does it, lane by lane).
  __m256i Reduce() const {
    const __m256i r = _mm256_set1_epi64x(0x87);
    // The true middle term: mid ^ lo ^ hi (Karatsuba), summed over terms.
    const __m256i m = Xor(mid, Xor(lo, hi));
    __m256i l = Xor(lo, _mm256_bslli_epi128(m, 8));
    __m256i h = Xor(hi, _mm256_bsrli_epi128(m, 8));
    const __m256i q = _mm256_clmulepi64_epi128(h, r, 0x01);
    h = Xor(h, _mm256_bsrli_epi128(q, 8));
    l = Xor(l, _mm256_bslli_epi128(q, 8));
    return Xor(l, _mm256_clmulepi64_epi128(h, r, 0x00));
  }
};

// b with lo ^ hi in its low qword, for Acc::Add.
__m256i Folded(__m256i b) { return Xor(b, _mm256_bsrli_epi128(b, 8)); }

__m256i Lanes(const LinearDigest& d0, const LinearDigest& d1) {
  return _mm256_set_epi64x(
      static_cast<long long>(d1.high), static_cast<long long>(d1.low),
      static_cast<long long>(d0.high), static_cast<long long>(d0.low));
}

// The kernel's constants, computed once: `k` always holds the format's K.
struct Constants {
  // Aggregate-initialised ({}): no call of LinearDigest's implicit
  // constructor, an inline function of a header.
  LinearDigest pw[kBlocks]{};                // K^1 .. K^32
  LinearDigest back{};                       // K^-32
  LinearDigest placed[kTabledGroups + 1]{};  // K^(32 j)
  Constants(const Powers& k, const Kernels& m) {
    for (size_t j = 0; j < kGroup; ++j) pw[j] = k.k[j];
    for (size_t j = kGroup; j < kBlocks; ++j) {
      pw[j] = m.multiply(pw[j - 1], k.k[0]);
    }
    back = InversePower(kBlocks);
    placed[0] = {1, 0};
    for (size_t j = 1; j <= kTabledGroups; ++j) {
      placed[j] = m.multiply(placed[j - 1], pw[kBlocks - 1]);
    }
  }
  // K^(32 groups).
  LinearDigest Place(uint64_t groups) const {
    return groups <= kTabledGroups ? placed[groups] : Power(kBlocks * groups);
  }
};

LinearDigest Body(const std::byte* p, uint64_t blocks, const Powers& k) {
  const Kernels& k128 = kClmul != nullptr ? *kClmul : kGeneric;
  static const Constants c(k, k128);
  __m256i w[kRegs], wf[kRegs];
  for (size_t r = 0; r < kRegs; ++r) {
    w[r] = Lanes(c.pw[2 * r], c.pw[2 * r + 1]);
    wf[r] = Folded(w[r]);
  }
  const __m256i step = Lanes(c.back, c.back), stepf = Folded(step);

  // Whole groups by Horner from the first, lane by lane, stepping by K^-32
  // (memory is read forward, as prefetchers expect): lane i ends with the
  // sum over groups g of (X_{32g+2r+i} K^(2r+i+1) summed over r) times
  // K^(-32 (groups - 1 - g)); K^(32 (groups - 1)) puts it in place.
  const uint64_t groups = blocks / kBlocks;
  __m256i acc = _mm256_setzero_si256();
  for (uint64_t g = 0; g < groups; ++g) {
    const std::byte* q = p + 16 * kBlocks * g;
#pragma GCC unroll 8
    for (size_t line = 0; line < 16 * kBlocks / 64; ++line) {
      _mm_prefetch(
          reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(q) +
                                        kPrefetchBytes + 64 * line),
          _MM_HINT_T0);
    }
    Acc s;
    s.Add(acc, step, stepf);
#pragma GCC unroll 16
    for (size_t r = 0; r < kRegs; ++r) {
      s.Add(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * r)),
            w[r], wf[r]);
    }
    acc = s.Reduce();
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  LinearDigest out{lanes[0] ^ lanes[2], lanes[1] ^ lanes[3]};
  if (groups > 1) out = k128.multiply(out, c.Place(groups - 1));
  // The blocks after the last whole group, by the PCLMUL kernel, at their
  // place: K^(32 groups).
  if (uint64_t rest = blocks - kBlocks * groups; rest > 0) {
    LinearDigest t = k128.body(p + 16 * kBlocks * groups, rest, k);
    if (groups != 0) t = k128.multiply(t, c.Place(groups));
    out.low ^= t.low;
    out.high ^= t.high;
  }
  return out;
}

LinearDigest Multiply(const LinearDigest& a, const LinearDigest& b) {
  return kClmul != nullptr ? kClmul->multiply(a, b) : MultiplyGeneric(a, b);
}

const Kernels kKernels = {Multiply, Body};

}  // namespace

const Kernels* const kVpclmul256 = &kKernels;

}  // namespace dcr::linear_digest

#else

namespace dcr::linear_digest {
const Kernels* const kVpclmul256 = nullptr;
}  // namespace dcr::linear_digest

#endif
