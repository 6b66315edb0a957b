// What the CUDA tests share (tests/cuda): the fixture that skips, with
// the driver's reason, where no GPU is usable; device buffer helpers; the
// random spans and their CPU reference changes.
#ifndef DCR_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define DCR_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "codec/diff.h"
#include "dcr/cuda.h"

namespace dcr::cuda::cudatest {

inline constexpr uint8_t kPoison = 0xa5;

// A helper binary of the tests: $`env` if set, else `name` beside this
// test binary (bench/gpu_check.sh carries them together), else
// `built_at`, where CMake built it.
inline std::string HelperBinary(const char* name, const char* env,
                                const char* built_at) {
  if (const char* e = std::getenv(env)) return e;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/')) + "/" + name;
    if (::access(dir.c_str(), X_OK) == 0) return dir;
  }
  return built_at;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto rt = Probe();
    if (!rt.ok()) GTEST_SKIP() << "no GPU: " << rt.status().ToString();
  }

  template <typename T>
  static T Value(Result<T> r) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }

  static DeviceBuffer Alloc(size_t bytes) {
    return Value(DeviceBuffer::Allocate(std::max<size_t>(bytes, 1)));
  }

  static DeviceBuffer Upload(std::span<const std::byte> host, size_t pad = 0) {
    DeviceBuffer d = Alloc(host.size() + pad);
    EXPECT_TRUE(Fill(d.data(), kPoison, d.size()).ok());
    EXPECT_TRUE(CopyToDevice(static_cast<char*>(d.data()) + pad, host).ok());
    return d;
  }

  static std::vector<std::byte> Download(const void* d, size_t bytes) {
    std::vector<std::byte> out(bytes);
    Status st = CopyToHost(out, d);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  std::mt19937_64 rng_{20261204};
};

// Bit patterns a float tensor holds that an integer compare must treat as
// plain bits: NaNs with payloads, infinities, signed zeros, denormals.
inline std::vector<uint64_t> SpecialBits(size_t w) {
  switch (w) {
    case 1:
      return {0x7f, 0xff, 0x80, 0x00, 0x01, 0x78};  // FP8 E4M3 NaN, -0, ...
    case 2:
      return {0x7fc0, 0x7fc1, 0xffc0, 0x7f80, 0xff80,
              0x8000, 0x0000, 0x0001, 0x807f};
    case 4:
      return {0x7fc00000, 0x7fc00001, 0x7f800000, 0xff800000,
              0x80000000, 0x00000001, 0x007fffff};
    default:
      return {0x7ff8000000000000ull, 0x7ff0000000000001ull,
              0xfff0000000000000ull, 0x8000000000000000ull, 1ull};
  }
}

struct Case {
  size_t w;
  uint64_t n;
  double density;
};

// Base and target spans of n elements: random base with special patterns
// sprinkled in; target changes about `density` of the elements (always the
// first and last and the elements either side of a 16 KiB tile edge when
// density > 0), some to special patterns, some by one bit only.
inline void MakeSpans(const Case& c, std::mt19937_64& rng,
                      std::vector<std::byte>* base,
                      std::vector<std::byte>* target) {
  const size_t w = c.w;
  base->resize(c.n * w);
  for (auto& b : *base) b = static_cast<std::byte>(rng());
  const auto special = SpecialBits(w);
  auto put = [&](std::vector<std::byte>* v, uint64_t i, uint64_t bits) {
    std::memcpy(v->data() + i * w, &bits, w);
  };
  for (uint64_t i = 0; i < c.n; i += 97)
    put(base, i, special[i % special.size()]);
  *target = *base;
  if (c.density <= 0) return;
  std::uniform_real_distribution<double> u(0, 1);
  auto change = [&](uint64_t i) {
    uint64_t old = 0, now = 0;
    std::memcpy(&old, base->data() + i * w, w);
    switch (rng() % 3) {
      case 0:
        now = special[rng() % special.size()];
        break;
      case 1:
        now = old ^ (1ull << (rng() % (8 * w)));
        break;
      default:
        now = rng();
    }
    if (std::memcmp(&now, &old, w) == 0) now = old ^ 1;
    put(target, i, now);
  };
  for (uint64_t i = 0; i < c.n; ++i) {
    if (c.density >= 1 || u(rng) < c.density) change(i);
  }
  change(0);
  change(c.n - 1);
  const uint64_t tile = 16384 / w;
  for (uint64_t e = tile; e < c.n; e += tile) {
    change(e - 1);
    change(e);
  }
}

struct CpuChanges {
  std::vector<uint32_t> positions;
  std::vector<std::byte> values;  // element-major
};

inline CpuChanges CpuFind(size_t w, std::span<const std::byte> base,
                          std::span<const std::byte> target, bool xor_values) {
  const size_t n = base.size() / w;
  CpuChanges out;
  out.positions.resize(n);
  std::vector<std::vector<uint8_t>> planes(w, std::vector<uint8_t>(n));
  uint8_t* ptrs[8];
  for (size_t j = 0; j < w; ++j) ptrs[j] = planes[j].data();
  const size_t k = FindChanges(w, base.data(), target.data(), n, xor_values,
                               out.positions.data(), ptrs);
  out.positions.resize(k);
  out.values.resize(k * w);
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = 0; j < w; ++j) {
      out.values[i * w + j] = static_cast<std::byte>(planes[j][i]);
    }
  }
  return out;
}

// BF16 spans whose changes depend on the exponent, as an Adam step's do:
// what makes the encoder code a span in context.
inline void AdamLikeBf16(uint64_t n, std::mt19937_64& rng,
                         std::vector<std::byte>* base,
                         std::vector<std::byte>* target) {
  base->resize(n * 2);
  target->resize(n * 2);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t e = 112 + static_cast<uint32_t>(rng() % 17);
    uint16_t x = static_cast<uint16_t>((e << 7) | (rng() & 0x7f));
    if (rng() & 1) x |= 0x8000;
    uint16_t y = x;
    const double pc = 0.3 / double(1u << std::min<uint32_t>(e - 112, 12));
    if (std::uniform_real_distribution<double>(0, 1)(rng) < pc) {
      y ^= static_cast<uint16_t>(1 + rng() % 3);
    }
    std::memcpy(base->data() + 2 * i, &x, 2);
    std::memcpy(target->data() + 2 * i, &y, 2);
  }
}

}  // namespace dcr::cuda::cudatest

#endif  // DCR_TESTS_CUDA_CUDA_TEST_UTIL_H_
