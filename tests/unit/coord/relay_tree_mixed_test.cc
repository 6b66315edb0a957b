// Mixed trees (docs/PROTOCOL.md §"Context-coded chunks"): the root codes in
// context for a0's subtree and sends b0's (taken as serving, RefitOptions::
// TEST_plain_nodes) each context-coded chunk base-independent at the same
// sequence number; real relays over the fake transport. A relay planned
// without context refuses a context-coded chunk as corrupt, so a commit
// with no repair round says every node got an encoding it can decode.
#include <bit>
#include <cstring>
#include <filesystem>

#include "dcr/objstore.h"
#include "relay_tree_fixture.h"

namespace dcr {
namespace {

class MixedTreeTest : public RelayTreeTest {
 protected:
  void SetUp() override {
    RelayTreeTest::SetUp();
    // One BF16 tensor of weights about N(0, 0.02) and Adam-like steps of
    // 3e-6 each: small weights (fine ULPs) change, large ones mostly do
    // not, so context-coded chunks are the smaller ones.
    infos_ = {{"w", DType::kBF16, {1u << 20}}};
    std::mt19937 rng(29);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> w(infos_[0].NumElements());
    for (float& x : w) x = normal(rng);
    for (int v = 0; v < 2; ++v) {
      Bytes b(infos_[0].NumBytes());
      for (size_t e = 0; e < w.size(); ++e) {
        const uint32_t u = std::bit_cast<uint32_t>(w[e]);
        const uint16_t h =
            static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        std::memcpy(&b[2 * e], &h, 2);
        w[e] += normal(rng) > 0 ? 3e-6f : -3e-6f;
      }
      Write(Ckpt(v), {b});
    }
  }

  // Context coding on, with b0's subtree (b0, b1) base-independent.
  static void Mixed(RefitOptions& o) {
    o.context_coding = RefitOptions::ContextCoding::kOn;
    o.TEST_plain_nodes = {"b1"};  // any node of the subtree will do
  }

  // The tree with cluster cb as `source: objstore` (b0 pulls its chunks
  // from a directory store), every relay started.
  Topology StartWithObjects() {
    std::string objects = dir_.Path("objects");
    Topology t = MakeTopology();
    for (ClusterSpec& c : t.clusters) {
      if (c.name == "cb") c.source = ChunkSource::kObjstore;
    }
    ObjectStoreSpec spec;
    spec.kind = ObjectStoreKind::kDir;
    spec.path = objects;
    t.objstore = spec;
    auto store = OpenDirObjectStore(objects);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    std::shared_ptr<ObjectStore> shared;
    if (store.ok()) shared = *std::move(store);
    for (const auto& n : kRelays) {
      StartRelay(n, "", [&](RelayOptions& o) {
        if (n == "b0") o.objects = shared;
      });
    }
    return t;
  }
  // Bytes of the objects stored for refit `id`.
  uint64_t ObjectBytes(const RefitId& id) {
    uint64_t total = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(
             dir_.Path("objects/refits/" + id.ToHex()), ec)) {
      if (e.is_regular_file()) total += e.file_size();
    }
    return total;
  }
};

TEST_F(MixedTreeTest, EachSubtreeGetsItsEncodingAndProgressCountsBoth) {
  SeedAll(0);
  StartAll();
  std::vector<RefitOptions::Progress> seen;
  RefitReport r = Refit(1, RefitMode::kDelta, 0, [&](RefitOptions& o) {
    Mixed(o);
    o.heartbeat = 20ms;
    o.on_progress = [&](const RefitOptions::Progress& p) { seen.push_back(p); };
  });
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
  EXPECT_GT(r.context_chunks, 0u) << r.ToJson();
  EXPECT_EQ(r.context_nodes, (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_GT(r.plain_payload_bytes, r.payload_bytes);
  // Progress is in payload bytes of the context-coded stream, whichever
  // encoding holds a subtree back.
  for (const RefitOptions::Progress& p : seen) {
    EXPECT_LE(p.payload_bytes, r.payload_bytes);
    if (p.delivered_bytes) {
      EXPECT_LE(*p.delivered_bytes, p.payload_bytes);
    }
  }
  const Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  // b0 and b1 applied the base-independent chunks, a0's subtree the
  // context-coded ones: as many of each.
  EXPECT_EQ(relays_["b1"]->Stats().chunks_applied,
            relays_["a1"]->Stats().chunks_applied);

  // The next refit without plain nodes codes in context for everyone.
  RefitReport all = Refit(0, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.context_coding = RefitOptions::ContextCoding::kOn;
  });
  ASSERT_EQ(all.outcome, RefitOutcome::kCommitted) << all.ToJson();
  EXPECT_GT(all.context_chunks, 0u);
  EXPECT_TRUE(all.context_nodes.empty());
  EXPECT_EQ(all.plain_payload_bytes, 0u);
}

// One object sequence for every pulling head: base-independent frames when
// a puller is planned without context (b0 here), context-coded ones when
// every puller has the flag (a0's subtree is the plain one then). Either
// way each node decodes what it gets: no repair round.
TEST_F(MixedTreeTest, ThePullersSequenceHoldsTheEncodingEveryPullerTakes) {
  SeedAll(0);
  Topology topo = StartWithObjects();
  // The same step twice: b0's subtree plain, then a0's.
  std::vector<uint64_t> stored, payload, plain_payload;
  for (const char* plain : {"b1", "a1"}) {
    RefitReport r = Refit(1, RefitMode::kDelta, 0, [&](RefitOptions& o) {
      o.topology = topo;
      o.context_coding = RefitOptions::ContextCoding::kOn;
      o.TEST_plain_nodes = {plain};
    });
    ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << plain << r.ToJson();
    EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
    EXPECT_GT(r.context_chunks, 0u);
    ASSERT_GT(r.plain_payload_bytes, r.payload_bytes);
    stored.push_back(ObjectBytes(r.refit));
    payload.push_back(r.payload_bytes);
    plain_payload.push_back(r.plain_payload_bytes);
    const Digest128 want = DigestOf(Ckpt(1));
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n << " (" << plain << ")";
    }
    // Back to v0 for the next round, by a full refit.
    RefitReport back = Refit(0, RefitMode::kFull, 0,
                             [&](RefitOptions& o) { o.topology = topo; });
    ASSERT_EQ(back.outcome, RefitOutcome::kCommitted) << back.ToJson();
  }
  // The same frames and END but for the chunks' encoding: the first
  // sequence held the base-independent chunks, the second the
  // context-coded ones.
  EXPECT_EQ(payload[0], payload[1]);
  EXPECT_EQ(plain_payload[0], plain_payload[1]);
  EXPECT_EQ(stored[0] - stored[1], plain_payload[0] - payload[0]);
}

// b0 (planned without context) is lost mid-stream before b1 got anything
// (its link from b0 is 2 s late): the root adopts b1 and resends it what
// it missed from its buffer, the base-independent frames, which b1 can
// decode: no repair round.
TEST_F(MixedTreeTest, AnOrphanOfAPlainSubtreeIsResentTheBaseIndependentFrames) {
  SeedAll(0);
  StartAll();
  FakeFaults late;
  late.delay = 2s;
  network_->SetFaults("b0", "b1", late);
  auto refit = std::async(std::launch::async, [&] {
    return Refit(1, RefitMode::kDelta, /*min_commit=*/4, [&](RefitOptions& o) {
      Mixed(o);
      o.heartbeat = 100ms;
      o.connect_timeout = 1s;
    });
  });
  // (b1's PLAN is 2 s late too: the stream starts once it answered.)
  ASSERT_TRUE(WaitUntil([&] {
    return relays_["b0"]->Stats().chunks_received > 0;
  })) << "b0 did not take the stream";
  EXPECT_EQ(relays_["b1"]->Stats().chunks_received, 0u);
  relays_["b0"]->Stop();
  RefitReport r = refit.get();
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
  EXPECT_GT(r.context_chunks, 0u) << r.ToJson();
  EXPECT_GT(r.resent_chunks, 0u) << r.ToJson();
  EXPECT_EQ(r.resend_misses, 0u) << r.ToJson();
  EXPECT_FALSE(Node(r, "b0")->committed);
  const Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a0", "a1", "a2", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

}  // namespace
}  // namespace dcr
