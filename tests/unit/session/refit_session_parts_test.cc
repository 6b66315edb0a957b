// A relay's session taking a producers' refit: the chunks of one span come
// as parts (ChunkId::part), each with its own elements. Parts apply in any
// order and concurrently, a repeated part is a duplicate, a part never
// applies over its span's whole-span overwrite, END counts parts, and
// Abort restores the base whatever mix of parts and overwrites applied.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "session/refit_session.h"
#include "testing/forwarding_store.h"
#include "unit/session/refit_session_fixture.h"

namespace dcr {
namespace {

using testing_relay::Bytes;
using testing_relay::RefitSessionTest;
using Outcome = RefitSession::ApplyOutcome;
using ::testing::HasSubstr;

class PartsSessionTest : public RefitSessionTest {
 protected:
  void SetUp() override {
    RefitSessionTest::SetUp();
    MakePartChunks(ChunkKind::kXor, 3, &xor_parts_);
    MakePartChunks(ChunkKind::kOverwrite, 3, &overwrite_parts_);
    ASSERT_GT(xor_parts_.size(), 2 * xor_chunks_.size());
  }
  // Applies `chunks` from one thread per part 1..parts, each in the
  // chunks' order (a producer's stream): how many were not applied.
  static int ApplyByPart(RefitSession* s, const std::vector<Bytes>& chunks,
                         uint16_t parts) {
    std::vector<std::thread> threads;
    std::atomic<int> dropped{0};
    for (uint16_t part = 1; part <= parts; ++part) {
      threads.emplace_back([&, part] {
        auto dec = std::move(*ChunkDecoder::Create());
        for (const auto& c : chunks) {
          if (PeekChunkHeader(c)->id.part != part) continue;
          auto r = s->Apply(c, dec.get());
          ASSERT_TRUE(r.ok());
          if (*r != Outcome::kApplied) ++dropped;
        }
      });
    }
    for (auto& t : threads) t.join();
    return dropped.load();
  }
  // A session of this refit on `store` (a wrapper of store_).
  std::unique_ptr<RefitSession> BeginOn(WeightStore* store) {
    NodeResult refusal;
    auto s = RefitSession::Begin(store, "n0", refit_, plan_, &refusal, {});
    EXPECT_TRUE(s) << refusal.detail;
    return s;
  }
  std::vector<Bytes> xor_parts_, overwrite_parts_;
};

TEST_F(PartsSessionTest, PartsApplyInAnyOrderAndVoteTheTarget) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (auto it = xor_parts_.rbegin(); it != xor_parts_.rend(); ++it) {
    ASSERT_EQ(*s->Apply(*it, decoder_.get()), Outcome::kApplied);
    // A part applied twice would revert its elements: dropped.
    ASSERT_EQ(*s->Apply(*it, decoder_.get()), Outcome::kDuplicate);
  }
  EXPECT_EQ(s->chunks_applied(), xor_parts_.size());
  NodeResult v = s->Vote(End(xor_parts_), nullptr);
  EXPECT_EQ(v.code, NodeCode::kOk) << v.detail;
  EXPECT_EQ(v.chunks_applied, xor_parts_.size());
  ASSERT_TRUE(s->Commit().ok());
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(PartsSessionTest, AMissingPartVotesIncomplete) {
  auto s = Begin();
  ASSERT_TRUE(s);
  for (size_t i = 1; i < xor_parts_.size(); ++i) {
    ASSERT_EQ(*s->Apply(xor_parts_[i], decoder_.get()), Outcome::kApplied);
  }
  EXPECT_EQ(s->Vote(End(xor_parts_), nullptr).code, NodeCode::kIncomplete);
  ASSERT_EQ(*s->Apply(xor_parts_[0], decoder_.get()), Outcome::kApplied);
  EXPECT_EQ(s->Vote(End(xor_parts_), nullptr).code, NodeCode::kOk);
}

TEST_F(PartsSessionTest, NoXorPartOverItsSpansOverwriteAndNoXorSpanOverAPart) {
  auto s = Begin();
  ASSERT_TRUE(s);
  // The first span's first part by XOR, then the whole span by overwrite
  // (a repair that resent the span): the span's other XOR parts would
  // apply over the target and are dropped; a part retried as an
  // overwrite still applies (it carries the target's bits).
  const ChunkId span0 = PeekChunkHeader(xor_chunks_[0])->id;
  ASSERT_EQ(PeekChunkHeader(xor_parts_[0])->id, (ChunkId{0, 0, 1}));
  ASSERT_EQ(*s->Apply(xor_parts_[0], decoder_.get()), Outcome::kApplied);
  // A whole-span XOR chunk overlaps the part already applied.
  EXPECT_EQ(*s->Apply(xor_chunks_[0], decoder_.get()), Outcome::kDuplicate);
  ASSERT_EQ(*s->Apply(overwrite_chunks_[0], decoder_.get()), Outcome::kApplied);
  for (const Bytes& c : xor_parts_) {
    if (!SameSpan(PeekChunkHeader(c)->id, span0)) continue;
    EXPECT_EQ(*s->Apply(c, decoder_.get()), Outcome::kDuplicate);
  }
  for (const Bytes& c : overwrite_parts_) {
    if (!SameSpan(PeekChunkHeader(c)->id, span0)) continue;
    EXPECT_EQ(*s->Apply(c, decoder_.get()), Outcome::kApplied);
  }
  // The span holds the target: everything else by parts.
  for (const Bytes& c : xor_parts_) {
    if (SameSpan(PeekChunkHeader(c)->id, span0)) continue;
    ASSERT_EQ(*s->Apply(c, decoder_.get()), Outcome::kApplied);
  }
  EXPECT_TRUE(StoreHolds(target_));
}

TEST_F(PartsSessionTest, AbortRestoresTheBaseAfterOverlappingParts) {
  auto s = Begin();
  ASSERT_TRUE(s);
  // Overlapping applications in both orders: a part, its span's whole
  // overwrite, then the part again as an overwrite; elsewhere a part's
  // overwrite before the XOR of another part.
  ASSERT_EQ(*s->Apply(xor_parts_[0], decoder_.get()), Outcome::kApplied);
  ASSERT_EQ(*s->Apply(overwrite_chunks_[0], decoder_.get()), Outcome::kApplied);
  ASSERT_EQ(*s->Apply(overwrite_parts_[0], decoder_.get()), Outcome::kApplied);
  ASSERT_EQ(*s->Apply(overwrite_parts_.back(), decoder_.get()),
            Outcome::kApplied);
  ASSERT_EQ(*s->Apply(xor_parts_[xor_parts_.size() - 2], decoder_.get()),
            Outcome::kApplied);
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
  EXPECT_FALSE(store_->InProgress().has_value());
}

// Overlapping overwrites undone in the order they wrote: the whole span
// first, then one of its parts. Undoing by chunk id (part 0 before part 1)
// would write the part's old values (the whole overwrite's target bits)
// back last.
TEST_F(PartsSessionTest, AbortUndoesAPartOverwriteBeforeItsSpansOverwrite) {
  auto s = Begin();
  ASSERT_TRUE(s);
  ASSERT_EQ(PeekChunkHeader(overwrite_parts_[0])->id, (ChunkId{0, 0, 1}));
  ASSERT_EQ(*s->Apply(overwrite_chunks_[0], decoder_.get()), Outcome::kApplied);
  ASSERT_EQ(*s->Apply(overwrite_parts_[0], decoder_.get()), Outcome::kApplied);
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
}

// A whole-span overwrite (a repair resending the span) that arrives while
// parts of its span are being applied waits for them instead of being
// dropped: the parts cover only their own elements.
TEST_F(PartsSessionTest, AWholeSpanOverwriteIsNeverDroppedForAPartInFlight) {
  for (int round = 0; round < 20; ++round) {
    auto s = Begin();
    ASSERT_TRUE(s);
    std::atomic<int> dropped{0};
    std::vector<std::thread> threads;
    for (uint16_t part = 1; part <= 3; ++part) {
      threads.emplace_back([&, part] {
        auto dec = std::move(*ChunkDecoder::Create());
        for (const auto& c : overwrite_parts_) {
          if (PeekChunkHeader(c)->id.part == part) {
            ASSERT_TRUE(s->Apply(c, dec.get()).ok());
          }
        }
      });
    }
    threads.emplace_back([&] {
      auto dec = std::move(*ChunkDecoder::Create());
      for (const auto& c : overwrite_chunks_) {
        auto r = s->Apply(c, dec.get());
        ASSERT_TRUE(r.ok());
        if (*r != Outcome::kApplied) ++dropped;
      }
    });
    for (auto& t : threads) t.join();
    EXPECT_EQ(dropped.load(), 0);
    EXPECT_TRUE(StoreHolds(target_));
    ASSERT_TRUE(s->Abort(decoder_.get()).ok());
    EXPECT_TRUE(StoreHolds(base_));
  }
}

TEST_F(PartsSessionTest, ConcurrentPartsOfOneSpanAllApply) {
  auto s = Begin();
  ASSERT_TRUE(s);
  // Three threads, each the parts of one producer, in the same span order:
  // parts of a span do not conflict, so none is dropped while another
  // part of its span is being applied.
  EXPECT_EQ(ApplyByPart(s.get(), xor_parts_, 3), 0);
  EXPECT_EQ(s->Vote(End(xor_parts_), nullptr).code, NodeCode::kOk);
  EXPECT_TRUE(StoreHolds(target_));
}

// A store whose ModifyTensor rewrites the range from a copy, slowly, and
// counts the calls in flight per range: what a file store on a disk
// filesystem does (MappedFile::Modify), with the window widened.
class SlowCopyStore final : public testing::ForwardingStore {
 public:
  explicit SlowCopyStore(WeightStore* inner)
      : ForwardingStore("slow-copy:", inner) {}
  Status ModifyTensor(
      size_t i, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
      const std::function<Status(std::span<std::byte>)>& fn) override {
    const std::pair<size_t, uint64_t> range{i, offset};
    int call = 0;
    {
      std::unique_lock lock(mu_);
      call = ++calls_;
      windows_.emplace_back(i, offset, from, to);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_[range]);
      company_.notify_all();
      if (call == 1 && wait_for_company_) {
        // The first call stays until a second one is in its range (or
        // 5 s pass): whether two may run at once does not hang on timing.
        company_.wait_for(lock, std::chrono::seconds(5),
                          [&] { return in_flight_[range] >= 2; });
      }
    }
    std::span<std::byte> t = MutableTensor(i).subspan(offset, size);
    std::vector<std::byte> copy(size);
    std::copy(t.begin() + from, t.begin() + to, copy.begin() + from);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    Status s = fn(copy);
    if (s.ok() && fail_write_back_at_ == call) {
      // A write-back that fails half way: the first half of the window
      // takes fn's bits, the rest keeps the old ones.
      const uint64_t half = from + (to - from) / 2;
      std::copy(copy.begin() + from, copy.begin() + half, t.begin() + from);
      s = Status::IOError("write-back failed half way");
    } else if (s.ok()) {
      std::copy(copy.begin() + from, copy.begin() + to, t.begin() + from);
    }
    std::lock_guard lock(mu_);
    --in_flight_[range];
    return s;
  }
  bool ModifiesByCopy(size_t, uint64_t) const override { return true; }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  // The windows ModifyTensor was given, by tensor and span offset.
  std::vector<std::tuple<size_t, uint64_t, uint64_t, uint64_t>> windows() {
    std::lock_guard lock(mu_);
    return windows_;
  }
  int max_in_flight() {
    std::lock_guard lock(mu_);
    return max_in_flight_;
  }

 private:
  std::mutex mu_;
  std::condition_variable company_;
  std::map<std::pair<size_t, uint64_t>, int> in_flight_;
  std::vector<std::tuple<size_t, uint64_t, uint64_t, uint64_t>> windows_;
  int max_in_flight_ = 0;
  int calls_ = 0;

 public:
  // The call (counting from 1) whose write-back fails half way; 0: none.
  int fail_write_back_at_ = 0;
  // The first call waits for a second in the same range (see above).
  bool wait_for_company_ = false;
};

// Parts that change most of their span's pages are applied by rewriting
// the span from a copy; two of one span at once would each write back the
// other's elements as they were. They are applied one after the other.
TEST_F(PartsSessionTest, PartsThatRewriteTheirSpanApplyOneAtATime) {
  SlowCopyStore slow(store_.get());
  auto s = BeginOn(&slow);
  ASSERT_TRUE(s);
  EXPECT_EQ(ApplyByPart(s.get(), xor_parts_, 3), 0);
  // Every part here changes its span's only page (1024 elements).
  EXPECT_EQ(slow.calls(), static_cast<int>(xor_parts_.size()));
  EXPECT_EQ(slow.max_in_flight(), 1);
  EXPECT_TRUE(StoreHolds(target_));
  EXPECT_EQ(s->Vote(End(xor_parts_), nullptr).code, NodeCode::kOk);
}

// A part of a span that holds one rank's rows: its footprint is its own
// pages, so parts of one span whose pages do not overlap apply at once,
// each from a copy of its window; Abort restores the base.
class BlockPartsSessionTest : public PartsSessionTest {
 protected:
  void SetUp() override {
    // 8-byte elements: a span of 1024 is two pages, each part one of them.
    infos_ = {{"w", DType::kF64, {3000}}};
    PartsSessionTest::SetUp();
    auto enc = std::move(*ChunkEncoder::Create(EncodeOptions()));
    const uint64_t n = infos_[0].NumElements();
    for (uint32_t s = 0; s < SpanCount(n, kSpan); ++s) {
      const uint64_t first = s * kSpan;
      const uint32_t len = static_cast<uint32_t>(std::min(kSpan, n - first));
      for (uint16_t p = 0; p * 512u < len; ++p) {
        std::vector<uint32_t> positions;
        Bytes values;
        for (uint32_t e = p * 512u; e < std::min(len, (p + 1) * 512u); ++e) {
          const std::byte* b = base_[0].data() + (first + e) * 8;
          const std::byte* g = target_[0].data() + (first + e) * 8;
          if (std::memcmp(b, g, 8) == 0) continue;
          positions.push_back(e);
          for (size_t k = 0; k < 8; ++k) values.push_back(b[k] ^ g[k]);
        }
        if (positions.empty()) continue;
        Bytes c;
        ASSERT_TRUE(enc->EncodeChanges(ChunkKind::kXor,
                                       ChunkId{0, s, uint16_t(p + 1)}, 8, len,
                                       positions, values, &c)
                        .ok());
        block_parts_.push_back(std::move(c));
      }
    }
    ASSERT_GE(block_parts_.size(), 5u);
  }
  std::vector<Bytes> block_parts_;
};

TEST_F(BlockPartsSessionTest, PartsOfDisjointPagesApplyAtOnceFromTheirWindows) {
  SlowCopyStore slow(store_.get());
  slow.wait_for_company_ = true;
  auto s = BeginOn(&slow);
  ASSERT_TRUE(s);
  EXPECT_EQ(ApplyByPart(s.get(), block_parts_, 2), 0);
  EXPECT_EQ(slow.calls(), static_cast<int>(block_parts_.size()));
  // Each part's window is its own page of the span (the last span, 952
  // elements, ends inside its second page).
  for (const auto& [tensor, offset, from, to] : slow.windows()) {
    const uint64_t span_bytes =
        std::min<uint64_t>(8 * kSpan, 8 * 3000 - offset);
    EXPECT_TRUE((from == 0 && to == 4096) ||
                (from == 4096 && to == std::min<uint64_t>(8192, span_bytes)))
        << offset << ": [" << from << ", " << to << ")";
  }
  // Disjoint windows of one span are not made to wait for each other.
  EXPECT_EQ(slow.max_in_flight(), 2);
  EXPECT_TRUE(StoreHolds(target_));
  EXPECT_EQ(s->Vote(End(block_parts_), nullptr).code, NodeCode::kOk);
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
}

// A write-back that fails half way leaves part of the chunk's changes in
// the store: Abort still restores the base, and the chunk, resent as XOR,
// is not applied over them.
TEST_F(BlockPartsSessionTest, AWriteBackThatFailsHalfWayIsUndoneByAbort) {
  SlowCopyStore slow(store_.get());
  slow.fail_write_back_at_ = 2;
  auto s = BeginOn(&slow);
  ASSERT_TRUE(s);
  ASSERT_EQ(*s->Apply(block_parts_[0], decoder_.get()), Outcome::kApplied);
  auto failed = s->Apply(block_parts_[1], decoder_.get());
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().ToString(), HasSubstr("half way"));
  EXPECT_FALSE(StoreHolds(base_));
  EXPECT_EQ(*s->Apply(block_parts_[1], decoder_.get()), Outcome::kDuplicate);
  EXPECT_EQ(s->chunks_applied(), 1u);
  ASSERT_TRUE(s->Abort(decoder_.get()).ok());
  EXPECT_TRUE(StoreHolds(base_));
}

// FootprintOf: the pages from a chunk's first change to its last, and
// whether it changes at least half of them.
TEST(FootprintTest, ThePagesFromTheFirstChangeToTheLast) {
  auto footprint = [](ChunkEncoding encoding, uint8_t w, uint32_t span,
                      std::vector<uint32_t> positions, uint32_t changed = 0) {
    DecodedChunk c;
    c.header.encoding = encoding;
    c.header.elem_size = w;
    c.header.span_elems = span;
    c.header.changed =
        changed != 0 ? changed : static_cast<uint32_t>(positions.size());
    c.positions = std::move(positions);
    return RefitSession::FootprintOf(c.header, c);
  };
  using F = RefitSession::Footprint;
  auto eq = [](const F& a, const F& b) {
    return a.by_copy == b.by_copy && a.from == b.from && a.to == b.to;
  };
  constexpr uint32_t kMi = 1u << 20;  // a BF16 span of 2 MiB: 512 pages
  // Dense and context-coded chunks: the whole span.
  EXPECT_TRUE(
      eq(footprint(ChunkEncoding::kDense, 2, kMi, {}), F{true, 0, 2 * kMi}));
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kContext, 2, kMi, {}, 512),
                 F{true, 0, 2 * kMi}));
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kContext, 2, kMi, {}, 511),
                 F{false, 0, 2 * kMi}));
  // A change every 1000 elements: every page of the span.
  std::vector<uint32_t> spread;
  for (uint32_t p = 3; p < kMi; p += 1000) spread.push_back(p);
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, spread),
                 F{true, 0, 2 * kMi}));
  // One rank's rows: pages 10 to 19.
  std::vector<uint32_t> rows;
  for (uint32_t p = 10 * 2048 + 7; p < 20 * 2048; p += 100) rows.push_back(p);
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, rows),
                 F{true, 10 * 4096, 20 * 4096}));
  // One change: its page.
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, {5000}),
                 F{true, 2 * 4096, 3 * 4096}));
  // Two changes 100 pages apart: through the mapping.
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, {0, 100 * 2048}),
                 F{false, 0, 101 * 4096}));
  // The threshold: half the pages of the footprint, or more.
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, {0, 3 * 2048}),
                 F{true, 0, 4 * 4096}));
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 2, kMi, {0, 4 * 2048}),
                 F{false, 0, 5 * 4096}));
  // 8-byte elements: 512 to a page.
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 8, 4096, {0, 511, 512}),
                 F{true, 0, 8192}));
  // 1-byte elements, a span ending inside its last page.
  EXPECT_TRUE(eq(footprint(ChunkEncoding::kSparse, 1, 10000, {9000, 9999}),
                 F{true, 8192, 10000}));
  // No change: nothing by copy.
  EXPECT_FALSE(footprint(ChunkEncoding::kSparse, 2, kMi, {}).by_copy);
}

}  // namespace
}  // namespace dcr
