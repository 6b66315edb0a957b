// Producers whose shards live in a ShardMemory (the GPU's path, issue 20),
// refitting a running tree end to end: two ranks' Producers with the host
// stand-in of a GPU memory (HostShardMemory) stream through a ProducerHub
// on 127.0.0.1 to RunRefit, which feeds five real relays over the fake
// transport. It checks what only the whole path shows: the parts and digest
// parts a memory's changes give commit every store and root.baseline at the
// gathered target's bits; a rank restarted without its baseline gets the
// tree's into its memory (SetBaselineFromHost) and refits from it; and a
// shard written during the diff aborts the step in every store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "unit/coord/producer_tree_fixture.h"

namespace dcr {
namespace {

using namespace producer_tree_testing;
using ::testing::HasSubstr;

TEST_F(ProducerMemoryTreeTest, MemoriesChangesCommitEveryStore) {
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
    // Setting the baseline read each shard back once, to hash it.
    EXPECT_EQ(m[r]->calls().reads, static_cast<int>(shards_[0][r].size()));
    m[r]->calls().reads = 0;
  }
  std::vector<Result<ProducerDecision>> d;
  for (int v = 1; v <= 2; ++v) {
    RefitReport report = Step(v, &d);
    EXPECT_EQ(report.outcome, RefitOutcome::kCommitted) << "v" << v;
    EXPECT_EQ(report.producers, 2u);
    // The parts of a span both ranks change went down as one chunk: the
    // tree got one per changed span, as from a canonical checkpoint.
    EXPECT_EQ(report.chunks, ChangedSpans(v)) << "v" << v;
    uint64_t parts = 0;
    for (uint32_t r = 0; r < 2; ++r) {
      parts += d[r].ok() ? d[r]->chunks : 0;
    }
    EXPECT_GT(parts, report.chunks) << "v" << v;
    for (uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(d[r].ok()) << d[r].status().ToString();
      EXPECT_EQ(d[r]->outcome, ProducerOutcome::kCommitted) << d[r]->reason;
      EXPECT_FALSE(d[r]->baseline_dropped);
      EXPECT_GT(d[r]->changed_elements, 0u);
      // The changes came from the memory, one FindChanges per shard and
      // step, and the commit advanced it in place.
      for (const auto& [name, bytes] : shards_[v][r]) {
        EXPECT_EQ(m[r]->calls().find_changes[name], v) << name;
      }
      EXPECT_EQ(m[r]->calls().advances, v);
      EXPECT_EQ(m[r]->calls().set_baselines, 1);  // the caller's, once
      EXPECT_EQ(m[r]->calls().baselines_from_host, 0);
      EXPECT_EQ(m[r]->calls().reads, 0);  // nothing read back at a step
      ExpectMemoryAt(m[r], r, v);
      m[r]->calls().reads = 0;  // (the check's own)
    }
    ExpectTreeAt(v);
  }
}

// Past the coordinator's bound on held parts (one byte here: every part is
// over it), the parts of a span both ranks change go down the tree one by
// one, each applied on its own at every store, and later parts of such a
// span follow alone rather than as a whole-span chunk after them: every
// store still ends at the target's bits, step after step. (A span's parts
// still go as one chunk when both arrive in one fetch of the coordinator:
// rank 1 is slowed so that, in practice, rank 0's parts come first and
// wait; the test asks that in at least one of the three steps.)
TEST_F(ProducerMemoryTreeTest, PartsPastTheHeldBoundApplyOneByOneEverywhere) {
  held_parts_bytes_ = 1;
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
  }
  // Rank 1 diffs slowly: rank 0's parts of the spans they share wait at
  // the coordinator, over the bound, rather than arriving with rank 1's.
  m[1]->set_after_find(
      [](std::string_view) { std::this_thread::sleep_for(50ms); });
  std::vector<Result<ProducerDecision>> d;
  int apart = 0;  // steps where parts of a shared span went one by one
  for (int v = 1; v <= 3; ++v) {
    RefitReport report = Step(v, &d);
    EXPECT_EQ(report.outcome, RefitOutcome::kCommitted) << "v" << v;
    uint64_t parts = 0;
    for (uint32_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(d[r].ok()) << d[r].status().ToString();
      EXPECT_EQ(d[r]->outcome, ProducerOutcome::kCommitted) << d[r]->reason;
      parts += d[r]->chunks;
    }
    EXPECT_GE(report.chunks, ChangedSpans(v)) << "v" << v;
    EXPECT_LE(report.chunks, parts) << "v" << v;
    apart += report.chunks > ChangedSpans(v) ? 1 : 0;
    ExpectTreeAt(v);
  }
  EXPECT_GT(apart, 0) << "no step reached the bound";
}

// A rank restarted without its shards: the coordinator sends it the tree's
// (built from root.baseline), which go into its memory, and the step diffs
// against them.
TEST_F(ProducerMemoryTreeTest, ARankWithoutABaselineGetsTheTreesIntoItsMemory) {
  HostShardMemory* m[2];
  ASSERT_NO_FATAL_FAILURE(MakeProducer(0, 0, &m[0]));
  ASSERT_NO_FATAL_FAILURE(MakeProducer(1, 0, &m[1]));
  std::vector<Result<ProducerDecision>> d;
  ASSERT_EQ(Step(1, &d).outcome, RefitOutcome::kCommitted);
  ASSERT_NO_FATAL_FAILURE(MakeProducer(1, -1, &m[1]));
  ASSERT_FALSE(producers_[1]->has_baseline());
  RefitReport report = Step(2, &d);
  EXPECT_EQ(report.outcome, RefitOutcome::kCommitted);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(d[r].ok()) << d[r].status().ToString();
    EXPECT_EQ(d[r]->outcome, ProducerOutcome::kCommitted) << d[r]->reason;
  }
  EXPECT_TRUE(producers_[1]->has_baseline());
  // The tree's shards went into the memory once, as host bytes.
  EXPECT_EQ(m[1]->calls().baselines_from_host, 1);
  EXPECT_EQ(m[1]->calls().set_baselines, 0);
  // Diffed against v1's shards from the tree: only v1 -> v2 changed.
  uint64_t stepped = 0;
  for (const auto& [name, shard] : layout_.ShardsOf(1)) {
    const auto& base = shards_[1][1].at(name);
    const auto& target = shards_[2][1].at(name);
    const size_t w = DTypeSize(shard.dtype);
    for (size_t e = 0; e < target.size() / w; ++e) {
      stepped += std::memcmp(&target[e * w], &base[e * w], w) != 0;
    }
  }
  EXPECT_EQ(d[1]->changed_elements, stepped);
  ExpectMemoryAt(m[1], 1, 2);
  ExpectTreeAt(2);
}

// A kernel writes a shard of rank 1 while its memory diffs it: the
// producer fails the step before DONE, the coordinator aborts the refit,
// every store and root.baseline keep the base, and the next step from the
// same memories commits.
TEST_F(ProducerMemoryTreeTest, AShardWrittenDuringTheDiffAbortsTheTree) {
  HostShardMemory* m[2];
  for (uint32_t r = 0; r < 2; ++r)
    ASSERT_NO_FATAL_FAILURE(MakeProducer(r, 0, &m[r]));
  std::vector<Result<ProducerDecision>> d;
  ASSERT_EQ(Step(1, &d).outcome, RefitOutcome::kCommitted);
  Shards written = shards_[2][1];
  const std::string shard = written.begin()->first;
  m[1]->set_after_find([&](std::string_view s) {
    if (s == shard) written.at(shard)[2] ^= std::byte{0x10};
  });
  {
    RefitOptions o = OptionsFor(2);
    o.producers = hub_.get();
    o.producer_wait = 20s;
    o.phase_timeout = 10s;
    o.kept_baseline = kept_;
    auto root = std::async(std::launch::async, [&] { return RunRefit(o); });
    Producer* p0 = producers_.at(0).get();
    auto r0 = std::async(std::launch::async,
                         [&] { return p0->Refit(2, Spans(shards_[2][0])); });
    auto r1 = producers_.at(1)->Refit(2, Spans(written));
    auto d0 = r0.get();
    auto report = root.get();
    ASSERT_FALSE(r1.ok());
    EXPECT_TRUE(r1.status().IsBaseMismatch()) << r1.status().ToString();
    EXPECT_THAT(std::string(r1.status().message()),
                HasSubstr("changed while it was diffed"));
    ASSERT_TRUE(d0.ok()) << d0.status().ToString();
    EXPECT_EQ(d0->outcome, ProducerOutcome::kAborted);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->outcome, RefitOutcome::kAborted);
  }
  ExpectTreeAt(1);
  ExpectMemoryAt(m[0], 0, 1);
  ExpectMemoryAt(m[1], 1, 1);
  m[1]->set_after_find(nullptr);
  EXPECT_EQ(Step(3, &d).outcome, RefitOutcome::kCommitted);
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(d[r].ok()) << d[r].status().ToString();
    EXPECT_EQ(d[r]->outcome, ProducerOutcome::kCommitted) << d[r]->reason;
    ExpectMemoryAt(m[r], r, 3);
  }
  ExpectTreeAt(3);
}

}  // namespace
}  // namespace dcr
