// The local half of a relay's refit against a real file store: baseline
// binding, apply, duplicates, votes, commit and abort-restore. Crash
// recovery: refit_session_crash_test.cc.
#include "session/refit_session.h"

#include <gtest/gtest.h>

#include <thread>

#include "unit/session/refit_session_fixture.h"

namespace dcr {
namespace {

using testing_relay::Bytes;
using testing_relay::kSpan;
using testing_relay::RefitSessionTest;

TEST_F(RefitSessionTest, DeltaRefitCommitsTheTarget) {
  auto s = Begin();
  ASSERT_TRUE(s);
  ASSERT_TRUE(store_->InProgress().has_value());
  for (const auto& c : xor_chunks_) {
    auto r = s->Apply(c, decoder_.get());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, RefitSession::ApplyOutcome::kApplied);
  }
  NodeResult vote = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kOk) << vote.detail;
  EXPECT_EQ(vote.version, target_v_);
  ASSERT_TRUE(s->Commit().ok());
  EXPECT_TRUE(StoreHolds(target_));
  EXPECT_EQ(store_->committed(), target_v_);
  EXPECT_FALSE(store_->InProgress().has_value());
  // The commit survives a restart.
  s.reset();
  Reopen();
  EXPECT_EQ(store_->committed(), target_v_);
}

TEST_F(RefitSessionTest, DuplicateXorIsDroppedAndOrderDoesNotMatter) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (auto it = xor_chunks_.rbegin(); it != xor_chunks_.rend(); ++it) {
    ASSERT_EQ(*s->Apply(*it, decoder_.get()),
              RefitSession::ApplyOutcome::kApplied);
    // A replayed XOR would silently revert the span: it is dropped.
    ASSERT_EQ(*s->Apply(*it, decoder_.get()),
              RefitSession::ApplyOutcome::kDuplicate);
  }
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(RefitSessionTest, WrongBaselineIsRefusedUntouched) {
  plan_.base = Version{1, Digest128{1, 2}};
  NodeResult refusal;
  auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal);
  EXPECT_FALSE(s);
  EXPECT_EQ(refusal.code, NodeCode::kNeedsCatchUp);
  EXPECT_EQ(refusal.version.digest, base_v_.digest);
  EXPECT_FALSE(store_->InProgress().has_value());
  EXPECT_TRUE(StoreHolds(base_));
  // A committed record is what binds once there is one.
  ASSERT_TRUE(store_->Commit(Version{9, base_v_.digest}, refit_).ok());
  plan_.base = base_v_;  // step 1, but the store committed step 9
  s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal);
  EXPECT_FALSE(s);
  EXPECT_EQ(refusal.code, NodeCode::kNeedsCatchUp);
  EXPECT_EQ(refusal.version.step, 9u);
}

TEST_F(RefitSessionTest, ManifestMismatchAndUnfinishedRefitAreRefused) {
  NodeResult refusal;
  PlanMsg other = plan_;
  other.manifest = Digest128{3, 3};
  EXPECT_FALSE(
      RefitSession::Begin(store_.get(), "n0", refit_, other, &refusal));
  EXPECT_EQ(refusal.code, NodeCode::kManifestMismatch);
  auto s = Begin();
  ASSERT_TRUE(s);
  RefitId another;
  another.bytes[0] = 8;
  // Another refit left unfinished (as after a crash): a delta cannot
  // apply to the mixed bits; the refusal names the unfinished refit, for
  // the root to repair it (coord/repair.h).
  EXPECT_FALSE(
      RefitSession::Begin(store_.get(), "n0", another, plan_, &refusal));
  EXPECT_EQ(refusal.code, NodeCode::kNeedsCatchUp);
  EXPECT_EQ(refusal.store.unfinished, refit_);
  EXPECT_EQ(refusal.store.base, plan_.base);
  EXPECT_EQ(refusal.store.target, plan_.target);
  EXPECT_FALSE(refusal.store.prepared);
  // A full refit overwrites every span, so it may take over.
  PlanMsg full = plan_;
  full.mode = RefitMode::kFull;
  auto repair =
      RefitSession::Begin(store_.get(), "n0", another, full, &refusal);
  EXPECT_TRUE(repair) << refusal.detail;
}

TEST_F(RefitSessionTest, AbortRestoresTheBaseAfterAnyMix) {
  auto s = Begin();
  ASSERT_TRUE(s);
  // Half the spans by XOR; one of them then retried as an overwrite (as
  // after an uncertain delivery); another span only by overwrite.
  for (size_t i = 0; i < xor_chunks_.size() / 2; ++i) {
    ASSERT_TRUE(s->Apply(xor_chunks_[i], decoder_.get()).ok());
  }
  ASSERT_TRUE(s->Apply(overwrite_chunks_[0], decoder_.get()).ok());
  ASSERT_TRUE(s->Apply(overwrite_chunks_.back(), decoder_.get()).ok());
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
  EXPECT_FALSE(store_->InProgress().has_value());
}

TEST_F(RefitSessionTest, UndoDataLivesOnDiskNotOnTheHeap) {
  // A full refit of an existing store: every span overwritten. What Abort
  // needs (the replaced values) goes to the journal beside the store, so
  // heap use does not grow with the store.
  plan_.mode = RefitMode::kFull;
  NodeResult refusal;
  auto s = RefitSession::Begin(store_.get(), "n0", refit_, plan_, &refusal);
  ASSERT_TRUE(s) << refusal.detail;
  std::vector<Bytes> full;
  MakeFullChunks(&full);
  for (const Bytes& c : full) ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(target_));
  const std::string journal = JournalPath(store_->record_path(), "");
  EXPECT_GT(std::filesystem::file_size(journal),
            store_->Tensor(0).size() + store_->Tensor(1).size());
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
  EXPECT_FALSE(std::filesystem::exists(journal));

  // A store created for the refit keeps nothing and aborts cleanly.
  auto fresh = RefitSession::Begin(
      store_.get(), "n0", refit_, plan_, &refusal,
      {.pool = nullptr, .fresh_store = true, .undo_dir = std::nullopt});
  ASSERT_TRUE(fresh);
  for (const Bytes& c : full) {
    ASSERT_TRUE(fresh->Apply(c, decoder_.get()).ok());
  }
  ASSERT_TRUE(fresh->Abort(decoder_.get()).ok());
  EXPECT_FALSE(store_->InProgress().has_value());
}

// A retry (overwrite) that overtakes the original XOR chunk: the late XOR
// must not be applied on top of it.
TEST_F(RefitSessionTest, LateXorAfterOverwriteIsDropped) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : overwrite_chunks_) {
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  }
  for (const auto& c : xor_chunks_) {
    EXPECT_EQ(*s->Apply(c, decoder_.get()),
              RefitSession::ApplyOutcome::kDuplicate);
  }
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(RefitSessionTest, MissingChunkOrFlippedBitVotesNo) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (size_t i = 1; i < xor_chunks_.size(); ++i) {
    ASSERT_TRUE(s->Apply(xor_chunks_[i], decoder_.get()).ok());
  }
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kIncomplete);
  ASSERT_TRUE(s->Apply(xor_chunks_[0], decoder_.get()).ok());
  store_->MutableTensor(0)[5] ^= std::byte{0x10};  // a bit flipped after apply
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kDigestMismatch);
  store_->MutableTensor(0)[5] ^= std::byte{0x10};
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
}

TEST_F(RefitSessionTest, ChunksThatDoNotFitAreRefused) {
  plan_.span_elems = 512;  // the chunks were cut at 1024
  auto s = Begin();
  ASSERT_TRUE(s);
  auto r = s->Apply(xor_chunks_[0], decoder_.get());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_TRUE(StoreHolds(base_));
  Bytes bad = xor_chunks_[0];
  bad[bad.size() / 2] ^= std::byte{1};
  EXPECT_FALSE(s->Apply(bad, decoder_.get()).ok());
}

// Four tensors of several spans each, streamed in manifest order.
// Context-coded chunks (codec.h kContext) decode against the span they
// apply to: only in a plan that offers them, only while the span holds the
// base.
class ContextSessionTest : public RefitSessionTest {
 protected:
  static constexpr uint64_t kCtxSpan = 8192;
  void SetUp() override {
    infos_ = {{"w", DType::kBF16, {3 * kCtxSpan + 100}}};
    RefitSessionTest::SetUp();
    // Adam-like bits: small exponents change often, large ones rarely.
    std::mt19937_64 rng(11);
    const size_t n = infos_[0].NumElements();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t e = 110 + static_cast<uint32_t>(rng() % 12);
      uint16_t x = static_cast<uint16_t>((e << 7) | (rng() & 0x7f));
      uint16_t y = x;
      const double p = 0.4 / static_cast<double>(1u << (e - 110));
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p) {
        y ^= static_cast<uint16_t>(1 + rng() % 3);
      }
      std::memcpy(base_[0].data() + 2 * i, &x, 2);
      std::memcpy(target_[0].data() + 2 * i, &y, 2);
    }
    store_.reset();
    Write(path_, base_);
    Reopen();
    base_v_ = Version{1, store_->Digests().version};
    std::string tpath = dir_.Path("ctx-target.safetensors");
    Write(tpath, target_);
    target_v_ =
        Version{2, (*Checkpoint::Open(tpath, Checkpoint::Mode::kReadOnly))
                       ->ComputeDigests()
                       .version};
    plan_.base = base_v_;
    plan_.target = target_v_;
    plan_.span_elems = kCtxSpan;
    plan_.context_coded = true;
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    for (uint32_t sp = 0; sp < SpanCount(n, kCtxSpan); ++sp) {
      const uint64_t off = sp * kCtxSpan * 2;
      const uint64_t len = std::min(kCtxSpan, n - sp * kCtxSpan) * 2;
      Bytes c;
      auto r = enc->EncodeDiffInContext(
          ChunkKind::kXor, {0, sp}, 2, ExponentFieldOf(DType::kBF16),
          std::span(base_[0]).subspan(off, len),
          std::span(target_[0]).subspan(off, len), &c);
      ASSERT_TRUE(r.ok() && *r);
      ctx_chunks_.push_back(std::move(c));
    }
    ASSERT_EQ(PeekChunkHeader(ctx_chunks_[0])->encoding,
              ChunkEncoding::kContext);
  }
  std::vector<Bytes> ctx_chunks_;
};

TEST_F(ContextSessionTest, ContextChunksApplyAndCommitTheTarget) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : ctx_chunks_) {
    auto r = s->Apply(c, decoder_.get());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, RefitSession::ApplyOutcome::kApplied);
    // Again: a duplicate, dropped before it is decoded against a span
    // that no longer holds its base.
    EXPECT_EQ(*s->Apply(c, decoder_.get()),
              RefitSession::ApplyOutcome::kDuplicate);
  }
  NodeResult vote = s->Vote(End(ctx_chunks_), nullptr);
  EXPECT_EQ(vote.code, NodeCode::kOk) << vote.detail;
  ASSERT_TRUE(s->Commit().ok());
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(ContextSessionTest, RefusedWithoutThePlanFlag) {
  plan_.context_coded = false;
  auto s = Begin();
  ASSERT_TRUE(s);
  auto r = s->Apply(ctx_chunks_[0], decoder_.get());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("did not offer"), std::string::npos);
  EXPECT_TRUE(StoreHolds(base_));
}

TEST_F(ContextSessionTest, ASpanThatIsNotTheBaseIsRefusedUntouched) {
  // A span that differs from the base where the chunk changes nothing:
  // its contexts differ, the chunk fails its decoded checksum, and the
  // span keeps its bits.
  std::vector<Bytes> other = base_;
  for (size_t i = 0; i < 2000; ++i) other[0][2 * i + 1] ^= std::byte{0x01};
  store_.reset();
  Write(path_, other);
  Reopen();
  plan_.base = Version{1, store_->Digests().version};
  auto s = Begin();
  ASSERT_TRUE(s);
  auto r = s->Apply(ctx_chunks_[0], decoder_.get());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_TRUE(StoreHolds(other));
}

class HashAheadTest : public RefitSessionTest {
 protected:
  void SetUp() override {
    infos_ = {{"t0", DType::kBF16, {3000}},
              {"t1", DType::kF32, {2500}},
              {"t2", DType::kBF16, {4096}},
              {"t3", DType::kF16, {1500}}};
    RefitSessionTest::SetUp();
  }
  uint32_t TensorOf(const Bytes& chunk) {
    return PeekChunkHeader(chunk)->id.tensor;
  }
};

TEST_F(HashAheadTest, AnOrderedStreamLeavesOnlyTheLastTensorToTheVote) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : xor_chunks_)
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  EXPECT_EQ(s->hash_counts().ahead, 3u);
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kOk) << v.detail;
  EXPECT_EQ(v.version, target_v_);
  EXPECT_EQ(s->hash_counts().at_vote, 1u);
}

TEST_F(HashAheadTest, AChunkThatLandsAfterItsTensorWasHashedIsHashedAgain) {
  // t0's first chunk comes last (a resend, or a slow worker): t0 was hashed
  // without it when the stream moved on, so that digest must not be used.
  auto s = Begin();
  ASSERT_TRUE(s);
  ASSERT_EQ(TensorOf(xor_chunks_[0]), 0u);
  for (size_t i = 1; i < xor_chunks_.size(); ++i) {
    ASSERT_TRUE(s->Apply(xor_chunks_[i], decoder_.get()).ok());
  }
  EXPECT_EQ(s->hash_counts().ahead, 3u);
  ASSERT_TRUE(s->Apply(xor_chunks_[0], decoder_.get()).ok());
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kOk) << v.detail;
  EXPECT_EQ(s->hash_counts().at_vote, 2u);  // t0 again, and t3
  EXPECT_TRUE(StoreHolds(target_));
}

// A producers' stream: the later pipeline stage's tensors (t2, t3) come
// first. By the chunks' ids alone t0 and t1 would be hashed before their
// chunks came, and again at the vote; with the root's marks no tensor is
// hashed twice.
TEST_F(HashAheadTest, MarksKeepAnInterleavedStreamFromHashingTwice) {
  std::vector<const Bytes*> late, early;  // t2 and t3; t0 and t1
  for (const auto& c : xor_chunks_)
    (TensorOf(c) >= 2 ? late : early).push_back(&c);
  ASSERT_FALSE(late.empty());
  ASSERT_FALSE(early.empty());
  {
    auto s = Begin();  // no marks
    ASSERT_TRUE(s);
    for (const Bytes* c : late) ASSERT_TRUE(s->Apply(*c, decoder_.get()).ok());
    for (const Bytes* c : early) ASSERT_TRUE(s->Apply(*c, decoder_.get()).ok());
    ASSERT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
    EXPECT_GT(s->hash_counts().ahead + s->hash_counts().at_vote, 4u);
    ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  }
  auto s = Begin();
  ASSERT_TRUE(s);
  s->StreamPassed(0);  // before any chunk: the stream is marked
  for (const Bytes* c : late) ASSERT_TRUE(s->Apply(*c, decoder_.get()).ok());
  EXPECT_EQ(s->hash_counts().ahead, 0u);
  s->StreamPassed(1);  // t0 is done
  s->StreamPassed(0);  // going back: ignored
  for (const Bytes* c : early) ASSERT_TRUE(s->Apply(*c, decoder_.get()).ok());
  // The applies after the mark hashed t0, and nothing above it.
  EXPECT_EQ(s->hash_counts().ahead, 1u);
  s->StreamPassed(4);
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kOk) << v.detail;
  EXPECT_EQ(s->hash_counts().at_vote, 3u);  // t1, t2, t3: each once
  EXPECT_TRUE(StoreHolds(target_));
}

// A mark past the manifest (a damaged or hostile frame that kept its
// checksum, or a root that marks too early) means every tensor: hashing
// stops at the manifest's end (ASan would see the overrun), ~0 does not
// read as "no mark", and the tensors written after they were hashed are
// hashed again at the vote, which takes the target.
TEST_F(HashAheadTest, AMarkPastTheManifestIsAHintTooEarly) {
  auto s = Begin();
  ASSERT_TRUE(s);
  s->StreamPassed(~uint32_t{0});
  for (const auto& c : xor_chunks_) {
    s->Queued(c);
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
    s->Unqueued(c);  // hashes up to the mark: the whole manifest
  }
  EXPECT_GE(s->hash_counts().ahead, 4u);
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kOk) << v.detail;
  EXPECT_EQ(v.version, target_v_);
  EXPECT_LE(s->hash_counts().at_vote, 4u);
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(HashAheadTest, LaterVotesHashEveryTensor) {
  auto t = Checkpoint::Open(dir_.Path("target.safetensors"),
                            Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(t.ok());
  plan_.target_tensor_digests = (*t)->ComputeDigests().tensors;
  auto s = Begin();
  ASSERT_TRUE(s);
  for (const auto& c : xor_chunks_)
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  ASSERT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  // A bit flipped outside the session in t1, hashed ahead and not written
  // since: the next vote (a repair round's) sees it.
  store_->MutableTensor(1)[9] ^= std::byte{0x04};
  NodeResult v = s->Vote(End(xor_chunks_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kDigestMismatch);
  EXPECT_EQ(v.repair, std::vector<uint32_t>{1});
  EXPECT_EQ(s->hash_counts().at_vote, 1u + 4u);
}

TEST_F(HashAheadTest, OffHashesEverythingAtTheVote) {
  RefitSession::Options options;
  options.hash_ahead = false;
  auto s = Begin(options);
  ASSERT_TRUE(s);
  for (const auto& c : xor_chunks_)
    ASSERT_TRUE(s->Apply(c, decoder_.get()).ok());
  EXPECT_EQ(s->hash_counts().ahead, 0u);
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  EXPECT_EQ(s->hash_counts().at_vote, 4u);
}

TEST_F(HashAheadTest, ConcurrentAppliesInAnyOrderVoteTheTarget) {
  // Three workers race through the chunks in different orders, duplicates
  // included: whatever was hashed ahead, the vote must see the target.
  for (int round = 0; round < 20; ++round) {
    Reopen();
    plan_.base = base_v_;
    auto s = Begin();
    ASSERT_TRUE(s);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        auto dec = std::move(*ChunkDecoder::Create());
        std::vector<size_t> order(xor_chunks_.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::mt19937 rng(round * 3 + t);
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i : order) {
          ASSERT_TRUE(s->Apply(overwrite_chunks_[i], dec.get()).ok());
        }
      });
    }
    for (auto& t : threads) t.join();
    NodeResult v = s->Vote(End(overwrite_chunks_), nullptr);
    ASSERT_EQ(v.code, NodeCode::kOk) << "round " << round << ": " << v.detail;
    // Back to the base for the next round.
    ASSERT_TRUE(s->Abort(decoder_.get()).ok());
    ASSERT_TRUE(StoreHolds(base_));
  }
}

TEST_F(RefitSessionTest, ConcurrentAppliesWithDuplicates) {
  auto s = Begin();
  ASSERT_TRUE(s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      auto dec = std::move(*ChunkDecoder::Create());
      for (const auto& c : xor_chunks_)
        ASSERT_TRUE(s->Apply(c, dec.get()).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s->Vote(End(xor_chunks_), nullptr).code, NodeCode::kOk);
  EXPECT_TRUE(StoreHolds(target_));
}

}  // namespace
}  // namespace dcr
