// LinearHash (dcr/digest.h): the partial blocks at either end of a range,
// the whole blocks by the fastest kernel the CPU runs, and powers of K by
// squaring.
#include "common/linear_digest.h"

#include <array>
#include <cstring>

namespace dcr {
namespace linear_digest {
namespace {

LinearDigest BodyGeneric(const std::byte* p, uint64_t blocks, const Powers& k) {
  // Horner from the last block: acc = sum of X_j * K^j, then times K.
  LinearDigest acc;
  for (uint64_t j = blocks; j-- > 0;) {
    LinearDigest x;
    std::memcpy(&x.low, p + 16 * j, 8);
    std::memcpy(&x.high, p + 16 * j + 8, 8);
    acc = MultiplyGeneric(acc, k.k[0]) ^ x;
  }
  return MultiplyGeneric(acc, k.k[0]);
}

}  // namespace

LinearDigest MultiplyGeneric(const LinearDigest& a, const LinearDigest& b) {
  // Shift-and-add, reducing x^128 to x^7 + x^2 + x + 1 as `v` shifts.
  LinearDigest out, v = a;
  for (int i = 0; i < 128; ++i) {
    uint64_t bit = i < 64 ? (b.low >> i) & 1 : (b.high >> (i - 64)) & 1;
    if (bit) out ^= v;
    uint64_t carry = v.high >> 63;
    v.high = (v.high << 1) | (v.low >> 63);
    v.low = (v.low << 1) ^ (carry ? 0x87u : 0u);
  }
  return out;
}

const Kernels kGeneric = {MultiplyGeneric, BodyGeneric};

std::vector<std::pair<const char*, const Kernels*>> AllKernels() {
  std::vector<std::pair<const char*, const Kernels*>> out = {
      {"generic", &kGeneric}};
#if defined(__x86_64__) && defined(__GNUC__)
  const bool clmul = kClmul != nullptr && __builtin_cpu_supports("pclmul") &&
                     __builtin_cpu_supports("sse4.1");
  if (clmul) out.emplace_back("pclmul", kClmul);
  if (clmul && kVpclmul256 != nullptr && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("vpclmulqdq")) {
    out.emplace_back("vpclmulqdq/avx2", kVpclmul256);
  }
  if (clmul && kAvx512 != nullptr && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("vpclmulqdq")) {
    out.emplace_back("vpclmulqdq", kAvx512);
  }
#endif
  return out;
}

const Kernels& BestKernels() {
  static const Kernels* k = AllKernels().back().second;
  return *k;
}

}  // namespace linear_digest

namespace {

using linear_digest::Kernels;
using linear_digest::Powers;

const Kernels& Best() { return linear_digest::BestKernels(); }

using Window = std::array<std::array<LinearDigest, 16>, 16>;

// window[i][j] = x^(j * 16^i).
Window MakeWindow(const LinearDigest& x) {
  const Kernels& m = Best();
  Window w;
  LinearDigest base = x;  // x^(16^i)
  for (auto& row : w) {
    row[0] = {1, 0};
    for (size_t j = 1; j < 16; ++j) row[j] = m.multiply(row[j - 1], base);
    base = m.multiply(row[15], base);
  }
  return w;
}

struct Tables {
  Powers k;               // K^1 .. K^8
  Window power, inverse;  // of K and of K^-1
  Tables() {
    const Kernels& m = Best();
    k.k[0] = kLinearDigestKey;
    for (size_t j = 1; j < linear_digest::kGroup; ++j) {
      k.k[j] = m.multiply(k.k[j - 1], kLinearDigestKey);
    }
    // K^-1 = K^(2^128 - 2), the product of K^(2^i) for i = 1 .. 127.
    LinearDigest inv{1, 0}, sq = kLinearDigestKey;
    for (int i = 1; i < 128; ++i) {
      sq = m.multiply(sq, sq);
      inv = m.multiply(inv, sq);
    }
    power = MakeWindow(kLinearDigestKey);
    inverse = MakeWindow(inv);
  }
};

const Tables& T() {
  static const Tables t;
  return t;
}

LinearDigest WindowPower(const Window& w, uint64_t n) {
  const Kernels& m = Best();
  LinearDigest out{1, 0};
  bool first = true;
  for (size_t i = 0; n != 0; ++i, n >>= 4) {
    if ((n & 15) == 0) continue;
    const LinearDigest& f = w[i][n & 15];
    out = first ? f : m.multiply(out, f);
    first = false;
  }
  return out;
}

// One block holding `bytes` at byte `at` of it, zero elsewhere.
LinearDigest Partial(std::span<const std::byte> bytes, size_t at) {
  unsigned char b[16] = {};
  std::memcpy(b + at, bytes.data(), bytes.size());
  LinearDigest x;
  std::memcpy(&x.low, b, 8);
  std::memcpy(&x.high, b + 8, 8);
  return x;
}

}  // namespace

namespace linear_digest {
LinearDigest Power(uint64_t n) { return WindowPower(T().power, n); }
LinearDigest InversePower(uint64_t n) { return WindowPower(T().inverse, n); }
}  // namespace linear_digest

using linear_digest::Power;

LinearDigest GfMultiply(const LinearDigest& a, const LinearDigest& b) {
  return Best().multiply(a, b);
}

LinearDigest LinearHash(uint64_t offset, std::span<const std::byte> bytes) {
  const Kernels& m = Best();
  LinearDigest out;
  uint64_t block = offset / 16;
  if (size_t at = offset % 16; at != 0 && !bytes.empty()) {
    size_t n = std::min<size_t>(16 - at, bytes.size());
    out ^= m.multiply(Partial(bytes.first(n), at), Power(block + 1));
    bytes = bytes.subspan(n);
    ++block;
  }
  if (uint64_t whole = bytes.size() / 16; whole > 0) {
    // Sum of X_j K^(j+1) over the run, moved to its place by K^block.
    LinearDigest s = m.body(bytes.data(), whole, T().k);
    out ^= block == 0 ? s : m.multiply(s, Power(block));
    bytes = bytes.subspan(16 * whole);
    block += whole;
  }
  if (!bytes.empty()) {
    out ^= m.multiply(Partial(bytes, 0), Power(block + 1));
  }
  return out;
}

LinearDigest LinearHashRuns(uint64_t offset, uint64_t stride,
                            uint64_t run_bytes, uint64_t count,
                            const std::byte* data, uint64_t data_stride) {
  LinearDigest out;
  if (offset % 16 != 0 || stride % 16 != 0 || run_bytes % 16 != 0 ||
      run_bytes == 0) {
    for (uint64_t i = 0; i < count; ++i) {
      out ^=
          LinearHash(offset + i * stride, {data + i * data_stride, run_bytes});
    }
    return out;
  }
  // Run i, hashed as if at block 0, is moved to block offset/16 + i *
  // stride/16 by K to that power: the first power once, each next one by
  // a product with K^(stride/16). Forward, in the order the memory lies.
  const Kernels& m = Best();
  const Powers& k = T().k;
  const LinearDigest step = Power(stride / 16);
  LinearDigest at = Power(offset / 16);
  for (uint64_t i = 0; i < count; ++i) {
    out ^= m.multiply(m.body(data + i * data_stride, run_bytes / 16, k), at);
    at = m.multiply(at, step);
  }
  return out;
}

LinearDigest LinearHashElements(uint64_t offset, size_t elem_size,
                                const uint64_t* positions, size_t count,
                                const std::byte* values) {
  const size_t w = elem_size;
  LinearDigest out;
  if (count == 0) return out;
  if (offset % w != 0 || 16 % w != 0) {
    for (size_t k = 0; k < count; ++k) {
      out ^= LinearHash(offset + positions[k] * w, {values + k * w, w});
    }
    return out;
  }
  // Block b contributes X_b K^(b+1). From the last block down, acc =
  // acc * K^(gap to the next block down) ^ X_b; the blocks between add
  // nothing. The sum is then acc * K^(lowest block + 1).
  const Kernels& m = Best();
  const Powers& kp = T().k;
  auto power = [&](uint64_t n) {
    return n <= linear_digest::kGroup ? kp.k[n - 1] : Power(n);
  };
  unsigned char x[16] = {};
  auto take = [&] {
    LinearDigest xb;
    std::memcpy(&xb.low, x, 8);
    std::memcpy(&xb.high, x + 8, 8);
    std::memset(x, 0, sizeof(x));
    return xb;
  };
  uint64_t block = (offset + positions[count - 1] * w) / 16;
  for (size_t k = count; k-- > 0;) {
    const uint64_t at = offset + positions[k] * w;
    if (at / 16 != block) {
      out = m.multiply(out ^ take(), power(block - at / 16));
      block = at / 16;
    }
    std::memcpy(x + at % 16, values + k * w, w);
  }
  out ^= take();
  return m.multiply(out, power(block + 1));
}

Digest128 FinishTensorDigest(const LinearDigest& sum, uint64_t length) {
  const LinearDigest d =
      sum ^ Best().multiply(LinearDigest{length, 0}, kTensorDigestLengthKey);
  return Digest128{d.high, d.low};
}

Digest128 TensorDigest(std::span<const std::byte> bytes) {
  return FinishTensorDigest(LinearHash(0, bytes), bytes.size());
}

}  // namespace dcr
