// The pipeline around the CUDA kernels (dcr/cuda.h): the chunk applier
// (pieces, every encoding, repairs, bad chunks, the caller's stream) and a
// relay process applying a refit into another process's buffers through
// CUDA IPC. Skipped, with the driver's reason, without a usable GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "dcr/codec.h"
#include "dcr/cuda.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"

namespace dcr::cuda {
namespace {

using namespace cudatest;  // NOLINT: the shared fixture and helpers

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

// Changes decoded elsewhere (a relay's diff of two host images) through
// the same pieces: every element size, XOR and overwrite, an empty list,
// positions at the span's ends and past it (skipped), staging small
// enough for pieces; the device ends with the CPU's result. Bad arguments
// enqueue nothing.
TEST_F(CudaTest, ApplyDecodedMatchesTheCpu) {
  auto applier = Value(ChunkApplier::Create({64 << 10, 4}));
  for (size_t w : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
    for (ChunkKind kind : {ChunkKind::kXor, ChunkKind::kOverwrite}) {
      SCOPED_TRACE("w=" + std::to_string(w));
      const uint64_t n = 50000;
      std::vector<std::byte> span(n * w);
      for (std::byte& b : span) b = static_cast<std::byte>(rng_());
      std::vector<uint32_t> positions = {0};
      for (uint32_t p = 1 + rng_() % 5; p < n - 1; p += 1 + rng_() % 9) {
        positions.push_back(p);
      }
      positions.push_back(n - 1);
      std::vector<std::byte> values(positions.size() * w);
      for (std::byte& b : values) b = static_cast<std::byte>(rng_());
      std::vector<std::byte> want = span;
      for (size_t k = 0; k < positions.size(); ++k) {
        for (size_t j = 0; j < w; ++j) {
          std::byte& e = want[positions[k] * w + j];
          e = kind == ChunkKind::kXor ? e ^ values[k * w + j]
                                      : values[k * w + j];
        }
      }
      // Past the span: never written.
      positions.push_back(n + 3);
      values.resize(values.size() + w, std::byte{0xee});
      DeviceBuffer d = Upload(span);
      ASSERT_TRUE(
          applier->ApplyDecoded(kind, w, d.data(), n, positions, values).ok());
      ASSERT_TRUE(applier->ApplyDecoded(kind, w, d.data(), n, {}, {}).ok());
      EXPECT_FALSE(applier
                       ->ApplyDecoded(kind, w, d.data(), n, positions,
                                      std::span(values).first(w))
                       .ok());
      EXPECT_FALSE(
          applier->ApplyDecoded(kind, 3, d.data(), n, positions, values).ok());
      ASSERT_TRUE(applier->Flush().ok());
      EXPECT_EQ(Download(d.data(), want.size()), want);
    }
  }
  EXPECT_GT(applier->stats().pieces, 8u);
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
  return HelperBinary("cuda_ipc_peer", "DCR_CUDA_IPC_PEER", DCR_CUDA_IPC_PEER);
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
