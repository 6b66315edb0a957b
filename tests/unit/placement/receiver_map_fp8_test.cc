// FP8 shards through a serving rank's view of a layout (dcr/receiver_map.h):
// canonical BF16 changes applied to a rank's FP8 codes and scales
// requantize the touched blocks to what quantizing the target gives, per
// block or per tensor; layouts that cannot hold that are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dcr/fp8.h"
#include "dcr/receiver_map.h"
#include "unit/placement/canonical_chunks.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Chunks;
using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using ::testing::HasSubstr;

// A tp 2 server holding three weights as FP8 (one with partial blocks,
// fused gate/up with named scales, a row split) and a BF16 norm.
constexpr const char* kFp8 = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.weight
    split: column
    shape: [256, 100]
    fp8: {block: [64, 32]}
  - names: [gate, up]
    shard: gate_up
    split: gate_up
    shape: [256, 64]
    fp8: {block: [64, 64], scale: gate_up.scales}
  - name: down
    shard: down
    split: row
    shape: [64, 256]
    fp8: {block: [32, 64]}
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
)";

// BF16 weights of N(0, 0.02)-like magnitudes: random signs and mantissas,
// exponents near 2^-6, so every block has its own amax.
Tensors Bf16Weights(const Layout& l, std::mt19937_64& rng) {
  Tensors out;
  for (const LayoutTensor& t : l.tensors) {
    auto& b = out[t.name];
    for (uint64_t e = 0; e < Volume(t.shape); ++e) {
      const uint16_t v = static_cast<uint16_t>(
          (rng() & 0x807F) | (uint16_t{0x3C} + rng() % 3) << 7);
      b.push_back(static_cast<std::byte>(v & 0xFF));
      b.push_back(static_cast<std::byte>(v >> 8));
    }
  }
  return out;
}

TEST(ReceiverMapTest, Fp8ShardsRequantizeToTheTargetsQuantization) {
  auto l = ParseLayout(kFp8, "fp8.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::mt19937_64 rng(43);
  const Tensors base = Bf16Weights(*l, rng);
  Tensors target = base;
  for (auto& [name, b] : target) {
    for (size_t e = 0; e < b.size(); e += 2) {
      if (rng() % 50 == 0) b[e] ^= std::byte{1};  // ~2% move by an ulp
    }
  }
  target.at("norm")[7] ^= std::byte{0x40};  // the BF16 copy changes too
  // One block of w gets a new maximum: its scale and every code change.
  target.at("w")[2 * 5] = std::byte{0};
  target.at("w")[2 * 5 + 1] = std::byte{0x3F};  // 0.5
  for (uint32_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto m = ReceiverMap::Create(*l, r);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE(m->serves_fp8());
    EXPECT_EQ(m->shards().at("w.weight").dtype, DType::kF8E4M3);
    EXPECT_EQ(m->shards().at("w.weight.shadow").dtype, DType::kBF16);
    EXPECT_EQ(m->shards().at("w.weight_scale_inv").shape, Shape({2, 4}));
    EXPECT_EQ(m->shards().at("gate_up.scales").shape, Shape({4, 1}));
    EXPECT_EQ(m->shards().at("down_scale_inv").shape, Shape({2, 2}));
    EXPECT_EQ(m->shards().at("norm").dtype, DType::kBF16);
    auto shards = m->Build(View(base));
    auto want = m->Build(View(target));
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    ASSERT_TRUE(want.ok());
    MutableShardBytes writable;
    for (auto& [name, bytes] : *shards) writable.emplace(name, bytes);
    Fp8Dirty dirty;
    for (const auto& [tensor, c] : Chunks(*l, base, target, 1000, false)) {
      const uint64_t first = uint64_t{c.header.id.span} * 1000;
      if (l->tensors[tensor].fp8) {
        EXPECT_THAT(m->Apply(tensor, first, c, writable).status().ToString(),
                    HasSubstr("Apply needs the dirty blocks"));
      }
      ASSERT_TRUE(m->Apply(tensor, first, c, writable, &dirty).ok());
    }
    ASSERT_TRUE(m->Requantize(writable, &dirty).ok());
    EXPECT_EQ(*shards, *want);
    // Independently: the codes and scales are QuantizeFp8 of the dense
    // target, restricted to the rank's rows.
    Fp8Tensor w{DType::kBF16, 256, 100, 64, 32};
    std::vector<uint8_t> q(w.elements());
    std::vector<float> sc(w.blocks());
    ASSERT_TRUE(QuantizeFp8(w, target.at("w"), q, sc).ok());
    const auto& codes = shards->at("w.weight");
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(static_cast<uint8_t>(codes[i]), q[r * 128 * 100 + i]) << i;
    }
    std::vector<float> got(8);
    std::memcpy(got.data(), shards->at("w.weight_scale_inv").data(), 32);
    EXPECT_EQ(got,
              std::vector<float>(sc.begin() + r * 8, sc.begin() + r * 8 + 8));
    // gate/up: the rank's 128 gate rows, then its 128 up rows, each the
    // dense tensor's codes; one scale per 64 rows.
    const auto& gu = shards->at("gate_up");
    std::vector<float> gu_scales(4);
    std::memcpy(gu_scales.data(), shards->at("gate_up.scales").data(), 16);
    for (const char* part : {"gate", "up"}) {
      const size_t at = part[0] == 'g' ? 0 : 128 * 64;
      Fp8Tensor g{DType::kBF16, 256, 64, 64, 64};
      std::vector<uint8_t> gq(g.elements());
      std::vector<float> gs(g.blocks());
      ASSERT_TRUE(QuantizeFp8(g, target.at(part), gq, gs).ok());
      for (size_t i = 0; i < 128 * 64; ++i) {
        ASSERT_EQ(static_cast<uint8_t>(gu[at + i]), gq[r * 128 * 64 + i])
            << part << " " << i;
      }
      for (size_t b = 0; b < 2; ++b) {
        EXPECT_EQ(gu_scales[(at / (64 * 64)) + b], gs[r * 2 + b]) << part;
      }
    }
    // down (row split): the rank's 128 columns of each of the 64 rows.
    Fp8Tensor d{DType::kBF16, 64, 256, 32, 64};
    std::vector<uint8_t> dq(d.elements());
    std::vector<float> ds(d.blocks());
    ASSERT_TRUE(QuantizeFp8(d, target.at("down"), dq, ds).ok());
    const auto& dn = shards->at("down");
    for (size_t row = 0; row < 64; ++row) {
      for (size_t col = 0; col < 128; ++col) {
        ASSERT_EQ(static_cast<uint8_t>(dn[row * 128 + col]),
                  dq[row * 256 + r * 128 + col])
            << row << "," << col;
      }
    }
    std::vector<float> dn_scales(4);
    std::memcpy(dn_scales.data(), shards->at("down_scale_inv").data(), 16);
    for (size_t br = 0; br < 2; ++br) {
      for (size_t bc = 0; bc < 2; ++bc) {
        EXPECT_EQ(dn_scales[br * 2 + bc], ds[br * 4 + r * 2 + bc]);
      }
    }
    // The vote hashes the shadows: the target's canonical bits.
    ShardBytes held;
    for (const auto& [name, bytes] : *shards) held.emplace(name, bytes);
    auto votes = m->HashRegions(held);
    auto expected = m->ExpectedRegions(View(target));
    ASSERT_TRUE(votes.ok()) << votes.status().ToString();
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(*votes, *expected);
  }
}

// A tp 2 server holding three weights as FP8 with one scale per tensor:
// a column split whose slices cut no blocks (125 rows each), fused
// gate/up (two scales), a row split.
constexpr const char* kFp8PerTensor = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.weight
    split: column
    shape: [250, 100]
    fp8: {block: tensor}
  - names: [gate, up]
    shard: gate_up
    split: gate_up
    shape: [256, 64]
    fp8: {block: tensor, scale: gate_up.scales}
  - name: down
    shard: down
    split: row
    shape: [64, 256]
    fp8: {block: tensor}
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
)";

// The per-tensor quantization of dense tensor `name` of `v`.
void QuantizeWhole(const Layout& l, const Tensors& v, const std::string& name,
                   std::vector<uint8_t>* q, float* scale) {
  for (const LayoutTensor& t : l.tensors) {
    if (t.name != name) continue;
    Fp8Tensor f{t.dtype, t.shape[0], t.shape[1], 0, 0};
    q->assign(f.elements(), 0);
    ASSERT_TRUE(QuantizeFp8(f, v.at(name), *q, std::span(scale, 1)).ok());
  }
}

float ScaleAt(const std::vector<std::byte>& scales, size_t i) {
  float f;
  std::memcpy(&f, scales.data() + i * sizeof(float), sizeof(float));
  return f;
}

TEST(ReceiverMapTest, PerTensorFp8ShardsTakeTheWholeTensorsScale) {
  auto l = ParseLayout(kFp8PerTensor, "fp8-tensor.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::mt19937_64 rng(53);
  const Tensors base = Bf16Weights(*l, rng);
  Tensors target = base;
  for (auto& [name, b] : target) {
    for (size_t e = 0; e < b.size(); e += 2) {
      if (rng() % 50 == 0) b[e] ^= std::byte{1};  // ~2% move by an ulp
    }
  }
  // w's new maximum lies in rank 1's rows: rank 0's scale and every one of
  // its codes change with it.
  const size_t big = 2 * (200 * 100 + 3);
  target.at("w")[big] = std::byte{0};
  target.at("w")[big + 1] = std::byte{0x3F};  // 0.5
  const auto chunks = Chunks(*l, base, target, 1000, false);
  for (uint32_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto m = ReceiverMap::Create(*l, r);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const auto& sh = m->shards();
    EXPECT_EQ(sh.at("w.weight").dtype, DType::kF8E4M3);
    EXPECT_EQ(sh.at("w.weight").shape, Shape({125, 100}));
    EXPECT_EQ(sh.at("w.shadow").shape, Shape({250, 100}));  // all of w
    EXPECT_EQ(sh.at("w.shadow").dtype, DType::kBF16);
    EXPECT_EQ(sh.at("w.weight_scale_inv").shape, Shape({1}));
    EXPECT_EQ(sh.at("gate_up.scales").shape, Shape({2}));
    EXPECT_EQ(sh.at("up.shadow").shape, Shape({256, 64}));
    EXPECT_EQ(sh.at("down.shadow").shape, Shape({64, 256}));
    EXPECT_EQ(sh.count("w.weight.shadow"), 0u);
    EXPECT_EQ(m->fp8_shards().at("gate_up").parts.size(), 2u);
    auto shards = m->Build(View(base));
    auto want = m->Build(View(target));
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    ASSERT_TRUE(want.ok());
    const auto built = *shards;
    MutableShardBytes writable;
    for (auto& [name, bytes] : *shards) writable.emplace(name, bytes);
    Fp8Dirty dirty;
    std::vector<std::pair<uint32_t, DecodedChunk>> undo;
    for (const auto& [tensor, c] : chunks) {
      const uint64_t first = uint64_t{c.header.id.span} * 1000;
      if (l->tensors[tensor].fp8) {
        EXPECT_THAT(m->Apply(tensor, first, c, writable).status().ToString(),
                    HasSubstr("Apply needs the dirty blocks"));
      }
      DecodedChunk back = c;
      back.header.kind = ChunkKind::kOverwrite;
      ASSERT_TRUE(m->Gather(tensor, first, c, writable, back.values).ok());
      undo.emplace_back(tensor, std::move(back));
      ASSERT_TRUE(m->Apply(tensor, first, c, writable, &dirty).ok());
    }
    // Every part changed: each shard's marks are all its parts.
    EXPECT_EQ(dirty.at("gate_up").count(), 2u);
    ASSERT_TRUE(m->Requantize(writable, &dirty).ok());
    EXPECT_EQ(*shards, *want);
    // Independently: the codes are the dense target's per-tensor
    // quantization at the rank's elements, and so are the scales.
    std::vector<uint8_t> q;
    float scale = 0;
    QuantizeWhole(*l, target, "w", &q, &scale);
    EXPECT_EQ(scale, 0.5f / 448.0f);
    EXPECT_EQ(ScaleAt(shards->at("w.weight_scale_inv"), 0), scale);
    const auto& codes = shards->at("w.weight");
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_EQ(static_cast<uint8_t>(codes[i]), q[r * 125 * 100 + i]) << i;
    }
    for (size_t k = 0; k < 2; ++k) {
      QuantizeWhole(*l, target, k == 0 ? "gate" : "up", &q, &scale);
      EXPECT_EQ(ScaleAt(shards->at("gate_up.scales"), k), scale);
      for (size_t i = 0; i < 128 * 64; ++i) {
        ASSERT_EQ(static_cast<uint8_t>(shards->at("gate_up")[k * 128 * 64 + i]),
                  q[r * 128 * 64 + i])
            << k << " " << i;
      }
    }
    QuantizeWhole(*l, target, "down", &q, &scale);
    EXPECT_EQ(ScaleAt(shards->at("down_scale_inv"), 0), scale);
    for (size_t row = 0; row < 64; ++row) {
      for (size_t col = 0; col < 128; ++col) {
        ASSERT_EQ(static_cast<uint8_t>(shards->at("down")[row * 128 + col]),
                  q[row * 256 + r * 128 + col]);
      }
    }
    // The vote covers the whole shadows: the root's digests of the target.
    ShardBytes held;
    for (const auto& [name, bytes] : *shards) held.emplace(name, bytes);
    auto votes = m->HashRegions(held);
    auto expected = m->ExpectedRegions(View(target));
    ASSERT_TRUE(votes.ok()) << votes.status().ToString();
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(*votes, *expected);
    // Undone last first through the journal's records and requantized,
    // the shards are the base's again: scales included.
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
      const uint64_t first = uint64_t{it->second.header.id.span} * 1000;
      ASSERT_TRUE(
          m->Apply(it->first, first, it->second, writable, &dirty).ok());
    }
    ASSERT_TRUE(m->Requantize(writable, &dirty).ok());
    EXPECT_EQ(*shards, built);
  }
}

TEST(ReceiverMapTest, PerTensorFp8ShardsMixingOthersAreRefused) {
  const std::string head = "version: 1\ntensors:\n";
  const std::string w =
      "  - name: w\n    shard: s\n    split: replicated\n"
      "    shape: [64, 64]\n    fp8: {block: tensor}\n";
  struct Bad {
    std::string yaml, error;
  };
  for (const Bad& b : {
           Bad{head + w +
                   "  - name: v\n    shard: s\n    split: replicated\n"
                   "    shape: [64, 64]\n",
               "shard 's' holds FP8 tensors and tensor 'v', which is not "
               "FP8"},
           // A block-scaled shard 'a' whose shadow would be tensor a's.
           Bad{head + "  - name: a\n    shard: a_q\n    split: replicated\n"
                      "    shape: [64, 64]\n    fp8: {block: tensor}\n"
                      "  - name: b\n    shard: a\n    split: replicated\n"
                      "    shape: [64, 64]\n    fp8: {block: [64, 64]}\n",
               "the shadow of FP8 shard 'a', 'a.shadow', is named like "
               "another tensor"},
           Bad{head + w +
                   "  - name: x\n    shard: x\n    split: replicated\n"
                   "    shape: [8]\n"
                   "  - name: y\n    shard: w.shadow\n"
                   "    split: replicated\n    shape: [64, 64]\n",
               "'y' is held in 'w.shadow', the name of tensor 'w''s FP8 "
               "shadow"},
           Bad{head + w +
                   "  - name: z\n    shard: s\n    split: replicated\n"
                   "    shape: [64, 64]\n    fp8: {block: [64, 64]}\n",
               "must share one shape, block shape, dtype and scale name"},
       }) {
    SCOPED_TRACE(b.yaml);
    auto l = ParseLayout(b.yaml, "bad.yaml");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_THAT(ReceiverMap::Create(*l, 0).status().ToString(),
                HasSubstr(b.error));
  }
}

TEST(ReceiverMapTest, Fp8BoxesThatCutBlocksAndFp8ProducersAreRefused) {
  std::string cut = kFp8;
  cut.replace(cut.find("[64, 32]"), 8, "[96, 32]");  // 128 rows per rank
  auto l = ParseLayout(cut, "cut.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_THAT(ReceiverMap::Create(*l, 1).status().ToString(),
              HasSubstr("FP8 tensor 'w' in shard 'w.weight': its box of "
                        "128x100 from [0, 0] at [128, 0] cuts 96x32 blocks"));
  auto fp8 = ParseLayout(kFp8, "fp8.yaml");
  ASSERT_TRUE(fp8.ok());
  std::mt19937_64 rng(47);
  const Tensors base = Bf16Weights(*fp8, rng);
  EXPECT_THAT(
      BuildShards(*fp8, 0, View(base)).status().ToString(),
      HasSubstr("serves tensor 'down' as FP8: that is a serving layout"));
  for (const char* bad :
       {"    fp8: {block: [64]}\n", "    fp8: {block: [64, 64], scales: x}\n",
        "    fp8: {scale: x}\n"}) {
    SCOPED_TRACE(bad);
    std::string y = std::string(R"(version: 1
tensors:
  - name: w
    shard: w
    split: replicated
    shape: [64, 64]
)") + bad;
    EXPECT_FALSE(ParseLayout(y, "bad.yaml").ok());
  }
  auto converted = ParseLayout(R"(version: 1
tensors:
  - name: w
    shard: w
    split: replicated
    shape: [64, 64]
    shard_dtype: F32
    fp8: {block: [64, 64]}
)",
                               "conv.yaml");
  EXPECT_THAT(converted.status().ToString(),
              HasSubstr("an fp8 entry takes no shard_dtype"));
}

}  // namespace
}  // namespace dcr
