// A producer whose shards live in a ShardMemory (dcr/shard_memory.h), the
// path a GPU's shards take, run here on HostShardMemory: the projection of
// each shard's changed elements gives what the host diff gives, and the
// producer's parts and digests are the bytes the host producer sends, step
// after step; what the memory returns is checked; each shard is asked for
// once per step; a shard written while it is diffed fails the step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>

#include "dcr/shard_delta.h"
#include "unit/placement/host_shard_memory.h"
#include "unit/placement/random_tiling.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Gpt;
using placement_testing::HostShardMemory;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using ::testing::HasSubstr;

using Shards = std::map<std::string, std::vector<std::byte>>;

ShardBytes Bytes(const Shards& s) {
  ShardBytes out;
  for (const auto& [n, v] : s) out.emplace(n, v);
  return out;
}

Shards Build(const Layout& l, uint32_t rank, const Tensors& t) {
  auto s = BuildShards(l, rank, View(t));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? Shards(s->begin(), s->end()) : Shards();
}

// Every changed shard element, as HostShardMemory finds them.
ShardChangesFetch FetchFrom(const Shards& base, const Shards& target,
                            const Layout& l, uint32_t rank) {
  return
      [&base, &target, &l, rank](const std::string& shard, ShardChanges* out) {
        HostShardMemory m;
        DCR_RETURN_IF_ERROR(m.SetBaselineFromHost({{shard, base.at(shard)}}));
        return m.FindChanges(shard, DTypeSize(l.ShardsOf(rank).at(shard).dtype),
                             target.at(shard), out);
      };
}

void ExpectSameChanges(const Layout& l, uint32_t rank, const Shards& base,
                       const Shards& target) {
  auto want = DiffShards(l, rank, Bytes(base), Bytes(target));
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  std::vector<CanonicalChanges> got;
  ShardDiffStats stats;
  Status s = ProjectShardChanges(
      l, rank, FetchFrom(base, target, l, rank),
      [&](CanonicalChanges&& c) {
        got.push_back(std::move(c));
        return Status::OK();
      },
      &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), want->size());
  uint64_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tensor, (*want)[i].tensor);
    EXPECT_EQ(got[i].positions, (*want)[i].positions);
    EXPECT_EQ(got[i].base, (*want)[i].base);
    EXPECT_EQ(got[i].target, (*want)[i].target);
    changed += got[i].positions.size();
  }
  EXPECT_EQ(stats.changed, changed);
  EXPECT_EQ(stats.shard_bytes_read, 0u);
}

TEST(ProjectShardChangesTest, RandomTilingsGiveTheHostDiff) {
  std::mt19937_64 rng(41);
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Layout l = placement_testing::RandomLayout(rng);
    auto [base, target] = RandomVersions(l, rng() % 2 ? 0.05 : 0.6, rng);
    for (uint32_t r = 0; r < l.ranks(); ++r) {
      ExpectSameChanges(l, r, Build(l, r, base), Build(l, r, target));
    }
  }
}

TEST(ProjectShardChangesTest, MegatronLayoutsGiveTheHostDiff) {
  std::mt19937_64 rng(43);
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      auto l = ParseLayout(Gpt(tp, pp), "gpt.yaml");
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      for (double rate : {0.0, 0.03, 1.0}) {
        auto [base, target] = RandomVersions(*l, rate, rng);
        for (uint32_t r = 0; r < l->ranks(); ++r) {
          ExpectSameChanges(*l, r, Build(*l, r, base), Build(*l, r, target));
        }
      }
    }
  }
}

// Padding (a padded vocabulary's rows) changes in the shard but maps to
// nothing: ignored, as the host diff never reads it.
TEST(ProjectShardChangesTest, PaddingChangesAreIgnored) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(47);
  auto [base, unused] = RandomVersions(*l, 0.0, rng);
  const uint32_t rank = 1;  // holds the vocabulary's last rows and padding
  Shards b = Build(*l, rank, base), t = b;
  auto& emb = t.at("emb");
  for (size_t i = emb.size() - 16; i < emb.size(); ++i) emb[i] = std::byte{7};
  ExpectSameChanges(*l, rank, b, t);
  auto got = DiffShards(*l, rank, Bytes(b), Bytes(t));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
}

// An F32 master published as BF16 w + 1: a shard change that rounds away
// is no change, as in the host diff.
TEST(ProjectShardChangesTest, ConvertedTensorsGiveTheHostDiff) {
  auto l = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: norm
    shard: norm
    split: column
    shape: [4]
    shard_dtype: F32
    add: 1
)",
                       "n.yaml");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto f32 = [](std::vector<float> v) {
    std::vector<std::byte> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  const Shards b = {{"norm", f32({0.5f, 0.25f})}};
  const Shards t = {{"norm", f32({0.5f + 1e-7f, -0.5f})}};
  ExpectSameChanges(*l, 0, b, t);
}

TEST(ProjectShardChangesTest, ChangesThatDoNotFitTheirShardAreRefused) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(53);
  auto [base, target] = RandomVersions(*l, 0.5, rng);
  const Shards b = Build(*l, 0, base), t = Build(*l, 0, target);
  for (int fault = 0; fault < 3; ++fault) {
    SCOPED_TRACE("fault " + std::to_string(fault));
    HostShardMemory m;
    m.faults().swap_first_positions = fault == 0;
    m.faults().position_past_end = fault == 1;
    m.faults().short_values = fault == 2;
    ASSERT_TRUE(m.SetBaselineFromHost(Bytes(b)).ok());
    int each = 0;
    Status s = ProjectShardChanges(
        *l, 0,
        [&](const std::string& shard, ShardChanges* out) {
          return m.FindChanges(shard, DTypeSize(l->ShardsOf(0).at(shard).dtype),
                               t.at(shard), out);
        },
        [&](CanonicalChanges&&) {
          ++each;
          return Status::OK();
        });
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rank 0: shard '"));
    EXPECT_EQ(each, 0) << "a tensor's changes went out before the check";
  }
}

// Each shard is asked for once, when the first tensor reading it comes
// (after the tensors before it went out), not all at once up front.
TEST(ProjectShardChangesTest, EachShardIsFetchedOnceWhenItsFirstTensorComes) {
  auto l = ParseLayout(Gpt(2, 2), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(59);
  auto [base, target] = RandomVersions(*l, 0.1, rng);
  const uint32_t rank = 1;
  const Shards b = Build(*l, rank, base), t = Build(*l, rank, target);
  std::map<std::string, int> fetched;
  size_t sent = 0;  // tensors out so far
  Status s = ProjectShardChanges(
      *l, rank,
      [&](const std::string& shard, ShardChanges* out) {
        ++fetched[shard];
        // The first tensor reading it is the next to go out: every tensor
        // before it (all changed at this rate) went already.
        size_t first = l->tensors.size();
        for (size_t ti = 0;
             ti < l->tensors.size() && first == l->tensors.size(); ++ti) {
          for (const AffinePiece& p : l->tensors[ti].pieces) {
            if (p.rank == rank && p.shard == shard) first = ti;
          }
        }
        size_t before = 0;  // tensors of the rank before it
        for (size_t ti = 0; ti < first; ++ti) {
          for (const AffinePiece& p : l->tensors[ti].pieces) {
            if (p.rank == rank) {
              ++before;
              break;
            }
          }
        }
        EXPECT_EQ(sent, before) << shard;
        return FetchFrom(b, t, *l, rank)(shard, out);
      },
      [&](CanonicalChanges&&) {
        ++sent;
        return Status::OK();
      });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fetched.size(), l->ShardsOf(rank).size());
  for (const auto& [shard, n] : fetched) EXPECT_EQ(n, 1) << shard;
}

// The producer through a ShardMemory sends the host producer's bytes: the
// same parts, base and target digests and counts, step after step (each
// commit advancing both), and takes the tree's baseline from the host.
TEST(ShardMemoryProducerTest, SendsTheHostProducersPartsAndDigests) {
  std::mt19937_64 rng(61);
  for (int layout = 0; layout < 12; ++layout) {
    const Layout l = layout < 2 ? *ParseLayout(Gpt(2, layout + 1), "gpt.yaml")
                                : placement_testing::RandomLayout(rng);
    SCOPED_TRACE("layout " + std::to_string(layout));
    auto [v0, v1] = RandomVersions(l, 0.05, rng);
    auto [unused, v2] = RandomVersions(l, 0.3, rng);
    for (uint32_t r = 0; r < l.ranks(); ++r) {
      const Shards s0 = Build(l, r, v0), s1 = Build(l, r, v1),
                   s2 = Build(l, r, v2);
      ShardProducer host(l, r, 1 + rng() % 64);
      ShardProducer dev(l, r, 0);
      auto memory = std::make_unique<HostShardMemory>();
      HostShardMemory* m = memory.get();
      ASSERT_TRUE(dev.UseMemory(std::move(memory)).ok());
      ASSERT_TRUE(host.SetBaseline(Bytes(s0)).ok());
      if (r % 2 == 0) {
        ASSERT_TRUE(dev.SetBaseline(Bytes(s0)).ok());
        EXPECT_EQ(m->calls().reads, static_cast<int>(s0.size()));
      } else {  // the tree's baseline, fetched
        ASSERT_TRUE(dev.AdoptBaseline({s0.begin(), s0.end()}).ok());
      }
      EXPECT_EQ(dev.baseline_digests(), host.baseline_digests());
      EXPECT_EQ(dev.baseline_bytes(), host.baseline_bytes());
      for (const Shards* next : {&s1, &s2, &s2}) {
        const uint64_t span = 1 + rng() % 64;
        auto want = host.Diff(Bytes(*next), span);
        auto got = dev.Diff(Bytes(*next), span);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
        EXPECT_EQ(got->chunks, want->chunks);
        EXPECT_EQ(got->base_digests, want->base_digests);
        EXPECT_EQ(got->target_digests, want->target_digests);
        EXPECT_EQ(got->changed, want->changed);
        EXPECT_EQ(got->sizes.total(), want->sizes.total());
        ASSERT_TRUE(host.Advance(Bytes(*next)).ok());
        ASSERT_TRUE(dev.Advance(Bytes(*next)).ok());
        EXPECT_EQ(dev.baseline_digests(), host.baseline_digests());
      }
      for (const auto& [shard, n] : m->calls().find_changes) {
        EXPECT_EQ(n, 3) << "once per step: " << shard;
      }
    }
  }
}

TEST(ShardMemoryProducerTest, AdvancesOnlyToWhatItDiffed) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(67);
  auto [v0, v1] = RandomVersions(*l, 0.05, rng);
  auto [unused, other] = RandomVersions(*l, 0.05, rng);
  const uint32_t rank = 0;
  const Shards s0 = Build(*l, rank, v0), s1 = Build(*l, rank, v1),
               so = Build(*l, rank, other);
  ShardProducer p(*l, rank, 32);
  auto memory = std::make_unique<HostShardMemory>();
  HostShardMemory* m = memory.get();
  ASSERT_TRUE(p.UseMemory(std::move(memory)).ok());
  EXPECT_EQ(p.memory(), m);
  auto early = p.Diff(Bytes(s1));
  EXPECT_THAT(early.status().message(), HasSubstr("no baseline yet"));
  ASSERT_TRUE(p.SetBaseline(Bytes(s0)).ok());
  // The memory cannot change under a held baseline.
  Status moved = p.UseMemory(nullptr);
  EXPECT_TRUE(moved.IsInvalidArgument());
  EXPECT_THAT(moved.message(), HasSubstr("holds its baseline in host-test"));
  EXPECT_TRUE(p.Advance(Bytes(s1)).IsInvalidArgument());  // nothing diffed
  auto step = p.Diff(Bytes(s1));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_GT(step->changed, 0u);
  // The trainer stepped again: the shards are not the diffed ones.
  Status s = p.Advance(Bytes(so));
  EXPECT_TRUE(s.IsBaseMismatch()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("did the trainer step again"));
  EXPECT_THAT(s.message(), HasSubstr("rank 0: shard '"));
  EXPECT_TRUE(p.has_baseline());
  ASSERT_TRUE(p.Advance(Bytes(s1)).ok());
  auto again = p.Diff(Bytes(s1));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->chunks.empty());
  EXPECT_EQ(again->target_digests, step->target_digests);
  // A shard of the wrong size is refused before the memory is asked.
  Shards bad = s1;
  bad.begin()->second.pop_back();
  const int asked = m->calls().fingerprints;
  auto resized = p.Diff(Bytes(bad));
  EXPECT_TRUE(resized.status().IsInvalidArgument());
  EXPECT_THAT(resized.status().message(), HasSubstr("needs a new layout"));
  EXPECT_EQ(m->calls().fingerprints, asked);
  // A copy that fails part-way leaves no baseline: the next refit fetches
  // the tree's.
  ASSERT_TRUE(p.Diff(Bytes(so)).ok());
  m->faults().fail_advance = true;
  EXPECT_FALSE(p.Advance(Bytes(so)).ok());
  EXPECT_FALSE(p.has_baseline());
  EXPECT_EQ(p.baseline_bytes(), 0u);
  // So does a baseline that cannot be read back to be hashed.
  m->faults().fail_read = true;
  Status set = p.SetBaseline(Bytes(s0));
  EXPECT_EQ(set.code(), StatusCode::kIOError) << set.ToString();
  EXPECT_FALSE(p.has_baseline());
  EXPECT_EQ(m->baseline_bytes(), 0u);
}

// A kernel the trainer did not wait for writes a shard while the producer
// diffs it: the changes may pair positions and values of two moments, and
// the digest parts derived from them would agree. The step fails instead,
// and the producer keeps its baseline and what it last diffed.
TEST(ShardMemoryProducerTest, AShardWrittenDuringTheDiffFailsTheStep) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(71);
  auto [v0, v1] = RandomVersions(*l, 0.05, rng);
  const uint32_t rank = 1;
  const Shards s0 = Build(*l, rank, v0);
  Shards s1 = Build(*l, rank, v1);
  ShardProducer p(*l, rank, 32);
  auto memory = std::make_unique<HostShardMemory>();
  HostShardMemory* m = memory.get();
  ASSERT_TRUE(p.UseMemory(std::move(memory)).ok());
  ASSERT_TRUE(p.SetBaseline(Bytes(s0)).ok());
  const std::string written = std::prev(s1.end())->first;
  m->set_after_find([&](std::string_view shard) {
    if (shard == written) s1.at(written)[0] ^= std::byte{0x40};
  });
  auto step = p.Diff(Bytes(s1));
  ASSERT_FALSE(step.ok());
  EXPECT_TRUE(step.status().IsBaseMismatch()) << step.status().ToString();
  EXPECT_THAT(
      step.status().message(),
      HasSubstr("rank 1: shard '" + written + "' changed while it was diffed"));
  EXPECT_TRUE(p.has_baseline());
  EXPECT_TRUE(p.Advance(Bytes(s1)).IsInvalidArgument());  // nothing diffed
  // Left alone, the same shards diff and advance.
  m->set_after_find(nullptr);
  auto again = p.Diff(Bytes(s1));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_GT(again->changed, 0u);
  EXPECT_TRUE(p.Advance(Bytes(s1)).ok());
}

}  // namespace
}  // namespace dcr
