// The CUDA kernels (dcr/cuda.h) against their CPU references on random
// inputs: every element size, densities from 0 to 100%, changes at the
// first and last element and at tile edges, NaN/Inf/denormal/signed-zero
// bit patterns, aligned and misaligned spans, outputs poisoned before each
// run. Without a usable GPU every test is skipped with the driver's reason
// (ctest reports it as skipped, never as passed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"
#include "dcr/fp8.h"
#include "dcr/shard_diff.h"

namespace dcr::cuda {
namespace {

using namespace cudatest;  // NOLINT: the shared fixture and helpers

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

}  // namespace
}  // namespace dcr::cuda
