// The layout YAML (dcr/layout.h): resolution checked against shards built
// the way Megatron builds them, written out here independently of the
// resolver; families, owners and fingerprints (layout_errors_test.cc has
// every refusal, with its message and line).
#include "dcr/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "dcr/shard_diff.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using ::testing::HasSubstr;

// Canonical tensors as values: element i of tensor k holds a number no
// other element of any tensor holds.
using Values = std::map<std::string, std::vector<int64_t>>;

Values CanonicalValues(const Layout& l) {
  Values v;
  int64_t next = 1;
  for (const LayoutTensor& t : l.tensors) {
    auto& x = v[t.name];
    x.resize(Volume(t.shape));
    for (auto& e : x) e = next++;
  }
  return v;
}

// Rows [first, first + n) of a row-major tensor with `row` elements per
// row; -1 where the rows run past the tensor (vocabulary padding).
std::vector<int64_t> Rows(const std::vector<int64_t>& t, uint64_t row,
                          uint64_t first, uint64_t n) {
  std::vector<int64_t> out;
  for (uint64_t r = first; r < first + n; ++r) {
    for (uint64_t c = 0; c < row; ++c) {
      out.push_back(r * row + c < t.size() ? t[r * row + c] : -1);
    }
  }
  return out;
}

std::vector<int64_t> Cols(const std::vector<int64_t>& t, uint64_t rows,
                          uint64_t cols, uint64_t first, uint64_t n) {
  std::vector<int64_t> out;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = first; c < first + n; ++c) out.push_back(t[r * cols + c]);
  }
  return out;
}

std::vector<int64_t> Transpose(const std::vector<int64_t>& t, uint64_t rows,
                               uint64_t cols) {
  std::vector<int64_t> out(t.size());
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) out[c * rows + r] = t[r * cols + c];
  }
  return out;
}

void Append(std::vector<int64_t>* a, const std::vector<int64_t>& b) {
  a->insert(a->end(), b.begin(), b.end());
}

// Every element of every rank's shard, read through the layout's pieces,
// must be the canonical element the reference sharding put there; and the
// pieces must reach every canonical element once.
void ExpectPiecesRead(const Layout& l, const Values& canonical,
                      const std::map<std::pair<uint32_t, std::string>,
                                     std::vector<int64_t>>& shards) {
  std::map<std::string, std::vector<int>> hits;
  for (const LayoutTensor& t : l.tensors) {
    hits[t.name].assign(Volume(t.shape), 0);
    for (const AffinePiece& p : t.pieces) {
      auto it = shards.find({p.rank, p.shard});
      ASSERT_NE(it, shards.end())
          << "rank " << p.rank << " holds no shard '" << p.shard << "'";
      ASSERT_EQ(it->second.size(), Volume(p.shard_shape)) << p.shard;
      PieceMap m(p, t.shape);
      for (uint64_t s = 0; s < it->second.size(); ++s) {
        if (!m.Holds(s)) continue;
        uint64_t c = m.ToCanonical(s);
        ASSERT_EQ(it->second[s], canonical.at(t.name)[c])
            << t.name << " rank " << p.rank << " shard " << p.shard
            << " position " << s;
        ++hits[t.name][c];
      }
    }
  }
  for (const auto& [name, h] : hits) {
    for (size_t c = 0; c < h.size(); ++c) {
      ASSERT_EQ(h[c], 1) << name << " element " << c;
    }
  }
}

// A small Megatron-style GPT: vocabulary 1000 padded, fused QKV with GQA,
// fused gate/up, row-parallel projections, replicated norms, a final norm
// and an untied head on the last stage.
std::string MegatronGpt(uint32_t tp, uint32_t pp, bool transpose_head = false) {
  std::string y = "version: 1\n";
  y += "parallel: {tp: " + std::to_string(tp) + ", pp: " + std::to_string(pp) +
       "}\n";
  y += R"(layers: 4
tensors:
  - name: model.embed_tokens.weight
    shard: embedding.word_embeddings.weight
    split: vocab
    pad_to: 8
    shape: [1000, 16]
  - names:
      - model.layers.{layer}.self_attn.q_proj.weight
      - model.layers.{layer}.self_attn.k_proj.weight
      - model.layers.{layer}.self_attn.v_proj.weight
    shard: decoder.layers.{layer}.self_attention.linear_qkv.weight
    split: qkv
    heads: 8
    kv_heads: 4
    head_dim: 2
    columns: 16
  - names:
      - model.layers.{layer}.self_attn.q_proj.bias
      - model.layers.{layer}.self_attn.k_proj.bias
      - model.layers.{layer}.self_attn.v_proj.bias
    shard: decoder.layers.{layer}.self_attention.linear_qkv.bias
    split: qkv
    heads: 8
    kv_heads: 4
    head_dim: 2
  - name: model.layers.{layer}.self_attn.o_proj.weight
    shard: decoder.layers.{layer}.self_attention.linear_proj.weight
    split: row
    shape: [16, 16]
  - names:
      - model.layers.{layer}.mlp.gate_proj.weight
      - model.layers.{layer}.mlp.up_proj.weight
    shard: decoder.layers.{layer}.mlp.linear_fc1.weight
    split: gate_up
    shape: [24, 16]
  - name: model.layers.{layer}.mlp.down_proj.weight
    shard: decoder.layers.{layer}.mlp.linear_fc2.weight
    split: row
    shape: [16, 24]
  - name: model.layers.{layer}.input_layernorm.weight
    shard: decoder.layers.{layer}.input_layernorm.weight
    split: replicated
    shape: [16]
  - name: model.norm.weight
    shard: decoder.final_layernorm.weight
    split: replicated
    shape: [16]
    stage: last
  - name: lm_head.weight
    shard: output_layer.weight
    split: vocab
    pad_to: 8
    shape: [1000, 16]
    stage: last
)";
  if (transpose_head) y += "    transpose: true\n";
  return y;
}

// The shards each rank of MegatronGpt(tp, pp) holds, built the way Megatron
// builds them from the canonical tensors.
std::map<std::pair<uint32_t, std::string>, std::vector<int64_t>> GptShards(
    const Values& v, uint32_t tp, uint32_t pp, bool transpose_head) {
  std::map<std::pair<uint32_t, std::string>, std::vector<int64_t>> out;
  const uint64_t hidden = 16, ffn = 24, heads = 8, groups = 4, d = 2;
  const uint64_t vocab_rows = (1000 + 8 * tp - 1) / (8 * tp) * 8 * tp / tp;
  const uint32_t per_stage = 4 / pp;
  for (uint32_t s = 0; s < pp; ++s) {
    for (uint32_t t = 0; t < tp; ++t) {
      uint32_t rank = t + tp * s;
      auto put = [&](const std::string& name, std::vector<int64_t> x) {
        out[{rank, name}] = std::move(x);
      };
      if (s == 0) {
        put("embedding.word_embeddings.weight",
            Rows(v.at("model.embed_tokens.weight"), hidden, t * vocab_rows,
                 vocab_rows));
      }
      if (s == pp - 1) {
        auto head =
            Rows(v.at("lm_head.weight"), hidden, t * vocab_rows, vocab_rows);
        if (transpose_head) head = Transpose(head, vocab_rows, hidden);
        put("output_layer.weight", head);
        if (t == 0)
          put("decoder.final_layernorm.weight", v.at("model.norm.weight"));
      }
      for (uint32_t ll = 0; ll < per_stage; ++ll) {
        std::string g = "model.layers." + std::to_string(s * per_stage + ll);
        std::string m = "decoder.layers." + std::to_string(ll);
        for (const char* kind : {"weight", "bias"}) {
          uint64_t row = std::string(kind) == "weight" ? hidden : 1;
          std::vector<int64_t> fused;
          for (uint64_t gi = t * groups / tp; gi < (t + 1) * groups / tp;
               ++gi) {
            uint64_t q = heads / groups * d;
            Append(&fused,
                   Rows(v.at(g + ".self_attn.q_proj." + kind), row, gi * q, q));
            Append(&fused,
                   Rows(v.at(g + ".self_attn.k_proj." + kind), row, gi * d, d));
            Append(&fused,
                   Rows(v.at(g + ".self_attn.v_proj." + kind), row, gi * d, d));
          }
          put(m + ".self_attention.linear_qkv." + kind, fused);
        }
        put(m + ".self_attention.linear_proj.weight",
            Cols(v.at(g + ".self_attn.o_proj.weight"), hidden, hidden,
                 t * hidden / tp, hidden / tp));
        std::vector<int64_t> fc1 = Rows(v.at(g + ".mlp.gate_proj.weight"),
                                        hidden, t * ffn / tp, ffn / tp);
        Append(&fc1, Rows(v.at(g + ".mlp.up_proj.weight"), hidden, t * ffn / tp,
                          ffn / tp));
        put(m + ".mlp.linear_fc1.weight", fc1);
        put(m + ".mlp.linear_fc2.weight",
            Cols(v.at(g + ".mlp.down_proj.weight"), hidden, ffn, t * ffn / tp,
                 ffn / tp));
        if (t == 0) {
          put(m + ".input_layernorm.weight",
              v.at(g + ".input_layernorm.weight"));
        }
      }
    }
  }
  return out;
}

TEST(LayoutTest, MegatronGptMatchesAReferenceSharding) {
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      for (bool transpose : {false, true}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) +
                     (transpose ? " transposed" : ""));
        auto l = ParseLayout(MegatronGpt(tp, pp, transpose), "gpt.yaml");
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        EXPECT_EQ(l->ranks(), tp * pp);
        // embed, norm and head, and 11 per layer.
        EXPECT_EQ(l->tensors.size(), 3u + 4 * 11);
        Values v = CanonicalValues(*l);
        ExpectPiecesRead(*l, v, GptShards(v, tp, pp, transpose));
      }
    }
  }
}

TEST(LayoutTest, ShapesDtypesAndShardsOfEachRank) {
  auto l = ParseLayout(MegatronGpt(2, 2), "gpt.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::map<std::string, const LayoutTensor*> by_name;
  for (const LayoutTensor& t : l->tensors) by_name[t.name] = &t;
  EXPECT_EQ(by_name.at("model.layers.3.self_attn.q_proj.weight")->shape,
            (Shape{16, 16}));
  EXPECT_EQ(by_name.at("model.layers.3.self_attn.k_proj.bias")->shape,
            (Shape{8}));
  EXPECT_EQ(by_name.at("model.embed_tokens.weight")->dtype, DType::kBF16);
  // Rank 3: tp 1 of the last stage holds layers 2-3 by local index 0-1,
  // its half of the head, and no norm (tp 0 owns those).
  auto shards = l->ShardsOf(3);
  ASSERT_TRUE(shards.contains("decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_EQ(shards.at("decoder.layers.1.mlp.linear_fc1.weight").shape,
            (Shape{24, 16}));
  EXPECT_EQ(shards.at("output_layer.weight").shape, (Shape{504, 16}));
  EXPECT_FALSE(shards.contains("decoder.layers.2.mlp.linear_fc1.weight"));
  EXPECT_FALSE(shards.contains("decoder.final_layernorm.weight"));
  EXPECT_FALSE(shards.contains("embedding.word_embeddings.weight"));
  EXPECT_TRUE(l->ShardsOf(2).contains("decoder.final_layernorm.weight"));
  EXPECT_TRUE(l->ShardsOf(4).empty());
}

TEST(LayoutTest, ExpertsSplitOverExpertParallelRanks) {
  auto l = ParseLayout(R"(version: 1
parallel: {tp: 2, ep: 2}
layers: 1
experts: 4
tensors:
  - name: model.layers.{layer}.mlp.gate.weight
    shard: decoder.layers.{layer}.mlp.router.weight
    split: replicated
    shape: [4, 8]
  - names:
      - model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight
      - model.layers.{layer}.mlp.experts.{expert}.up_proj.weight
    shard: decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight
    split: gate_up
    shape: [6, 8]
  - name: model.layers.{layer}.mlp.experts.{expert}.down_proj.weight
    shard: decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc2.weight
    split: row
    shape: [8, 6]
)",
                       "moe.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->ranks(), 4u);
  int found = 0;
  // Experts 2 and 3 live on ep rank 1 (ranks 2 and 3) as local 0 and 1.
  for (const LayoutTensor& t : l->tensors) {
    if (t.name == "model.layers.0.mlp.experts.3.down_proj.weight") {
      ++found;
      ASSERT_EQ(t.pieces.size(), 2u);
      EXPECT_EQ(t.pieces[0].rank, 2u);
      EXPECT_EQ(t.pieces[1].rank, 3u);
      EXPECT_EQ(t.pieces[1].shard,
                "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2."
                "weight");
      EXPECT_EQ(t.pieces[1].to, (Shape{0, 3}));
    }
    if (t.name == "model.layers.0.mlp.gate.weight") {
      ++found;
      // Replicated over tp and ep: produced by rank 0 alone.
      ASSERT_EQ(t.pieces.size(), 1u);
      EXPECT_EQ(t.pieces[0].rank, 0u);
    }
  }
  EXPECT_EQ(found, 2);
  EXPECT_EQ(l->tensors.size(), 1u + 4 * 3);
  EXPECT_TRUE(l->ShardsOf(3).contains(
      "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"));
  EXPECT_FALSE(l->ShardsOf(3).contains(
      "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"));
}

TEST(LayoutTest, UnevenStagesConversionsAndExplicitPieces) {
  auto l = ParseLayout(R"(version: 1
parallel: {pp: 2}
layers: 3
stages: [1, 2]
tensors:
  - name: model.layers.{layer}.input_layernorm.weight
    shard: layers.{layer}.norm
    split: replicated
    shape: [4]
    shard_dtype: F32
    add: 1
  - name: w
    split: pieces
    shape: [4, 2]
    dtype: F32
    pieces:
      - {rank: 1, shard: a, shard_shape: [2, 2], to: [0, 0], step: [2, 1]}
      - {rank: 0, shard: b, shard_shape: [2, 2], to: [1, 0], step: [2, 1]}
)",
                       "x.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->stages, (std::vector<uint32_t>{1, 2}));
  ASSERT_EQ(l->tensors.size(), 4u);
  int found = 0;
  for (const LayoutTensor& t : l->tensors) {
    if (t.name == "model.layers.2.input_layernorm.weight") {
      ++found;
      EXPECT_EQ(t.pieces[0].rank, 1u);
      EXPECT_EQ(t.pieces[0].shard, "layers.1.norm");
      EXPECT_EQ(t.conversion.shard_dtype, DType::kF32);
      EXPECT_EQ(t.conversion.add, 1.0);
      EXPECT_FALSE(t.conversion.identity(t.dtype));
    }
    if (t.name == "model.layers.0.input_layernorm.weight") {
      ++found;
      EXPECT_EQ(t.pieces[0].rank, 0u);
    }
    if (t.name == "w") {
      ++found;
      EXPECT_TRUE(t.conversion.identity(t.dtype));
      EXPECT_EQ(t.pieces.size(), 2u);
    }
  }
  EXPECT_EQ(found, 3);
}

TEST(LayoutTest, FingerprintFollowsWhatIsResolvedNotHowItIsWritten) {
  auto a = ParseLayout(MegatronGpt(2, 2), "a.yaml");
  ASSERT_TRUE(a.ok());
  // The same layout with the final norm's entry moved first.
  std::string text = MegatronGpt(2, 2);
  size_t at = text.find("  - name: model.norm.weight");
  size_t end = text.find("  - name: lm_head.weight");
  std::string norm = text.substr(at, end - at);
  text.erase(at, end - at);
  text.insert(text.find("tensors:\n") + 9, norm);
  auto b = ParseLayout(text + "# a comment\n", "b.yaml");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  auto c = ParseLayout(MegatronGpt(4, 2), "c.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->Fingerprint(), c->Fingerprint());
  auto d = ParseLayout(MegatronGpt(2, 2, /*transpose_head=*/true), "d.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_NE(a->Fingerprint(), d->Fingerprint());
  // Explicit pieces in another order, and add: -0 for nothing.
  const std::string p1 =
      "version: 1\nparallel: {tp: 2}\ntensors:\n  - name: w\n"
      "    split: pieces\n    shape: [4]\n    dtype: F32\n"
      "    shard_dtype: BF16\n    add: ADD\n    pieces:\n"
      "      - {rank: 0, shard: a, shard_shape: [2], to: [0]}\n"
      "      - {rank: 1, shard: b, shard_shape: [2], to: [2]}\n";
  std::string p2 = p1;
  const std::string first =
      "      - {rank: 0, shard: a, shard_shape: [2], to: [0]}\n";
  p2.erase(p2.find(first), first.size());
  p2 += first;
  auto with = [](std::string y, const char* add) {
    y.replace(y.find("ADD"), 3, add);
    return ParseLayout(y, "p.yaml");
  };
  auto e1 = with(p1, "0"), e2 = with(p2, "-0"), e3 = with(p1, "1");
  ASSERT_TRUE(e1.ok() && e2.ok() && e3.ok()) << e2.status().ToString();
  EXPECT_NE(p1, p2);
  EXPECT_EQ(e1->Fingerprint(), e2->Fingerprint());
  EXPECT_NE(e1->Fingerprint(), e3->Fingerprint());
}

TEST(LayoutTest, StackedQkvHoldsEachRanksQueriesThenKeysThenValues) {
  // vLLM's QKVParallelLinear at tp 2: 4 query heads and 2 kv heads of
  // size 2; rank t holds query heads 2t, 2t+1, then kv head t's key, then
  // its value. Megatron's grouped order interleaves per kv group instead.
  const std::string qkv =
      "  - names: [q, k, v]\n    shard: qkv\n    split: qkv\n"
      "    heads: 4\n    kv_heads: 2\n    head_dim: 2\n    columns: 1\n";
  auto stacked = ParseLayout(
      One(qkv + "    order: stacked\n", "parallel: {tp: 2}\n"), "s.yaml");
  auto grouped = ParseLayout(One(qkv, "parallel: {tp: 2}\n"), "g.yaml");
  ASSERT_TRUE(stacked.ok()) << stacked.status().ToString();
  ASSERT_TRUE(grouped.ok()) << grouped.status().ToString();
  // One kv group per rank: the two orders are the same pieces.
  EXPECT_EQ(stacked->Fingerprint(), grouped->Fingerprint());
  // Canonical element values: q rows 0-7 hold 0-7, k rows 10-13, v 20-23.
  Tensors canonical;
  auto fill = [&](const char* name, int first, int rows) {
    auto& b = canonical[name];
    for (int r = 0; r < rows; ++r) {
      const uint16_t v = static_cast<uint16_t>(first + r);
      b.push_back(static_cast<std::byte>(v & 0xFF));
      b.push_back(static_cast<std::byte>(v >> 8));
    }
  };
  fill("q", 0, 8);
  fill("k", 10, 4);
  fill("v", 20, 4);
  auto rows_of = [&](const Layout& l, uint32_t rank) {
    auto built = BuildShards(l, rank, View(canonical));
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    std::vector<int> rows;
    const auto& b = built->at("qkv");
    for (size_t i = 0; i < b.size(); i += 2) rows.push_back(int(b[i]));
    return rows;
  };
  EXPECT_EQ(rows_of(*stacked, 0),
            (std::vector<int>{0, 1, 2, 3, 10, 11, 20, 21}));
  EXPECT_EQ(rows_of(*stacked, 1),
            (std::vector<int>{4, 5, 6, 7, 12, 13, 22, 23}));
  EXPECT_EQ(rows_of(*grouped, 0),
            (std::vector<int>{0, 1, 2, 3, 10, 11, 20, 21}));
  // With two groups per rank the orders differ.
  auto stacked1 = ParseLayout(One(qkv + "    order: stacked\n"), "s1.yaml");
  auto grouped1 = ParseLayout(One(qkv), "g1.yaml");
  ASSERT_TRUE(stacked1.ok() && grouped1.ok());
  EXPECT_NE(stacked1->Fingerprint(), grouped1->Fingerprint());
  EXPECT_EQ(rows_of(*stacked1, 0),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 20, 21,
                              22, 23}));
  EXPECT_EQ(rows_of(*grouped1, 0),
            (std::vector<int>{0, 1, 2, 3, 10, 11, 20, 21, 4, 5, 6, 7, 12, 13,
                              22, 23}));
}

TEST(LayoutTest, LoadLayoutSaysWhatIsMissing) {
  auto l = LoadLayout("/nonexistent/layout.yaml");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(l.status().message(), HasSubstr("/nonexistent/layout.yaml"));
}

TEST(LayoutTest, EveryExampleLayoutResolves) {
  int seen = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(DCR_LAYOUTS_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    auto l = LoadLayout(entry.path().string());
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_GT(l->tensors.size(), 0u);
    for (uint32_t r = 0; r < l->ranks(); ++r) {
      EXPECT_FALSE(l->ShardsOf(r).empty()) << "rank " << r << " holds nothing";
    }
    ++seen;
  }
  EXPECT_GE(seen, 2);
}

}  // namespace
}  // namespace dcr
