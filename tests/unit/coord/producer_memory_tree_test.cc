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

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcr/producer.h"
#include "dcr/shard_diff.h"
#include "unit/coord/relay_tree_fixture.h"
#include "unit/placement/host_shard_memory.h"
#include "unit/placement/versions.h"

namespace dcr {
namespace {

using placement_testing::HostShardMemory;
using placement_testing::RandomVersions;
using placement_testing::Tensors;
using placement_testing::View;
using placement_testing::Volume;
using Shards = std::map<std::string, std::vector<std::byte>>;
using ::testing::HasSubstr;

// Two tensor-parallel ranks. Every canonical span of the column split's
// boundary and of the row split holds both ranks' elements, so the
// coordinator merges parts of two producers into one chunk.
constexpr const char* kLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: layer.0.w
    shard: qkv
    split: column
    shape: [96, 64]
  - name: layer.1.w
    shard: proj
    split: row
    shape: [64, 96]
  - name: norm
    shard: norm
    split: replicated
    shape: [64]
    dtype: F32
)";

// The same, larger: spans of 32768 elements (ProducerContextTreeTest), 4
// per matrix, are large enough for context coding to gain on.
constexpr const char* kLargerLayout = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: layer.0.w
    shard: qkv
    split: column
    shape: [512, 256]
  - name: layer.1.w
    shard: proj
    split: row
    shape: [256, 512]
  - name: norm
    shard: norm
    split: replicated
    shape: [256]
    dtype: F32
)";

// Two pipeline stages of four layers (ProducerPipelineTreeTest): rank 0
// holds tensors 0-3, rank 1 tensors 4-7, and both stream at once.
constexpr const char* kPipelineLayout = R"(version: 1
parallel: {pp: 2}
layers: 8
tensors:
  - name: layers.{layer}.w
    shard: layers.{layer}.w
    split: replicated
    shape: [64, 96]
)";

constexpr int kVersions = 4;

// `count` versions whose changes follow each element's exponent, as an
// optimizer step's do (small exponents change often, large ones rarely):
// what context coding gains on. Changes flip low mantissa bits, so an
// element keeps its exponent across versions.
std::vector<Tensors> AdamVersions(const Layout& layout, int count,
                                  std::mt19937_64& rng) {
  std::vector<Tensors> v(1);
  std::uniform_real_distribution<double> uniform(0, 1);
  for (const LayoutTensor& t : layout.tensors) {
    const size_t w = DTypeSize(t.dtype);
    const ExponentField f = ExponentFieldOf(t.dtype);
    auto& b = v[0][t.name];
    b.resize(Volume(t.shape) * w);
    for (size_t i = 0; i < Volume(t.shape); ++i) {
      // 2^(bits-2) + 1 exponents around the middle of the field.
      const uint64_t e = (1u << (f.bits - 1)) - (1u << (f.bits - 3)) +
                         rng() % ((1u << (f.bits - 2)) + 1);
      uint64_t x = (e << f.shift) | (rng() & ((uint64_t{1} << f.shift) - 1));
      if (rng() & 1) x |= uint64_t{1} << (8 * w - 1);
      std::memcpy(b.data() + i * w, &x, w);
    }
  }
  while (static_cast<int>(v.size()) < count) {
    Tensors next = v.back();
    for (const LayoutTensor& t : layout.tensors) {
      const size_t w = DTypeSize(t.dtype);
      const ExponentField f = ExponentFieldOf(t.dtype);
      auto& b = next.at(t.name);
      for (size_t i = 0; i < Volume(t.shape); ++i) {
        uint64_t x = 0;
        std::memcpy(&x, b.data() + i * w, w);
        const uint64_t e = (x >> f.shift) & ((uint64_t{1} << f.bits) - 1);
        // p(change) halves with every step up in exponent.
        const uint64_t k = std::min<uint64_t>(
            e - ((1u << (f.bits - 1)) - (1u << (f.bits - 3))), 12);
        if (uniform(rng) < 0.3 / static_cast<double>(uint64_t{1} << k)) {
          x ^= 1 + rng() % 3;
          std::memcpy(b.data() + i * w, &x, w);
        }
      }
    }
    v.push_back(std::move(next));
  }
  return v;
}

ShardBytes Spans(const Shards& s) {
  ShardBytes out;
  for (const auto& [name, b] : s) out.emplace(name, b);
  return out;
}

class ProducerMemoryTreeTest : public RelayTreeTest {
 protected:
  void SetUp() override {
    RelayTreeTest::SetUp();
    auto l = ParseLayout(layout_text_ != nullptr ? layout_text_
                         : adam_like_            ? kLargerLayout
                                                 : kLayout,
                         "memory.yaml");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_ = *std::move(l);
    // The fixture's checkpoints, replaced by this layout's versions: each
    // step changes about 4% of the elements.
    infos_.clear();
    for (const LayoutTensor& t : layout_.tensors) {
      infos_.push_back({t.name, t.dtype, t.shape});
    }
    std::mt19937_64 rng(29);
    auto [v0, v1] = RandomVersions(layout_, 0.04, rng);
    canonical_ = {v0, v1};
    if (adam_like_) canonical_ = AdamVersions(layout_, kVersions, rng);
    while (canonical_.size() < kVersions) {
      // RandomVersions draws a fresh base: its change, base ^ target,
      // applied to the last version.
      auto [base, next] = RandomVersions(layout_, 0.04, rng);
      Tensors stepped = canonical_.back();
      for (auto& [name, bytes] : stepped) {
        const auto& from = base.at(name);
        const auto& to = next.at(name);
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] ^= from[i] ^ to[i];
      }
      canonical_.push_back(std::move(stepped));
    }
    versions_.clear();
    for (int v = 0; v < kVersions; ++v) {
      std::vector<std::vector<std::byte>> data;
      for (const TensorInfo& t : infos_)
        data.push_back(canonical_[v].at(t.name));
      Write(Ckpt(v), data);
      versions_.push_back(std::move(data));
      for (uint32_t r = 0; r < 2; ++r) {
        auto s = BuildShards(layout_, r, View(canonical_[v]));
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        shards_[v][r] = *std::move(s);
      }
    }
    SeedAll(0);
    StartAll();
    auto hub = ProducerHub::Listen(layout_, "127.0.0.1", 0, TransportOptions());
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = *std::move(hub);
  }
  void TearDown() override {
    producers_.clear();
    hub_.reset();
    RelayTreeTest::TearDown();
  }

  // Rank `rank`'s producer with a fresh host stand-in of a GPU memory
  // (returned in `*memory`), holding version `base`'s shards there unless
  // `base` is negative.
  void MakeProducer(uint32_t rank, int base, HostShardMemory** memory) {
    ProducerOptions o;
    o.coordinator = "127.0.0.1:" + std::to_string(hub_->port());
    o.connect_timeout = 5s;
    o.timeout = 30s;
    auto p = std::make_unique<Producer>(layout_, rank, o);
    auto m = std::make_unique<HostShardMemory>();
    *memory = m.get();
    ASSERT_TRUE(p->UseMemory(std::move(m)).ok());
    if (base >= 0) {
      ASSERT_TRUE(p->SetBaseline(Spans(shards_[base][rank])).ok());
    }
    producers_[rank] = std::move(p);
  }

  // One refit of trainer step `v`: the root over the fake transport, each
  // rank's producer handing version `v`'s shards in its own thread.
  RefitReport Step(int v, std::vector<Result<ProducerDecision>>* decisions) {
    Producer* p[2] = {producers_.at(0).get(), producers_.at(1).get()};
    RefitOptions o = OptionsFor(v);
    o.producers = hub_.get();
    o.producer_wait = 20s;
    o.phase_timeout = 10s;
    o.threads = 2;
    o.kept_baseline = kept_;
    o.TEST_held_parts_bytes = held_parts_bytes_;
    o.context_coding = context_;
    o.TEST_plain_nodes = plain_nodes_;
    auto root = std::async(std::launch::async, [&] { return RunRefit(o); });
    std::vector<std::future<Result<ProducerDecision>>> ranks;
    for (uint32_t r = 0; r < 2; ++r) {
      ranks.push_back(std::async(std::launch::async, [this, p, r, v] {
        return p[r]->Refit(v, Spans(shards_[v][r]));
      }));
    }
    decisions->clear();
    for (auto& f : ranks) decisions->push_back(f.get());
    auto report = root.get();
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : RefitReport();
  }

  // Every relay's store and root.baseline hold version `v`'s bits.
  void ExpectTreeAt(int v) {
    const Digest128 want = DigestOf(Ckpt(v));
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n << " at v" << v;
    }
    EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), want);
  }

  // Canonical spans (of span_elems_ elements) that step v changes.
  uint64_t ChangedSpans(int v) const {
    uint64_t n = 0;
    for (const LayoutTensor& t : layout_.tensors) {
      const auto& a = canonical_[v - 1].at(t.name);
      const auto& b = canonical_[v].at(t.name);
      const size_t span = span_elems_ * DTypeSize(t.dtype);
      for (size_t at = 0; at < a.size(); at += span) {
        const size_t end = std::min(a.size(), at + span);
        n += !std::equal(a.begin() + at, a.begin() + end, b.begin() + at);
      }
    }
    return n;
  }

  // The baseline `memory` holds for rank `rank` is version `v`'s shards.
  void ExpectMemoryAt(HostShardMemory* memory, uint32_t rank, int v) {
    for (const auto& [name, bytes] : shards_[v][rank]) {
      std::vector<std::byte> held(bytes.size());
      ASSERT_TRUE(memory->ReadBaseline(name, 0, held).ok()) << name;
      EXPECT_TRUE(held == bytes) << "rank " << rank << " " << name;
    }
  }

  Layout layout_;
  std::vector<Tensors> canonical_;
  Shards shards_[kVersions][2];
  std::shared_ptr<ProducerHub> hub_;
  std::shared_ptr<KeptBaseline> kept_ = std::make_shared<KeptBaseline>();
  std::map<uint32_t, std::unique_ptr<Producer>> producers_;
  uint64_t held_parts_bytes_ = 0;  // RefitOptions::TEST_held_parts_bytes
  // Set by a derived fixture's constructor (before SetUp).
  // Larger versions whose changes follow the exponent.
  bool adam_like_ = false;
  const char* layout_text_ = nullptr;  // another layout of two ranks
  RefitOptions::ContextCoding context_ = RefitOptions::ContextCoding::kAuto;
  std::set<std::string> plain_nodes_;  // RefitOptions::TEST_plain_nodes
};

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
