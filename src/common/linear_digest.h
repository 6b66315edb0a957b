// The kernels behind LinearHash (dcr/digest.h), one per instruction set.
// Not part of the public API.
#ifndef DCR_COMMON_LINEAR_DIGEST_H_
#define DCR_COMMON_LINEAR_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "dcr/digest.h"

namespace dcr::linear_digest {

// K^(j + 1) for j < kGroup, and K^kGroup: the constants of the kernels.
inline constexpr size_t kGroup = 8;
struct Powers {
  LinearDigest k[kGroup];  // K^1 .. K^kGroup
};

struct Kernels {
  // a * b in GF(2^128).
  LinearDigest (*multiply)(const LinearDigest& a, const LinearDigest& b);
  // XOR over j < blocks of X_j * K^(j + 1), for the 16-byte blocks X_j at
  // `p` (blocks > 0). `k` must hold the powers of kLinearDigestKey: a
  // kernel may keep tables derived from its first call.
  LinearDigest (*body)(const std::byte* p, uint64_t blocks, const Powers& k);
};

// Bitwise, for every CPU.
LinearDigest MultiplyGeneric(const LinearDigest& a, const LinearDigest& b);
extern const Kernels kGeneric;
// PCLMULQDQ (x86-64); null where not compiled.
extern const Kernels* const kClmul;
// VPCLMULQDQ on 256-bit registers with AVX2 (x86-64); null where not
// compiled.
extern const Kernels* const kVpclmul256;
// VPCLMULQDQ with AVX-512BW (x86-64); null where not compiled.
extern const Kernels* const kAvx512;
// K^n, and K^-n (K's inverse to the n), in at most 16 products each.
LinearDigest Power(uint64_t n);
LinearDigest InversePower(uint64_t n);

// The fastest of them this CPU runs.
const Kernels& BestKernels();
// All of them this CPU runs, slowest first (for tests and benchmarks).
std::vector<std::pair<const char*, const Kernels*>> AllKernels();

}  // namespace dcr::linear_digest

#endif  // DCR_COMMON_LINEAR_DIGEST_H_
