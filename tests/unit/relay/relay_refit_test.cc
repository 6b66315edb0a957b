// The relay's refit state machine without sockets: every transition from a
// legal and an illegal source phase (table-driven, forward-only refits),
// then whole refits on a memory store with the real apply workers.
#include "relay/relay_refit.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "testing/store_pair.h"

namespace dcr {
namespace {

constexpr uint64_t kSpan = 1024;
using Bytes = std::vector<std::byte>;
using P = RefitPhase;

class RelayRefitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    decoder_ = std::move(*ChunkDecoder::Create());
    env_.node = "n0";
    env_.workers = &workers_;
    env_.hash_pool = &pool_;
    env_.decoder = decoder_.get();
    id_.bytes[0] = 9;
  }

  // A forward-only refit (no session) walked to `phase` through legal
  // transitions.
  std::unique_ptr<RelayRefit> At(P phase) {
    PlanMsg plan;
    plan.target.step = 2;
    NodeResult own;  // why it only forwards
    own.node = "n0";
    own.code = NodeCode::kNeedsCatchUp;
    auto r = std::make_unique<RelayRefit>(&env_, id_, 1, std::move(plan),
                                          std::move(own), nullptr);
    auto step = [&](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); };
    if (phase == P::kPlanning) return r;
    step(r->Planned());
    if (phase == P::kReceiving) return r;
    if (phase == P::kCommitting) {
      step(r->Commit(CommitMsg{}));
      return r;
    }
    if (phase == P::kAborting) {
      step(r->Abort());
      return r;
    }
    if (phase == P::kOrphaned) {
      step(r->GiveUp());
      return r;
    }
    if (phase == P::kEnded) {
      step(r->Abort());
      step(r->Finish());
      EXPECT_TRUE(r->Conclude().ok());
      return r;
    }
    step(r->End(EndMsg{}));
    if (phase == P::kVoting) return r;
    step(r->Vote());
    EXPECT_TRUE(r->Voted().ok());
    return r;  // kVoted
  }

  ApplyWorkers workers_{2, nullptr};
  ThreadPool pool_{2};
  std::unique_ptr<ChunkDecoder> decoder_;
  RelayRefit::Env env_;
  RefitId id_;
};

CommitMsg CommitSet(std::vector<std::string> nodes) {
  CommitMsg m;
  m.commit_set = std::move(nodes);
  return m;
}

struct Transition {
  std::string name;
  std::function<Status(RelayRefit&)> run;
  P legal;    // a source phase it leaves from
  P after;    // where it leads from there
  P illegal;  // a source phase it refuses
};

template <typename T>
Status Ok(const Result<T>& r) {
  return r.status();
}

TEST_F(RelayRefitTest, EveryTransitionFromALegalAndAnIllegalPhase) {
  const std::vector<Transition> table = {
      {"Planned", [](RelayRefit& r) { return r.Planned(); }, P::kPlanning,
       P::kReceiving, P::kReceiving},
      {"Chunk", [](RelayRefit& r) { return Ok(r.Chunk()); }, P::kReceiving,
       P::kReceiving, P::kPlanning},
      {"Chunk (repair round)", [](RelayRefit& r) { return Ok(r.Chunk()); },
       P::kVoted, P::kReceiving, P::kCommitting},
      {"End", [](RelayRefit& r) { return r.End(EndMsg{}); }, P::kReceiving,
       P::kVoting, P::kPlanning},
      {"End (vote again)", [](RelayRefit& r) { return r.End(EndMsg{}); },
       P::kVoted, P::kVoting, P::kAborting},
      {"Vote", [](RelayRefit& r) { return r.Vote(); }, P::kVoting, P::kVoting,
       P::kReceiving},
      {"Voted",
       [](RelayRefit& r) {
         Status s = r.Vote();
         return s.ok() ? Ok(r.Voted()) : s;
       },
       P::kVoting, P::kVoted, P::kVoted},
      {"Commit", [](RelayRefit& r) { return r.Commit(CommitMsg{}); }, P::kVoted,
       P::kCommitting, P::kCommitting},
      {"Abort", [](RelayRefit& r) { return r.Abort(); }, P::kReceiving,
       P::kAborting, P::kOrphaned},
      {"GiveUp", [](RelayRefit& r) { return r.GiveUp(); }, P::kVoted,
       P::kOrphaned, P::kCommitting},
      {"Finish", [](RelayRefit& r) { return r.Finish(); }, P::kCommitting,
       P::kCommitting, P::kVoted},
      {"Conclude",
       [](RelayRefit& r) {
         Status s = r.Finish();
         return s.ok() ? Ok(r.Conclude()) : s;
       },
       P::kAborting, P::kEnded, P::kVoting},
      {"Shutdown", [](RelayRefit& r) { return r.Shutdown(); }, P::kReceiving,
       P::kEnded, P::kEnded},
  };
  for (const Transition& t : table) {
    SCOPED_TRACE(t.name);
    auto legal = At(t.legal);
    ASSERT_EQ(legal->phase(), t.legal);
    Status s = t.run(*legal);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(legal->phase(), t.after);

    auto illegal = At(t.illegal);
    ASSERT_EQ(illegal->phase(), t.illegal);
    s = t.run(*illegal);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(illegal->phase(), t.illegal) << "an illegal call changes nothing";
    if (t.name == "Planned" || t.name == "Commit") {
      EXPECT_NE(s.message().find(RefitPhaseName(t.illegal)), std::string::npos)
          << s.ToString();
    }
  }
}

TEST_F(RelayRefitTest, GuardsWithinAPhase) {
  auto r = At(P::kVoting);
  EXPECT_FALSE(r->Voted().ok()) << "no vote yet";
  ASSERT_TRUE(r->Vote().ok());
  EXPECT_FALSE(r->Vote().ok()) << "one vote per END";
  auto c = At(P::kCommitting);
  EXPECT_FALSE(c->Conclude().ok()) << "not finished";
  ASSERT_TRUE(c->Finish().ok());
  EXPECT_FALSE(c->Finish().ok()) << "finished once";
}

TEST_F(RelayRefitTest, ForwardOnlyVotesNoAndConcludesWithoutCommitting) {
  auto r = At(P::kVoting);
  ASSERT_TRUE(r->Vote().ok());
  auto vote = r->Voted();
  ASSERT_TRUE(vote.ok());
  EXPECT_EQ(vote->code, NodeCode::kNeedsCatchUp);
  ASSERT_TRUE(r->Commit(CommitSet({"n0"})).ok());
  ASSERT_TRUE(r->Finish().ok());
  auto done = r->Conclude();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->reply, FrameType::kCommitReply);
  EXPECT_FALSE(done->committed);
}

// Whole refits against a memory store, chunks applied by the real workers.
class RelayRefitStoreTest : public RelayRefitTest {
 protected:
  void SetUp() override {
    RelayRefitTest::SetUp();
    std::vector<TensorInfo> infos = {{"a", DType::kBF16, {3000}},
                                     {"b", DType::kF32, {500}}};
    auto manifest = Manifest::Create(infos);
    ASSERT_TRUE(manifest.ok());
    infos_ = manifest->tensors();
    auto store = CreateStore(*ParseStoreSpec("memory:"), *manifest);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *std::move(store);
    auto target = CreateStore(*ParseStoreSpec("memory:"), *manifest);
    ASSERT_TRUE(target.ok());
    testing::StorePair pair = testing::MakeStorePair(infos_);
    base_ = std::move(pair.base);
    target_ = std::move(pair.target);
    for (size_t t = 0; t < infos_.size(); ++t) {
      std::copy(base_[t].begin(), base_[t].end(),
                store_->MutableTensor(t).begin());
      std::copy(target_[t].begin(), target_[t].end(),
                (*target)->MutableTensor(t).begin());
    }
    plan_.mode = RefitMode::kDelta;
    plan_.base = Version{1, store_->Digests().version};
    plan_.target = Version{2, (*target)->Digests().version};
    plan_.manifest = manifest->digest();
    plan_.span_elems = kSpan;
    plan_.nodes = {{"n0", "127.0.0.1", 1, "tcp", -1}};
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    for (uint32_t t = 0; t < infos_.size(); ++t) {
      size_t w = DTypeSize(infos_[t].dtype);
      uint64_t n = infos_[t].NumElements();
      for (uint32_t s = 0; s < SpanCount(n, kSpan); ++s) {
        uint64_t off = s * kSpan * w, len = std::min(kSpan, n - s * kSpan) * w;
        Bytes c;
        auto changed = enc->EncodeDiff(
            ChunkKind::kXor, {t, s}, w, std::span(base_[t]).subspan(off, len),
            std::span(target_[t]).subspan(off, len), &c);
        ASSERT_TRUE(changed.ok());
        if (*changed) {
          ids_.push_back(ChunkId{t, s});
          chunks_.push_back(std::make_shared<Bytes>(std::move(c)));
        }
      }
    }
  }

  std::unique_ptr<RelayRefit> Begin() {
    NodeResult own;
    own.node = "n0";
    auto session =
        RefitSession::Begin(store_.get(), "n0", id_, plan_, &own, {});
    EXPECT_TRUE(session) << own.detail;
    return std::make_unique<RelayRefit>(&env_, id_, 1, plan_, own,
                                        std::move(session));
  }

  // The END of every chunk, naming `target` (version 3) if given.
  EndMsg End(std::optional<Version> target = std::nullopt,
             std::vector<Digest128> tensor_digests = {}) const {
    EndMsg end{ids_.size(), ChunkIdsDigest(ids_)};
    end.target = target;
    end.target_tensor_digests = std::move(tensor_digests);
    return end;
  }

  // Planned, every chunk, `end`; waits for the applies (the completion
  // event the relay would get) and votes.
  NodeResult StreamAndVote(RelayRefit& r) { return StreamAndVote(r, End()); }
  NodeResult StreamAndVote(RelayRefit& r, const EndMsg& end) {
    EXPECT_TRUE(r.Planned().ok());
    for (const auto& c : chunks_) {
      EXPECT_TRUE(r.Chunk().ok());
      r.Apply(c, *c);
    }
    EXPECT_TRUE(r.End(end).ok());
    while (!r.WantsLocalWork()) std::this_thread::yield();
    EXPECT_TRUE(r.Vote().ok());
    auto vote = r.Voted();
    EXPECT_TRUE(vote.ok());
    return vote.ok() ? *vote : NodeResult{};
  }

  bool StoreHolds(const std::vector<Bytes>& data) {
    return testing::StoreHolds(*store_, data);
  }

  std::vector<TensorInfo> infos_;
  std::unique_ptr<WeightStore> store_;
  std::vector<Bytes> base_, target_;
  PlanMsg plan_;
  std::vector<FrameBuffer> chunks_;
  std::vector<ChunkId> ids_;
};

TEST_F(RelayRefitStoreTest, CommitsTheTargetWhenInTheCommitSet) {
  auto r = Begin();
  NodeResult vote = StreamAndVote(*r);
  EXPECT_EQ(vote.code, NodeCode::kOk) << vote.detail;
  EXPECT_EQ(r->tracker().applied(), chunks_.size());
  ASSERT_TRUE(r->Commit(CommitSet({"n0"})).ok());
  ASSERT_TRUE(r->Finish().ok());
  auto done = r->Conclude();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->committed);
  EXPECT_EQ(done->reply, FrameType::kCommitReply);
  EXPECT_EQ(store_->committed(), plan_.target);
  EXPECT_TRUE(StoreHolds(target_));
}

// A PLAN that leaves the target's digest to END (the root hashes the target
// while it streams): the relay votes and commits the target END names,
// and refuses an END that names none or contradicts the PLAN.
TEST_F(RelayRefitStoreTest, TheTargetNamedAtEndIsVotedAndCommitted) {
  const Version target = plan_.target;
  std::vector<Digest128> tensors;
  for (const Bytes& t : target_) tensors.push_back(TensorDigest(t));
  ASSERT_EQ(VersionDigest(plan_.manifest, tensors), target.digest);
  plan_.target.digest = Digest128{};
  ASSERT_TRUE(plan_.target_at_end());
  // Each bad END: the vote is a rejection naming why, and the abort
  // restores the base.
  struct Bad {
    EndMsg end;
    std::string why;
  };
  std::vector<Digest128> wrong = tensors;
  wrong[0].low ^= 1;
  for (const Bad& bad : {
           Bad{End(), "END names none"},
           Bad{End(Version{target.step + 1, target.digest}, tensors),
               "END names target step 3, the PLAN step 2"},
           Bad{End(target, wrong), "do not make its target digest"},
       }) {
    SCOPED_TRACE(bad.why);
    auto r = Begin();
    NodeResult vote = StreamAndVote(*r, bad.end);
    EXPECT_EQ(vote.code, NodeCode::kRejected);
    EXPECT_NE(vote.detail.find(bad.why), std::string::npos) << vote.detail;
    ASSERT_TRUE(r->Abort().ok());
    ASSERT_TRUE(r->Finish().ok());
    ASSERT_TRUE(r->Conclude().ok());
    EXPECT_TRUE(StoreHolds(base_));
  }
  auto r = Begin();
  NodeResult vote = StreamAndVote(*r, End(target, tensors));
  EXPECT_EQ(vote.code, NodeCode::kOk) << vote.detail;
  EXPECT_EQ(vote.version, target);
  EXPECT_EQ(r->plan().target, target);
  ASSERT_TRUE(r->Commit(CommitSet({"n0"})).ok());
  ASSERT_TRUE(r->Finish().ok());
  auto done = r->Conclude();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->committed);
  EXPECT_EQ(store_->committed(), target);
  EXPECT_TRUE(StoreHolds(target_));
}

// A PLAN that named the target: an END naming another one is refused.
TEST_F(RelayRefitStoreTest, AnEndContradictingThePlansTargetIsRefused) {
  auto r = Begin();
  Version other = plan_.target;
  other.digest.high ^= 1;
  NodeResult vote = StreamAndVote(*r, End(other));
  EXPECT_EQ(vote.code, NodeCode::kRejected);
  EXPECT_NE(vote.detail.find("the PLAN"), std::string::npos) << vote.detail;
}

TEST_F(RelayRefitStoreTest, NotInTheCommitSetRestoresTheBase) {
  auto r = Begin();
  StreamAndVote(*r);
  ASSERT_TRUE(r->Commit(CommitSet({"other"})).ok());
  ASSERT_TRUE(r->Finish().ok());
  auto done = r->Conclude();
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->committed);
  EXPECT_EQ(done->local.detail, "not in the commit set; base restored");
  EXPECT_TRUE(StoreHolds(base_));
}

TEST_F(RelayRefitStoreTest, AbortAndOrphanRestoreTheBase) {
  for (bool orphan : {false, true}) {
    SCOPED_TRACE(orphan ? "orphaned" : "aborted");
    auto r = Begin();
    StreamAndVote(*r);
    ASSERT_TRUE((orphan ? r->GiveUp() : r->Abort()).ok());
    ASSERT_TRUE(r->Finish().ok());
    auto done = r->Conclude();
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(done->reply, orphan ? FrameType::kError : FrameType::kAbortReply);
    EXPECT_EQ(done->local.version, plan_.base);
    EXPECT_TRUE(StoreHolds(base_));
  }
}

TEST_F(RelayRefitStoreTest, ARepairRoundNeedsANewVote) {
  auto r = Begin();
  StreamAndVote(*r);
  auto repair = r->Chunk();  // from kVoted
  ASSERT_TRUE(repair.ok());
  EXPECT_TRUE(*repair);
  EXPECT_EQ(r->phase(), P::kReceiving);
  // Without a new vote the old yes does not commit.
  ASSERT_TRUE(r->Commit(CommitSet({"n0"})).ok());
  ASSERT_TRUE(r->Finish().ok());
  EXPECT_FALSE(r->Conclude()->committed);
  EXPECT_TRUE(StoreHolds(base_));
}

TEST_F(RelayRefitStoreTest, ShutdownWaitsForAppliesAndRestores) {
  auto r = Begin();
  ASSERT_TRUE(r->Planned().ok());
  for (const auto& c : chunks_) {
    ASSERT_TRUE(r->Chunk().ok());
    r->Apply(c, *c);
  }
  ASSERT_TRUE(r->Shutdown().ok());
  EXPECT_TRUE(r->tracker().idle());
  EXPECT_EQ(r->phase(), P::kEnded);
  EXPECT_TRUE(StoreHolds(base_));
}

}  // namespace
}  // namespace dcr
