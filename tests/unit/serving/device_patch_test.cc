// StageDeviceChanges and the patches SyncDeviceWeights writes from it
// (relay/device_weights.h), against GPU buffers faked in host memory: the
// diff of two host images finds exactly the changed elements, a pause
// writes only those, and whatever the patches do not cover (too dense,
// over the budget, no base, buffers not at the base) is still rewritten.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "unit/serving/gpu_serving_testing.h"

namespace dcr {
namespace {

using serving_testing::FakeGpu;

std::unique_ptr<WeightStore> MemoryStore(const std::vector<TensorInfo>& t) {
  auto m = Manifest::Create(t);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  auto s = CreateStore(*ParseStoreSpec("memory:"), *m);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *std::move(s);
}

void Randomize(WeightStore& s, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t t = 0; t < s.manifest().size(); ++t) {
    for (std::byte& b : s.MutableTensor(t)) b = std::byte(rng());
  }
}

// Copies `from` into `to`, then changes the elements of tensor t at
// `positions` (every byte of each, so each element differs).
void CopyAndChange(const WeightStore& from, WeightStore& to, size_t t,
                   const std::vector<uint64_t>& positions) {
  for (size_t i = 0; i < from.manifest().size(); ++i) {
    std::memcpy(to.MutableTensor(i).data(), from.Tensor(i).data(),
                from.Tensor(i).size());
  }
  const size_t w = DTypeSize(from.manifest()[t].dtype);
  for (uint64_t p : positions) {
    for (size_t j = 0; j < w; ++j) {
      to.MutableTensor(t)[p * w + j] ^= std::byte{0x5a};
    }
  }
}

// A device holding `s`'s bits.
void Load(FakeGpu& gpu, const WeightStore& s) {
  for (size_t i = 0; i < gpu.tensors().size(); ++i) {
    auto b =
        s.Tensor(static_cast<size_t>(s.manifest().Find(gpu.tensors()[i].name)));
    gpu.bytes(i).assign(b.begin(), b.end());
  }
}

void ExpectHolds(FakeGpu& gpu, const WeightStore& s) {
  for (size_t i = 0; i < gpu.tensors().size(); ++i) {
    auto b =
        s.Tensor(static_cast<size_t>(s.manifest().Find(gpu.tensors()[i].name)));
    EXPECT_TRUE(std::equal(b.begin(), b.end(), gpu.bytes(i).begin(),
                           gpu.bytes(i).end()))
        << gpu.tensors()[i].name;
  }
}

// Named in the manifest's (sorted) order, so that a tensor's index in
// a store is its index on the device.
const std::vector<TensorInfo> kTensors = {{"a_bf16", DType::kBF16, {1000}},
                                          {"b_u8", DType::kU8, {500}},
                                          {"c_f32", DType::kF32, {300}},
                                          {"d_f64", DType::kF64, {10, 20}},
                                          {"e_same", DType::kBF16, {64}}};

TEST(StageDeviceChangesTest, FindsTheChangedElementsAndTheTargetsDigests) {
  auto base = MemoryStore(kTensors);
  auto target = MemoryStore(kTensors);
  Randomize(*base, 1);
  // The first and last elements, and a few between, in each tensor but
  // the last.
  const std::vector<std::vector<uint64_t>> changes = {
      {0, 17, 512, 999}, {0, 499}, {5, 299}, {0, 100, 199}, {}};
  CopyAndChange(*base, *target, 0, changes[0]);
  for (size_t t = 1; t < changes.size(); ++t) {
    for (uint64_t p : changes[t]) {
      const size_t w = DTypeSize(kTensors[t].dtype);
      for (size_t j = 0; j < w; ++j) {
        target->MutableTensor(t)[p * w + j] ^= std::byte{0x81};
      }
    }
  }
  FakeGpu gpu(kTensors);
  ThreadPool pool(3);
  auto staged = StageDeviceChanges(gpu.tensors(), base.get(), *target, &pool,
                                   uint64_t{1} << 20);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_EQ(staged->changed, 4u);
  EXPECT_EQ(staged->patched, 4u);
  ASSERT_EQ(staged->patches.size(), 4u);
  uint64_t bytes = 0;
  for (size_t t = 0; t < 4; ++t) {
    const DevicePatch& p = staged->patches[t];
    const size_t w = DTypeSize(kTensors[t].dtype);
    EXPECT_EQ(p.tensor, t);
    EXPECT_EQ(p.first, 0u);
    ASSERT_EQ(p.positions.size(), changes[t].size()) << t;
    for (size_t k = 0; k < p.positions.size(); ++k) {
      EXPECT_EQ(p.positions[k], changes[t][k]);
      // The target's value, not the XOR mask.
      EXPECT_EQ(0,
                std::memcmp(p.values.data() + k * w,
                            target->Tensor(t).data() + changes[t][k] * w, w));
    }
    bytes += p.positions.size() * (4 + w);
  }
  EXPECT_EQ(staged->bytes, bytes);
  ASSERT_EQ(staged->target.size(), kTensors.size());
  for (size_t t = 0; t < kTensors.size(); ++t) {
    EXPECT_EQ(staged->target[t], TensorDigest(target->Tensor(t))) << t;
  }
  // Without a pool: the same.
  auto serial = StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr,
                                   uint64_t{1} << 20);
  ASSERT_TRUE(serial.ok());
  EXPECT_EQ(serial->target, staged->target);
  EXPECT_EQ(serial->bytes, staged->bytes);
}

TEST(StageDeviceChangesTest, APauseWritesOnlyThePatches) {
  auto base = MemoryStore(kTensors);
  auto target = MemoryStore(kTensors);
  Randomize(*base, 2);
  CopyAndChange(*base, *target, 0, {3, 4, 900});
  FakeGpu gpu(kTensors);
  Load(gpu, *base);
  auto staged = StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr,
                                   uint64_t{1} << 20);
  ASSERT_TRUE(staged.ok());
  auto sync = SyncDeviceWeights(gpu, *target, nullptr, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->patched, 1u);
  EXPECT_EQ(sync->patched_bytes, 3u * 6);
  EXPECT_EQ(sync->rewritten, 0u);
  EXPECT_EQ(gpu.patches, 1);
  EXPECT_EQ(gpu.writes, 0);
  ExpectHolds(gpu, *target);
}

TEST(StageDeviceChangesTest, BuffersNotAtTheBaseAreRewrittenAfterTheirPatch) {
  auto base = MemoryStore(kTensors);
  auto target = MemoryStore(kTensors);
  Randomize(*base, 3);
  CopyAndChange(*base, *target, 0, {10});
  FakeGpu gpu(kTensors);
  Load(gpu, *base);
  // Changed behind the relay's back, in an element the refit left alone.
  gpu.bytes(0)[40] ^= std::byte{1};
  auto staged = StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr,
                                   uint64_t{1} << 20);
  ASSERT_TRUE(staged.ok());
  auto sync = SyncDeviceWeights(gpu, *target, nullptr, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->patched, 1u);
  EXPECT_EQ(sync->rewritten, 1u);
  ExpectHolds(gpu, *target);
}

TEST(StageDeviceChangesTest, DenseTensorsAndThoseOverTheBudgetAreRewritten) {
  auto base = MemoryStore(kTensors);
  auto target = MemoryStore(kTensors);
  Randomize(*base, 4);
  // bf16: 200 of 1000 changed, past a sixth: 1200 bytes of patch against
  // 2000 of tensor.
  std::vector<uint64_t> dense;
  for (uint64_t p = 0; p < 1000; p += 5) dense.push_back(p);
  CopyAndChange(*base, *target, 0, dense);
  // f32: 10 changes (80 bytes of patch); u8: 20 (100 bytes).
  for (uint64_t p = 0; p < 10; ++p)
    target->MutableTensor(2)[p * 4] ^= std::byte{1};
  for (uint64_t p = 0; p < 20; ++p)
    target->MutableTensor(1)[p * 7] ^= std::byte{1};
  FakeGpu gpu(kTensors);
  Load(gpu, *base);
  // Room for one of the two sparse tensors' patches.
  auto staged =
      StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr, 100);
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(staged->changed, 3u);
  EXPECT_EQ(staged->patched, 1u);
  EXPECT_LE(staged->bytes, 100u);
  ASSERT_EQ(staged->patches.size(), 1u);
  auto sync = SyncDeviceWeights(gpu, *target, nullptr, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->patched, 1u);
  EXPECT_EQ(sync->rewritten, 2u);
  ExpectHolds(gpu, *target);
  // A budget of nothing: every changed tensor rewritten.
  Load(gpu, *base);
  staged = StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr, 0);
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(staged->patched, 0u);
  EXPECT_TRUE(staged->patches.empty());
  sync = SyncDeviceWeights(gpu, *target, nullptr, &*staged);
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(sync->rewritten, 3u);
  ExpectHolds(gpu, *target);
}

TEST(StageDeviceChangesTest, TensorsWithoutABaseTwinAreNotPatched) {
  auto target = MemoryStore(kTensors);
  Randomize(*target, 5);
  FakeGpu gpu(kTensors);
  // No base at all (a first flip): only the digests.
  auto staged =
      StageDeviceChanges(gpu.tensors(), nullptr, *target, nullptr, 1 << 20);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_TRUE(staged->patches.empty());
  EXPECT_EQ(staged->target[3], TensorDigest(target->Tensor(3)));
  // A base that lacks one tensor and holds another with another shape.
  std::vector<TensorInfo> other = kTensors;
  other[0].shape = {10, 100};
  other.erase(other.begin() + 1);
  auto base = MemoryStore(other);
  for (size_t i = 0; i < other.size(); ++i) {
    std::memcpy(base->MutableTensor(i).data(),
                target
                    ->Tensor(static_cast<size_t>(
                        target->manifest().Find(other[i].name)))
                    .data(),
                base->Tensor(i).size());
  }
  base->MutableTensor(1)[0] ^= std::byte{1};  // f32 changes: patched
  staged =
      StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr, 1 << 20);
  ASSERT_TRUE(staged.ok());
  ASSERT_EQ(staged->patches.size(), 1u);
  EXPECT_EQ(staged->patches[0].tensor, 2u);
  // bf16 and u8 count as changed: nothing says they are not.
  EXPECT_EQ(staged->changed, 3u);
  EXPECT_EQ(staged->patched, 1u);
  // A target that lacks a device tensor is refused, as the sync refuses it.
  FakeGpu stranger({{"kv_cache", DType::kBF16, {4}}});
  EXPECT_EQ(
      StageDeviceChanges(stranger.tensors(), base.get(), *target, nullptr, 0)
          .status()
          .code(),
      StatusCode::kInvalidArgument);
}

// Fills a large store fast: a 64-bit LCG per 8 bytes.
void FastRandomize(WeightStore& s, uint64_t seed) {
  for (size_t t = 0; t < s.manifest().size(); ++t) {
    auto b = s.MutableTensor(t);
    for (size_t i = 0; i + 8 <= b.size(); i += 8) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      std::memcpy(b.data() + i, &seed, 8);
    }
  }
}

// Tensors of several sub-blocks of the diff (2^18 elements), with wide
// elements and random bits: positions and values land at their offsets.
TEST(StageDeviceChangesTest, WideElementsArePatchedAtTheirOffsets) {
  const uint64_t block = uint64_t{1} << 18;
  const std::vector<TensorInfo> t = {{"a", DType::kBF16, {3 * block + 7}},
                                     {"b", DType::kF32, {block + 1}}};
  auto base = MemoryStore(t);
  auto target = MemoryStore(t);
  FastRandomize(*base, 11);
  const std::vector<uint64_t> a = {1, block - 1, block, 2 * block + 3,
                                   3 * block + 6};
  CopyAndChange(*base, *target, 0, a);
  for (size_t j = 0; j < 4; ++j) {
    target->MutableTensor(1)[block * 4 + j] ^= std::byte{0x33};
  }
  FakeGpu gpu(t);
  Load(gpu, *base);
  ThreadPool pool(2);
  auto staged =
      StageDeviceChanges(gpu.tensors(), base.get(), *target, &pool, 1 << 20);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_EQ(staged->patches.size(), 2u);
  const DevicePatch& pa = staged->patches[0];
  ASSERT_EQ(pa.positions.size(), a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(pa.positions[k], a[k]);
    EXPECT_EQ(0, std::memcmp(pa.values.data() + 2 * k,
                             target->Tensor(0).data() + 2 * a[k], 2));
  }
  EXPECT_EQ(staged->patches[1].positions,
            std::vector<uint32_t>{uint32_t(block)});
  EXPECT_EQ(staged->target[0], TensorDigest(target->Tensor(0)));
  EXPECT_EQ(staged->target[1], TensorDigest(target->Tensor(1)));
  auto sync = SyncDeviceWeights(gpu, *target, &pool, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->patched, 2u);
  EXPECT_EQ(sync->rewritten, 0u);
  ExpectHolds(gpu, *target);
}

// A tensor that reserves budget in its first sub-block and then turns
// dense gives that budget back: a later tensor fits in it.
TEST(StageDeviceChangesTest, ATensorThatTurnsDenseGivesItsBudgetBack) {
  const uint64_t block = uint64_t{1} << 18;
  const std::vector<TensorInfo> t = {{"a", DType::kBF16, {2 * block}},
                                     {"b", DType::kBF16, {1000}}};
  auto base = MemoryStore(t);
  auto target = MemoryStore(t);
  FastRandomize(*base, 12);
  // "a": 100 changes in its first sub-block, every element of its second.
  std::vector<uint64_t> a;
  for (uint64_t p = 0; p < 100; ++p) a.push_back(p * 7);
  for (uint64_t p = block; p < 2 * block; ++p) a.push_back(p);
  CopyAndChange(*base, *target, 0, a);
  // "b": 50 changes, 300 bytes of patch; "a"'s first sub-block held 600.
  for (uint64_t p = 0; p < 50; ++p) {
    target->MutableTensor(1)[p * 2 * 3] ^= std::byte{1};
  }
  FakeGpu gpu(t);
  auto staged =
      StageDeviceChanges(gpu.tensors(), base.get(), *target, nullptr, 800);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_EQ(staged->changed, 2u);
  EXPECT_EQ(staged->patched, 1u);
  ASSERT_EQ(staged->patches.size(), 1u);
  EXPECT_EQ(staged->patches[0].tensor, 1u);
  EXPECT_EQ(staged->bytes, 300u);
}

TEST(StageDeviceChangesTest, ALongTensorIsPatchedInStretches) {
  const uint64_t n = kPatchStretchElems + 1000;
  const std::vector<TensorInfo> t = {{"embed", DType::kBF16, {n}}};
  auto base = MemoryStore(t);
  auto target = MemoryStore(t);
  FastRandomize(*base, 13);
  CopyAndChange(*base, *target, 0,
                {0, kPatchStretchElems - 1, kPatchStretchElems, n - 1});
  FakeGpu gpu(t);
  Load(gpu, *base);
  ThreadPool pool(2);
  auto staged =
      StageDeviceChanges(gpu.tensors(), base.get(), *target, &pool, 1 << 20);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_EQ(staged->patches.size(), 2u);
  EXPECT_EQ(staged->patches[0].first, 0u);
  EXPECT_EQ(staged->patches[0].positions,
            (std::vector<uint32_t>{0, uint32_t(kPatchStretchElems - 1)}));
  EXPECT_EQ(staged->patches[1].first, kPatchStretchElems);
  EXPECT_EQ(staged->patches[1].positions, (std::vector<uint32_t>{0, 999}));
  EXPECT_EQ(staged->target[0], TensorDigest(target->Tensor(0)));
  auto sync = SyncDeviceWeights(gpu, *target, &pool, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->patched, 1u);
  EXPECT_EQ(sync->rewritten, 0u);
  EXPECT_EQ(gpu.patches, 2);
  ExpectHolds(gpu, *target);
}

// Random images, densities from none to all, and budgets from nothing to
// plenty: the device always ends at the target, and a patched tensor is
// never also rewritten when the device held the base.
TEST(StageDeviceChangesTest, AnyDiffAndBudgetEndsAtTheTarget) {
  std::mt19937 rng(7);
  const DType dtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64};
  for (int round = 0; round < 30; ++round) {
    std::vector<TensorInfo> t;
    const size_t count = 1 + rng() % 6;
    for (size_t i = 0; i < count; ++i) {
      t.push_back({"t" + std::to_string(i),
                   dtypes[rng() % 4],
                   {uint64_t(rng() % 3000)}});
    }
    auto base = MemoryStore(t);
    auto target = MemoryStore(t);
    Randomize(*base, rng());
    for (size_t i = 0; i < count; ++i) {
      auto from = base->Tensor(i);
      auto to = target->MutableTensor(i);
      std::memcpy(to.data(), from.data(), from.size());
      const size_t w = DTypeSize(t[i].dtype);
      const double density = std::uniform_real_distribution<>(0, 1)(rng) *
                             (rng() % 2 ? 1.0 : 0.05);
      for (uint64_t e = 0; e < t[i].NumElements(); ++e) {
        if (std::uniform_real_distribution<>(0, 1)(rng) < density) {
          to[e * w + rng() % w] ^= std::byte{0x10};
        }
      }
    }
    FakeGpu gpu(t);
    Load(gpu, *base);
    const uint64_t budget = rng() % 2 ? rng() % 20000 : uint64_t{1} << 30;
    ThreadPool pool(1 + rng() % 3);
    auto staged =
        StageDeviceChanges(gpu.tensors(), base.get(), *target, &pool, budget);
    ASSERT_TRUE(staged.ok()) << staged.status().ToString();
    EXPECT_LE(staged->bytes, budget);
    auto sync = SyncDeviceWeights(gpu, *target, &pool, &*staged);
    ASSERT_TRUE(sync.ok()) << sync.status().ToString();
    EXPECT_EQ(sync->patched, staged->patched);
    EXPECT_EQ(sync->rewritten, staged->changed - staged->patched) << round;
    ExpectHolds(gpu, *target);
  }
}

}  // namespace
}  // namespace dcr
