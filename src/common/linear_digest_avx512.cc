// LinearHash's body with VPCLMULQDQ on 512-bit registers (x86-64 with
// AVX-512BW; picked at run time only where the CPU has both). Four blocks
// per register, 32 per group; the Horner step over groups runs forward in
// every lane, and the lanes are added at the end.
#include "common/linear_digest.h"

// This file is compiled for AVX-512: it calls no inline function of a
// header (LinearDigest's operators included), whose out-of-line copy the
// linker could pick for callers on other CPUs.
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__VPCLMULQDQ__)
#include <immintrin.h>

namespace dcr::linear_digest {
namespace {

constexpr size_t kBlocks = 32;  // per group: 8 registers
constexpr size_t kRegs = kBlocks / 4;
// How far ahead each group asks for its lines. The Horner step chains the
// groups, so the core waits on every group's loads: without the prefetch
// a 1 GiB buffer hashed at 12 GB/s against 25 from L2 (digest_bench on
// this 2-core AMD EPYC VM); with it, at 20 GB/s. A prefetch past the end
// is a hint that never faults (the address is formed as an integer).
constexpr size_t kPrefetchBytes = 2048;

// Products a * b, four lanes at once, summed unreduced by Karatsuba: each
// costs lo * lo, hi * hi and (lo ^ hi) * (lo ^ hi), the last taken from
// the low qwords of `af` and `bf` (a and b folded: lo ^ hi).
struct Acc {
  __m512i lo = _mm512_setzero_si512();
  __m512i mid = _mm512_setzero_si512();  // sum of folded products
  __m512i hi = _mm512_setzero_si512();

  void Add(__m512i a, __m512i b, __m512i bf) {
    __m512i af = _mm512_xor_si512(a, _mm512_bsrli_epi128(a, 8));
    lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(a, b, 0x00));
    hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(a, b, 0x11));
    mid = _mm512_xor_si512(mid, _mm512_clmulepi64_epi128(af, bf, 0x00));
  }
  // Each lane reduced modulo x^128 + x^7 + x^2 + x + 1 (as the PCLMUL
  // kernel does it, lane by lane).
  __m512i Reduce() const {
    const __m512i r = _mm512_set1_epi64(0x87);
    // The true middle term: mid ^ lo ^ hi (Karatsuba), summed over terms.
    __m512i m = _mm512_ternarylogic_epi64(mid, lo, hi, 0x96);
    __m512i l = _mm512_xor_si512(lo, _mm512_bslli_epi128(m, 8));
    __m512i h = _mm512_xor_si512(hi, _mm512_bsrli_epi128(m, 8));
    __m512i q = _mm512_clmulepi64_epi128(h, r, 0x01);
    h = _mm512_xor_si512(h, _mm512_bsrli_epi128(q, 8));
    l = _mm512_xor_si512(l, _mm512_bslli_epi128(q, 8));
    return _mm512_xor_si512(l, _mm512_clmulepi64_epi128(h, r, 0x00));
  }
};

// b with lo ^ hi in its low qword, for Acc::Add.
__m512i Folded(__m512i b) {
  return _mm512_xor_si512(b, _mm512_bsrli_epi128(b, 8));
}

__m512i Lanes(const LinearDigest* d) {  // d[0..3], lane 0 first
  return _mm512_set_epi64(
      static_cast<long long>(d[3].high), static_cast<long long>(d[3].low),
      static_cast<long long>(d[2].high), static_cast<long long>(d[2].low),
      static_cast<long long>(d[1].high), static_cast<long long>(d[1].low),
      static_cast<long long>(d[0].high), static_cast<long long>(d[0].low));
}

LinearDigest Body(const std::byte* p, uint64_t blocks, const Powers& k) {
  const Kernels& k128 = kClmul != nullptr ? *kClmul : kGeneric;
  // K^1 .. K^32, computed once: `k` always holds the format's K.
  struct Weights {
    LinearDigest pw[kBlocks];
    explicit Weights(const Powers& k, const Kernels& m) {
      for (size_t j = 0; j < kGroup; ++j) pw[j] = k.k[j];
      for (size_t j = kGroup; j < kBlocks; ++j) {
        pw[j] = m.multiply(pw[j - 1], k.k[0]);
      }
    }
  };
  static const Weights weights(k, k128);
  const LinearDigest* pw = weights.pw;
  __m512i w[kRegs], wf[kRegs];
  for (size_t r = 0; r < kRegs; ++r) {
    w[r] = Lanes(pw + 4 * r);
    wf[r] = Folded(w[r]);
  }
  static const LinearDigest back = InversePower(kBlocks);  // K^-32
  const LinearDigest backs[4] = {back, back, back, back};
  const __m512i step = Lanes(backs), stepf = Folded(step);

  // Whole groups by Horner from the first, lane by lane, stepping by K^-32
  // (memory is read forward, as prefetchers expect): lane i ends with the
  // sum over groups g of (X_{32g+4r+i} K^(4r+i+1) summed over r) times
  // K^(-32 (groups - 1 - g)); K^(32 (groups - 1)) puts it in place.
  const uint64_t groups = blocks / kBlocks;
  __m512i acc = _mm512_setzero_si512();
  for (uint64_t g = 0; g < groups; ++g) {
    const std::byte* q = p + 16 * kBlocks * g;
#pragma GCC unroll 8
    for (size_t r = 0; r < kRegs; ++r) {
      _mm_prefetch(
          reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(q) +
                                        kPrefetchBytes + 64 * r),
          _MM_HINT_T0);
    }
    Acc s;
    s.Add(acc, step, stepf);
#pragma GCC unroll 8
    for (size_t r = 0; r < kRegs; ++r) {
      s.Add(_mm512_loadu_si512(q + 64 * r), w[r], wf[r]);
    }
    acc = s.Reduce();
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc);
  LinearDigest out;
  for (size_t i = 0; i < 4; ++i) {
    out.low ^= lanes[2 * i];
    out.high ^= lanes[2 * i + 1];
  }
  if (groups > 1) out = k128.multiply(out, Power(kBlocks * (groups - 1)));
  // The blocks after the last whole group, by the PCLMUL kernel, at their
  // place: K^(32 groups).
  if (uint64_t rest = blocks - kBlocks * groups; rest > 0) {
    LinearDigest t = k128.body(p + 16 * kBlocks * groups, rest, k);
    if (groups != 0) t = k128.multiply(t, Power(kBlocks * groups));
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

const Kernels* const kAvx512 = &kKernels;

}  // namespace dcr::linear_digest

#else

namespace dcr::linear_digest {
const Kernels* const kAvx512 = nullptr;
}  // namespace dcr::linear_digest

#endif
