// CheckIpcManifest: a serving process's exported GPU buffers against its
// rank's layout, and ReceiverMap::DeviceShards, what it must export. No GPU
// needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "dcr/cuda.h"
#include "dcr/layout.h"
#include "dcr/receiver_map.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A tp 2 server: a column split held as FP8 with per-block scales, a row
// split as FP8 with one scale per tensor (its shard named apart from the
// tensor: the per-tensor shadow takes the tensor's name), and a BF16 norm
// on both ranks.
constexpr const char* kServing = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.weight
    split: column
    shape: [256, 64]
    fp8: {block: [64, 32]}
  - name: down
    shard: down_proj
    split: row
    shape: [64, 256]
    fp8: {block: tensor}
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
)";

ReceiverMap MapOf(const char* yaml, uint32_t rank) {
  auto l = ParseLayout(yaml, "serving.yaml");
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  auto m = ReceiverMap::Create(*l, rank);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// What a server holding exactly `shards` exports (handles and offsets do
// not matter to the check).
cuda::IpcManifest Exported(const std::map<std::string, LayoutShard>& shards) {
  cuda::IpcManifest m;
  m.device = "0000:19:00.0";
  for (const auto& [name, s] : shards) {
    uint64_t n = DTypeSize(s.dtype);
    for (uint64_t d : s.shape) n *= d;
    m.tensors.push_back({name, s.dtype, s.shape, std::string(128, 'a'), 0, n});
  }
  return m;
}

TEST(IpcAttachTest, TheDeviceHoldsEveryShardButTheFp8Shadows) {
  for (uint32_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const ReceiverMap map = MapOf(kServing, rank);
    const auto device = map.DeviceShards();
    for (const auto& [name, s] : map.shards()) {
      const bool shadow =
          name == ReceiverMap::ShadowName("w.weight") ||
          name == ReceiverMap::ShadowName("down");  // the tensor's name
      EXPECT_EQ(device.count(name), shadow ? 0u : 1u) << name;
    }
    EXPECT_EQ(device.size() + 2, map.shards().size());
    EXPECT_EQ(device.at("w.weight").dtype, DType::kF8E4M3);
    EXPECT_EQ(device.at("w.weight").shape, Shape({128, 64}));
    EXPECT_EQ(device.at("down_proj").dtype, DType::kF8E4M3);
    EXPECT_EQ(device.count(ReceiverMap::ShadowName("down_proj")), 0u);
    EXPECT_EQ(device.at("norm").dtype, DType::kBF16);
  }
  // Without FP8 the device holds what the store holds.
  const ReceiverMap plain = MapOf(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.weight
    split: column
    shape: [256, 64]
)",
                                  1);
  EXPECT_EQ(plain.DeviceShards().size(), plain.shards().size());
  EXPECT_EQ(plain.DeviceShards().count("w.weight"), 1u);
}

TEST(IpcAttachTest, AManifestOfTheDeviceShardsPassesExtrasIncluded) {
  const ReceiverMap map = MapOf(kServing, 1);
  cuda::IpcManifest m = Exported(map.DeviceShards());
  EXPECT_TRUE(cuda::CheckIpcManifest(m, map).ok());
  // A server may export more than its weights (here, its shadows too).
  m = Exported(map.shards());
  m.tensors.push_back({"kv_cache", DType::kBF16, {4, 8}, "", 0, 64});
  EXPECT_TRUE(cuda::CheckIpcManifest(m, map).ok());
}

TEST(IpcAttachTest, EveryMissingOrDifferentTensorIsNamed) {
  const ReceiverMap map = MapOf(kServing, 0);
  cuda::IpcManifest m = Exported(map.DeviceShards());
  std::erase_if(m.tensors,
                [](const cuda::IpcTensor& t) { return t.name == "norm"; });
  for (cuda::IpcTensor& t : m.tensors) {
    if (t.name == "w.weight") t.dtype = DType::kBF16;  // not quantized
    if (t.name == "down_proj") t.shape = {64, 256};    // the whole tensor
  }
  const Status s = cuda::CheckIpcManifest(m, map);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr("serving rank 0"));
  EXPECT_THAT(msg, HasSubstr("'norm' is not exported"));
  EXPECT_THAT(msg, HasSubstr("'w.weight' is [128, 64] BF16, the layout gives "
                             "[128, 64] F8_E4M3"));
  EXPECT_THAT(msg, HasSubstr("'down_proj' is [64, 256] F8_E4M3, the layout "
                             "gives [64, 128] F8_E4M3"));
  EXPECT_THAT(msg, Not(HasSubstr("more")));
}

TEST(IpcAttachTest, ALongListStopsAfterTheFirstSixteen) {
  std::string yaml = "version: 1\nparallel: {tp: 1}\ntensors:\n";
  for (int i = 0; i < 20; ++i) {
    const std::string n = "t" + std::to_string(100 + i);
    yaml += "  - name: " + n + "\n    shard: " + n +
            "\n    split: replicated\n    shape: [8]\n";
  }
  const ReceiverMap map = MapOf(yaml.c_str(), 0);
  const Status s = cuda::CheckIpcManifest(cuda::IpcManifest{}, map);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr("'t115' is not exported; and 4 more"));
  EXPECT_THAT(msg, Not(HasSubstr("'t116'")));
}

}  // namespace
}  // namespace dcr
