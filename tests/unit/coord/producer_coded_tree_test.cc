// Producers' refits whose chunks are not the parts as the ranks sent them,
// end to end (the fixture of producer_tree_fixture.h: two ranks' Producers
// through a ProducerHub, five real relays): spans coded in the context of
// root.baseline's bits (--context on), a tree that mixes subtrees with and
// without context, and two pipeline stages streaming side by side, whose
// STREAM_MARKs let each relay hash each tensor once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "unit/coord/producer_tree_fixture.h"

namespace dcr {
namespace {

using namespace producer_tree_testing;

// In a plan with the context flag (--context on), each span whose parts all
// came goes down as one whole-span chunk coded in the context of
// root.baseline's bits: the bytes a canonical root would send for the same
// step, whose payload is about 0.77x the parts' on an optimizer's steps.
class ProducerContextTreeTest : public ProducerMemoryTreeTest {
 protected:
  ProducerContextTreeTest() {
    adam_like_ = true;
    context_ = RefitOptions::ContextCoding::kOn;
    span_elems_ = 32768;
  }

  // What a canonical root's encoder sends for step `v`: each changed
  // span's chunk, EncodeDiffInContext.
  uint64_t CanonicalPayload(int v) const {
    auto enc = ChunkEncoder::Create(EncodeOptions());
    uint64_t bytes = 0;
    for (size_t ti = 0; ti < layout_.tensors.size(); ++ti) {
      const LayoutTensor& t = layout_.tensors[ti];
      const auto& a = canonical_[v - 1].at(t.name);
      const auto& b = canonical_[v].at(t.name);
      const size_t w = DTypeSize(t.dtype);
      const size_t span = span_elems_ * w;
      for (size_t at = 0; at < a.size(); at += span) {
        const size_t n = std::min(span, a.size() - at);
        std::vector<std::byte> out;
        auto r = (*enc)->EncodeDiffInContext(
            ChunkKind::kXor,
            ChunkId{static_cast<uint32_t>(ti),
                    static_cast<uint32_t>(at / span)},
            w, ExponentFieldOf(t.dtype), std::span(a).subspan(at, n),
            std::span(b).subspan(at, n), &out);
        EXPECT_TRUE(r.ok()) << r.status().ToString();
        bytes += out.size();
      }
    }
    return bytes;
  }
};

TEST_F(ProducerContextTreeTest, WholeSpansGoAsTheCanonicalRootCodesThem) {
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
  }
  std::vector<Result<ProducerDecision>> d;
  RefitReport one = Step(1, &d);
  ASSERT_EQ(one.outcome, RefitOutcome::kCommitted) << one.ToJson();
  EXPECT_EQ(one.chunks, ChangedSpans(1));
  EXPECT_GT(one.context_chunks, one.chunks / 2) << one.ToJson();
  EXPECT_EQ(one.payload_bytes, CanonicalPayload(1));
  uint64_t parts_bytes = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(d[r].ok()) << d[r].status().ToString();
    EXPECT_EQ(d[r]->outcome, ProducerOutcome::kCommitted) << d[r]->reason;
    parts_bytes += d[r]->payload_bytes;
  }
  EXPECT_LT(one.payload_bytes, parts_bytes);
  ExpectTreeAt(1);
  // b1 missed step 1 (its store is back at v0): the next refit catches it
  // up from the history, which holds the base-independent copies.
  relays_["b1"]->Stop();
  relays_.erase("b1");
  Seed("b1", 0);
  StartRelay("b1");
  RefitReport two = Step(2, &d);
  ASSERT_EQ(two.outcome, RefitOutcome::kCommitted) << two.ToJson();
  EXPECT_GT(two.context_chunks, 0u) << two.ToJson();
  EXPECT_EQ(two.payload_bytes, CanonicalPayload(2));
  ASSERT_EQ(two.catch_up.size(), 1u) << two.ToJson();
  EXPECT_EQ(two.catch_up[0].method, "history");
  EXPECT_EQ(two.catch_up[0].nodes, std::vector<std::string>{"b1"});
  ExpectTreeAt(2);
}

// A subtree that takes no context (a serving cluster's: here b0's and b1's,
// by TEST_plain_nodes) gets each context-coded chunk's base-independent
// copy at the same sequence number; every store ends at the target.
TEST_F(ProducerContextTreeTest, AMixedTreeSendsEachSubtreeItsEncoding) {
  plain_nodes_ = {"b0", "b1"};
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
  }
  std::vector<Result<ProducerDecision>> d;
  for (int v = 1; v <= 2; ++v) {
    RefitReport r = Step(v, &d);
    ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
    EXPECT_GT(r.context_chunks, 0u) << r.ToJson();
    EXPECT_EQ(r.payload_bytes, CanonicalPayload(v));
    EXPECT_GT(r.plain_payload_bytes, r.payload_bytes) << r.ToJson();
    EXPECT_THAT(r.context_nodes,
                ::testing::UnorderedElementsAre("a0", "a1", "a2"));
    ExpectTreeAt(v);
  }
}

// Two pipeline stages stream side by side, so the merged stream is not in
// manifest order: a chunk of stage 1 says nothing of stage 0's tensors.
// The coordinator's STREAM_MARKs tell the relays (every level of the tree)
// which tensors no chunk will write again, and each relay hashes each
// tensor about once for its vote: ahead where the marks allowed, the rest
// at the vote, never ahead and then again (bar an apply racing the hash).
class ProducerPipelineTreeTest : public ProducerMemoryTreeTest {
 protected:
  ProducerPipelineTreeTest() {
    layout_text_ = kPipelineLayout;
    span_elems_ = 1024;
  }
};

TEST_F(ProducerPipelineTreeTest, MarksLetEveryRelayHashEachTensorOnce) {
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
  }
  std::map<std::string, std::pair<uint64_t, uint64_t>> before;
  for (const auto& n : kRelays) {
    auto s = relays_[n]->Stats();
    before[n] = {s.tensors_hashed_ahead, s.tensors_hashed_at_vote};
  }
  std::vector<Result<ProducerDecision>> d;
  for (int v = 1; v <= 2; ++v) {
    RefitReport report = Step(v, &d);
    ASSERT_EQ(report.outcome, RefitOutcome::kCommitted) << report.ToJson();
    ExpectTreeAt(v);
  }
  const uint64_t tensors = layout_.tensors.size();
  for (const auto& n : kRelays) {
    auto s = relays_[n]->Stats();
    const uint64_t ahead = s.tensors_hashed_ahead - before[n].first;
    const uint64_t at_vote = s.tensors_hashed_at_vote - before[n].second;
    // Two refits: every tensor at least once each; hashed ahead, so the
    // marks reached this relay; twice at most for two tensors.
    EXPECT_GE(ahead + at_vote, 2 * tensors) << n;
    EXPECT_LE(ahead + at_vote, 2 * tensors + 2) << n;
    EXPECT_GT(ahead, 0u) << n;
  }
}

}  // namespace
}  // namespace dcr
