// Shard diff and projection (dcr/shard_diff.h): over random tilings and the
// Megatron layouts, every rank's shards are built from canonical base and
// target tensors, each rank diffs its own, and together the ranks' changes
// are exactly the canonical changed set with its base and target bits,
// each element once. Conversions, missing and resized shards.
#include "dcr/shard_diff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "unit/placement/random_tiling.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Gpt;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using ::testing::HasSubstr;

// Diffs every rank and checks the union against the canonical diff.
void ExpectRanksCoverTheChangedSet(const Layout& l, const Tensors& base,
                                   const Tensors& target) {
  std::map<size_t, std::map<uint64_t, std::pair<std::vector<std::byte>,
                                                std::vector<std::byte>>>>
      got;
  std::vector<std::vector<LinearDigest>> parts;
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    auto bs = BuildShards(l, r, View(base));
    auto ts = BuildShards(l, r, View(target));
    ASSERT_TRUE(bs.ok()) << bs.status().ToString();
    ASSERT_TRUE(ts.ok()) << ts.status().ToString();
    ShardBytes b, t;
    for (const auto& [n, v] : *bs) b.emplace(n, v);
    for (const auto& [n, v] : *ts) t.emplace(n, v);
    // One shard at a time builds what BuildShards builds, and hashing
    // the canonical regions in place gives the built shards' parts.
    size_t seen = 0;
    ASSERT_TRUE(BuildShardsEach(
                    l, r, View(target),
                    [&](const std::string& n, std::vector<std::byte>&& v) {
                      EXPECT_EQ(v, ts->at(n)) << "rank " << r << " shard " << n;
                      ++seen;
                      return Status::OK();
                    })
                    .ok());
    EXPECT_EQ(seen, ts->size());
    auto in_place = HashCanonicalRegions(l, r, View(target));
    auto built = HashShardRegions(l, r, t);
    ASSERT_TRUE(in_place.ok()) << in_place.status().ToString();
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_EQ(*in_place, *built) << "rank " << r;
    parts.push_back(*built);
    ShardDiffStats st;
    auto changes = DiffShards(l, r, b, t, &st);
    ASSERT_TRUE(changes.ok()) << changes.status().ToString();
    uint64_t own = 0;
    for (const auto& [n, v] : *bs) own += v.size();
    // The change log the same diff keeps moves a copy of the base shards
    // to the target's bits and back, within its bound.
    {
      const uint64_t limit = 8 * own + 4096;
      ShardChangeLog log(limit);
      ASSERT_TRUE(DiffShardsEach(
                      l, r, b, t,
                      [](CanonicalChanges&&) { return Status::OK(); }, nullptr,
                      &log)
                      .ok());
      EXPECT_FALSE(log.overflowed()) << "rank " << r;
      EXPECT_LE(log.bytes(), limit);
      ShardChangeLog::Buffers moved(bs->begin(), bs->end());
      ASSERT_TRUE(log.Forward(&moved).ok());
      for (const auto& [n, v] : *ts) {
        EXPECT_TRUE(moved.at(n) == v) << "rank " << r << " shard " << n;
      }
      ASSERT_TRUE(log.Back(&moved).ok());
      for (const auto& [n, v] : *bs) {
        EXPECT_TRUE(moved.at(n) == v) << "rank " << r << " shard " << n;
      }
    }
    EXPECT_EQ(st.shard_bytes_read, 2 * own) << "rank " << r;
    for (const CanonicalChanges& c : *changes) {
      const size_t w = DTypeSize(l.tensors[c.tensor].dtype);
      ASSERT_EQ(c.base.size(), c.positions.size() * w);
      ASSERT_EQ(c.target.size(), c.positions.size() * w);
      ASSERT_TRUE(std::is_sorted(c.positions.begin(), c.positions.end()));
      for (size_t k = 0; k < c.positions.size(); ++k) {
        auto [it, fresh] = got[c.tensor].emplace(
            c.positions[k],
            std::pair(
                std::vector<std::byte>(&c.base[k * w], &c.base[k * w] + w),
                std::vector<std::byte>(&c.target[k * w],
                                       &c.target[k * w] + w)));
        ASSERT_TRUE(fresh) << l.tensors[c.tensor].name << " position "
                           << c.positions[k] << " produced twice";
      }
    }
  }
  for (size_t ti = 0; ti < l.tensors.size(); ++ti) {
    const LayoutTensor& t = l.tensors[ti];
    const size_t w = DTypeSize(t.dtype);
    const auto& b = base.at(t.name);
    const auto& g = target.at(t.name);
    uint64_t want = 0;
    for (uint64_t e = 0; e < Volume(t.shape); ++e) {
      if (std::memcmp(&b[e * w], &g[e * w], w) == 0) continue;
      ++want;
      auto it = got[ti].find(e);
      ASSERT_NE(it, got[ti].end()) << t.name << " position " << e << " lost";
      EXPECT_EQ(0, std::memcmp(it->second.first.data(), &b[e * w], w));
      EXPECT_EQ(0, std::memcmp(it->second.second.data(), &g[e * w], w));
    }
    EXPECT_EQ(got[ti].size(), want) << t.name << ": unchanged elements sent";
    // The ranks' parts (contiguous runs hashed in batches) add up to the
    // tensor's digest.
    LinearDigest sum;
    for (const auto& p : parts) sum ^= p[ti];
    EXPECT_EQ(FinishTensorDigest(sum, g.size()), TensorDigest(g)) << t.name;
  }
}

TEST(ShardDiffTest, RandomTilingsCoverTheChangedSetOnce) {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Layout l = placement_testing::RandomLayout(rng);
    for (const LayoutTensor& t : l.tensors) {
      ASSERT_TRUE(CheckTiling(t.name, t.shape, t.pieces).ok());
    }
    auto [base, target] = RandomVersions(l, rng() % 2 ? 0.05 : 0.6, rng);
    ExpectRanksCoverTheChangedSet(l, base, target);
  }
}

TEST(ShardDiffTest, MegatronLayoutsCoverTheChangedSetOnce) {
  std::mt19937_64 rng(5);
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      auto l = ParseLayout(Gpt(tp, pp), "gpt.yaml");
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      for (double rate : {0.0, 0.03, 0.5, 1.0}) {
        auto [base, target] = RandomVersions(*l, rate, rng);
        ExpectRanksCoverTheChangedSet(*l, base, target);
      }
    }
  }
}

// Rank `rank`'s shards of two versions, and views of them.
struct BuiltShards {
  ShardChangeLog::Buffers base, target;
  ShardBytes base_view, target_view;
};
BuiltShards Build(const Layout& l, uint32_t rank, const Tensors& base,
                  const Tensors& target) {
  BuiltShards out;
  auto bs = BuildShards(l, rank, View(base));
  auto ts = BuildShards(l, rank, View(target));
  EXPECT_TRUE(bs.ok() && ts.ok());
  if (!bs.ok() || !ts.ok()) return out;
  out.base = ShardChangeLog::Buffers(bs->begin(), bs->end());
  out.target = ShardChangeLog::Buffers(ts->begin(), ts->end());
  for (const auto& [n, v] : out.base) out.base_view.emplace(n, v);
  for (const auto& [n, v] : out.target) out.target_view.emplace(n, v);
  return out;
}

// A log past its bound keeps nothing more and says so; what it held never
// passed the bound, and Clear makes it whole again.
TEST(ShardDiffTest, AChangeLogPastItsBoundOverflows) {
  std::mt19937_64 rng(23);
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto [base, target] = RandomVersions(*l, 0.3, rng);
  const BuiltShards built = Build(*l, 0, base, target);
  const ShardBytes& b = built.base_view;
  const ShardBytes& t = built.target_view;
  auto none = [](CanonicalChanges&&) { return Status::OK(); };
  uint64_t full = 0;  // what a log without a bound holds at its largest
  {
    ShardChangeLog log(~uint64_t{0});
    ASSERT_TRUE(DiffShardsEach(*l, 0, b, t, none, nullptr, &log).ok());
    ASSERT_FALSE(log.overflowed());
    full = log.bytes();
  }
  for (uint64_t limit : {uint64_t{0}, uint64_t{64}, full / 4}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    ShardChangeLog log(limit);
    ASSERT_TRUE(DiffShardsEach(*l, 0, b, t, none, nullptr, &log).ok());
    EXPECT_TRUE(log.overflowed());
    EXPECT_LE(log.bytes(), limit);
    log.Clear();
    EXPECT_FALSE(log.overflowed());
    EXPECT_LE(log.bytes(), limit);
    log.Free();
    EXPECT_EQ(log.bytes(), 0u);
  }
}

// Cleared, a log keeps its blocks for the next diff and allocates no more
// for as many changes; what it keeps then is the new diff's alone. A new
// bound below what it holds frees them.
TEST(ShardDiffTest, AClearedChangeLogKeepsItsBlocks) {
  std::mt19937_64 rng(31);
  auto l = ParseLayout(Gpt(2, 2), "gpt.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto none = [](CanonicalChanges&&) { return Status::OK(); };
  ShardChangeLog log(~uint64_t{0});
  uint64_t held = 0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto [base, target] = RandomVersions(*l, 0.1, rng);
    const BuiltShards built = Build(*l, 1, base, target);
    const ShardBytes& b = built.base_view;
    const ShardBytes& t = built.target_view;
    log.Clear();
    ASSERT_TRUE(DiffShardsEach(*l, 1, b, t, none, nullptr, &log).ok());
    ASSERT_FALSE(log.overflowed());
    if (step > 0) {
      // About as many changes: few new blocks, if any (the first of a
      // shard that had none, or one more where it had more).
      EXPECT_LE(log.bytes(), held + held / 2);
    }
    held = log.bytes();
    ShardChangeLog::Buffers moved = built.base;
    ASSERT_TRUE(log.Forward(&moved).ok());
    EXPECT_TRUE(moved == built.target);
    ASSERT_TRUE(log.Back(&moved).ok());
    EXPECT_TRUE(moved == built.base);
  }
  ASSERT_GT(held, 0u);
  log.Clear(held);
  EXPECT_EQ(log.bytes(), held);
  log.Clear(held - 1);
  EXPECT_EQ(log.bytes(), 0u);
}

// The bound is each step's, whichever shards change: blocks one shard
// kept from a step before go to another that needs them now, and the last
// block is cut to what is left of the bound.
TEST(ShardDiffTest, AChangeLogsBoundIsEachSteps) {
  constexpr uint64_t kPer = 8;  // 4 bytes of index, 2 + 2 of bits
  constexpr size_t kElems = 100000;
  ShardChangeLog log(kElems * kPer);
  // An element's base and target bits (BF16: 2 bytes each).
  const std::byte base_bits[2] = {std::byte{1}, std::byte{0}};
  const std::byte target_bits[2] = {std::byte{2}, std::byte{0}};
  auto fill = [&](const std::string& shard, size_t n) {
    ShardChangeLog::Shard* s = log.For(shard, 2);
    for (size_t i = 0; i < n; i += 1000) {
      const size_t k = std::min<size_t>(1000, n - i);
      if (!log.Reserve(s, k)) return false;
      for (size_t j = 0; j < k; ++j) {
        log.Add(s, i + j, base_bits, target_bits);
      }
    }
    return true;
  };
  // Step 1: all of the bound in shard a (its last block cut to fit).
  ASSERT_TRUE(fill("a", kElems));
  EXPECT_FALSE(log.overflowed());
  EXPECT_EQ(log.bytes(), kElems * kPer);
  // Step 2: as many in shard b, none in a.
  log.Clear();
  ASSERT_TRUE(fill("b", kElems));
  EXPECT_FALSE(log.overflowed());
  EXPECT_LE(log.bytes(), kElems * kPer);
  ShardChangeLog::Buffers shards = {{"a", std::vector<std::byte>(2 * kElems)},
                                    {"b", std::vector<std::byte>(2 * kElems)}};
  ASSERT_TRUE(log.Forward(&shards).ok());
  EXPECT_EQ(shards.at("a"), std::vector<std::byte>(2 * kElems));
  for (size_t i = 0; i < kElems; ++i) {
    ASSERT_EQ(shards.at("b")[2 * i], std::byte{2}) << i;
  }
  // One more than the bound overflows.
  log.Clear();
  EXPECT_FALSE(fill("a", kElems + 1));
  EXPECT_TRUE(log.overflowed());
  EXPECT_LE(log.bytes(), kElems * kPer);
}

uint16_t Bf16(float v) {
  uint32_t b = std::bit_cast<uint32_t>(v);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

TEST(ShardDiffTest, ConvertedTensorsReportOnlyCanonicalChanges) {
  // A zero-centred norm weight: an F32 master w - 1, published as BF16 w.
  auto l = ParseLayout(R"(version: 1
tensors:
  - name: norm
    shard: norm
    split: replicated
    shape: [4]
    shard_dtype: F32
    add: 1
)",
                       "n.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::vector<float> b = {0.5f, 0.25f, -0.125f, 0.0f};
  std::vector<float> t = b;
  t[0] = 0.5f + 1e-7f;  // rounds to the same BF16 after adding 1
  t[2] = -0.5f;         // a real change
  t[3] = std::bit_cast<float>(0xFFC00001u);  // a NaN
  ShardBytes bs{{"norm", std::as_bytes(std::span(b))}};
  ShardBytes ts{{"norm", std::as_bytes(std::span(t))}};
  auto c = DiffShards(*l, 0, bs, ts);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].positions, (std::vector<uint64_t>{2, 3}));
  uint16_t got[2];
  std::memcpy(got, (*c)[0].target.data(), 4);
  EXPECT_EQ(got[0], Bf16(0.5f));
  EXPECT_EQ(got[1], 0x7FC0u);  // as PyTorch: one NaN for all
  std::memcpy(got, (*c)[0].base.data(), 4);
  EXPECT_EQ(got[0], Bf16(0.875f));
  EXPECT_EQ(got[1], Bf16(1.0f));
  // Its shard cannot be built from canonical bits.
  std::vector<std::byte> canon(8);
  auto s = BuildShards(*l, 0, CanonicalBytes{{"norm", canon}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("tensor 'norm' is converted"));
  bool called = false;
  Status each =
      BuildShardsEach(*l, 0, CanonicalBytes{{"norm", canon}},
                      [&](const std::string&, std::vector<std::byte>&&) {
                        called = true;
                        return Status::OK();
                      });
  EXPECT_THAT(each.message(), HasSubstr("tensor 'norm' is converted"));
  EXPECT_FALSE(called) << "a shard built before the checks";
  // Nor hashed as if it were.
  auto h = HashCanonicalRegions(*l, 0, CanonicalBytes{{"norm", canon}});
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("tensor 'norm' is converted"));
  EXPECT_FALSE(
      HashCanonicalRegions(*l, 9, CanonicalBytes{{"norm", canon}}).ok());
}

// A head tied to its embedding reads the embedding's shard. Built from a
// canonical checkpoint where the two differ, the shard holds one of them
// in both regions; the parts hashed without building say the same.
TEST(ShardDiffTest, ATiedShardIsHashedAsBuilt) {
  auto l = ParseLayout(R"(version: 1
tensors:
  - name: embed
    shard: word
    split: replicated
    shape: [6, 4]
  - name: head
    shard: word
    split: replicated
    shape: [6, 4]
)",
                       "tied.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::vector<std::byte> embed(48), head(48);
  for (size_t i = 0; i < 48; ++i) {
    embed[i] = std::byte(i);
    head[i] = std::byte(i % 7 == 0 ? 0xEE : i);
  }
  for (const auto& [e, h] : {std::pair(embed, head), std::pair(embed, embed)}) {
    CanonicalBytes canon{{"embed", e}, {"head", h}};
    auto built = BuildShards(*l, 0, canon);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    ShardBytes view;
    for (const auto& [n, v] : *built) view.emplace(n, v);
    auto want = HashShardRegions(*l, 0, view);
    auto got = HashCanonicalRegions(*l, 0, canon);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(*got, *want);
  }
}

TEST(ShardDiffTest, MissingAndResizedShardsAreRefused) {
  auto l = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.local
    split: column
    shape: [4, 2]
)",
                       "c.yaml");
  ASSERT_TRUE(l.ok());
  std::vector<std::byte> ok(8), small(6), extra(3);
  ShardBytes good{{"w.local", ok}, {"adam.exp_avg", extra}};
  ShardBytes none{{"other", ok}};
  ShardBytes resized{{"w.local", small}};
  // Shards the layout does not name are ignored.
  EXPECT_TRUE(DiffShards(*l, 1, good, good).ok());
  auto r = DiffShards(*l, 1, none, good);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound());
  EXPECT_THAT(r.status().message(),
              HasSubstr("rank 1: the base shards lack 'w.local', which "
                        "layout c.yaml gives this rank"));
  r = DiffShards(*l, 0, good, resized);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("rank 0: target shard 'w.local' has 6 bytes, but "
                        "layout c.yaml gives it shape [2, 2] of BF16 (8 "
                        "bytes)"));
  r = DiffShards(*l, 2, good, good);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("rank 2 is not below"));
}

TEST(ShardDiffTest, CompareShardsFindsTheFirstWrongElementOfEachShard) {
  auto l = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: embed
    shard: emb
    split: vocab
    pad_to: 4
    shape: [10, 2]
  - name: w
    shard: w.t
    split: column
    shape: [4, 3]
    transpose: true
)",
                       "v.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::mt19937_64 rng(3);
  auto [canon, unused] = RandomVersions(*l, 0, rng);
  auto built = BuildShards(*l, 1, View(canon));
  ASSERT_TRUE(built.ok());
  auto view = [](const Tensors& t) {
    ShardBytes out;
    for (const auto& [n, v] : t) out.emplace(n, v);
    return out;
  };
  auto m = CompareShards(*l, 1, view(*built), View(canon));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->empty());
  // Rank 1 holds vocabulary rows 8-9 of its 8-row shard: rows 2-7 are
  // padding, which is not compared.
  Tensors changed = *built;
  changed["emb"][2 * 2 * 2] ^= std::byte{1};
  m = CompareShards(*l, 1, view(changed), View(canon));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->empty());
  // Element 4 of the transposed shard [3, 2] is shard (2, 0): canonical
  // row 2 + 0, column 2 of w [4, 3], i.e. element 8.
  changed["w.t"][4 * 2] ^= std::byte{1};
  changed["emb"][1 * 2 + 1] ^= std::byte{0x80};
  m = CompareShards(*l, 1, view(changed), View(canon));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].shard, "emb");
  EXPECT_EQ((*m)[0].shard_element, 1u);
  EXPECT_EQ((*m)[0].tensor, "embed");
  EXPECT_EQ((*m)[0].element, 8 * 2 + 1u);
  EXPECT_EQ((*m)[1].shard, "w.t");
  EXPECT_EQ((*m)[1].shard_element, 4u);
  EXPECT_EQ((*m)[1].element, 8u);
  EXPECT_EQ((*m)[1].differing, 1u);
  EXPECT_NE((*m)[1].shard_hex, (*m)[1].canonical_hex);
}

TEST(ShardDiffTest, HalfConversionsMatchTheCompiler) {
#ifdef __FLT16_MANT_DIG__  // _Float16 exists: compare with it
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 x;
    const auto bits = static_cast<uint16_t>(h);
    std::memcpy(&x, &bits, 2);
    const float want = static_cast<float>(x);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(HalfToFloat(bits))) << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(HalfToFloat(bits)),
              std::bit_cast<uint32_t>(want))
        << h;
    // Every half is a float that converts back to itself.
    ASSERT_EQ(FloatToHalf(want), bits) << h;
  }
  std::mt19937_64 rng(9);
  for (int i = 0; i < 2000000; ++i) {
    // Floats around the half range, ties included (low mantissa bits 0).
    uint32_t x = static_cast<uint32_t>(rng());
    if (i % 2) x &= ~0xFFFu;
    x = (x & 0x807FFFFFu) | ((100 + static_cast<uint32_t>(rng() % 50)) << 23);
    const float v = std::bit_cast<float>(x);
    _Float16 want = static_cast<_Float16>(v);
    uint16_t wb;
    std::memcpy(&wb, &want, 2);
    ASSERT_EQ(FloatToHalf(v), wb) << std::hex << x;
  }
#endif
  // NaNs: one per sign, as PyTorch's c10::Half.
  EXPECT_EQ(FloatToHalf(std::bit_cast<float>(0x7FC00123u)), 0x7E00u);
  EXPECT_EQ(FloatToHalf(std::bit_cast<float>(0xFF800001u)), 0xFE00u);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFFu);  // rounds down to 65504
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00u);  // the tie rounds to infinity
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000u);  // half the smallest: even
  EXPECT_EQ(FloatToHalf(0x1.8p-25f), 0x0001u);
}

}  // namespace
}  // namespace dcr
