// The CUDA kernels (dcr/cuda.h) against their CPU references on random
// inputs: every element size, densities from 0 to 100%, changes at the
// first and last element and at tile edges, NaN/Inf/denormal/signed-zero
// bit patterns, aligned and misaligned spans, outputs poisoned before each
// run. Without a usable GPU every test is skipped with the driver's reason
// (ctest reports it as skipped, never as passed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec/diff.h"
#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"
#include "dcr/fp8.h"
#include "dcr/shard_diff.h"

namespace dcr::cuda {
namespace {

constexpr uint8_t kPoison = 0xa5;

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
std::vector<uint64_t> SpecialBits(size_t w) {
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
void MakeSpans(const Case& c, std::mt19937_64& rng,
               std::vector<std::byte>* base, std::vector<std::byte>* target) {
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

CpuChanges CpuFind(size_t w, std::span<const std::byte> base,
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

TEST_F(CudaTest, ProbeReportsTheDevices) {
  Runtime rt = Value(Probe());
  ASSERT_FALSE(rt.devices.empty());
  EXPECT_GT(rt.driver_version, 0);
  for (const auto& d : rt.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.cc_major, 3);
    EXPECT_GT(d.memory_bytes, 0u);
    EXPECT_TRUE(d.ipc || !d.ipc_detail.empty());
    std::printf("GPU %d: %s, cc %d.%d, %.1f GiB, %d SMs, %s, IPC %s\n", d.index,
                d.name.c_str(), d.cc_major, d.cc_minor,
                d.memory_bytes / 1073741824.0, d.multiprocessors,
                d.pci_bus_id.c_str(), d.ipc ? "yes" : d.ipc_detail.c_str());
  }
}

TEST_F(CudaTest, FindChangesMatchesTheCpu) {
  auto differ = Value(Differ::Create(3 << 20));
  const std::vector<uint64_t> sizes = {1,     7,      8192,
                                       16384, 100003, (1 << 20) + 3};
  const std::vector<double> densities = {0, 1e-4, 0.03, 0.5, 1.0};
  for (size_t w : {1, 2, 4, 8}) {
    for (uint64_t n : sizes) {
      for (double density : densities) {
        for (bool xor_values : {true, false}) {
          // pad 0: 256-byte aligned (the vector path); pad w: misaligned.
          for (size_t pad : {size_t{0}, w}) {
            SCOPED_TRACE("w=" + std::to_string(w) + " n=" + std::to_string(n) +
                         " density=" + std::to_string(density) +
                         " xor=" + std::to_string(xor_values) +
                         " pad=" + std::to_string(pad));
            std::vector<std::byte> base, target;
            MakeSpans({w, n, density}, rng_, &base, &target);
            CpuChanges want = CpuFind(w, base, target, xor_values);
            DeviceBuffer db = Upload(base, pad), dt = Upload(target, pad);
            DeviceBuffer dp =
                Upload(std::vector<std::byte>(4 * n + 4, std::byte{kPoison}));
            DeviceBuffer dv = Upload(
                std::vector<std::byte>(w * n + w, std::byte{kPoison}), pad);
            const uint64_t k = Value(differ->FindChanges(
                w, static_cast<char*>(db.data()) + pad,
                static_cast<char*>(dt.data()) + pad, n, xor_values,
                static_cast<uint32_t*>(dp.data()),
                static_cast<char*>(dv.data()) + pad));
            ASSERT_EQ(k, want.positions.size());
            auto pos = Download(dp.data(), 4 * (k + 1));
            auto val =
                Download(static_cast<char*>(dv.data()) + pad, w * (k + 1));
            ASSERT_EQ(0, std::memcmp(pos.data(), want.positions.data(), 4 * k));
            ASSERT_EQ(0, std::memcmp(val.data(), want.values.data(), w * k));
            // Nothing past the last change was written.
            for (size_t b = 0; b < 4; ++b) {
              ASSERT_EQ(pos[4 * k + b], std::byte{kPoison});
            }
            for (size_t b = 0; b < w; ++b) {
              ASSERT_EQ(val[w * k + b], std::byte{kPoison});
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaTest, FindChangesRefusesBadArguments) {
  auto differ = Value(Differ::Create(1024));
  DeviceBuffer a = Alloc(4096), b = Alloc(4096), p = Alloc(4096),
               v = Alloc(8192);
  auto* pa = static_cast<char*>(a.data());
  auto* pb = static_cast<char*>(b.data());
  auto* pp = static_cast<uint32_t*>(p.data());
  EXPECT_FALSE(differ->FindChanges(3, pa, pb, 16, true, pp, v.data()).ok());
  EXPECT_FALSE(differ->FindChanges(2, pa, pb, 2048, true, pp, v.data()).ok());
  EXPECT_FALSE(differ->FindChanges(2, pa + 1, pb, 16, true, pp, v.data()).ok());
  EXPECT_EQ(0u, Value(differ->FindChanges(2, pa, pb, 0, true, pp, v.data())));
  EXPECT_FALSE(Differ::Create(0).ok());
}

DecodedChunk MakeChunk(ChunkKind kind, ChunkEncoding enc, size_t w,
                       uint32_t span_elems, std::vector<uint32_t> positions,
                       std::vector<std::byte> values) {
  DecodedChunk c;
  c.header.kind = kind;
  c.header.encoding = enc;
  c.header.elem_size = static_cast<uint8_t>(w);
  c.header.span_elems = span_elems;
  c.header.changed = enc == ChunkEncoding::kDense
                         ? span_elems
                         : static_cast<uint32_t>(positions.size());
  c.positions = std::move(positions);
  c.values = std::move(values);
  return c;
}

TEST_F(CudaTest, ApplyMatchesTheCpu) {
  for (size_t w : {1, 2, 4, 8}) {
    for (uint64_t n : {uint64_t{1}, uint64_t{4099}, uint64_t{(1 << 18) + 5}}) {
      for (double density : {0.0, 0.03, 0.6, 1.0}) {
        for (ChunkKind kind : {ChunkKind::kXor, ChunkKind::kOverwrite}) {
          for (size_t pad : {size_t{0}, w}) {
            SCOPED_TRACE("w=" + std::to_string(w) + " n=" + std::to_string(n) +
                         " density=" + std::to_string(density) +
                         " kind=" + std::to_string(int(kind)) +
                         " pad=" + std::to_string(pad));
            std::vector<std::byte> base, target;
            MakeSpans({w, n, density}, rng_, &base, &target);
            CpuChanges ch = CpuFind(w, base, target, kind == ChunkKind::kXor);
            // Sparse.
            {
              std::vector<std::byte> want = base;
              ASSERT_TRUE(
                  ApplyChunk(MakeChunk(kind, ChunkEncoding::kSparse, w,
                                       uint32_t(n), ch.positions, ch.values),
                             want)
                      .ok());
              ASSERT_EQ(want, target);
              DeviceBuffer ds = Upload(base, pad);
              DeviceBuffer dp = Upload(std::as_bytes(std::span(ch.positions)));
              DeviceBuffer dv = Upload(ch.values, pad);
              ASSERT_TRUE(ApplyChanges(kind, w,
                                       static_cast<char*>(ds.data()) + pad, n,
                                       static_cast<uint32_t*>(dp.data()),
                                       static_cast<char*>(dv.data()) + pad,
                                       ch.positions.size())
                              .ok());
              ASSERT_TRUE(Synchronize(nullptr).ok());
              ASSERT_EQ(Download(static_cast<char*>(ds.data()) + pad, n * w),
                        want);
            }
            // Dense: every element's mask or new value.
            {
              std::vector<std::byte> values = target;
              if (kind == ChunkKind::kXor) {
                for (size_t i = 0; i < values.size(); ++i) values[i] ^= base[i];
              }
              std::vector<std::byte> want = base;
              ASSERT_TRUE(ApplyChunk(MakeChunk(kind, ChunkEncoding::kDense, w,
                                               uint32_t(n), {}, values),
                                     want)
                              .ok());
              ASSERT_EQ(want, target);
              DeviceBuffer ds = Upload(base, pad);
              DeviceBuffer dv = Upload(values, pad);
              ASSERT_TRUE(ApplyDense(kind, w,
                                     static_cast<char*>(ds.data()) + pad, n,
                                     static_cast<char*>(dv.data()) + pad)
                              .ok());
              ASSERT_TRUE(Synchronize(nullptr).ok());
              ASSERT_EQ(Download(static_cast<char*>(ds.data()) + pad, n * w),
                        want);
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaTest, ApplySkipsPositionsOutsideTheSpan) {
  const size_t w = 2;
  const uint64_t n = 1000;
  std::vector<std::byte> span(n * w);
  for (auto& b : span) b = static_cast<std::byte>(rng_());
  // The span sits inside a larger buffer whose tail must stay untouched.
  std::vector<std::byte> whole = span;
  whole.resize(2 * n * w, std::byte{kPoison});
  DeviceBuffer ds = Upload(whole);
  std::vector<uint32_t> pos = {0, 999, 1000, 1999, 0xffffffffu};
  std::vector<std::byte> vals(pos.size() * w, std::byte{0xff});
  DeviceBuffer dp = Upload(std::as_bytes(std::span(pos)));
  DeviceBuffer dv = Upload(vals);
  ASSERT_TRUE(ApplyChanges(ChunkKind::kOverwrite, w, ds.data(), n,
                           static_cast<uint32_t*>(dp.data()), dv.data(),
                           pos.size())
                  .ok());
  ASSERT_TRUE(Synchronize(nullptr).ok());
  auto got = Download(ds.data(), whole.size());
  std::vector<std::byte> want = whole;
  for (size_t b = 0; b < w; ++b) {
    want[b] = std::byte{0xff};
    want[999 * w + b] = std::byte{0xff};
  }
  EXPECT_EQ(got, want);
  EXPECT_FALSE(ApplyChanges(ChunkKind::kXor, 3, ds.data(), n,
                            static_cast<uint32_t*>(dp.data()), dv.data(), 1)
                   .ok());
  EXPECT_FALSE(ApplyChanges(ChunkKind::kXor, 2,
                            static_cast<char*>(ds.data()) + 1, n,
                            static_cast<uint32_t*>(dp.data()), dv.data(), 1)
                   .ok());
}

TEST_F(CudaTest, DigestMatchesTheCpu) {
  auto digester = Value(Digester::Create());
  std::vector<uint64_t> lengths = {0,
                                   1,
                                   15,
                                   16,
                                   17,
                                   255,
                                   4096,
                                   4097,
                                   65536 + 9,
                                   (1 << 20) + 13,
                                   (24 << 20) + 5};
  for (int i = 0; i < 6; ++i) lengths.push_back(rng_() % (3 << 20));
  for (uint64_t len : lengths) {
    std::vector<std::byte> bytes(len);
    for (auto& b : bytes) b = static_cast<std::byte>(rng_());
    for (uint64_t offset : {uint64_t{0}, uint64_t{16}, uint64_t{5},
                            uint64_t{1} << 40, (uint64_t{1} << 33) + 7}) {
      for (size_t pad : {size_t{0}, size_t{3}}) {
        SCOPED_TRACE("len=" + std::to_string(len) + " offset=" +
                     std::to_string(offset) + " pad=" + std::to_string(pad));
        DeviceBuffer d = Upload(bytes, pad);
        const LinearDigest got = Value(digester->LinearHash(
            offset, static_cast<char*>(d.data()) + pad, len));
        ASSERT_EQ(got, LinearHash(offset, bytes));
      }
    }
    DeviceBuffer d = Upload(bytes);
    ASSERT_EQ(Value(digester->TensorDigest(d.data(), len)),
              TensorDigest(bytes));
  }
  // All-zero and all-one strings, and special float patterns.
  for (uint8_t fill : {uint8_t{0}, uint8_t{0xff}, uint8_t{0x7f}}) {
    std::vector<std::byte> bytes((5 << 20) + 3, std::byte{fill});
    DeviceBuffer d = Upload(bytes);
    ASSERT_EQ(Value(digester->TensorDigest(d.data(), bytes.size())),
              TensorDigest(bytes));
  }
}

// The round trip a GPU producer and a GPU relay make: diff on the device,
// encode the changes on the CPU into the chunk the CPU encoder makes,
// decode, apply on the device, and the device digest of the result is the
// target's.
TEST_F(CudaTest, DiffEncodeDecodeApplyRoundTrip) {
  auto differ = Value(Differ::Create(1 << 20));
  auto digester = Value(Digester::Create());
  auto enc = Value(ChunkEncoder::Create(EncodeOptions{}));
  auto dec = Value(ChunkDecoder::Create());
  const size_t w = 2;
  const uint64_t n = 1 << 20;
  for (double density : {0.01, 0.05}) {
    std::vector<std::byte> base, target;
    MakeSpans({w, n, density}, rng_, &base, &target);
    DeviceBuffer db = Upload(base), dt = Upload(target);
    DeviceBuffer dp = Alloc(4 * n), dv = Alloc(w * n);
    const uint64_t k = Value(
        differ->FindChanges(w, db.data(), dt.data(), n, true,
                            static_cast<uint32_t*>(dp.data()), dv.data()));
    std::vector<uint32_t> pos(k);
    ASSERT_TRUE(
        CopyToHost(std::as_writable_bytes(std::span(pos)), dp.data()).ok());
    auto vals = Download(dv.data(), k * w);
    std::vector<std::byte> gpu_chunk, cpu_chunk;
    ASSERT_TRUE(enc->EncodeChanges(ChunkKind::kXor, {1, 2, 0}, w, uint32_t(n),
                                   pos, vals, &gpu_chunk)
                    .ok());
    ASSERT_TRUE(Value(enc->EncodeDiff(ChunkKind::kXor, {1, 2, 0}, w, base,
                                      target, &cpu_chunk)));
    ASSERT_EQ(gpu_chunk, cpu_chunk);
    DecodedChunk c;
    ASSERT_TRUE(dec->Decode(gpu_chunk, &c).ok());
    DeviceBuffer dp2 = Upload(std::as_bytes(std::span(c.positions)));
    DeviceBuffer dv2 = Upload(c.values);
    ASSERT_TRUE(ApplyChanges(c.header.kind, w, db.data(), n,
                             static_cast<uint32_t*>(dp2.data()), dv2.data(),
                             c.positions.size())
                    .ok());
    EXPECT_EQ(Value(digester->TensorDigest(db.data(), n * w)),
              TensorDigest(target));
  }
}

// BF16 spans whose changes depend on the exponent, as an Adam step's do:
// what makes the encoder code a span in context.
void AdamLikeBf16(uint64_t n, std::mt19937_64& rng,
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

// A refit's chunks through the staging pipeline: XOR (sparse and dense),
// overwrite and context-coded chunks, a repair's overwrite right after a
// chunk for the same span, with staging small enough that chunks go in
// pieces; the device spans end with the bits the CPU's ApplyChunk gives.
TEST_F(CudaTest, ChunkApplierMatchesTheCpu) {
  const size_t w = 2;
  const uint64_t span = 1 << 16;
  const uint64_t spans = 6;
  auto enc = Value(ChunkEncoder::Create(EncodeOptions{}));
  const ExponentField bf16 = ExponentFieldOf(DType::kBF16);
  for (size_t staging : {size_t{64} << 10, size_t{64} << 20}) {
    SCOPED_TRACE("staging=" + std::to_string(staging));
    auto applier = Value(ChunkApplier::Create({staging, 4}));
    std::vector<std::byte> base, target;
    AdamLikeBf16(spans * span, rng_, &base, &target);
    // Span 1: dense changes; span 2: an overwrite chunk; span 3: an
    // XOR and then a repair's overwrite to other bits.
    for (uint64_t i = span; i < 2 * span; ++i) {
      target[i * w] ^= static_cast<std::byte>(1 + rng_() % 255);
    }
    std::vector<std::byte> want = target;
    for (uint64_t i = 3 * span; i < 4 * span; i += 7)
      want[i * w + 1] ^= std::byte{0x40};
    DeviceBuffer d = Upload(base);
    auto dspan = [&](uint64_t s) {
      return static_cast<char*>(d.data()) + s * span * w;
    };
    auto sub = [&](const std::vector<std::byte>& v, uint64_t s) {
      return std::span<const std::byte>(v).subspan(s * span * w, span * w);
    };
    int context_chunks = 0, dense_chunks = 0;
    for (uint64_t s = 0; s < spans; ++s) {
      const ChunkKind kind = s == 2 ? ChunkKind::kOverwrite : ChunkKind::kXor;
      std::vector<std::byte> chunk;
      ASSERT_TRUE(Value(enc->EncodeDiffInContext(kind, {0, uint32_t(s), 0}, w,
                                                 bf16, sub(base, s),
                                                 sub(target, s), &chunk)));
      const ChunkHeader h = Value(PeekChunkHeader(chunk));
      context_chunks += h.encoding == ChunkEncoding::kContext;
      dense_chunks += h.encoding == ChunkEncoding::kDense;
      ASSERT_TRUE(applier->Apply(chunk, dspan(s), span).ok());
      if (s == 3) {
        std::vector<std::byte> repair;
        ASSERT_TRUE(
            Value(enc->EncodeDiff(ChunkKind::kOverwrite, {0, 3, 0}, w,
                                  sub(target, s), sub(want, s), &repair)));
        ASSERT_TRUE(applier->Apply(repair, dspan(s), span).ok());
      }
    }
    EXPECT_GT(context_chunks, 0);
    EXPECT_GT(dense_chunks, 0);
    // Bad chunks change nothing: a torn one and one for another span size.
    std::vector<std::byte> chunk;
    ASSERT_TRUE(Value(enc->EncodeDiff(ChunkKind::kXor, {0, 4, 0}, w,
                                      sub(target, 4), sub(base, 4), &chunk)));
    std::vector<std::byte> torn = chunk;
    torn[torn.size() / 2] ^= std::byte{1};
    EXPECT_FALSE(applier->Apply(torn, dspan(4), span).ok());
    EXPECT_FALSE(applier->Apply(chunk, dspan(4), span - 1).ok());
    ASSERT_TRUE(applier->Flush().ok());
    EXPECT_EQ(Download(d.data(), want.size()), want);
    EXPECT_EQ(applier->stats().chunks, spans + 1);
    if (staging < (1 << 20)) {
      EXPECT_GT(applier->stats().pieces, spans + 1);
    }
  }
  EXPECT_FALSE(ChunkApplier::Create({1024, 4}).ok());
  EXPECT_FALSE(ChunkApplier::Create({1 << 20, 0}).ok());
}

// FP8 block requantization against the CPU's: BF16, F16 and F32 sources
// with NaNs of both signs, infinities, subnormals, zeros and values far past
// 448; partial edge blocks, an all-zero block (the scale floor), blocks of
// other shapes; only the marked blocks may change.
TEST_F(CudaTest, RequantizeFp8MatchesTheCpu) {
  struct Shape {
    uint64_t rows, cols;
    uint32_t br, bc;
  };
  const std::vector<Shape> shapes = {{300, 200, 128, 128},
                                     {1, 1000, 128, 128},
                                     {257, 129, 1, 64},
                                     {64, 64, 128, 128}};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " +
                   std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                   " blocks " + std::to_string(sh.br) + "x" +
                   std::to_string(sh.bc));
      Fp8Tensor t;
      t.dtype = dtype;
      t.rows = sh.rows;
      t.cols = sh.cols;
      t.block_rows = sh.br;
      t.block_cols = sh.bc;
      const size_t w = DTypeSize(dtype);
      const uint64_t n = t.elements();
      std::vector<std::byte> src(n * w);
      const std::vector<uint32_t> special32 = {
          0x7fc00000, 0xffc00001, 0x7f800000, 0xff800000, 0x00000001,
          0x80000003, 0x00000000, 0x80000000, 0x4b000000, 0x3c7fffff};
      for (uint64_t i = 0; i < n; ++i) {
        uint32_t bits;
        if (rng_() % 50 == 0) {
          bits = special32[rng_() % special32.size()];
        } else {
          // Mostly normal magnitudes around 2^-8..2^4, some tiny.
          const float v =
              std::ldexp(float(rng_() % 1000) / 1000.0f + 0.5f,
                         int(rng_() % 13) - 8 - (rng_() % 9 == 0 ? 20 : 0));
          std::memcpy(&bits, &v, 4);
          bits |= (rng_() & 1) << 31;
        }
        if (dtype == DType::kF32) {
          std::memcpy(src.data() + 4 * i, &bits, 4);
        } else if (dtype == DType::kBF16) {
          const uint16_t h = static_cast<uint16_t>(bits >> 16);
          std::memcpy(src.data() + 2 * i, &h, 2);
        } else {
          float f;
          std::memcpy(&f, &bits, 4);
          uint16_t h = FloatToHalf(f);
          if (rng_() % 40 == 0)
            h = static_cast<uint16_t>(rng_() % 0x400);              // subnormal
          if (rng_() % 97 == 0) h = 0x7e01 | ((rng_() & 1) << 15);  // NaN
          std::memcpy(src.data() + 2 * i, &h, 2);
        }
      }
      // One block all zeros: its scale is the floor's.
      const uint64_t bw = std::min<uint64_t>(sh.bc, t.cols);
      for (uint64_t r = 0; r < std::min<uint64_t>(sh.br, t.rows); ++r) {
        std::memset(src.data() + (r * t.cols) * w, 0, bw * w);
      }
      // The state before: poison, so unmarked blocks must stay poison.
      std::vector<uint8_t> q(n, 0xA5);
      std::vector<float> scales(t.blocks(), -1.0f);
      Fp8BlockSet marked(t);
      // Every third block or so, by an element inside it; the first
      // (all zeros) always, the last never.
      for (uint64_t b = 0; b < t.blocks(); ++b) {
        if (b != 0 && (b + 1 == t.blocks() || rng_() % 3 != 0)) continue;
        const uint64_t r = b / t.blocks_across() * sh.br;
        const uint64_t c = b % t.blocks_across() * sh.bc;
        marked.MarkRange(r * t.cols + c, 1);
      }
      ASSERT_GT(marked.count(), 0u);
      ASSERT_LT(marked.count(), t.blocks() > 1 ? t.blocks() : 2);
      std::vector<uint8_t> want_q = q;
      std::vector<float> want_s = scales;
      ASSERT_TRUE(dcr::RequantizeFp8(t, src, marked, want_q, want_s).ok());
      DeviceBuffer d_src = Upload(src);
      DeviceBuffer d_q = Upload(std::as_bytes(std::span(q)));
      DeviceBuffer d_s = Upload(std::as_bytes(std::span(scales)));
      ASSERT_TRUE(RequantizeFp8(t, d_src.data(), marked,
                                static_cast<uint8_t*>(d_q.data()),
                                static_cast<float*>(d_s.data()))
                      .ok());
      auto got_q = Download(d_q.data(), n);
      auto got_s = Download(d_s.data(), scales.size() * 4);
      ASSERT_EQ(0, std::memcmp(got_q.data(), want_q.data(), n));
      ASSERT_EQ(0, std::memcmp(got_s.data(), want_s.data(), got_s.size()));
    }
  }
  Fp8Tensor per_tensor;
  per_tensor.rows = 4;
  per_tensor.cols = 4;
  per_tensor.block_rows = per_tensor.block_cols = 0;
  DeviceBuffer d = Alloc(64);
  EXPECT_EQ(RequantizeFp8(per_tensor, d.data(), Fp8BlockSet(per_tensor),
                          static_cast<uint8_t*>(d.data()),
                          static_cast<float*>(d.data()))
                .code(),
            StatusCode::kUnsupported);
}

// Work the caller queued on its own non-blocking stream comes first: a
// dense XOR written there right before, then the applier's chunk and the
// digest, both given that stream, see its result (a race would read the
// span before the XOR landed).
TEST_F(CudaTest, AppliesAndDigestsFollowTheCallersStream) {
  const size_t w = 2;
  const uint64_t n = 1 << 22;  // 8 MiB: the XOR takes a while
  auto enc = Value(ChunkEncoder::Create(EncodeOptions{}));
  auto digester = Value(Digester::Create());
  OwnedStream s = Value(OwnedStream::Create());
  // The caller's kernel XORs `mask` into the base, giving `mid`; the
  // chunk overwrites `mid` into `want`. Had the overwrite landed before
  // the XOR, its elements would read want ^ mask; had the digest read
  // before it, it would be the base's.
  std::vector<std::byte> base(n * w), mask(n * w), mid(n * w), want;
  for (size_t i = 0; i < base.size(); ++i) {
    base[i] = static_cast<std::byte>(rng_());
    mask[i] = static_cast<std::byte>(rng_() | 1);
    mid[i] = base[i] ^ mask[i];
  }
  want = mid;
  for (uint64_t e = 0; e < n; e += 1 + rng_() % 60) {
    want[e * w] ^= std::byte{0x5a};
  }
  std::vector<std::byte> chunk;
  ASSERT_TRUE(Value(
      enc->EncodeDiff(ChunkKind::kOverwrite, {0, 0, 0}, w, mid, want, &chunk)));
  auto applier = Value(ChunkApplier::Create({1 << 20, 4}));
  for (int round = 0; round < 3; ++round) {
    DeviceBuffer d = Upload(base), m = Upload(mask);
    ASSERT_TRUE(
        ApplyDense(ChunkKind::kXor, w, d.data(), n, m.data(), s.get()).ok());
    EXPECT_EQ(Value(digester->TensorDigest(d.data(), n * w, s.get())),
              TensorDigest(mid));
    ASSERT_TRUE(Synchronize(s.get()).ok());
    ASSERT_TRUE(CopyToDevice(d.data(), base).ok());
    ASSERT_TRUE(
        ApplyDense(ChunkKind::kXor, w, d.data(), n, m.data(), s.get()).ok());
    ASSERT_TRUE(applier->Apply(chunk, d.data(), n, s.get()).ok());
    ASSERT_TRUE(applier->Flush().ok());
    ASSERT_EQ(Download(d.data(), n * w), want) << "round " << round;
  }
}

// The IPC peer: $DCR_CUDA_IPC_PEER, else beside this binary (where
// bench/gpu_check.sh --pack puts it), else where the build put it.
std::string PeerPath() {
  if (const char* e = std::getenv("DCR_CUDA_IPC_PEER")) return e;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    if (::access((dir + "/cuda_ipc_peer").c_str(), X_OK) == 0) {
      return dir + "/cuda_ipc_peer";
    }
  }
  return DCR_CUDA_IPC_PEER;
}

// A serving process's weights, in its own device buffers (two tensors in
// one allocation at an offset, as a caching allocator places them, and one
// in another), exported through CUDA IPC; another process, the relay,
// fetches the manifest, maps them and applies a refit's chunks in place.
// The server then holds the target's bits, and the relay's device digests
// are the target's.
TEST_F(CudaTest, ARelayAppliesIntoAServingProcesssBuffersThroughIpc) {
  const uint64_t span = 1 << 16;
  struct T {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    size_t alloc;
    size_t offset;
  };
  const std::vector<T> specs = {
      {"model.a.weight", DType::kBF16, {700, 500}, 0, 0},
      {"model.b.bias", DType::kF32, {70001}, 0, 700 * 500 * 2 + 256},
      {"model.c.weight", DType::kBF16, {3, 65536}, 1, 512}};
  std::vector<DeviceBuffer> allocs;
  allocs.push_back(Alloc(4 << 20));
  allocs.push_back(Alloc(1 << 20));
  auto enc = Value(ChunkEncoder::Create(EncodeOptions{}));
  char dir_template[] = "/tmp/dcr-cuda-ipc-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  IpcManifest manifest;
  manifest.device = Value(Probe()).devices.front().pci_bus_id;
  std::vector<std::vector<std::byte>> targets;
  std::vector<void*> ptrs;
  for (const T& t : specs) {
    const size_t w = DTypeSize(t.dtype);
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    std::vector<std::byte> base, target;
    if (t.dtype == DType::kBF16) {
      AdamLikeBf16(n, rng_, &base, &target);
    } else {
      MakeSpans({w, n, 0.05}, rng_, &base, &target);
    }
    void* p = static_cast<char*>(allocs[t.alloc].data()) + t.offset;
    ASSERT_TRUE(CopyToDevice(p, base).ok());
    ptrs.push_back(p);
    manifest.tensors.push_back(
        Value(ExportIpcTensor(t.name, t.dtype, t.shape, p)));
    EXPECT_EQ(manifest.tensors.back().offset, t.offset);
    std::vector<std::byte> chunks;
    for (uint64_t s = 0; s * span < n; ++s) {
      const uint64_t k = std::min(span, n - s * span);
      auto b = std::span<const std::byte>(base).subspan(s * span * w, k * w);
      auto g = std::span<const std::byte>(target).subspan(s * span * w, k * w);
      ASSERT_TRUE(enc->EncodeDiffInContext(ChunkKind::kXor, {0, uint32_t(s), 0},
                                           w, ExponentFieldOf(t.dtype), b, g,
                                           &chunks)
                      .ok());
    }
    std::ofstream(dir + "/" + t.name + ".chunks", std::ios::binary)
        .write(reinterpret_cast<const char*>(chunks.data()),
               static_cast<std::streamsize>(chunks.size()));
    targets.push_back(std::move(target));
  }
  // Two tensors share an allocation: one handle.
  EXPECT_EQ(manifest.tensors[0].handle, manifest.tensors[1].handle);
  EXPECT_NE(manifest.tensors[0].handle, manifest.tensors[2].handle);
  auto server = Value(IpcServer::Start(dir + "/ipc.sock", manifest));

  const std::string peer = PeerPath();
  const std::string out = dir + "/peer.out";
  const std::string cmd = "'" + peer + "' '" + dir + "/ipc.sock' '" + dir +
                          "' " + std::to_string(span) + " > '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string name, hex;
    ASSERT_TRUE(in >> name >> hex);
    EXPECT_EQ(name, specs[i].name);
    EXPECT_EQ(hex, TensorDigest(targets[i]).ToHex()) << name;
    EXPECT_EQ(Download(ptrs[i], targets[i].size()), targets[i]) << name;
  }
  server.reset();
  // A manifest whose tensor runs past its allocation is refused before
  // anything is mapped for writing.
  IpcManifest bad = manifest;
  bad.tensors[2].offset = (1 << 20) - 256;
  auto bad_server = Value(IpcServer::Start(dir + "/bad.sock", bad));
  const std::string bad_cmd = "'" + peer + "' '" + dir + "/bad.sock' '" + dir +
                              "' " + std::to_string(span) + " 2> '" + out + "'";
  EXPECT_NE(std::system(bad_cmd.c_str()), 0);
  std::ifstream err(out);
  std::string line;
  std::getline(err, line);
  EXPECT_NE(line.find("runs past the end of its exported allocation"),
            std::string::npos)
      << line;
  bad_server.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcr::cuda
