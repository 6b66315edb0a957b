// The fixture of the producer tree tests (producer_*_tree_test.cc): two
// ranks' Producers, each with the host stand-in of a GPU memory
// (HostShardMemory), stream through a ProducerHub on 127.0.0.1 to
// RunRefit, which feeds the five real relays of RelayTreeTest over the
// fake transport.
#ifndef DCR_TESTS_UNIT_COORD_PRODUCER_TREE_FIXTURE_H_
#define DCR_TESTS_UNIT_COORD_PRODUCER_TREE_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dcr/producer.h"
#include "dcr/shard_diff.h"
#include "unit/coord/relay_tree_fixture.h"
#include "unit/placement/host_shard_memory.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace producer_tree_testing {

using placement_testing::HostShardMemory;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using Shards = std::map<std::string, std::vector<std::byte>>;

// Two tensor-parallel ranks. Every canonical span of the column split's
// boundary and of the row split holds both ranks' elements, so the
// coordinator merges parts of two producers into one chunk.
inline constexpr const char* kLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: layer.0.w
    shard: qkv
    split: column
    shape: [96, 64]
  - name: layer.1.w
    shard: proj
    split: row
    shape: [64, 96]
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
    dtype: F32
)";

// The same, larger: spans of 32768 elements (ProducerContextTreeTest), 4
// per matrix, are large enough for context coding to gain on.
inline constexpr const char* kLargerLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: layer.0.w
    shard: qkv
    split: column
    shape: [512, 256]
  - name: layer.1.w
    shard: proj
    split: row
    shape: [256, 512]
  - name: norm
    shard: norm
    split: replicated
    shape: [256]
    dtype: F32
)";

// Two pipeline stages of four layers (ProducerPipelineTreeTest): rank 0
// holds tensors 0-3, rank 1 tensors 4-7, and both stream at once.
inline constexpr const char* kPipelineLayout = R"(version: 1
parallel: {pp: 2}
layers: 8
tensors:
  - name: layers.{layer}.w
    shard: layers.{layer}.w
    split: replicated
    shape: [64, 96]
)";

inline constexpr int kVersions = 4;

// `count` versions whose changes follow each element's exponent, as an
// optimizer step's do (small exponents change often, large ones rarely):
// what context coding gains on. Changes flip low mantissa bits, so an
// element keeps its exponent across versions.
inline std::vector<Tensors> AdamVersions(const Layout& layout, int count,
                                         std::mt19937_64& rng) {
  std::vector<Tensors> v(1);
  std::uniform_real_distribution<double> uniform(0, 1);
  for (const LayoutTensor& t : layout.tensors) {
    const size_t w = DTypeSize(t.dtype);
    const ExponentField f = ExponentFieldOf(t.dtype);
    auto& b = v[0][t.name];
    b.resize(Volume(t.shape) * w);
    for (size_t i = 0; i < Volume(t.shape); ++i) {
      // 2^(bits-2) + 1 exponents around the middle of the field.
      const uint64_t e = (1u << (f.bits - 1)) - (1u << (f.bits - 3)) +
                         rng() % ((1u << (f.bits - 2)) + 1);
      uint64_t x = (e << f.shift) | (rng() & ((uint64_t{1} << f.shift) - 1));
      if (rng() & 1) x |= uint64_t{1} << (8 * w - 1);
      std::memcpy(b.data() + i * w, &x, w);
    }
  }
  while (static_cast<int>(v.size()) < count) {
    Tensors next = v.back();
    for (const LayoutTensor& t : layout.tensors) {
      const size_t w = DTypeSize(t.dtype);
      const ExponentField f = ExponentFieldOf(t.dtype);
      auto& b = next.at(t.name);
      for (size_t i = 0; i < Volume(t.shape); ++i) {
        uint64_t x = 0;
        std::memcpy(&x, b.data() + i * w, w);
        const uint64_t e = (x >> f.shift) & ((uint64_t{1} << f.bits) - 1);
        // p(change) halves with every step up in exponent.
        const uint64_t k = std::min<uint64_t>(
            e - ((1u << (f.bits - 1)) - (1u << (f.bits - 3))), 12);
        if (uniform(rng) < 0.3 / static_cast<double>(uint64_t{1} << k)) {
          x ^= 1 + rng() % 3;
          std::memcpy(b.data() + i * w, &x, w);
        }
      }
    }
    v.push_back(std::move(next));
  }
  return v;
}

inline ShardBytes Spans(const Shards& s) {
  ShardBytes out;
  for (const auto& [name, b] : s) out.emplace(name, b);
  return out;
}

class ProducerMemoryTreeTest : public RelayTreeTest {
 protected:
  void SetUp() override {
    RelayTreeTest::SetUp();
    auto l = ParseLayout(layout_text_ != nullptr ? layout_text_
                         : adam_like_            ? kLargerLayout
                                                 : kLayout,
                         "memory.yaml");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_ = *std::move(l);
    // The fixture's checkpoints, replaced by this layout's versions: each
    // step changes about 4% of the elements.
    infos_.clear();
    for (const LayoutTensor& t : layout_.tensors) {
      infos_.push_back({t.name, t.dtype, t.shape});
    }
    std::mt19937_64 rng(29);
    auto [v0, v1] = RandomVersions(layout_, 0.04, rng);
    canonical_ = {v0, v1};
    if (adam_like_) canonical_ = AdamVersions(layout_, kVersions, rng);
    while (canonical_.size() < kVersions) {
      // RandomVersions draws a fresh base: its change, base ^ target,
      // applied to the last version.
      auto [base, next] = RandomVersions(layout_, 0.04, rng);
      Tensors stepped = canonical_.back();
      for (auto& [name, bytes] : stepped) {
        const auto& from = base.at(name);
        const auto& to = next.at(name);
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] ^= from[i] ^ to[i];
      }
      canonical_.push_back(std::move(stepped));
    }
    versions_.clear();
    for (int v = 0; v < kVersions; ++v) {
      std::vector<std::vector<std::byte>> data;
      for (const TensorInfo& t : infos_)
        data.push_back(canonical_[v].at(t.name));
      Write(Ckpt(v), data);
      versions_.push_back(std::move(data));
      for (uint32_t r = 0; r < 2; ++r) {
        auto s = BuildShards(layout_, r, View(canonical_[v]));
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        shards_[v][r] = *std::move(s);
      }
    }
    SeedAll(0);
    StartAll();
    auto hub = ProducerHub::Listen(layout_, "127.0.0.1", 0, TransportOptions());
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = *std::move(hub);
  }
  void TearDown() override {
    producers_.clear();
    hub_.reset();
    RelayTreeTest::TearDown();
  }

  // Rank `rank`'s producer with a fresh host stand-in of a GPU memory
  // (returned in `*memory`), holding version `base`'s shards there unless
  // `base` is negative.
  void MakeProducer(uint32_t rank, int base, HostShardMemory** memory) {
    ProducerOptions o;
    o.coordinator = "127.0.0.1:" + std::to_string(hub_->port());
    o.connect_timeout = 5s;
    o.timeout = 30s;
    auto p = std::make_unique<Producer>(layout_, rank, o);
    auto m = std::make_unique<HostShardMemory>();
    *memory = m.get();
    ASSERT_TRUE(p->UseMemory(std::move(m)).ok());
    if (base >= 0) {
      ASSERT_TRUE(p->SetBaseline(Spans(shards_[base][rank])).ok());
    }
    producers_[rank] = std::move(p);
  }

  // One refit of trainer step `v`: the root over the fake transport, each
  // rank's producer handing version `v`'s shards in its own thread.
  RefitReport Step(int v, std::vector<Result<ProducerDecision>>* decisions) {
    Producer* p[2] = {producers_.at(0).get(), producers_.at(1).get()};
    RefitOptions o = OptionsFor(v);
    o.producers = hub_.get();
    o.producer_wait = 20s;
    o.phase_timeout = 10s;
    o.threads = 2;
    o.kept_baseline = kept_;
    o.TEST_held_parts_bytes = held_parts_bytes_;
    o.context_coding = context_;
    o.TEST_plain_nodes = plain_nodes_;
    auto root = std::async(std::launch::async, [&] { return RunRefit(o); });
    std::vector<std::future<Result<ProducerDecision>>> ranks;
    for (uint32_t r = 0; r < 2; ++r) {
      ranks.push_back(std::async(std::launch::async, [this, p, r, v] {
        return p[r]->Refit(v, Spans(shards_[v][r]));
      }));
    }
    decisions->clear();
    for (auto& f : ranks) decisions->push_back(f.get());
    auto report = root.get();
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : RefitReport();
  }

  // Every relay's store and root.baseline hold version `v`'s bits.
  void ExpectTreeAt(int v) {
    const Digest128 want = DigestOf(Ckpt(v));
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n << " at v" << v;
    }
    EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), want);
  }

  // Canonical spans (of span_elems_ elements) that step v changes.
  uint64_t ChangedSpans(int v) const {
    uint64_t n = 0;
    for (const LayoutTensor& t : layout_.tensors) {
      const auto& a = canonical_[v - 1].at(t.name);
      const auto& b = canonical_[v].at(t.name);
      const size_t span = span_elems_ * DTypeSize(t.dtype);
      for (size_t at = 0; at < a.size(); at += span) {
        const size_t end = std::min(a.size(), at + span);
        n += !std::equal(a.begin() + at, a.begin() + end, b.begin() + at);
      }
    }
    return n;
  }

  // The baseline `memory` holds for rank `rank` is version `v`'s shards.
  void ExpectMemoryAt(HostShardMemory* memory, uint32_t rank, int v) {
    for (const auto& [name, bytes] : shards_[v][rank]) {
      std::vector<std::byte> held(bytes.size());
      ASSERT_TRUE(memory->ReadBaseline(name, 0, held).ok()) << name;
      EXPECT_TRUE(held == bytes) << "rank " << rank << " " << name;
    }
  }

  Layout layout_;
  std::vector<Tensors> canonical_;
  Shards shards_[kVersions][2];
  std::shared_ptr<ProducerHub> hub_;
  std::shared_ptr<KeptBaseline> kept_ = std::make_shared<KeptBaseline>();
  std::map<uint32_t, std::unique_ptr<Producer>> producers_;
  uint64_t held_parts_bytes_ = 0;  // RefitOptions::TEST_held_parts_bytes
  // Set by a derived fixture's constructor (before SetUp).
  // Larger versions whose changes follow the exponent.
  bool adam_like_ = false;
  const char* layout_text_ = nullptr;  // another layout of two ranks
  RefitOptions::ContextCoding context_ = RefitOptions::ContextCoding::kAuto;
  std::set<std::string> plain_nodes_;  // RefitOptions::TEST_plain_nodes
};

}  // namespace producer_tree_testing
}  // namespace dcr

#endif  // DCR_TESTS_UNIT_COORD_PRODUCER_TREE_FIXTURE_H_
