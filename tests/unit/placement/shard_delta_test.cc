// Deltas from shards (dcr/shard_delta.h): every rank encodes its changes as
// chunk parts and hashes its regions; over random tilings and the Megatron
// layouts the parts of all ranks take the canonical base to the canonical
// target bit for bit, and the regions' hashes compose into the canonical
// tensor digests. `dcr diff --layout`'s writer against the canonical files.
#include "dcr/shard_delta.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <random>

#include "dcr/thread_pool.h"
#include "testing/temp_dir.h"
#include "unit/placement/host_shard_memory.h"
#include "unit/placement/random_tiling.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::Gpt;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using ::testing::HasSubstr;

ShardBytes ViewShards(const std::map<std::string, std::vector<std::byte>>& s) {
  ShardBytes out;
  for (const auto& [n, v] : s) out.emplace(n, v);
  return out;
}

// Every rank of `l` diffs, encodes and hashes its own shards (built from
// the canonical versions); checks that the parts rebuild the target from
// the base and that the hashes give the canonical digests.
void ExpectPartsRebuildTheTarget(const Layout& l, const Tensors& base,
                                 const Tensors& target, uint64_t span_elems,
                                 ChunkKind kind) {
  auto encoder = std::move(*ChunkEncoder::Create(EncodeOptions()));
  auto decoder = std::move(*ChunkDecoder::Create());
  Tensors work = base;
  std::vector<std::vector<LinearDigest>> base_parts, target_parts;
  for (uint32_t r = 0; r < l.ranks(); ++r) {
    auto bs = BuildShards(l, r, View(base));
    auto ts = BuildShards(l, r, View(target));
    ASSERT_TRUE(bs.ok() && ts.ok());
    const ShardBytes b = ViewShards(*bs), t = ViewShards(*ts);
    auto changes = DiffShards(l, r, b, t);
    ASSERT_TRUE(changes.ok()) << changes.status().ToString();
    std::optional<ChunkId> last;
    Status s =
        EncodeParts(l, r, *changes, kind, span_elems, encoder.get(),
                    [&](const ChunkId& id, std::span<const std::byte> chunk) {
                      EXPECT_EQ(id.part, r + 1);
                      EXPECT_TRUE(!last || *last < id) << "ids ascend per rank";
                      last = id;
                      DecodedChunk c;
                      DCR_RETURN_IF_ERROR(decoder->Decode(chunk, &c));
                      EXPECT_EQ(c.header.id, id);
                      EXPECT_EQ(c.header.kind, kind);
                      const LayoutTensor& lt = l.tensors[id.tensor];
                      const size_t w = DTypeSize(lt.dtype);
                      auto& bytes = work[lt.name];
                      const uint64_t first = uint64_t{id.span} * span_elems;
                      return ApplyChunk(
                          c, std::span(bytes).subspan(
                                 first * w, uint64_t{c.header.span_elems} * w));
                    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto hb = HashShardRegions(l, r, b);
    auto ht = HashShardRegions(l, r, t);
    ASSERT_TRUE(hb.ok() && ht.ok());
    base_parts.push_back(*hb);
    target_parts.push_back(*ht);
  }
  EXPECT_EQ(work, target);
  const CheckpointDigests bd = DigestsFromParts(l, base_parts);
  const CheckpointDigests td = DigestsFromParts(l, target_parts);
  for (size_t ti = 0; ti < l.tensors.size(); ++ti) {
    const std::string& name = l.tensors[ti].name;
    EXPECT_EQ(bd.tensors[ti], TensorDigest(base.at(name))) << name;
    EXPECT_EQ(td.tensors[ti], TensorDigest(target.at(name))) << name;
  }
}

TEST(ShardDeltaTest, RandomTilingsPartsRebuildTheTargetAndDigests) {
  std::mt19937_64 rng(23);
  for (int iter = 0; iter < 150; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    const Layout l = placement_testing::RandomLayout(rng);
    auto [base, target] = RandomVersions(l, rng() % 2 ? 0.05 : 0.6, rng);
    const uint64_t span = 1 + rng() % 200;
    ExpectPartsRebuildTheTarget(
        l, base, target, span,
        rng() % 4 ? ChunkKind::kXor : ChunkKind::kOverwrite);
  }
}

TEST(ShardDeltaTest, MegatronLayoutsPartsRebuildTheTargetAndDigests) {
  std::mt19937_64 rng(29);
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t pp : {1u, 2u}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      auto l = ParseLayout(Gpt(tp, pp), "gpt.yaml");
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      for (double rate : {0.0, 0.03, 1.0}) {
        auto [base, target] = RandomVersions(*l, rate, rng);
        ExpectPartsRebuildTheTarget(*l, base, target, 16, ChunkKind::kXor);
      }
    }
  }
}

// A converted tensor (an F32 master published as BF16 w = master + 1) is
// hashed by its canonical bits, not its shard's.
TEST(ShardDeltaTest, ConvertedRegionsHashTheirCanonicalBits) {
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
  std::vector<float> r0 = {0.5f, 0.25f}, r1 = {-0.125f, 0.0f};
  std::vector<std::byte> canon(8);
  const float all[4] = {0.5f, 0.25f, -0.125f, 0.0f};
  for (int i = 0; i < 4; ++i) {
    ConvertElement(l->tensors[0].conversion, DType::kBF16,
                   reinterpret_cast<const std::byte*>(&all[i]), &canon[2 * i]);
  }
  auto h0 = HashShardRegions(*l, 0, {{"norm", std::as_bytes(std::span(r0))}});
  auto h1 = HashShardRegions(*l, 1, {{"norm", std::as_bytes(std::span(r1))}});
  ASSERT_TRUE(h0.ok() && h1.ok());
  std::vector<std::vector<LinearDigest>> parts = {*h0, *h1};
  EXPECT_EQ(DigestsFromParts(*l, parts).tensors[0], TensorDigest(canon));
}

TEST(ShardDeltaTest, BadArgumentsAreRefused) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  auto encoder = std::move(*ChunkEncoder::Create(EncodeOptions()));
  auto sink = [](const ChunkId&, std::span<const std::byte>) {
    return Status::OK();
  };
  CanonicalChanges c;
  c.tensor = 0;
  c.positions = {5, 3};  // not ascending
  c.base.resize(4);
  c.target.assign(4, std::byte{1});
  Status s =
      EncodeParts(*l, 0, {&c, 1}, ChunkKind::kXor, 1024, encoder.get(), sink);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("not ascending"));
  c.positions = {3, 1u << 30};  // past the tensor
  s = EncodeParts(*l, 0, {&c, 1}, ChunkKind::kXor, 1024, encoder.get(), sink);
  EXPECT_THAT(s.message(), HasSubstr("outside it"));
  s = EncodeParts(*l, 2, {}, ChunkKind::kXor, 1024, encoder.get(), sink);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 2 is not below layout gpt.yaml's 2"));
  s = EncodeParts(*l, 0, {}, ChunkKind::kXor, 0, encoder.get(), sink);
  EXPECT_THAT(s.message(), HasSubstr("span length"));
}

// A rank's producer across steps: its baseline copy, a diff per step, and
// an advance only to the bits it diffed.
TEST(ShardProducerTest, DiffsAgainstItsBaselineAndAdvancesOnlyToWhatItDiffed) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(37);
  auto [base, target] = RandomVersions(*l, 0.05, rng);
  auto [unused, other] = RandomVersions(*l, 0.05, rng);
  const uint32_t rank = 1;
  auto bs = BuildShards(*l, rank, View(base));
  auto ts = BuildShards(*l, rank, View(target));
  auto os = BuildShards(*l, rank, View(other));
  ASSERT_TRUE(bs.ok() && ts.ok() && os.ok());
  ShardProducer p(*l, rank, 32);
  p.set_step_log_bytes(0);  // no change log: Advance checks and copies
  auto early = p.Diff(ViewShards(*ts));
  EXPECT_TRUE(early.status().IsInvalidArgument());
  EXPECT_THAT(early.status().message(), HasSubstr("no baseline yet"));
  ASSERT_TRUE(p.SetBaseline(ViewShards(*bs)).ok());
  uint64_t own = 0;
  for (const auto& [n, v] : *bs) own += v.size();
  EXPECT_EQ(p.baseline_bytes(), own);
  EXPECT_TRUE(p.Advance(ViewShards(*ts)).IsInvalidArgument());  // no diff
  auto step = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_GT(step->changed, 0u);
  EXPECT_FALSE(step->chunks.empty());
  EXPECT_TRUE(std::is_sorted(
      step->chunks.begin(), step->chunks.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; }));
  for (const auto& [id, bytes] : step->chunks) EXPECT_EQ(id.part, rank + 1);
  // The trainer stepped again: the bits are not the diffed ones.
  Status s = p.Advance(ViewShards(*os));
  EXPECT_TRUE(s.IsBaseMismatch()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("did the trainer step again"));
  ASSERT_TRUE(p.Advance(ViewShards(*ts)).ok());
  // The target is the baseline now: nothing changed since.
  auto again = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->chunks.empty());
  EXPECT_EQ(again->base_digests, step->target_digests);
  EXPECT_EQ(again->target_digests, step->target_digests);
}

// With the step's change log (the default) a diff moves the baseline to the
// bits it diffed at once: an advance reads nothing and takes those bits
// even if the trainer stepped again meanwhile; a rewind (the refit did not
// commit), or a second diff without an advance, puts the base back. Past
// the log's bound the step goes without one, as before.
TEST(ShardProducerTest, TheStepLogAdvancesWithoutAPassAndRewinds) {
  auto l = ParseLayout(Gpt(2, 1), "gpt.yaml");
  ASSERT_TRUE(l.ok());
  std::mt19937_64 rng(43);
  auto [base, target] = RandomVersions(*l, 0.03, rng);
  auto [unused, other] = RandomVersions(*l, 0.03, rng);
  const uint32_t rank = 0;
  auto bs = BuildShards(*l, rank, View(base));
  auto ts = BuildShards(*l, rank, View(target));
  auto os = BuildShards(*l, rank, View(other));
  ASSERT_TRUE(bs.ok() && ts.ok() && os.ok());
  auto chunks_of = [](const ShardProducer::Step& s) { return s.chunks; };
  ShardProducer p(*l, rank, 32);
  // (These shards are a few hundred bytes: the default bound, a quarter of
  // them, would not hold the log's first buffers.)
  const uint64_t bound = 4096;
  p.set_step_log_bytes(bound);
  ASSERT_TRUE(p.SetBaseline(ViewShards(*bs)).ok());
  auto first = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->logged) << first->log_bytes << " bytes";
  EXPECT_GT(first->log_bytes, 0u);
  EXPECT_LE(first->log_bytes, bound);
  // Not advanced: the next diff is against the base again, the same parts.
  auto second = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(chunks_of(*second), chunks_of(*first));
  // Rewound: the same again.
  p.Rewind();
  p.Rewind();  // twice is once
  auto third = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(chunks_of(*third), chunks_of(*first));
  EXPECT_EQ(third->base_digests, first->base_digests);
  // The trainer stepped again before the commit: the advance takes the
  // bits the diff read, not these.
  ASSERT_TRUE(p.Advance(ViewShards(*os)).ok());
  EXPECT_EQ(p.baseline_digests(), first->target_digests);
  auto after = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->chunks.empty());
  EXPECT_EQ(after->changed, 0u);
  EXPECT_EQ(after->base_digests, first->target_digests);
  p.Rewind();
  // A diff that fails part way (its sink refuses the second part) leaves
  // the baseline at the base: the next diff gives the same parts.
  int sent = 0;
  auto fails = p.Diff(
      ViewShards(*os), 0, [&](const ChunkId&, std::span<const std::byte>) {
        return ++sent < 2 ? Status::OK() : Status::Aborted("link down");
      });
  ASSERT_FALSE(fails.ok());
  auto same = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->chunks.empty());  // the baseline is still ts's bits
  p.Rewind();
  // A bound of 0: never a log, even for a step without changes.
  p.set_step_log_bytes(0);
  auto none = p.Diff(ViewShards(*ts));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->logged);
  EXPECT_EQ(none->log_bytes, 0u);
  EXPECT_TRUE(p.Advance(ViewShards(*os)).IsBaseMismatch());
  p.Rewind();
  // Past the bound (a few bytes): no log, and the advance checks.
  p.set_step_log_bytes(64);
  auto big = p.Diff(ViewShards(*os));
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->logged);
  EXPECT_LE(big->log_bytes, 64u);
  Status s = p.Advance(ViewShards(*ts));
  EXPECT_TRUE(s.IsBaseMismatch()) << s.ToString();
  ASSERT_TRUE(p.Advance(ViewShards(*os)).ok());
  auto settled = p.Diff(ViewShards(*os));
  ASSERT_TRUE(settled.ok());
  EXPECT_TRUE(settled->chunks.empty());
  EXPECT_EQ(settled->base_digests, big->target_digests);
}

// A diff's target digests are what hashing the target gives, whether the
// shards are in host memory (hashed in a pass) or in a ShardMemory (the
// baseline's moved by the changes' masks, no pass), for shards held as
// they are and for converted ones (an F32 master whose small changes
// leave some BF16 bits as they were).
TEST(ShardProducerTest, TargetDigestsAreTheTargetsHash) {
  auto gpt = ParseLayout(Gpt(2, 2), "gpt.yaml");
  ASSERT_TRUE(gpt.ok());
  std::mt19937_64 rng(41);
  for (uint32_t rank = 0; rank < gpt->ranks(); ++rank) {
    auto [base, target] = RandomVersions(*gpt, 0.05, rng);
    auto bs = BuildShards(*gpt, rank, View(base));
    auto ts = BuildShards(*gpt, rank, View(target));
    ASSERT_TRUE(bs.ok() && ts.ok());
    auto want = HashShardRegions(*gpt, rank, ViewShards(*ts));
    ASSERT_TRUE(want.ok());
    for (bool memory : {false, true}) {
      ShardProducer p(*gpt, rank, 32);
      if (memory) {
        ASSERT_TRUE(
            p.UseMemory(std::make_unique<placement_testing::HostShardMemory>())
                .ok());
      }
      ASSERT_TRUE(p.SetBaseline(ViewShards(*bs)).ok());
      auto step = p.Diff(ViewShards(*ts));
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      EXPECT_EQ(step->target_digests, *want)
          << "rank " << rank << (memory ? " in a ShardMemory" : "");
    }
  }
  auto conv = ParseLayout(R"(version: 1
parallel: {tp: 2}
tensors:
  - name: norm
    shard: norm
    split: column
    shape: [256]
    shard_dtype: F32
    add: 1
)",
                          "n.yaml");
  ASSERT_TRUE(conv.ok()) << conv.status().ToString();
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> base(128), target(128);
  for (float& v : base) v = value(rng);
  size_t kept = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    // Every element moves; a move of 1e-6 leaves most BF16 bits alone.
    target[i] = base[i] + (i % 3 == 0 ? 0.25f : 1e-6f);
    kept += i % 3 != 0;
  }
  ASSERT_GT(kept, 0u);
  const ShardBytes ts = {{"norm", std::as_bytes(std::span(target))}};
  auto want = HashShardRegions(*conv, 1, ts);
  ASSERT_TRUE(want.ok());
  for (bool memory : {false, true}) {
    ShardProducer p(*conv, 1, 32);
    if (memory) {
      ASSERT_TRUE(
          p.UseMemory(std::make_unique<placement_testing::HostShardMemory>())
              .ok());
    }
    ASSERT_TRUE(p.SetBaseline({{"norm", std::as_bytes(std::span(base))}}).ok());
    auto step = p.Diff(ts);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_GT(step->changed, 0u);
    EXPECT_LT(step->changed, base.size());
    EXPECT_EQ(step->target_digests, *want)
        << (memory ? "in a ShardMemory" : "in host memory");
  }
}

class ShardDeltaFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = ParseLayout(Gpt(2, 2), "gpt.yaml");
    ASSERT_TRUE(l.ok());
    layout_ = std::move(*l);
    std::mt19937_64 rng(31);
    std::tie(base_, target_) = RandomVersions(layout_, 0.05, rng);
    WriteVersion(base_, "v0");
    WriteVersion(target_, "v1");
  }
  // The canonical file DIR/NAME.safetensors and the shards DIR/NAME.shards.
  void WriteVersion(const Tensors& t, const std::string& name) {
    std::vector<TensorToWrite> tw;
    for (const LayoutTensor& lt : layout_.tensors) {
      tw.push_back({TensorInfo{lt.name, lt.dtype, lt.shape}, t.at(lt.name)});
    }
    ASSERT_TRUE(
        WriteSafetensors(dir_.Path(name + ".safetensors"), tw, {}).ok());
    std::filesystem::create_directories(dir_.Path(name + ".shards"));
    for (uint32_t r = 0; r < layout_.ranks(); ++r) {
      auto shards = BuildShards(layout_, r, View(t));
      ASSERT_TRUE(shards.ok());
      std::vector<TensorToWrite> sw;
      for (const auto& [n, info] : layout_.ShardsOf(r)) {
        sw.push_back({TensorInfo{n, info.dtype, info.shape}, shards->at(n)});
      }
      ASSERT_TRUE(WriteSafetensors(
                      ShardFilePath(dir_.Path(name + ".shards"), r), sw, {})
                      .ok());
    }
  }

  testing::TempDir dir_;
  Layout layout_;
  Tensors base_, target_;
};

TEST_F(ShardDeltaFileTest, TheDeltaTakesTheCanonicalBaseToTheTarget) {
  ThreadPool pool(2);
  DiffOptions opt;
  opt.span_elems = 64;
  opt.base_step = 4;
  opt.target_step = 5;
  const std::string out = dir_.Path("v1.dcr");
  auto stats = WriteDeltaFromShards(layout_, dir_.Path("v0.shards"),
                                    dir_.Path("v1.shards"), out, opt, &pool);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_GT(stats->chunks, 0u);
  // The header names both versions as their canonical files do.
  auto b = Checkpoint::Open(dir_.Path("v0.safetensors"),
                            Checkpoint::Mode::kReadOnly);
  auto t = Checkpoint::Open(dir_.Path("v1.safetensors"),
                            Checkpoint::Mode::kReadWrite);
  ASSERT_TRUE(b.ok() && t.ok());
  EXPECT_EQ(stats->header.base, (Version{4, (*b)->ComputeDigests().version}));
  const Version target_v{5, (*t)->ComputeDigests().version};
  EXPECT_EQ(stats->header.target, target_v);
  EXPECT_EQ(stats->header.manifest, (*b)->manifest().digest());
  t->reset();
  // Applied to the gathered base, it gives the gathered target.
  std::filesystem::copy_file(dir_.Path("v0.safetensors"),
                             dir_.Path("work.safetensors"));
  auto work = Checkpoint::Open(dir_.Path("work.safetensors"),
                               Checkpoint::Mode::kReadWrite);
  ASSERT_TRUE(work.ok());
  auto applied = ApplyDelta(out, work->get(), &pool);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ((*work)->ComputeDigests().version, target_v.digest);
}

// A delta that carries a span whole and also a part of it is refused
// before anything is written: the two overlap.
TEST_F(ShardDeltaFileTest, ADeltaWithASpanWholeAndInPartsIsRefused) {
  DiffOptions opt;
  opt.span_elems = 64;
  const std::string parts = dir_.Path("parts.dcr");
  auto stats =
      WriteDeltaFromShards(layout_, dir_.Path("v0.shards"),
                           dir_.Path("v1.shards"), parts, opt, nullptr);
  ASSERT_TRUE(stats.ok());
  auto reader = DeltaReader::Open(parts);
  ASSERT_TRUE(reader.ok());
  std::span<const std::byte> first;
  ASSERT_TRUE(*(*reader)->Next(&first));
  DecodedChunk c;
  ASSERT_TRUE((*ChunkDecoder::Create())->Decode(first, &c).ok());
  // The first part's changes again as part 0 of its span, ahead of it.
  ChunkId whole = c.header.id;
  whole.part = 0;
  std::vector<std::byte> w;
  ASSERT_TRUE((*ChunkEncoder::Create(EncodeOptions()))
                  ->EncodeChanges(ChunkKind::kXor, whole, c.header.elem_size,
                                  c.header.span_elems, c.positions, c.values,
                                  &w)
                  .ok());
  const std::string mixed = dir_.Path("mixed.dcr");
  auto writer = DeltaWriter::Create(mixed);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(w).ok());
  ASSERT_TRUE((*writer)->Append(first).ok());
  DeltaHeader h = stats->header;
  ASSERT_TRUE((*writer)->Finish(h).ok());
  std::filesystem::copy_file(dir_.Path("v0.safetensors"),
                             dir_.Path("work.safetensors"));
  auto work = Checkpoint::Open(dir_.Path("work.safetensors"),
                               Checkpoint::Mode::kReadWrite);
  ASSERT_TRUE(work.ok());
  auto r = ApplyDelta(mixed, work->get(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("also carries whole"));
}

TEST_F(ShardDeltaFileTest, MissingAndReshapedShardFilesAreNamed) {
  DiffOptions opt;
  std::filesystem::remove(ShardFilePath(dir_.Path("v1.shards"), 3));
  auto r = WriteDeltaFromShards(layout_, dir_.Path("v0.shards"),
                                dir_.Path("v1.shards"), dir_.Path("x.dcr"), opt,
                                nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("rank-00003.safetensors"));
  // A rank file whose tensor changed shape: the layout no longer holds.
  auto tp1 = ParseLayout(Gpt(1, 2), "gpt-tp1.yaml");
  ASSERT_TRUE(tp1.ok());
  r = WriteDeltaFromShards(*tp1, dir_.Path("v0.shards"), dir_.Path("v0.shards"),
                           dir_.Path("x.dcr"), opt, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("but layout gpt-tp1.yaml says"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("x.dcr")));
}

}  // namespace
}  // namespace dcr
