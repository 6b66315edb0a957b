// The parts of one span that several producers send (coord/part_groups.h):
// held until no rank holding elements of the span can send another, then
// released together and composed into one whole-span chunk; a span that
// one rank holds goes alone without waiting for the others; a rank's
// chunks must ascend and lie where it holds elements; past the cap, held
// spans go out part by part, and so do their later parts.
#include "coord/part_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "dcr/codec.h"
#include "dcr/layout.h"
#include "dcr/shard_delta.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

// Two tensor-parallel ranks, spans of 64 elements. Tensor 0 (a column
// split, 16 rows of 8) gives rank 0 rows 0-7 (span 0 only; span 1 holds
// rank 1 alone); tensor 1 (a row split, 8 rows of 16) interleaves both
// ranks in every span; tensor 2 (replicated) is rank 0's.
constexpr const char* kLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: a
    shard: a
    split: column
    shape: [16, 8]
  - name: b
    shard: b
    split: row
    shape: [8, 16]
  - name: c
    shard: c
    split: replicated
    shape: [8]
)";
constexpr uint64_t kSpan = 64;

Layout TestLayout() {
  auto l = ParseLayout(kLayout, "groups.yaml");
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *std::move(l) : Layout();
}

// A stand-in for a rank's chunk of `bytes` bytes (PartGroups reads only
// its rank and size).
ProducerChunk Chunk(uint32_t rank, size_t bytes = 10) {
  auto buffer = std::make_shared<std::vector<std::byte>>(bytes);
  return ProducerChunk{rank, buffer, std::span<const std::byte>(*buffer)};
}

ChunkId Part(uint32_t tensor, uint32_t span, uint32_t rank) {
  return ChunkId{tensor, span, PartOf(rank)};
}

// The released groups as (id, ranks).
std::vector<std::pair<ChunkId, std::vector<uint32_t>>> Ids(
    const std::vector<PartGroups::Group>& groups) {
  std::vector<std::pair<ChunkId, std::vector<uint32_t>>> out;
  for (const auto& g : groups) {
    std::vector<uint32_t> ranks;
    for (const auto& c : g.parts) ranks.push_back(c.rank);
    out.emplace_back(g.id, ranks);
  }
  return out;
}

using Released = std::vector<std::pair<ChunkId, std::vector<uint32_t>>>;

TEST(PartGroupsTest, ASharedSpanWaitsForEveryRankThatHoldsIt) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  std::vector<PartGroups::Group> out;
  // Rank 0's part of tensor 1 span 0: rank 1 holds elements there too.
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 0, 0)).ok());
  g.Take(&out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(g.held_bytes(), 10u);
  // Rank 1 sends its part: both are in, released as one group (part 0),
  // parts in rank order.
  ASSERT_TRUE(g.Add(Chunk(1), Part(1, 0, 1)).ok());
  g.Take(&out);
  EXPECT_EQ(Ids(out), (Released{{ChunkId{1, 0, 0}, {0, 1}}}));
  EXPECT_TRUE(out[0].whole);
  EXPECT_EQ(g.held_bytes(), 0u);
  EXPECT_EQ(g.grouped_spans(), 1u);
  EXPECT_EQ(g.grouped_parts(), 2u);
}

TEST(PartGroupsTest, ARankThatMovedPastASpanIsNotWaitedFor) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  std::vector<PartGroups::Group> out;
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 0, 0)).ok());
  // Rank 1 changed nothing in tensor 1 span 0: its next chunk is later.
  ASSERT_TRUE(g.Add(Chunk(1), Part(1, 1, 1)).ok());
  g.Take(&out);
  // Span 0 goes as rank 0's part alone (its own id); span 1 waits for
  // rank 0.
  EXPECT_EQ(Ids(out), (Released{{Part(1, 0, 0), {0}}}));
  // It holds every change of the span: it may go as the whole span.
  EXPECT_TRUE(out[0].whole);
  out.clear();
  g.Ended(0);
  g.Take(&out);
  EXPECT_EQ(Ids(out), (Released{{Part(1, 1, 1), {1}}}));
  EXPECT_EQ(g.grouped_spans(), 0u);
}

TEST(PartGroupsTest, ASpanOneRankHoldsGoesWithoutWaiting) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  std::vector<PartGroups::Group> out;
  // Tensor 0 span 1 is rank 1's alone, tensor 2 rank 0's alone.
  ASSERT_TRUE(g.Add(Chunk(1), Part(0, 1, 1)).ok());
  ASSERT_TRUE(g.Add(Chunk(0), Part(2, 0, 0)).ok());
  g.Take(&out);
  EXPECT_EQ(Ids(out), (Released{{Part(0, 1, 1), {1}}, {Part(2, 0, 0), {0}}}));
}

// The lowest tensor an item may still come of (what a STREAM_MARK names):
// a rank that sent nothing yet may still send its first tensor's parts, a
// rank that sent a chunk may send more of that chunk's tensor, a held span
// is not out, and an ended rank sends nothing.
TEST(PartGroupsTest, LowestOpenIsTheLowestTensorAnItemMayStillComeOf) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  std::vector<PartGroups::Group> out;
  EXPECT_EQ(g.LowestOpen(), 0u);
  // Rank 1 moved on to tensor 1, rank 0 has sent nothing (it holds
  // tensor 0).
  ASSERT_TRUE(g.Add(Chunk(1), Part(1, 0, 1)).ok());
  g.Take(&out);
  EXPECT_EQ(g.LowestOpen(), 0u);
  // Rank 0 is at tensor 1 too; span (1, 0) is held for it still.
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 1, 0)).ok());
  g.Take(&out);
  EXPECT_EQ(g.LowestOpen(), 1u);
  // Rank 0 moves to tensor 2; rank 1 is still at tensor 1.
  ASSERT_TRUE(g.Add(Chunk(0), Part(2, 0, 0)).ok());
  g.Take(&out);
  EXPECT_EQ(g.LowestOpen(), 1u);
  // Rank 1 ends: both held spans of tensor 1 go out; rank 0 may still
  // send more of tensor 2.
  g.Ended(1);
  g.Take(&out);
  EXPECT_EQ(g.LowestOpen(), 2u);
  g.Ended(0);
  g.Take(&out);
  EXPECT_EQ(g.LowestOpen(), 3u);  // the layout's tensor count: none left
}

TEST(PartGroupsTest, FlushReleasesEverythingHeld) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  std::vector<PartGroups::Group> out;
  // Both spans wait for rank 1, which sent nothing yet.
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 0, 0)).ok());
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 1, 0)).ok());
  g.Take(&out);
  EXPECT_TRUE(out.empty());
  g.Flush(&out);
  EXPECT_EQ(Ids(out), (Released{{Part(1, 0, 0), {0}}, {Part(1, 1, 0), {0}}}));
  EXPECT_TRUE(out[0].whole && out[1].whole);  // every rank ended
  EXPECT_EQ(g.held_bytes(), 0u);
}

TEST(PartGroupsTest, ARanksChunksMustAscend) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  ASSERT_TRUE(g.Add(Chunk(0), Part(1, 1, 0)).ok());
  Status s = g.Add(Chunk(0), Part(1, 0, 0));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr("rank 0"));
  EXPECT_THAT(s.ToString(), HasSubstr("ascend"));
  // The same span again (a chunk sent twice) is refused the same way.
  s = g.Add(Chunk(0), Part(1, 1, 0));
  EXPECT_THAT(s.ToString(), HasSubstr("ascend"));
}

TEST(PartGroupsTest, AChunkWhereTheRankHoldsNothingIsRefused) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, 1 << 20);
  for (const ChunkId& id : {Part(0, 1, 0), Part(2, 0, 1), Part(7, 0, 1)}) {
    const uint32_t rank = id.part - 1;
    Status s = g.Add(Chunk(rank), id);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr("do not reach"));
  }
}

// Random streams of three ranks against the rule itself: after every Take,
// no span still held is complete (nothing waits longer than it must; Take
// looks only at the spans an Add or Ended may have completed), each span
// released was complete, with every part it had, and every part comes out
// exactly once.
TEST(PartGroupsTest, RandomStreamsReleaseEachSpanOnceAsSoonAsItIsComplete) {
  auto parsed = ParseLayout(R"(version: 1
parallel: {tp: 3}
tensors:
  - name: a
    shard: a
    split: column
    shape: [48, 8]
  - name: b
    shard: b
    split: row
    shape: [8, 48]
  - name: c
    shard: c
    split: replicated
    shape: [100]
  - name: d
    shard: d
    split: row
    shape: [6, 96]
)",
                            "random.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Layout& layout = *parsed;
  using Key = std::pair<uint32_t, uint32_t>;
  struct Reach {
    uint32_t rank;
    uint64_t first, last;
  };
  std::map<uint32_t, std::vector<Reach>> reach;
  std::vector<std::vector<Key>> can(3);  // spans each rank may send
  for (uint32_t t = 0; t < layout.tensors.size(); ++t) {
    for (const AffinePiece& p : layout.tensors[t].pieces) {
      const PieceMap m(p, layout.tensors[t].shape);
      reach[t].push_back({p.rank, m.first() / kSpan, m.last() / kSpan});
      for (uint64_t s = m.first() / kSpan; s <= m.last() / kSpan; ++s) {
        can[p.rank].push_back({t, static_cast<uint32_t>(s)});
      }
    }
  }
  std::mt19937 rng(17);
  for (int round = 0; round < 300; ++round) {
    PartGroups g(layout, kSpan, 1 << 30);
    std::vector<std::vector<Key>> stream(3);
    for (uint32_t r = 0; r < 3; ++r) {
      for (const Key& k : can[r]) {
        if (rng() % 3 != 0) stream[r].push_back(k);
      }
      std::sort(stream[r].begin(), stream[r].end());
      stream[r].erase(std::unique(stream[r].begin(), stream[r].end()),
                      stream[r].end());
    }
    std::map<Key, std::set<uint32_t>> received;
    std::set<Key> released;
    std::map<uint32_t, Key> last;
    std::set<uint32_t> ended;
    size_t next[3] = {0, 0, 0}, parts_in = 0, parts_out = 0;
    // What a STREAM_MARK would name after each take: never goes back, and
    // no later item is of a tensor below it.
    uint32_t mark = 0;
    auto complete = [&](const Key& k) {
      for (const Reach& r : reach[k.first]) {
        if (k.second < r.first || k.second > r.last) continue;
        if (ended.contains(r.rank) || received[k].contains(r.rank)) continue;
        if (last.contains(r.rank) && k < last[r.rank]) continue;
        return false;
      }
      return true;
    };
    auto take = [&] {
      std::vector<PartGroups::Group> out;
      g.Take(&out);
      for (const PartGroups::Group& grp : out) {
        const Key k{grp.id.tensor, grp.id.span};
        ASSERT_GE(k.first, mark) << "round " << round << ": an item below "
                                 << "the last mark";
        ASSERT_TRUE(released.insert(k).second) << "released twice";
        ASSERT_TRUE(complete(k)) << k.first << "/" << k.second;
        std::set<uint32_t> ranks;
        for (const ProducerChunk& c : grp.parts) ranks.insert(c.rank);
        EXPECT_EQ(ranks, received[k]);
        parts_out += grp.parts.size();
      }
      for (const auto& [k, ranks] : received) {
        if (!released.contains(k)) {
          ASSERT_FALSE(complete(k))
              << "round " << round << ": " << k.first << "/" << k.second
              << " is complete and still held";
        }
      }
      const uint32_t now = g.LowestOpen();
      ASSERT_GE(now, mark) << "round " << round << ": the mark went back";
      mark = now;
    };
    while (ended.size() < 3) {
      const uint32_t r = rng() % 3;
      if (ended.contains(r)) continue;
      if (next[r] == stream[r].size()) {
        g.Ended(r);
        ended.insert(r);
      } else {
        const Key k = stream[r][next[r]++];
        ASSERT_TRUE(g.Add(Chunk(r), Part(k.first, k.second, r)).ok());
        received[k].insert(r);
        last[r] = k;
        ++parts_in;
      }
      if (rng() % 3 == 0) {
        ASSERT_NO_FATAL_FAILURE(take());
      }
    }
    ASSERT_NO_FATAL_FAILURE(take());
    EXPECT_EQ(mark, layout.tensors.size()) << "round " << round;
    EXPECT_EQ(parts_out, parts_in) << "round " << round;
    EXPECT_EQ(released.size(), received.size()) << "round " << round;
  }
}

TEST(PartGroupsTest, PastTheCapHeldSpansGoPartByPartAndStaySo) {
  const Layout layout = TestLayout();
  PartGroups g(layout, kSpan, /*cap_bytes=*/15);
  std::vector<PartGroups::Group> out;
  // Both of rank 0's parts wait for rank 1.
  ASSERT_TRUE(g.Add(Chunk(0, 10), Part(1, 0, 0)).ok());
  g.Take(&out);
  EXPECT_TRUE(out.empty());  // 10 bytes held
  ASSERT_TRUE(g.Add(Chunk(0, 10), Part(1, 1, 0)).ok());
  g.Take(&out);
  // 20 bytes held: the lowest span goes, its part alone: not the whole
  // span's changes.
  EXPECT_EQ(Ids(out), (Released{{Part(1, 0, 0), {0}}}));
  EXPECT_FALSE(out[0].whole);
  EXPECT_EQ(g.held_bytes(), 10u);
  out.clear();
  // Rank 1's part of that span follows alone: a whole-span chunk must not
  // follow a part of its span. Span 1 is whole now and goes as a group.
  ASSERT_TRUE(g.Add(Chunk(1, 10), Part(1, 0, 1)).ok());
  ASSERT_TRUE(g.Add(Chunk(1, 10), Part(1, 1, 1)).ok());
  g.Take(&out);
  EXPECT_EQ(Ids(out),
            (Released{{Part(1, 0, 1), {1}}, {ChunkId{1, 1, 0}, {0, 1}}}));
  EXPECT_FALSE(out[0].whole);
  EXPECT_TRUE(out[1].whole);
}

// Parts coded as producers code them, for ComposeParts.
class ComposeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = ChunkEncoder::Create(EncodeOptions());
    ASSERT_TRUE(e.ok());
    encoder_ = *std::move(e);
    auto d = ChunkDecoder::Create();
    ASSERT_TRUE(d.ok());
    decoder_ = *std::move(d);
  }
  // Rank `rank`'s part of tensor 3 span 5: 2-byte XOR masks at `positions`.
  std::vector<std::byte> PartOfRank(uint32_t rank,
                                    const std::vector<uint32_t>& positions,
                                    uint32_t span_elems = 4096) {
    std::vector<std::byte> values(positions.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = std::byte((i * 7 + rank * 13 + 1) | 1);
    }
    std::vector<std::byte> out;
    EXPECT_TRUE(encoder_
                    ->EncodeChanges(ChunkKind::kXor,
                                    ChunkId{3, 5, PartOf(rank)}, 2, span_elems,
                                    positions, values, &out)
                    .ok());
    return out;
  }
  std::unique_ptr<ChunkEncoder> encoder_;
  std::unique_ptr<ChunkDecoder> decoder_;
};

TEST_F(ComposeTest, TheComposedChunkAppliesAsTheParts) {
  std::mt19937 rng(3);
  // Three ranks whose elements interleave in runs of 16.
  std::vector<std::vector<uint32_t>> pos(3);
  for (uint32_t p = 0; p < 4096; ++p) {
    if (rng() % 20 == 0) pos[(p / 16) % 3].push_back(p);
  }
  std::vector<std::vector<std::byte>> parts;
  for (uint32_t r = 0; r < 3; ++r) parts.push_back(PartOfRank(r, pos[r]));
  std::vector<std::span<const std::byte>> views(parts.begin(), parts.end());
  std::vector<std::byte> composed;
  ChunkSizes sizes;
  ASSERT_TRUE(ComposeParts(ChunkId{3, 5, 0}, views, decoder_.get(),
                           encoder_.get(), &composed, &sizes)
                  .ok());
  // The span applied part by part, and with the one chunk.
  std::vector<std::byte> by_parts(4096 * 2), by_one(4096 * 2);
  for (size_t i = 0; i < by_parts.size(); ++i) {
    by_parts[i] = by_one[i] = std::byte(rng());
  }
  DecodedChunk c;
  for (const auto& p : parts) {
    ASSERT_TRUE(decoder_->Decode(p, &c).ok());
    ASSERT_TRUE(ApplyChunk(c, by_parts).ok());
  }
  ASSERT_TRUE(decoder_->Decode(composed, &c).ok());
  EXPECT_EQ(c.header.id, (ChunkId{3, 5, 0}));
  EXPECT_EQ(c.header.kind, ChunkKind::kXor);
  EXPECT_EQ(c.positions.size(), pos[0].size() + pos[1].size() + pos[2].size());
  EXPECT_EQ(sizes.changed, c.positions.size());
  ASSERT_TRUE(ApplyChunk(c, by_one).ok());
  EXPECT_TRUE(by_parts == by_one);
}

// Any number of parts, in runs of any length (one element: a strided
// split), ranks without a part (they changed nothing there): the composed
// chunk holds exactly the union of the positions, each with its own part's
// mask.
TEST_F(ComposeTest, RandomInterleavingsComposeToTheUnion) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    const uint32_t ranks = 1 + rng() % 8;
    const uint32_t run = 1 + rng() % 64;
    const uint32_t density = 1 + rng() % 40;
    std::vector<std::vector<uint32_t>> pos(ranks);
    std::map<uint32_t, uint32_t> owner;
    for (uint32_t p = 0; p < 4096; ++p) {
      if (rng() % density != 0) continue;
      const uint32_t r = (p / run) % ranks;
      pos[r].push_back(p);
      owner[p] = r;
    }
    std::vector<std::vector<std::byte>> parts;
    std::map<uint32_t, std::pair<std::byte, std::byte>> mask;
    for (uint32_t r = 0; r < ranks; ++r) {
      if (pos[r].empty()) continue;
      parts.push_back(PartOfRank(r, pos[r]));
      DecodedChunk c;
      ASSERT_TRUE(decoder_->Decode(parts.back(), &c).ok());
      for (size_t i = 0; i < c.positions.size(); ++i) {
        mask[c.positions[i]] = {c.values[2 * i], c.values[2 * i + 1]};
      }
    }
    if (parts.empty()) continue;
    std::vector<std::span<const std::byte>> views(parts.begin(), parts.end());
    std::vector<std::byte> composed;
    ASSERT_TRUE(ComposeParts(ChunkId{3, 5, 0}, views, decoder_.get(),
                             encoder_.get(), &composed, nullptr)
                    .ok())
        << round;
    DecodedChunk c;
    ASSERT_TRUE(decoder_->Decode(composed, &c).ok());
    ASSERT_EQ(c.positions.size(), owner.size()) << round;
    size_t i = 0;
    for (const auto& [p, r] : owner) {
      ASSERT_EQ(c.positions[i], p) << round;
      EXPECT_EQ(c.values[2 * i], mask[p].first) << round << " at " << p;
      EXPECT_EQ(c.values[2 * i + 1], mask[p].second) << round << " at " << p;
      ++i;
    }
  }
}

TEST_F(ComposeTest, PartsThatShareAnElementOrDisagreeAreRefused) {
  const auto a = PartOfRank(0, {1, 5, 9});
  const auto b = PartOfRank(1, {2, 5});
  std::vector<std::span<const std::byte>> views{a, b};
  std::vector<std::byte> out;
  Status s = ComposeParts(ChunkId{3, 5, 0}, views, decoder_.get(),
                          encoder_.get(), &out, nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr("change element 5"));
  // Shared where one part's run ends, and at the very last element.
  const auto e = PartOfRank(2, {3, 4, 9});
  views = {a, e};
  s = ComposeParts(ChunkId{3, 5, 0}, views, decoder_.get(), encoder_.get(),
                   &out, nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr("change element 9"));
  // Another span length, and another span.
  const auto c = PartOfRank(1, {2}, /*span_elems=*/2048);
  views = {a, c};
  s = ComposeParts(ChunkId{3, 5, 0}, views, decoder_.get(), encoder_.get(),
                   &out, nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  views = {a};
  s = ComposeParts(ChunkId{3, 6, 0}, views, decoder_.get(), encoder_.get(),
                   &out, nullptr);
  EXPECT_THAT(s.ToString(), HasSubstr("cannot join"));
}

}  // namespace
}  // namespace dcr
