// A refit session on a serving store (RefitSession::Options::serving): a
// file store holding one serving rank's shards, FP8 codes, scales and
// shadows included, taking canonical chunks through the rank's map. The
// shards after a commit are what ReceiverMap::Build makes of the target;
// after an abort or a crash's restore, what it makes of the base.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "dcr/receiver_map.h"
#include "session/journal.h"
#include "session/refit_session.h"
#include "testing/temp_dir.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kServingSpan = 1000;

// tp 2: an FP8 weight split by columns, a BF16 weight split by rows, a
// replicated norm, and an FP8 vocabulary split padded to 128 rows (rank 1
// holds 36 rows and 7 blocks of padding rows).
constexpr const char* kLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: w
    shard: w.weight
    split: column
    shape: [256, 100]
    fp8: {block: [64, 32]}
  - name: down
    shard: down
    split: row
    shape: [40, 96]
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
  - name: emb
    shard: emb
    split: vocab
    pad_to: 64
    shape: [100, 64]
    fp8: {block: [4, 32]}
)";

class ServingSessionTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    auto l = ParseLayout(kLayout, "serve.yaml");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_ = *std::move(l);
    auto m = ReceiverMap::Create(layout_, GetParam());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    map_ = std::make_unique<ReceiverMap>(*std::move(m));
    std::mt19937_64 rng(7 + GetParam());
    std::tie(base_, target_) = RandomVersions(layout_, 0.05, rng);
    // The FP8 weight as plausible BF16 weights (no NaN exponent), so that
    // its blocks have real scales.
    for (Tensors* t : {&base_, &target_}) {
      for (const char* fp8 : {"w", "emb"}) {
        auto& w = t->at(fp8);
        for (size_t i = 1; i < w.size(); i += 2) w[i] &= std::byte{0xBC};
      }
    }
    path_ = dir_.Path("rank.safetensors");
    auto built = map_->Build(View(base_));
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    std::vector<TensorToWrite> tw;
    auto manifest = map_->StoreManifest();
    ASSERT_TRUE(manifest.ok());
    for (const TensorInfo& t : manifest->tensors()) {
      tw.push_back({t, built->at(t.name)});
    }
    ASSERT_TRUE(WriteSafetensors(path_, tw, {}).ok());
    Reopen();
    ASSERT_TRUE(store_->Commit(base_v_, refit_).ok());
    auto canonical = map_->CanonicalManifest();
    ASSERT_TRUE(canonical.ok());
    canonical_ = *canonical;
    plan_.mode = RefitMode::kDelta;
    plan_.base = base_v_;
    plan_.target = target_v_;
    plan_.manifest = canonical_.digest();
    plan_.span_elems = kServingSpan;
    plan_.nodes = {{"n0", "127.0.0.1", 1, "tcp", -1}};
    refit_.bytes[0] = 9;
    decoder_ = std::move(*ChunkDecoder::Create());
    base_bits_ = Bits(base_);
    target_bits_ = Bits(target_);
  }

  void Reopen() {
    store_.reset();
    auto s = OpenStore(*ParseStoreSpec("file:" + path_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  // What the root names: the rank's regions of `v`, and their digest.
  RefitSession::ServingTarget Bits(const Tensors& v) {
    auto regions = map_->ExpectedRegions(View(v));
    EXPECT_TRUE(regions.ok());
    return {map_->BitsDigest(*regions), *regions};
  }
  // Calls fn(id, element size, base span, target span) for every span of
  // every canonical tensor.
  template <typename Fn>
  void ForEachSpan(Fn fn) {
    for (uint32_t t = 0; t < canonical_.size(); ++t) {
      const TensorInfo& info = canonical_[t];
      const size_t w = DTypeSize(info.dtype);
      const uint64_t n = info.NumElements();
      for (uint32_t s = 0; s < SpanCount(n, kServingSpan); ++s) {
        const uint64_t off = s * kServingSpan * w;
        const uint64_t len = std::min(kServingSpan, n - s * kServingSpan) * w;
        fn(ChunkId{t, s, 0}, w,
           std::span<const std::byte>(base_.at(info.name)).subspan(off, len),
           std::span<const std::byte>(target_.at(info.name)).subspan(off, len));
      }
    }
  }
  // The canonical chunks from base to target, every span of every tensor.
  std::vector<Bytes> Chunks(ChunkKind kind) {
    std::vector<Bytes> out;
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    ForEachSpan([&](ChunkId id, size_t w, auto base, auto target) {
      Bytes c;
      auto r = enc->EncodeDiff(kind, id, w, base, target, &c);
      EXPECT_TRUE(r.ok());
      if (*r) out.push_back(std::move(c));
    });
    return out;
  }
  EndMsg End(const std::vector<Bytes>& chunks) {
    std::vector<ChunkId> ids;
    for (const auto& c : chunks) ids.push_back(PeekChunkHeader(c)->id);
    const uint64_t n = ids.size();
    return EndMsg{n, ChunkIdsDigest(std::move(ids))};
  }
  RefitSession::Options Serving() {
    RefitSession::Options o;
    o.serving = map_.get();
    o.serving_base = base_bits_.bits;
    return o;
  }
  std::unique_ptr<RefitSession> Begin() {
    NodeResult refusal;
    auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal,
                                 Serving());
    EXPECT_TRUE(s) << refusal.detail;
    return s;
  }
  // Every shard of the store equals the map's build of `v`.
  void ExpectHolds(const Tensors& v) {
    auto want = map_->Build(View(v));
    ASSERT_TRUE(want.ok());
    const Manifest& m = store_->manifest();
    for (size_t i = 0; i < m.size(); ++i) {
      auto got = store_->Tensor(i);
      EXPECT_TRUE(std::equal(got.begin(), got.end(),
                             want->at(m[i].name).begin(),
                             want->at(m[i].name).end()))
          << m[i].name;
    }
  }

  testing::TempDir dir_;
  Layout layout_;
  std::unique_ptr<ReceiverMap> map_;
  Tensors base_, target_;
  Manifest canonical_;
  std::string path_;
  std::unique_ptr<WeightStore> store_;
  Version base_v_{1, Digest128{1, 1}}, target_v_{2, Digest128{2, 2}};
  RefitSession::ServingTarget base_bits_, target_bits_;
  PlanMsg plan_;
  RefitId refit_;
  std::unique_ptr<ChunkDecoder> decoder_;
};

TEST_P(ServingSessionTest, ChunksApplyThroughTheMapAndTheVoteIsTheRanks) {
  auto s = Begin();
  ASSERT_TRUE(s);
  const auto chunks = Chunks(ChunkKind::kXor);
  ASSERT_GT(chunks.size(), 10u);
  for (const auto& c : chunks) {
    auto r = s->Apply(c, decoder_.get());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, RefitSession::ApplyOutcome::kApplied);
    // A replayed XOR is dropped as on a canonical store.
    EXPECT_EQ(*s->Apply(c, decoder_.get()),
              RefitSession::ApplyOutcome::kDuplicate);
  }
  // Without the root's target bits the vote cannot be yes.
  NodeResult vote = s->Vote(End(chunks), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kDigestMismatch);
  EXPECT_THAT(vote.detail, HasSubstr("named no target bits"));
  s->LearnServingTarget(target_bits_);
  vote = s->Vote(End(chunks), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kOk) << vote.detail;
  EXPECT_EQ(vote.version, target_v_);
  ASSERT_TRUE(s->Commit().ok());
  // Codes and scales requantized from the shadows: the target's build.
  ExpectHolds(target_);
  EXPECT_EQ(store_->committed(), target_v_);
}

TEST_P(ServingSessionTest, AbortPutsTheBasesShardsCodesAndScalesBack) {
  auto s = Begin();
  ASSERT_TRUE(s);
  const auto xors = Chunks(ChunkKind::kXor);
  const auto overwrites = Chunks(ChunkKind::kOverwrite);
  // A mix: half the XOR chunks, then every span again as an overwrite (a
  // repair round's retries), and a vote (which requantizes).
  for (size_t i = 0; i < xors.size(); i += 2) {
    ASSERT_TRUE(s->Apply(xors[i], decoder_.get()).ok());
  }
  for (const auto& c : overwrites) {
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  s->LearnServingTarget(target_bits_);
  EXPECT_EQ(s->Vote(End(overwrites), nullptr).code, NodeCode::kOk);
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  ExpectHolds(base_);
  EXPECT_EQ(store_->committed(), base_v_);
  EXPECT_FALSE(store_->InProgress());
}

TEST_P(ServingSessionTest, AFlippedBitVotesNoAndNamesItsTensor) {
  auto s = Begin();
  ASSERT_TRUE(s);
  const auto chunks = Chunks(ChunkKind::kXor);
  for (const auto& c : chunks) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  s->LearnServingTarget(target_bits_);
  // norm is held by both ranks: a bit of it flips in the store.
  const int64_t norm = store_->manifest().Find("norm");
  ASSERT_GE(norm, 0);
  store_->MutableTensor(static_cast<size_t>(norm))[3] ^= std::byte{4};
  NodeResult vote = s->Vote(End(chunks), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kDigestMismatch);
  EXPECT_EQ(vote.repair, std::vector<uint32_t>{
                             static_cast<uint32_t>(canonical_.Find("norm"))});
  // Missing chunks too: incomplete.
  auto fewer = chunks;
  fewer.pop_back();
  EXPECT_EQ(s->Vote(End(fewer), nullptr).code, NodeCode::kIncomplete);
}

TEST_P(ServingSessionTest, ACrashRestoresThroughTheMapOrKeepsAYesVote) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok());
  const std::string journal = JournalPath(store_->record_path(), "");
  const auto chunks = Chunks(ChunkKind::kXor);
  {
    // Killed after half the chunks: the session is dropped as it is.
    auto s = Begin();
    ASSERT_TRUE(s);
    for (size_t i = 0; i < chunks.size() / 2; ++i) {
      ASSERT_TRUE(s->Apply(chunks[i], decoder_.get()).ok());
    }
  }
  Reopen();
  auto r = RefitSession::RecoverAfterCrash(store_.get(), journal, *boot,
                                           nullptr, map_.get());
  EXPECT_EQ(r.outcome, RefitSession::CrashRecovery::Outcome::kRestored)
      << r.detail;
  ExpectHolds(base_);
  EXPECT_EQ(store_->committed(), base_v_);
  {
    // Killed after its yes vote: never restored; the bits are checked.
    auto s = Begin();
    ASSERT_TRUE(s);
    for (const auto& c : chunks) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
    s->LearnServingTarget(target_bits_);
    ASSERT_EQ(s->Vote(End(chunks), nullptr).code, NodeCode::kOk);
  }
  Reopen();
  r = RefitSession::RecoverAfterCrash(store_.get(), journal, *boot, nullptr,
                                      map_.get());
  EXPECT_EQ(r.outcome, RefitSession::CrashRecovery::Outcome::kPrepared)
      << r.detail;
  ExpectHolds(target_);
  store_->MutableTensor(0)[0] ^= std::byte{1};
  r = RefitSession::RecoverAfterCrash(store_.get(), journal, *boot, nullptr,
                                      map_.get());
  EXPECT_EQ(r.outcome, RefitSession::CrashRecovery::Outcome::kPreparedMix)
      << r.detail;
}

TEST_P(ServingSessionTest, PlansAndStoresThatDoNotFitAreRefused) {
  NodeResult refusal;
  auto begin = [&](const PlanMsg& plan, RefitSession::Options o) {
    return RefitSession::Begin(store_.get(), "n0", refit_, plan, &refusal, o);
  };
  PlanMsg other = plan_;
  other.manifest = Digest128{3, 3};
  EXPECT_FALSE(begin(other, Serving()));
  EXPECT_EQ(refusal.code, NodeCode::kManifestMismatch);
  EXPECT_THAT(refusal.detail, HasSubstr("are not those of serving rank"));
  other = plan_;
  other.context_coded = true;
  EXPECT_FALSE(begin(other, Serving()));
  EXPECT_THAT(refusal.detail, HasSubstr("context-coded"));
  // A tp 1 server's map: the store does not hold its shards.
  std::string tp1 = kLayout;
  tp1.replace(tp1.find("tp: 2"), 5, "tp: 1");
  auto whole = ParseLayout(tp1, "serve-tp1.yaml");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto one = ReceiverMap::Create(*whole, 0);
  ASSERT_TRUE(one.ok());
  RefitSession::Options wrong = Serving();
  wrong.serving = &*one;
  EXPECT_FALSE(begin(plan_, wrong));
  EXPECT_EQ(refusal.code, NodeCode::kManifestMismatch);
  EXPECT_THAT(refusal.detail, HasSubstr("does not hold the shards"));
  // Nothing of the refusals touched the store.
  EXPECT_FALSE(store_->InProgress());
  ExpectHolds(base_);
  // A delta onto a serving store without a record (its digest cannot say
  // which version it holds): a full refit seeds it.
  const std::string bare = dir_.Path("bare.safetensors");
  std::filesystem::copy_file(path_, bare);
  auto unrecorded = OpenStore(*ParseStoreSpec("file:" + bare));
  ASSERT_TRUE(unrecorded.ok());
  ASSERT_FALSE((*unrecorded)->committed());
  EXPECT_FALSE(RefitSession::Begin(unrecorded->get(), "n0", refit_, plan_,
                                   &refusal, Serving()));
  EXPECT_EQ(refusal.code, NodeCode::kNeedsCatchUp);
  EXPECT_THAT(refusal.detail, HasSubstr("seeded by a full refit"));
}

// The ranks of an even split hold shards of the same names and shapes: the
// store's manifest cannot tell them apart. A store bound to the wrong rank
// takes the chunks, and its vote says no.
TEST_P(ServingSessionTest, TheOtherRanksStoreVotesNo) {
  auto other = ReceiverMap::Create(layout_, 1 - GetParam());
  ASSERT_TRUE(other.ok());
  auto mine = std::move(map_);
  map_ = std::make_unique<ReceiverMap>(*std::move(other));
  auto s = Begin();
  ASSERT_TRUE(s);
  const auto chunks = Chunks(ChunkKind::kXor);
  for (const auto& c : chunks) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  s->LearnServingTarget(Bits(target_));
  NodeResult vote = s->Vote(End(chunks), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kDigestMismatch);
  EXPECT_FALSE(vote.repair.empty());
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  map_ = std::move(mine);
  ExpectHolds(base_);
}

// A full refit seeds a store created for it (zeros): its codes and scales
// are requantized whole, padding blocks included, not only where chunks
// landed.
TEST_P(ServingSessionTest, AFullRefitSeedsAFreshStoreWhole) {
  store_.reset();
  const std::string fresh = dir_.Path("fresh.safetensors");
  auto created =
      CreateStore(*ParseStoreSpec("file:" + fresh), *map_->StoreManifest());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  store_ = *std::move(created);
  plan_.mode = RefitMode::kFull;
  plan_.base = Version{};
  std::vector<Bytes> chunks;
  auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
  ForEachSpan([&](ChunkId id, size_t w, auto /*base*/, auto target) {
    Bytes c;
    EXPECT_TRUE(enc->EncodeFull(id, w, target, &c).ok());
    chunks.push_back(std::move(c));
  });
  RefitSession::Options o = Serving();
  o.fresh_store = true;
  o.serving_base.reset();
  NodeResult refusal;
  auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal, o);
  ASSERT_TRUE(s) << refusal.detail;
  for (const auto& c : chunks) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  s->LearnServingTarget(target_bits_);
  ASSERT_EQ(s->Vote(End(chunks), nullptr).code, NodeCode::kOk);
  ASSERT_TRUE(s->Commit().ok());
  ExpectHolds(target_);
}

// A plan that does not name the base's bits (a catch-up from a version
// the root no longer holds) is taken, but a restore after a crash cannot
// be checked: the store stays unfinished, for the root to repair.
TEST_P(ServingSessionTest, ARestoreWithoutTheBasesBitsIsNotTrusted) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok());
  const auto chunks = Chunks(ChunkKind::kXor);
  {
    RefitSession::Options o = Serving();
    o.serving_base.reset();
    NodeResult refusal;
    auto s =
        RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal, o);
    ASSERT_TRUE(s) << refusal.detail;
    for (const auto& c : chunks) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  Reopen();
  auto r = RefitSession::RecoverAfterCrash(
      store_.get(), JournalPath(store_->record_path(), ""), *boot, nullptr,
      map_.get());
  EXPECT_EQ(r.outcome, RefitSession::CrashRecovery::Outcome::kRestoreFailed)
      << r.detail;
  EXPECT_TRUE(store_->InProgress());
}

INSTANTIATE_TEST_SUITE_P(Ranks, ServingSessionTest, ::testing::Values(0u, 1u));

}  // namespace
}  // namespace dcr
