// A serving rank's view of a layout (dcr/receiver_map.h): canonical chunks
// applied through it leave each rank's shards exactly as built from the
// target, over random tilings and Megatron-style layouts with copies and
// a tied head. FP8 shards: receiver_map_fp8_test.cc.
#include "dcr/receiver_map.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "unit/placement/canonical_chunks.h"
#include "unit/placement/random_tiling.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Chunks;
using placement_testing::Gpt;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using ::testing::HasSubstr;

// Every rank: its shards built from base, every chunk applied, equal the
// shards built from target.
void ExpectAppliedEqualsBuilt(const Layout& l, const Tensors& base,
                              const Tensors& target, uint64_t span,
                              bool overwrite, bool dense = false) {
  const auto chunks = Chunks(l, base, target, span, overwrite, dense);
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto m = ReceiverMap::Create(l, r);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto shards = m->Build(View(base));
    auto want = m->Build(View(target));
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    ASSERT_TRUE(want.ok());
    const auto built = *shards;
    MutableShardBytes writable;
    for (auto& [name, bytes] : *shards) writable.emplace(name, bytes);
    // Before each apply, the values it replaces (what a relay's journal
    // keeps), as the overwrite chunk that puts them back.
    std::vector<std::pair<uint32_t, DecodedChunk>> undo;
    for (const auto& [tensor, c] : chunks) {
      const uint64_t first = uint64_t{c.header.id.span} * span;
      DecodedChunk back = c;
      back.header.kind = ChunkKind::kOverwrite;
      auto read = m->Gather(tensor, first, c, writable, back.values);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      auto wrote = m->Apply(tensor, first, c, writable);
      ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
      EXPECT_EQ(*read, *wrote);
      if (!m->Holds(tensor)) {
        EXPECT_EQ(*wrote, 0u);
      }
      undo.emplace_back(tensor, std::move(back));
    }
    EXPECT_EQ(*shards, *want);
    // Undone last first, the shards are the base's again.
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
      const uint64_t first = uint64_t{it->second.header.id.span} * span;
      ASSERT_TRUE(m->Apply(it->first, first, it->second, writable).ok());
    }
    EXPECT_EQ(*shards, built);
    for (const auto& [tensor, c] : chunks) {
      const uint64_t first = uint64_t{c.header.id.span} * span;
      ASSERT_TRUE(m->Apply(tensor, first, c, writable).ok());
    }
    // The rank's vote: its regions' digests equal those the root computes
    // from the target, and not those of the base where a region changed.
    ShardBytes held;
    for (const auto& [name, bytes] : *shards) held.emplace(name, bytes);
    auto votes = m->HashRegions(held);
    auto expected = m->ExpectedRegions(View(target));
    auto before = m->ExpectedRegions(View(base));
    ASSERT_TRUE(votes.ok()) << votes.status().ToString();
    ASSERT_TRUE(expected.ok() && before.ok());
    EXPECT_EQ(*votes, *expected);
    EXPECT_EQ(m->BitsDigest(*votes), m->BitsDigest(*expected));
    if (*expected != *before) {
      EXPECT_NE(m->BitsDigest(*votes), m->BitsDigest(*before));
    }
    for (uint32_t t = 0; t < l.tensors.size(); ++t) {
      if (!m->Holds(t)) {
        EXPECT_EQ((*votes)[t], LinearDigest{}) << t;
      }
    }
  }
}

TEST(ReceiverMapTest, RandomTilingsApplyToWhatTheTargetBuilds) {
  std::mt19937_64 rng(23);
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Layout l = placement_testing::RandomLayout(rng);
    auto [base, target] = RandomVersions(l, rng() % 2 ? 0.05 : 0.6, rng);
    ExpectAppliedEqualsBuilt(l, base, target, 1 + rng() % 40, rng() % 2,
                             rng() % 4 == 0);
  }
}

TEST(ReceiverMapTest, MegatronLayoutsApplyToWhatTheTargetBuilds) {
  std::mt19937_64 rng(29);
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      auto l = ParseLayout(Gpt(tp, pp), "gpt.yaml");
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      for (double rate : {0.03, 1.0}) {
        auto [base, target] = RandomVersions(*l, rate, rng);
        ExpectAppliedEqualsBuilt(*l, base, target, 7, false);
        ExpectAppliedEqualsBuilt(*l, base, target, 64, true);
        ExpectAppliedEqualsBuilt(*l, base, target, 33, rate > 0.5, true);
      }
    }
  }
}

// tp 2 x ep 2: a replicated norm on all four ranks, attention on both
// expert-parallel groups, each expert on its own group.
constexpr const char* kMoe = R"(version: 1
parallel: {tp: 2, ep: 2}
layers: 1
experts: 2
tensors:
  - name: l.{layer}.norm
    shard: l.{layer}.norm
    split: replicated
    shape: [6]
  - name: l.{layer}.attn
    shard: l.{layer}.attn
    split: column
    shape: [4, 6]
  - name: l.{layer}.e.{expert}.w
    shard: l.{layer}.e.{expert}.w
    split: row
    shape: [3, 4]
)";

TEST(ReceiverMapTest, EveryServingRankHoldsItsCopies) {
  auto l = ParseLayout(kMoe, "moe.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  for (uint32_t r = 0; r < 4; ++r) {
    auto m = ReceiverMap::Create(*l, r);
    ASSERT_TRUE(m.ok());
    // Norm and attention on every rank; one expert per group (local name
    // e.0), half its columns per tensor-parallel rank.
    EXPECT_THAT(m->shards(), ::testing::SizeIs(3)) << r;
    EXPECT_EQ(m->shards().at("l.0.norm").shape, Shape({6}));
    EXPECT_EQ(m->shards().at("l.0.attn").shape, Shape({2, 6}));
    EXPECT_EQ(m->shards().at("l.0.e.0.w").shape, Shape({3, 2}));
    for (uint32_t t = 0; t < l->tensors.size(); ++t) {
      const std::string& name = l->tensors[t].name;
      const bool expert = name.find(".e.") != std::string::npos;
      const bool own_expert = name == "l.0.e." + std::to_string(r / 2) + ".w";
      EXPECT_EQ(m->Holds(t), !expert || own_expert) << r << " " << name;
    }
  }
  // A producer still sees one owner per element: rank 3 (tp rank 1 of
  // expert-parallel group 1) produces its expert's columns, while the
  // first group produces attention and rank 0 the norm.
  EXPECT_EQ(l->ShardsOf(3).count("l.0.attn"), 0u);
  EXPECT_EQ(l->ShardsOf(3).count("l.0.norm"), 0u);
  std::mt19937_64 rng(31);
  auto [base, target] = RandomVersions(*l, 0.3, rng);
  ExpectAppliedEqualsBuilt(*l, base, target, 5, false);
  // The copies hold the canonical bits: rank 3's norm is the whole tensor.
  auto m3 = ReceiverMap::Create(*l, 3);
  auto built = m3->Build(View(target));
  ASSERT_TRUE(built.ok());
  EXPECT_EQ(built->at("l.0.norm"), target.at("l.0.norm"));
  // A bit flipped in that copy changes rank 3's vote on the norm, and on
  // nothing else.
  built->at("l.0.norm")[3] ^= std::byte{0x04};
  ShardBytes held;
  for (const auto& [name, bytes] : *built) held.emplace(name, bytes);
  auto votes = m3->HashRegions(held);
  auto expected = m3->ExpectedRegions(View(target));
  ASSERT_TRUE(votes.ok() && expected.ok());
  for (uint32_t t = 0; t < l->tensors.size(); ++t) {
    EXPECT_EQ((*votes)[t] == (*expected)[t], l->tensors[t].name != "l.0.norm")
        << l->tensors[t].name;
  }
}

TEST(ReceiverMapTest, ATiedHeadTakesItsEmbeddingsChangesOnce) {
  auto l = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: embed
    shard: emb
    split: column
    shape: [8, 4]
  - name: head
    shard: emb
    split: column
    shape: [8, 4]
)",
                       "tied.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::mt19937_64 rng(37);
  auto [base, target] = RandomVersions(*l, 0.5, rng);
  target["head"] = target["embed"];  // tied: the same bits
  base["head"] = base["embed"];
  // XOR chunks for both tensors: applied twice, the shard would be back at
  // the base.
  ExpectAppliedEqualsBuilt(*l, base, target, 8, false);
}

TEST(ReceiverMapTest, ShardsOfTwoShapesAndPartlyTiedBoxesAreRefused) {
  // Rank 1 holds a copy of 'a' in shard s as [4], and 'b' in s as [8]:
  // the layout's own checks see each pair of rank and shard once.
  auto two = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: a
    shard: s
    split: replicated
    shape: [4]
  - name: b
    split: pieces
    shape: [4]
    pieces:
      - {rank: 1, shard: s, shard_shape: [8], from: [4], extent: [4], to: [0]}
)",
                         "two.yaml");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_TRUE(ReceiverMap::Create(*two, 0).ok());
  EXPECT_THAT(ReceiverMap::Create(*two, 1).status().ToString(),
              HasSubstr("shard 's' is [4] BF16 for tensor 'a' but [8] BF16 "
                        "for tensor 'b'"));
  auto part = ParseLayout(R"(version: 1
tensors:
  - name: a
    split: pieces
    shape: [4]
    pieces:
      - {rank: 0, shard: s, shard_shape: [8], extent: [4], to: [0]}
  - name: b
    split: pieces
    shape: [6]
    pieces:
      - {rank: 0, shard: s, shard_shape: [8], from: [2], extent: [6], to: [0]}
)",
                          "part.yaml");
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_THAT(ReceiverMap::Create(*part, 0).status().ToString(),
              HasSubstr("tensors 'a' and 'b' share part of a box of shard "
                        "'s'; tied tensors must hold the same box"));
}

TEST(ReceiverMapTest, BadRanksTensorsChunksAndShardsAreRefused) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(ReceiverMap::Create(*l, 2).status().ToString(),
              HasSubstr("serving rank 2 is not below the 2 ranks"));
  auto converted = ParseLayout(R"(version: 1
tensors:
  - name: w
    shard: w
    split: replicated
    shape: [4]
    shard_dtype: F32
)",
                               "f32.yaml");
  ASSERT_TRUE(converted.ok());
  EXPECT_THAT(ReceiverMap::Create(*converted, 0).status().ToString(),
              HasSubstr("holds tensor 'w' converted from F32"));

  auto m = ReceiverMap::Create(*l, 0);
  ASSERT_TRUE(m.ok());
  std::mt19937_64 rng(41);
  auto [base, target] = RandomVersions(*l, 0.5, rng);
  auto shards = m->Build(View(base));
  ASSERT_TRUE(shards.ok());
  MutableShardBytes writable;
  for (auto& [name, bytes] : *shards) writable.emplace(name, bytes);
  const auto chunks = Chunks(*l, base, target, 16, false);
  ASSERT_FALSE(chunks.empty());
  const auto& [tensor, c] = chunks.front();
  EXPECT_FALSE(
      m->Apply(static_cast<uint32_t>(l->tensors.size()), 0, c, writable).ok());
  DecodedChunk wide = c;
  wide.header.elem_size = 4;  // the tensors are BF16
  EXPECT_THAT(m->Apply(tensor, 0, wide, writable).status().ToString(),
              HasSubstr("does not fit tensor"));
  EXPECT_FALSE(
      m->Apply(tensor, Volume(l->tensors[tensor].shape), c, writable).ok());
  MutableShardBytes missing = writable;
  missing.clear();
  EXPECT_THAT(m->Apply(tensor, 0, c, missing).status().ToString(),
              HasSubstr("is missing"));
  // A position past the span writes nothing.
  DecodedChunk stray = c;
  stray.positions.assign(stray.positions.size(), stray.header.span_elems);
  auto wrote = m->Apply(tensor, 0, stray, writable);
  ASSERT_TRUE(wrote.ok());
  EXPECT_EQ(*wrote, 0u);
  // Gather needs one element of room per position, and checks as Apply.
  std::vector<std::byte> old(c.values.size());
  EXPECT_TRUE(m->Gather(tensor, 0, c, writable, old).ok());
  EXPECT_THAT(m->Gather(tensor, 0, c, writable, std::span(old).first(2))
                  .status()
                  .ToString(),
              HasSubstr("one element of room per position"));
  EXPECT_THAT(m->Gather(tensor, 0, c, missing, old).status().ToString(),
              HasSubstr("is missing"));
}

TEST(ReceiverMapTest, ManifestsAndTheBitsDigestNameTheRankAndItsLayout) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto r0 = ReceiverMap::Create(*l, 0);
  auto r1 = ReceiverMap::Create(*l, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->fingerprint(), l->Fingerprint());
  auto stored = r0->StoreManifest();
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_EQ(stored->size(), r0->shards().size());
  for (const TensorInfo& t : stored->tensors()) {
    const LayoutShard& s = r0->shards().at(t.name);
    EXPECT_EQ(t.shape, s.shape) << t.name;
    EXPECT_EQ(t.dtype, s.dtype) << t.name;
  }
  auto canonical = r0->CanonicalManifest();
  ASSERT_TRUE(canonical.ok());
  ASSERT_EQ(canonical->size(), l->tensors.size());
  for (size_t i = 0; i < l->tensors.size(); ++i) {
    EXPECT_EQ((*canonical)[i].name, l->tensors[i].name);
  }
  EXPECT_EQ(canonical->digest(), r1->CanonicalManifest()->digest());
  std::vector<LinearDigest> regions(l->tensors.size());
  regions[1].low = 5;
  EXPECT_NE(r0->BitsDigest(regions), r1->BitsDigest(regions));
  const Digest128 d = r0->BitsDigest(regions);
  regions[1].low = 4;
  EXPECT_NE(r0->BitsDigest(regions), d);
  regions.pop_back();
  EXPECT_NE(r0->BitsDigest(regions), d);
}

}  // namespace
}  // namespace dcr
