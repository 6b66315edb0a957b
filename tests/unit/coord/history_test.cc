// The root's delta history: chains found and refused, composition bit for
// bit against applying each delta in turn, overwrites and cancelling
// masks, pruning.
#include "coord/history.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "coord/repair.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kHistorySpan = 4096;
constexpr size_t kElem = 2;  // BF16-like
// Two "tensors": 3 spans (the last one short) and 1 span.
const std::vector<uint64_t> kHistoryElems = {2 * kHistorySpan + 1000, 700};
const Digest128 kManifest{7, 7};

Version V(uint64_t step) { return Version{step, Digest128{step + 1, 99}}; }

struct Model {
  std::vector<Bytes> t;
  explicit Model(uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t n : kHistoryElems) {
      Bytes b(n * kElem);
      for (auto& x : b) x = static_cast<std::byte>(rng());
      t.push_back(std::move(b));
    }
  }
  Model Step(double rate, uint32_t seed) const {
    Model m = *this;
    std::mt19937 rng(seed);
    std::bernoulli_distribution pick(rate);
    for (auto& b : m.t) {
      for (size_t i = 0; i < b.size(); i += kElem) {
        if (pick(rng)) b[i] ^= static_cast<std::byte>(1 + rng() % 7);
      }
    }
    return m;
  }
  std::span<std::byte> Span(ChunkId id) {
    uint64_t first = uint64_t{id.span} * kHistorySpan;
    uint64_t n = std::min(kHistorySpan, kHistoryElems[id.tensor] - first);
    return std::span<std::byte>(t[id.tensor]).subspan(first * kElem, n * kElem);
  }
};

class HistoryTest : public ::testing::Test {
 protected:
  HistoryTest() : history_(dir_.Path("history"), 4) {
    encoder_ = *ChunkEncoder::Create(EncodeOptions{});
    decoder_ = *ChunkDecoder::Create();
  }

  // Records the delta a -> b as a refit would (XOR chunks, in order);
  // `overwrite` turns the chunk of that id into a dense overwrite; `parts`
  // > 0 records each span as that many XOR parts, as a producers' refit
  // sends them (element e in part e % parts + 1).
  void Record(Model a, Model b, uint64_t from, uint64_t to,
              std::optional<ChunkId> overwrite = std::nullopt,
              std::optional<RefitId> aborted = std::nullopt,
              uint16_t parts = 0) {
    auto w = history_.Record(V(to));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    if (aborted) {
      fs::create_directories(history_.AbortedDir());
      (*w)->set_path(history_.AbortedPathFor(*aborted));
    }
    for (uint32_t t = 0; t < kHistoryElems.size(); ++t) {
      for (uint32_t s = 0; s < SpanCount(kHistoryElems[t], kHistorySpan); ++s) {
        ChunkId id{t, s};
        Bytes out;
        if (overwrite == id) {
          ASSERT_TRUE(encoder_->EncodeFull(id, kElem, b.Span(id), &out).ok());
        } else if (parts > 0) {
          auto sa = a.Span(id), sb = b.Span(id);
          const uint32_t n = static_cast<uint32_t>(sa.size() / kElem);
          for (uint16_t p = 0; p < parts; ++p) {
            std::vector<uint32_t> pos;
            Bytes masks;
            for (uint32_t e = p; e < n; e += parts) {
              if (std::memcmp(&sa[e * kElem], &sb[e * kElem], kElem) == 0)
                continue;
              pos.push_back(e);
              for (size_t k = 0; k < kElem; ++k)
                masks.push_back(sa[e * kElem + k] ^ sb[e * kElem + k]);
            }
            if (pos.empty()) continue;
            Bytes part;
            ASSERT_TRUE(encoder_
                            ->EncodeChanges(ChunkKind::kXor,
                                            ChunkId{t, s, uint16_t(p + 1)},
                                            kElem, n, pos, masks, &part)
                            .ok());
            ASSERT_TRUE((*w)->Append(part).ok());
          }
          continue;
        } else {
          auto changed = encoder_->EncodeDiff(ChunkKind::kXor, id, kElem,
                                              a.Span(id), b.Span(id), &out);
          ASSERT_TRUE(changed.ok());
          if (!*changed) continue;
        }
        ASSERT_TRUE((*w)->Append(out).ok());
      }
    }
    DeltaHeader h;
    h.base = V(from);
    h.target = V(to);
    h.manifest = kManifest;
    h.span_elems = kHistorySpan;
    h.tensor_count = kHistoryElems.size();
    h.total_elements = kHistoryElems[0] + kHistoryElems[1];
    h.total_bytes = h.total_elements * kElem;
    ASSERT_TRUE((*w)->Finish(h).ok());
  }

  // Applies the composition of `chain` to `base`; `end` gives the target
  // bits the composer needs for overwritten spans.
  Model Compose(const std::vector<std::string>& chain, Model base, Model end,
                size_t* chunks = nullptr) {
    auto c = ComposedDelta::Open(chain, kManifest, kHistorySpan);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return base;
    Bytes scratch;
    DecodedChunk d;
    size_t n = 0;
    for (size_t i = 0; i < (*c)->ids().size(); ++i) {
      ChunkId id = (*c)->ids()[i];
      Bytes out;
      ChunkSizes sizes;
      auto any = (*c)->Encode(i, kElem, end.Span(id), encoder_.get(),
                              decoder_.get(), &scratch, &out, &sizes);
      EXPECT_TRUE(any.ok()) << any.status().ToString();
      if (!any.ok() || !*any) continue;
      ++n;
      EXPECT_TRUE(decoder_->Decode(out, &d).ok());
      EXPECT_TRUE(ApplyChunk(d, base.Span(id)).ok());
    }
    if (chunks) *chunks = n;
    return base;
  }

  testing::TempDir dir_;
  DeltaHistory history_;
  std::unique_ptr<ChunkEncoder> encoder_;
  std::unique_ptr<ChunkDecoder> decoder_;
};

TEST_F(HistoryTest, ComposedChainTakesTheBaseToTheEndBitForBit) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3),
               v3 = v2.Step(0.03, 4);
  Record(v0, v1, 0, 1);
  Record(v1, v2, 1, 2);
  Record(v2, v3, 2, 3);
  auto chain = history_.Chain(V(0), V(3));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[0], history_.PathFor(V(1)));
  EXPECT_EQ((*chain)[2], history_.PathFor(V(3)));
  EXPECT_EQ(Compose(*chain, v0, v3).t, v3.t);
  // A shorter chain from a later version.
  auto from1 = history_.Chain(V(1), V(3));
  ASSERT_TRUE(from1.ok());
  EXPECT_EQ(from1->size(), 2u);
  EXPECT_EQ(Compose(*from1, v1, v3).t, v3.t);
}

TEST_F(HistoryTest, AnOverwriteInTheChainBecomesADenseOverwrite) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3);
  Record(v0, v1, 0, 1, ChunkId{0, 1});
  Record(v1, v2, 1, 2);
  auto chain = history_.Chain(V(0), V(2));
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(Compose(*chain, v0, v2).t, v2.t);
}

// A producers' refit records its spans as parts; catch-up composes them
// into one whole-span chunk per span, with the other deltas of the chain.
TEST_F(HistoryTest, PartsComposeIntoWholeSpans) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3);
  Record(v0, v1, 0, 1, std::nullopt, std::nullopt, /*parts=*/3);
  Record(v1, v2, 1, 2);
  auto chain = history_.Chain(V(0), V(2));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  auto c = ComposedDelta::Open(*chain, kManifest, kHistorySpan);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ((*c)->ids().size(), 4u);  // the spans, not the parts
  for (const ChunkId& id : (*c)->ids()) EXPECT_EQ(id.part, 0);
  EXPECT_EQ(Compose(*chain, v0, v2).t, v2.t);
  auto one = history_.Chain(V(0), V(1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Compose(*one, v0, v1).t, v1.t);
}

TEST_F(HistoryTest, MasksThatCancelSendNothing) {
  Model v0(1), v1 = v0.Step(0.03, 2);
  Record(v0, v1, 0, 1);
  Record(v1, v0, 1, 2);  // back to v0's bits
  auto chain = history_.Chain(V(0), V(2));
  ASSERT_TRUE(chain.ok());
  size_t chunks = 99;
  EXPECT_EQ(Compose(*chain, v0, v0, &chunks).t, v0.t);
  EXPECT_EQ(chunks, 0u);
}

TEST_F(HistoryTest, MissingLinksAndBadChainsAreRefused) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3);
  Record(v0, v1, 0, 1);
  Record(v1, v2, 1, 2);
  EXPECT_TRUE(history_.Chain(V(0), V(0)).status().IsInvalidArgument());
  auto none = history_.Chain(V(5), V(2));
  EXPECT_TRUE(none.status().IsNotFound());
  EXPECT_NE(none.status().message().find("step 5"), std::string::npos)
      << none.status().ToString();
  fs::remove(history_.PathFor(V(1)));
  EXPECT_TRUE(history_.Chain(V(0), V(2)).status().IsNotFound());
  // Out of order, another manifest, another span length.
  Record(v0, v1, 0, 1);
  std::vector<std::string> reversed = {history_.PathFor(V(2)),
                                       history_.PathFor(V(1))};
  EXPECT_TRUE(ComposedDelta::Open(reversed, kManifest, kHistorySpan)
                  .status()
                  .IsInvalidArgument());
  std::vector<std::string> ok = {history_.PathFor(V(1))};
  EXPECT_FALSE(ComposedDelta::Open(ok, Digest128{1, 2}, kHistorySpan).ok());
  EXPECT_FALSE(ComposedDelta::Open(ok, kManifest, kHistorySpan * 2).ok());
  EXPECT_FALSE(ComposedDelta::Open({}, kManifest, kHistorySpan).ok());
  // A damaged file is no link of a chain.
  std::ofstream(history_.PathFor(V(1)), std::ios::binary | std::ios::trunc)
      << "garbage";
  EXPECT_TRUE(history_.Chain(V(0), V(2)).status().IsNotFound());
}

// A file torn after its header, or misnamed, leaves the history for
// history/quarantine/ and is treated as absent; a stray file is left alone.
TEST_F(HistoryTest, UnreadableFilesAreQuarantinedAndTreatedAsAbsent) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3),
               v3 = v2.Step(0.03, 4);
  Record(v0, v1, 0, 1);
  Record(v1, v2, 1, 2);
  Record(v2, v3, 2, 3);
  const std::string torn = history_.PathFor(V(2));
  fs::resize_file(torn, kDeltaHeaderBytes + 5);
  std::ofstream(dir_.Path("history/README")) << "mine";
  auto chain = history_.Chain(V(0), V(3));
  EXPECT_TRUE(chain.status().IsNotFound()) << chain.status().ToString();
  EXPECT_FALSE(fs::exists(torn));
  const std::string moved =
      history_.QuarantineDir() + "/" + fs::path(torn).filename().string();
  EXPECT_TRUE(fs::exists(moved));
  EXPECT_TRUE(fs::exists(dir_.Path("history/README")));
  // The rest of the history still serves: v2 -> v3 reads whole.
  auto rest = history_.Chain(V(2), V(3));
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(Compose(*rest, v2, v3).t, v3.t);
  // Recording the lost link again mends the chain.
  Record(v1, v2, 1, 2);
  auto mended = history_.Chain(V(0), V(3));
  ASSERT_TRUE(mended.ok()) << mended.status().ToString();
  EXPECT_EQ(Compose(*mended, v0, v3).t, v3.t);
  // A file whose name is not its header's target is no index entry.
  fs::rename(history_.PathFor(V(1)), dir_.Path("history/000000000007-ab.dcr"));
  EXPECT_TRUE(history_.Chain(V(0), V(3)).status().IsNotFound());
  EXPECT_TRUE(fs::exists(history_.QuarantineDir() + "/000000000007-ab.dcr"));
  // A broken header is quarantined by Prune too.
  std::ofstream(history_.PathFor(V(9)), std::ios::binary) << "garbage";
  ASSERT_TRUE(history_.Prune().ok());
  EXPECT_FALSE(fs::exists(history_.PathFor(V(9))));
  EXPECT_TRUE(fs::exists(history_.QuarantineDir() + "/" +
                         fs::path(history_.PathFor(V(9))).filename().string()));
}

TEST_F(HistoryTest, PruneBoundsTheQuarantine) {
  fs::create_directories(history_.QuarantineDir());
  for (int i = 0; i < 12; ++i) {
    std::string p = history_.QuarantineDir() + "/" + std::to_string(i) + ".dcr";
    std::ofstream(p) << i;
    fs::last_write_time(
        p, fs::file_time_type::clock::now() - std::chrono::hours(12 - i));
  }
  ASSERT_TRUE(history_.Prune().ok());
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(history_.QuarantineDir())) {
    ++left;
    EXPECT_GE(std::stoi(e.path().stem().string()), 4) << e.path();
  }
  EXPECT_EQ(left, DeltaHistory::kQuarantineKept);
}

TEST_F(HistoryTest, PruneKeepsTheNewestAndDropsTemporaryFiles) {
  Model m(1);
  Model prev = m;
  for (uint64_t s = 1; s <= 6; ++s) {
    Model next = prev.Step(0.01, static_cast<uint32_t>(s));
    Record(prev, next, s - 1, s);
    prev = next;
  }
  std::ofstream(dir_.Path("history/000000000009-abc.dcr.tmp")) << "x";
  ASSERT_TRUE(history_.Prune().ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(history_.dir())) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  ASSERT_EQ(left.size(), 4u);
  EXPECT_EQ(fs::path(history_.PathFor(V(3))).filename(), left[0]);
  EXPECT_TRUE(history_.Chain(V(2), V(6)).ok());
  EXPECT_TRUE(history_.Chain(V(1), V(6)).status().IsNotFound());
  // keep = 0 records nothing.
  DeltaHistory none(dir_.Path("none"), 0);
  auto w = none.Record(V(1));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, nullptr);
}

// A refit's record is named by its refit while it runs (the target's digest
// is known only after the stream) and by its target once finished.
TEST_F(HistoryTest, ARecordingIsNamedByItsRefitThenByItsTarget) {
  Model v0(1), v1 = v0.Step(0.03, 2);
  RefitId refit;
  refit.bytes[3] = 0x5c;
  HistoryRecording r(history_, refit);
  ASSERT_TRUE(r.active());
  EXPECT_EQ(r.undo_path(), history_.TmpPathFor(refit));
  EXPECT_NE(r.undo_path().find(refit.ToHex()), std::string::npos);
  uint64_t changed = 0;
  for (uint32_t t = 0; t < kHistoryElems.size(); ++t) {
    for (uint32_t s = 0; s < SpanCount(kHistoryElems[t], kHistorySpan); ++s) {
      Bytes out;
      auto c = encoder_->EncodeDiff(ChunkKind::kXor, {t, s}, kElem,
                                    v0.Span({t, s}), v1.Span({t, s}), &out);
      ASSERT_TRUE(c.ok());
      if (!*c) continue;
      r.Append(out);
      ++changed;
    }
  }
  ASSERT_GT(changed, 0u);
  EXPECT_TRUE(fs::exists(history_.TmpPathFor(refit)));
  DeltaHeader h;
  h.base = V(0);
  h.target = V(1);
  h.manifest = kManifest;
  h.span_elems = kHistorySpan;
  h.tensor_count = kHistoryElems.size();
  h.total_elements = kHistoryElems[0] + kHistoryElems[1];
  h.total_bytes = h.total_elements * kElem;
  auto path = r.Finish(h);
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(*path, history_.PathFor(V(1)));
  EXPECT_FALSE(fs::exists(history_.TmpPathFor(refit)));
  auto chain = history_.Chain(V(0), V(1));
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(*chain, std::vector<std::string>{*path});
}

}  // namespace
}  // namespace dcr

namespace dcr {
namespace {

// A store a crash left in the middle of applying a -> b: every element
// holds a's bits or b's, chosen at random (a span may be partly applied).
Model Mix(const Model& a, const Model& b, uint32_t seed) {
  Model m = a;
  std::mt19937 rng(seed);
  for (size_t t = 0; t < m.t.size(); ++t) {
    for (size_t i = 0; i < m.t[t].size(); i += kElem) {
      if (rng() % 2) std::copy_n(&b.t[t][i], kElem, &m.t[t][i]);
    }
  }
  return m;
}

class RepairTest : public HistoryTest {
 protected:
  // Applies the repair overwrites of `files` (the union of their change
  // sets, with `end`'s bits) to `store`.
  Model Repair(const std::vector<std::string>& files, Model store, Model end) {
    auto c = ComposedDelta::Open(files, kManifest, kHistorySpan,
                                 ComposedDelta::Kind::kUnion);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return store;
    Bytes scratch;
    DecodedChunk d;
    for (size_t i = 0; i < (*c)->ids().size(); ++i) {
      ChunkId id = (*c)->ids()[i];
      Bytes out;
      auto any = (*c)->EncodeUnion(i, kElem, end.Span(id), encoder_.get(),
                                   decoder_.get(), &scratch, &out, nullptr);
      EXPECT_TRUE(any.ok()) << any.status().ToString();
      if (!any.ok() || !*any) continue;
      EXPECT_TRUE(decoder_->Decode(out, &d).ok());
      EXPECT_EQ(d.header.kind, ChunkKind::kOverwrite);
      EXPECT_TRUE(ApplyChunk(d, store.Span(id)).ok());
    }
    return store;
  }
  static StoreCondition Unfinished(uint8_t id, uint64_t base, uint64_t target) {
    StoreCondition c;
    c.unfinished = RefitId{};
    c.unfinished->bytes[0] = id;
    c.base = V(base);
    c.target = V(target);
    return c;
  }
};

TEST_F(RepairTest, ACommittedRefitsMixIsRepairedByTheChainFromItsBase) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3);
  Record(v0, v1, 0, 1);
  Record(v1, v2, 1, 2);
  // Died applying v0 -> v1 (which committed elsewhere); the tree is at v2.
  RepairPlan plan = PlanRepair(history_, Unfinished(1, 0, 1), V(2));
  ASSERT_EQ(plan.by, RepairPlan::By::kUnion) << plan.why;
  EXPECT_EQ(plan.files, *history_.Chain(V(0), V(2)));
  for (uint32_t seed : {5u, 6u, 7u}) {
    EXPECT_EQ(Repair(plan.files, Mix(v0, v1, seed), v2).t, v2.t) << seed;
  }
  // The tree still at v1: the refit's own delta.
  plan = PlanRepair(history_, Unfinished(1, 0, 1), V(1));
  ASSERT_EQ(plan.by, RepairPlan::By::kUnion) << plan.why;
  EXPECT_EQ(Repair(plan.files, Mix(v0, v1, 8), v1).t, v1.t);
}

TEST_F(RepairTest, AnAbortedRefitsMixNeedsItsKeptDelta) {
  Model v0(1), v1 = v0.Step(0.03, 2), v1b = v1.Step(0.03, 9);
  Record(v0, v1, 0, 1);
  // Refit 7 (v1 -> v1b, step 2) aborted: its delta is kept apart.
  RefitId seven;
  seven.bytes[0] = 7;
  Record(v1, v1b, 1, 2, std::nullopt, seven);
  ASSERT_TRUE(fs::exists(history_.AbortedPathFor(seven)));
  EXPECT_FALSE(history_.Chain(V(1), V(2)).ok());  // not in the chain
  StoreCondition c = Unfinished(7, 1, 2);
  // Without a later refit: back to v1, the tree's version.
  RepairPlan plan = PlanRepair(history_, c, V(1));
  ASSERT_EQ(plan.by, RepairPlan::By::kUnion) << plan.why;
  EXPECT_EQ(plan.files,
            std::vector<std::string>{history_.AbortedPathFor(seven)});
  EXPECT_EQ(Repair(plan.files, Mix(v1, v1b, 4), v1).t, v1.t);
  // After a crash of the host the record's base may be older (the last
  // version on disk): the chain from it and the kept delta.
  plan = PlanRepair(history_, Unfinished(7, 0, 2), V(1));
  ASSERT_EQ(plan.by, RepairPlan::By::kUnion) << plan.why;
  EXPECT_EQ(plan.files.size(), 2u);
  Model older = Mix(v0, Mix(v1, v1b, 5), 6);  // some pages still v0
  EXPECT_EQ(Repair(plan.files, older, v1).t, v1.t);
  // Another refit's id does not find it: dense.
  EXPECT_EQ(PlanRepair(history_, Unfinished(8, 1, 2), V(1)).by,
            RepairPlan::By::kDense);
}

// A relay that stopped before END named the target reports its refit's
// target with a zero digest; unless a commit decision names it, the refit
// is taken as aborted and its kept delta found by the refit's id.
TEST_F(RepairTest, AnUnknownTargetIsFoundByTheRefitsId) {
  Model v0(1), v1 = v0.Step(0.03, 2), v1b = v1.Step(0.03, 9);
  Record(v0, v1, 0, 1);
  RefitId seven;
  seven.bytes[0] = 7;
  Record(v1, v1b, 1, 2, std::nullopt, seven);
  StoreCondition c = Unfinished(7, 1, 2);
  c.target.digest = Digest128{};
  RepairPlan plan = PlanRepair(history_, c, V(1));
  ASSERT_EQ(plan.by, RepairPlan::By::kUnion) << plan.why;
  EXPECT_EQ(plan.files,
            std::vector<std::string>{history_.AbortedPathFor(seven)});
  EXPECT_EQ(Repair(plan.files, Mix(v1, v1b, 4), v1).t, v1.t);
  // Another step is not this refit's delta.
  c.target.step = 3;
  EXPECT_EQ(PlanRepair(history_, c, V(1)).by, RepairPlan::By::kDense);
  // Not aborted and no decision found (the caller fills in a decided
  // target): a dense copy, never a guess at the chain.
  StoreCondition committed = Unfinished(1, 0, 1);
  committed.target.digest = Digest128{};
  EXPECT_EQ(PlanRepair(history_, committed, V(1)).by, RepairPlan::By::kDense);
}

TEST_F(RepairTest, WithoutTheHistoryTheRepairIsDense) {
  Model v0(1), v1 = v0.Step(0.03, 2), v2 = v1.Step(0.03, 3);
  Record(v1, v2, 1, 2);  // v0 -> v1 pruned
  // The chain from the base is gone.
  RepairPlan plan = PlanRepair(history_, Unfinished(1, 0, 1), V(2));
  EXPECT_EQ(plan.by, RepairPlan::By::kDense);
  EXPECT_FALSE(plan.why.empty());
  // A refit from no version (a full refit seeding a store).
  StoreCondition seeded = Unfinished(1, 0, 1);
  seeded.base = Version{};
  EXPECT_EQ(PlanRepair(history_, seeded, V(2)).by, RepairPlan::By::kDense);
  // A missing store.
  StoreCondition missing;
  missing.missing = true;
  EXPECT_EQ(PlanRepair(history_, missing, V(2)).by, RepairPlan::By::kDense);
}

}  // namespace
}  // namespace dcr
