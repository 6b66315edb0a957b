// A producer whose shards live on the GPU (dcr/cuda.h CreateShardMemory):
// over random tilings and the Megatron-style layouts, its parts and digests
// are the bytes the host producer sends for the same shards, step after
// step (each commit advancing both), with pieces small enough that a shard
// is diffed in several; and it refuses shards the trainer changed after
// the diff, and leaves the caller's current device as it was.
// Skipped with the driver's reason where no GPU is usable, but for the
// checks of the options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_util.h"
#include "dcr/shard_delta.h"
#include "unit/placement/versions.h"

namespace dcr::cuda {
namespace {

using cudatest::CudaTest;
using placement_testing::Gpt;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using ::testing::HasSubstr;

// A rank's shards on the host and their copies on the device.
struct Shards {
  std::map<std::string, std::vector<std::byte>> host;
  std::map<std::string, DeviceBuffer> device;

  ShardBytes Host() const {
    ShardBytes out;
    for (const auto& [n, v] : host) out.emplace(n, v);
    return out;
  }
  ShardBytes Device() const {
    ShardBytes out;
    for (const auto& [n, d] : device) {
      out.emplace(
          n, std::span<const std::byte>(static_cast<const std::byte*>(d.data()),
                                        host.at(n).size()));
    }
    return out;
  }
};

Shards Place(const Layout& l, uint32_t rank, const Tensors& t) {
  Shards s;
  auto built = BuildShards(l, rank, View(t));
  EXPECT_TRUE(built.ok()) << built.status().ToString();
  if (!built.ok()) return s;
  for (auto& [n, v] : *built) {
    auto d = DeviceBuffer::Allocate(std::max<size_t>(v.size(), 1));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return s;
    EXPECT_TRUE(CopyToDevice(d->data(), v).ok());
    s.device.emplace(n, std::move(*d));
    s.host.emplace(n, std::move(v));
  }
  return s;
}

class CudaProducerTest : public CudaTest {};

TEST_F(CudaProducerTest, SendsTheHostProducersPartsAndDigests) {
  std::mt19937_64 rng(71);
  for (int layout = 0; layout < 10; ++layout) {
    const Layout l = layout < 2 ? *ParseLayout(Gpt(2, layout + 1), "gpt.yaml")
                                : placement_testing::RandomLayout(rng);
    SCOPED_TRACE("layout " + std::to_string(layout));
    auto [v0, v1] = RandomVersions(l, 0.05, rng);
    auto [unused, v2] = RandomVersions(l, 0.5, rng);
    for (uint32_t r = 0; r < l.ranks(); ++r) {
      const Shards s0 = Place(l, r, v0), s1 = Place(l, r, v1),
                   s2 = Place(l, r, v2);
      ShardProducer host(l, r, 0);
      ShardProducer gpu(l, r, 0);
      // Pieces of 5 elements: every shard of more is diffed in several.
      auto memory = CreateShardMemory({.device = 0, .piece_elems = 5});
      ASSERT_TRUE(memory.ok()) << memory.status().ToString();
      ASSERT_TRUE(gpu.UseMemory(std::move(*memory)).ok());
      ASSERT_TRUE(host.SetBaseline(s0.Host()).ok());
      if (r % 2 == 0) {
        ASSERT_TRUE(gpu.SetBaseline(s0.Device()).ok());
      } else {  // the tree's, from the coordinator
        ASSERT_TRUE(gpu.AdoptBaseline({s0.host.begin(), s0.host.end()}).ok());
      }
      EXPECT_EQ(gpu.baseline_digests(), host.baseline_digests());
      EXPECT_EQ(gpu.baseline_bytes(), host.baseline_bytes());
      for (const Shards* next : {&s1, &s2, &s2}) {
        const uint64_t span = 1 + rng() % 64;
        auto want = host.Diff(next->Host(), span);
        auto got = gpu.Diff(next->Device(), span);
        ASSERT_TRUE(want.ok()) << want.status().ToString();
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(got->chunks, want->chunks);
        EXPECT_EQ(got->target_digests, want->target_digests);
        EXPECT_EQ(got->changed, want->changed);
        ASSERT_TRUE(host.Advance(next->Host()).ok());
        ASSERT_TRUE(gpu.Advance(next->Device()).ok());
      }
    }
  }
}

TEST_F(CudaProducerTest, RefusesShardsTheTrainerChangedBeforeTheCommit) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(73);
  auto [v0, v1] = RandomVersions(*l, 0.05, rng);
  auto [unused, other] = RandomVersions(*l, 0.05, rng);
  const Shards s0 = Place(*l, 0, v0), s1 = Place(*l, 0, v1),
               so = Place(*l, 0, other);
  ShardProducer p(*l, 0, 32);
  auto memory = CreateShardMemory({});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ((*memory)->name(), "cuda:0");
  ASSERT_TRUE(p.UseMemory(std::move(*memory)).ok());
  ASSERT_TRUE(p.SetBaseline(s0.Device()).ok());
  ASSERT_TRUE(p.Diff(s1.Device()).ok());
  Status s = p.Advance(so.Device());
  EXPECT_TRUE(s.IsBaseMismatch()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("did the trainer step again"));
  ASSERT_TRUE(p.Advance(s1.Device()).ok());
  auto again = p.Diff(s1.Device());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->chunks.empty());
}

// Shards in host memory (or another device's) are refused before a kernel
// reads them: a fault there would stay with the context torch shares.
TEST_F(CudaProducerTest, RefusesShardsOutsideItsDevicesMemory) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(79);
  auto [v0, v1] = RandomVersions(*l, 0.05, rng);
  const Shards s0 = Place(*l, 0, v0), s1 = Place(*l, 0, v1);
  auto dev = DeviceOfPointer(s0.device.begin()->second.data());
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(*dev, 0);
  EXPECT_EQ(*DeviceOfPointer(s0.host.begin()->second.data()), -1);
  ShardProducer p(*l, 0, 32);
  auto memory = CreateShardMemory({});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  ASSERT_TRUE(p.UseMemory(std::move(*memory)).ok());
  Status set = p.SetBaseline(s0.Host());
  EXPECT_TRUE(set.IsInvalidArgument()) << set.ToString();
  EXPECT_THAT(set.message(), HasSubstr("is in host memory"));
  ASSERT_TRUE(p.SetBaseline(s0.Device()).ok());
  auto step = p.Diff(s1.Host());
  EXPECT_TRUE(step.status().IsInvalidArgument()) << step.status().ToString();
  EXPECT_THAT(step.status().message(), HasSubstr("is in host memory"));
  EXPECT_TRUE(p.has_baseline());
  ASSERT_TRUE(p.Diff(s1.Device()).ok());
  ASSERT_TRUE(p.Advance(s1.Device()).ok());
}

// A trainer's thread keeps its current device whatever the producer's
// memory is on (the last device, where there are several).
TEST_F(CudaProducerTest, LeavesTheCallersCurrentDevice) {
  auto rt = Probe();
  ASSERT_TRUE(rt.ok());
  const int other = static_cast<int>(rt->devices.size()) - 1;
  ASSERT_TRUE(UseDevice(0).ok());
  auto memory = CreateShardMemory({.device = other});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ(*CurrentDevice(), 0);
  auto d = DeviceBuffer::Allocate(64);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(
      (*memory)
          ->SetBaseline({{"w", std::span<const std::byte>(
                                   static_cast<std::byte*>(d->data()), 64)}})
          .ok());
  EXPECT_EQ(*CurrentDevice(), 0);
  memory->reset();
  EXPECT_EQ(*CurrentDevice(), 0);
}

// Without a GPU too: checked before any device is touched, and a device
// that cannot be used is named.
TEST(CudaShardMemoryTest, BadOptionsAreRefused) {
  EXPECT_TRUE(CreateShardMemory({.device = -1}).status().IsInvalidArgument());
  EXPECT_TRUE(CreateShardMemory({.device = 0, .piece_elems = 0})
                  .status()
                  .IsInvalidArgument());
  auto missing = CreateShardMemory({.device = 1 << 20});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot keep a producer's shards on cuda:1048576"));
}

}  // namespace
}  // namespace dcr::cuda
