// The root's side of producers' baselines (coord/producer_feed.h) against
// raw producers on 127.0.0.1 (unit/coord/producer_clients.h): what a rank
// without a baseline, or with another version than the tree's, is sent,
// and that a refused check sends nothing.
#include "coord/producer_feed.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"
#include "dcr/store.h"
#include "unit/coord/producer_clients.h"

namespace dcr {
namespace {

using namespace producer_test;  // NOLINT: the fixtures of these tests

// A memory store of `layout`'s tensors, byte i of tensor t = t * seed + i.
std::unique_ptr<WeightStore> FilledStore(const Layout& layout, int seed) {
  auto manifest = ManifestOf(layout);
  EXPECT_TRUE(manifest.ok()) << manifest.status().ToString();
  if (!manifest.ok()) return nullptr;
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kMemory;
  auto store = CreateStore(spec, *manifest);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return nullptr;
  for (size_t t = 0; t < manifest->size(); ++t) {
    std::span<std::byte> bits = (*store)->MutableTensor(t);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = std::byte(t * seed + i);
  }
  return *std::move(store);
}

CanonicalBytes CanonicalOf(const Layout& layout, const WeightStore& store) {
  CanonicalBytes canonical;
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    canonical.emplace(layout.tensors[t].name, store.Tensor(t));
  }
  return canonical;
}

// The shards in the first `frames` PRODUCER_BASELINE frames `c` got.
::testing::AssertionResult ReceivedShards(
    Client& c, size_t frames,
    std::map<std::string, std::vector<std::byte>>* got) {
  for (size_t n = 0; n < frames; ++n) {
    auto f = c.Frame(n);
    if (!f.ok()) return ::testing::AssertionFailure() << f.status().ToString();
    auto m = DecodeProducerBaseline(f->frame.payload);
    if (!m.ok()) return ::testing::AssertionFailure() << m.status().ToString();
    (*got)[m->shard].insert((*got)[m->shard].end(), m->bytes.begin(),
                            m->bytes.end());
  }
  return ::testing::AssertionSuccess();
}

// The root's side: a rank without a baseline gets root.baseline's bits of
// its shards (the layout's maps inverted), and its base parts for the base
// check are what those shards hash to.
TEST(ProducerFeedTest, ServesRootBaselineToARankWithoutOne) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  const Layout& layout = hub->layout();
  auto store = FilledStore(layout, 64);
  ASSERT_TRUE(store);
  const CanonicalBytes canonical = CanonicalOf(layout, *store);
  // Rank 0 holds the tree's version; rank 1 holds nothing.
  auto shards0 = BuildShards(layout, 0, canonical);
  ASSERT_TRUE(shards0.ok());
  ShardBytes view0;
  for (const auto& [name, bytes] : *shards0) view0.emplace(name, bytes);
  ProducerHelloMsg hello0 = Hello(layout, 0, 7);
  auto parts0 = HashShardRegions(layout, 0, view0);
  ASSERT_TRUE(parts0.ok());
  hello0.base_parts = *parts0;
  ProducerHelloMsg bare = Hello(layout, 1, 7);
  bare.base_parts.clear();
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  c0.SendHello(hello0);
  c1.SendHello(bare);
  ProducerFeed feed(hub.get());
  ASSERT_TRUE(feed.Gather(kLong).ok());
  // A refit the check refuses sends nothing.
  Status refused =
      feed.CheckBaseline(*store, Version{3, Digest128{1, 2}}, nullptr, kLong);
  EXPECT_TRUE(refused.code() == StatusCode::kBaseMismatch)
      << refused.ToString();
  // Rank 1's base parts, those of the shards it will be sent, complete the
  // check against root.baseline's own digest; then it is sent them.
  const Version base{3, store->Digests().version};
  Status s = feed.CheckBaseline(*store, base, nullptr, kLong);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto want = BuildShards(layout, 1, canonical);
  ASSERT_TRUE(want.ok());
  std::map<std::string, std::vector<std::byte>> got;
  ASSERT_TRUE(ReceivedShards(c1, want->size(), &got));
  for (const auto& [name, bytes] : *want) {
    EXPECT_EQ(got[name], bytes) << name;
  }
  EXPECT_TRUE(c0.Messages().empty());
  EXPECT_EQ(c1.Messages().size(), want->size());  // none from the refusal
}

// A rank whose baseline is another version than the tree's (it missed the
// last decision) is found by the base check and sent the tree's; the
// check then passes. The rank that agreed gets nothing.
TEST(ProducerFeedTest, ResyncsARankThatHoldsAnotherVersion) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  const Layout& layout = hub->layout();
  auto store = FilledStore(layout, 32);
  ASSERT_TRUE(store);
  const CanonicalBytes canonical = CanonicalOf(layout, *store);
  auto parts_of = [&](uint32_t rank) {
    auto shards = BuildShards(layout, rank, canonical);
    EXPECT_TRUE(shards.ok());
    ShardBytes view;
    for (const auto& [name, bytes] : *shards) view.emplace(name, bytes);
    auto parts = HashShardRegions(layout, rank, view);
    EXPECT_TRUE(parts.ok());
    return *parts;
  };
  ProducerHelloMsg hello0 = Hello(layout, 0, 7);  // made-up parts: stale
  ProducerHelloMsg hello1 = Hello(layout, 1, 7);
  hello1.base_parts = parts_of(1);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  c0.SendHello(hello0);
  c1.SendHello(hello1);
  ProducerFeed feed(hub.get());
  ASSERT_TRUE(feed.Gather(kLong).ok());
  const Version base{3, store->Digests().version};
  Status check = feed.CheckBaseline(*store, base, nullptr, kLong);
  EXPECT_TRUE(check.ok()) << check.ToString();
  auto want = BuildShards(layout, 0, canonical);
  ASSERT_TRUE(want.ok());
  std::map<std::string, std::vector<std::byte>> got;
  ASSERT_TRUE(ReceivedShards(c0, want->size(), &got));
  for (const auto& [name, bytes] : *want) EXPECT_EQ(got[name], bytes) << name;
  EXPECT_TRUE(c1.Messages().empty());
  // A base that root.baseline does not hold is refused, saying so (every
  // rank now agrees with root.baseline's bits, not with that version).
  Status other =
      feed.CheckBaseline(*store, Version{3, Digest128{1, 2}}, nullptr, kLong);
  EXPECT_TRUE(other.code() == StatusCode::kBaseMismatch) << other.ToString();
  EXPECT_TRUE(Contains(other.message(), "does not hold its recorded step 3"))
      << other.ToString();
}

// A converted tensor's shard bits are not a copy of the canonical ones:
// a rank without a baseline that holds one is refused, naming it.
TEST(ProducerFeedTest, RefusesARankWithoutBaselineWhoseTensorsAreConverted) {
  auto layout = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: model.norm.weight
    shard: norm
    split: replicated
    shape: [4]
    shard_dtype: F32
  - name: model.proj.weight
    shard: proj
    split: column
    shape: [4, 2]
)",
                            "converted.yaml");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  auto listened =
      ProducerHub::Listen(*layout, "127.0.0.1", 0, TransportOptions());
  ASSERT_TRUE(listened.ok());
  std::shared_ptr<ProducerHub> hub = *std::move(listened);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ProducerHelloMsg bare = Hello(*layout, 0, 7);
  bare.base_parts.clear();
  c0.SendHello(bare);
  c1.SendHello(Hello(*layout, 1, 7));
  ProducerFeed feed(hub.get());
  ASSERT_TRUE(feed.Gather(kLong).ok());
  auto store = FilledStore(*layout, 0);
  ASSERT_TRUE(store);
  Status s =
      feed.CheckBaseline(*store, Version{0, Digest128{1, 2}}, nullptr, kLong);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "producer rank 0 has no baseline"))
      << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "model.norm.weight")) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "Producer::SetBaseline")) << s.ToString();
  EXPECT_TRUE(c0.Messages().empty());
}

}  // namespace
}  // namespace dcr
