// SyncDeviceWeights (relay/device_weights.h) against GPU
// buffers faked in host memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "unit/serving/gpu_serving_testing.h"

namespace dcr {
namespace {

using serving_testing::FakeGpu;
using serving_testing::Filled;
using ::testing::HasSubstr;

TEST(SyncDeviceWeightsTest, RewritesOnlyTheTensorsThatDiffer) {
  auto m = Manifest::Create({{"a", DType::kBF16, {4}},
                             {"b", DType::kU8, {3}},
                             {"c", DType::kF32, {2}}});
  ASSERT_TRUE(m.ok());
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  for (size_t t = 0; t < 3; ++t) {
    auto b = (*host)->MutableTensor(t);
    std::memset(b.data(), 0x30 + static_cast<int>(t), b.size());
  }
  // The device holds "a" and "c" (not every store tensor is computed
  // with); "c" already matches.
  FakeGpu gpu({(*m)[0], (*m)[2]});
  gpu.bytes(1) = Filled(8, 0x32);
  ThreadPool pool(2);
  auto sync = SyncDeviceWeights(gpu, **host, &pool);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->tensors, 2u);
  EXPECT_EQ(sync->rewritten, 1u);
  EXPECT_EQ(sync->rewritten_bytes, 8u);
  EXPECT_EQ(gpu.writes, 1);
  EXPECT_EQ(gpu.bytes(0), Filled(8, 0x30));
  // In step: nothing to write.
  sync = SyncDeviceWeights(gpu, **host, nullptr);
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(sync->rewritten, 0u);
  EXPECT_EQ(gpu.writes, 1);
}

TEST(SyncDeviceWeightsTest, TakesTheStagedDigestsInsteadOfHashing) {
  auto m = Manifest::Create({{"a", DType::kU8, {6}}, {"b", DType::kU8, {2}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  std::memset((*host)->MutableTensor(0).data(), 1, 6);
  std::memset((*host)->MutableTensor(1).data(), 2, 2);
  FakeGpu gpu(m->tensors());
  // No base: the digests only.
  auto staged = StageDeviceChanges(gpu.tensors(), nullptr, **host, nullptr, 0);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_EQ(staged->target.size(), 2u);
  EXPECT_EQ(staged->target[1], TensorDigest(Filled(2, 2)));
  auto sync = SyncDeviceWeights(gpu, **host, nullptr, &*staged);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->rewritten, 2u);
  EXPECT_EQ(gpu.bytes(0), Filled(6, 1));
  // Digests that are not the host's: the check after the write says so,
  // which shows they were used rather than computed again.
  gpu.bytes(0) = Filled(6, 9);
  DeviceChanges wrong = *staged;
  wrong.target[0] = TensorDigest(Filled(6, 5));
  sync = SyncDeviceWeights(gpu, **host, nullptr, &wrong);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.status().code(), StatusCode::kCorruption);
  // Of another tensor list: refused.
  wrong.target.pop_back();
  EXPECT_EQ(SyncDeviceWeights(gpu, **host, nullptr, &wrong).status().code(),
            StatusCode::kInternal);
}

TEST(SyncDeviceWeightsTest, RefusesTensorsTheHostDoesNotHoldAlike) {
  auto m = Manifest::Create({{"a", DType::kBF16, {4}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  {
    FakeGpu gpu({{"kv_cache", DType::kBF16, {4}}});
    auto sync = SyncDeviceWeights(gpu, **host, nullptr);
    ASSERT_FALSE(sync.ok());
    EXPECT_EQ(sync.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(sync.status().message(), HasSubstr("'kv_cache' is not in"));
  }
  {
    FakeGpu gpu({{"a", DType::kBF16, {2, 2}}});
    auto sync = SyncDeviceWeights(gpu, **host, nullptr);
    ASSERT_FALSE(sync.ok());
    EXPECT_THAT(sync.status().message(),
                HasSubstr("'a' is [2, 2] BF16, memory: holds it as [4] BF16"));
    EXPECT_EQ(gpu.writes, 0);
  }
}

TEST(SyncDeviceWeightsTest, AWriteTheDeviceDoesNotHoldIsCorruption) {
  auto m = Manifest::Create({{"a", DType::kU8, {5}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  std::memset((*host)->MutableTensor(0).data(), 7, 5);
  FakeGpu gpu({(*m)[0]});
  gpu.drop_writes = true;
  auto sync = SyncDeviceWeights(gpu, **host, nullptr);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(sync.status().message(),
              HasSubstr("'a' does not hold what was written"));
}

}  // namespace
}  // namespace dcr
