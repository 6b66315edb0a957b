// Signed refits in a running tree: real Relay engines and RunRefit over the
// fake transport, frames keyed with a shared HMAC key, and the root's
// Ed25519 signing key. A relay holding the hop key but not the signing key
// can forward a forged, well-formed chunk (the relay.forward=forge
// failpoint); the receivers below it catch it against the signed manifest,
// vote no and restore their base, and the report says who and why.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/failpoint.h"
#include "coord/coordinator.h"
#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "relay/relay.h"
#include "testing/temp_dir.h"
#include "transport/fake_transport.h"
#include "wire/hmac_authenticator.h"
#include "wire/signature.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;
using namespace std::chrono_literals;

// ca: a0 -> {a1, a2}; cb: b0. Only a0 forwards to children.
const std::vector<std::string> kRelays = {"a0", "a1", "a2", "b0"};

class SigningTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    infos_ = {{"layer.0.w", DType::kBF16, {30000}},
              {"layer.1.w", DType::kBF16, {20000}},
              {"norm", DType::kF32, {2000}}};
    std::mt19937 rng(17);
    std::vector<Bytes> data;
    for (const auto& t : infos_) {
      Bytes b(t.NumBytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
      data.push_back(std::move(b));
    }
    for (int v = 0; v < 2; ++v) {
      Write(Ckpt(v), data);
      for (auto& b : data) {
        for (size_t i = rng() % 64; i < b.size(); i += 1 + rng() % 64) {
          b[i] ^= std::byte{1};
        }
      }
    }
    network_ = FakeNetwork::Create();
    std::string hop = dir_.Path("hop.key");
    std::mt19937 krng(3);
    std::string bytes(32, '\0');
    for (char& c : bytes) c = static_cast<char>(krng());
    std::ofstream(hop, std::ios::binary) << bytes;
    ASSERT_EQ(::chmod(hop.c_str(), 0600), 0);
    auto k = LoadFrameKey(hop);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    hop_key_ = *k;
    ASSERT_TRUE(
        WriteNewKeyPair(dir_.Path("root.key"), dir_.Path("root.pub")).ok());
    ASSERT_TRUE(
        WriteNewKeyPair(dir_.Path("other.key"), dir_.Path("other.pub")).ok());
    for (const auto& n : kRelays) {
      std::filesystem::copy_file(Ckpt(0), StorePath(n));
    }
    std::filesystem::copy_file(Ckpt(0), dir_.Path("base.safetensors"));
  }
  void TearDown() override {
    relays_.clear();
    network_.reset();
    DisarmFailpoints();
  }

  std::string Ckpt(int v) const {
    return dir_.Path("v" + std::to_string(v) + ".safetensors");
  }
  std::string StorePath(const std::string& node) const {
    return dir_.Path(node + ".safetensors");
  }
  void Write(const std::string& path, const std::vector<Bytes>& data) {
    std::vector<TensorToWrite> tw;
    for (size_t i = 0; i < infos_.size(); ++i) {
      tw.push_back({infos_[i], data[i]});
    }
    ASSERT_TRUE(WriteSafetensors(path, tw, {}).ok());
  }

  Topology MakeTopology(uint32_t min_commit) {
    std::string yaml = fmt::format(
        R"(version: 1
defaults: {{span_elems: 4096, fanout: 2, window_bytes: 1MiB, min_commit: {}}}
root: {{name: root, host: root, port: 1, cluster: train,
       state_dir: "{}", baseline: "{}"}}
clusters:
  - name: train
  - name: ca
    bandwidth: 10Gbps
    nodes:
)",
        min_commit == 0 ? std::string("all") : std::to_string(min_commit),
        dir_.Path("state"), dir_.Path("base.safetensors"));
    for (const char* n : {"a0", "a1", "a2"}) {
      yaml += fmt::format(
          "      - {{name: {0}, host: {0}, port: 2, store: {{kind: file, "
          "path: \"{1}\"}}}}\n",
          n, StorePath(n));
    }
    yaml += fmt::format(
        "  - name: cb\n    bandwidth: 10Gbps\n    nodes:\n"
        "      - {{name: b0, host: b0, port: 2, store: {{kind: file, path: "
        "\"{}\"}}}}\n",
        StorePath("b0"));
    yaml +=
        "links:\n  - {from: train, to: ca, bandwidth: 1Gbps, latency: 1ms}\n"
        "  - {from: train, to: cb, bandwidth: 1Gbps, latency: 1ms}\n";
    auto topo = ParseTopology(yaml, "test.yaml");
    EXPECT_TRUE(topo.ok()) << topo.status().ToString() << "\n" << yaml;
    return *topo;
  }

  // Every relay holds the hop key; those in `verifying` also the root's
  // public key (`public_key` file).
  void StartRelays(const std::vector<std::string>& verifying,
                   const std::string& public_key = "root.pub") {
    for (const auto& node : kRelays) {
      RelayOptions o;
      o.name = node;
      o.store = *ParseStoreSpec("file:" + StorePath(node));
      o.listen_host = node;
      o.listen_port = 2;
      o.transport = "fake";
      o.transport_options.fake_network = network_;
      o.transport_options.frames.authenticator = hop_key_;
      if (std::find(verifying.begin(), verifying.end(), node) !=
          verifying.end()) {
        auto pub = Ed25519PublicKey::Load(dir_.Path(public_key));
        ASSERT_TRUE(pub.ok()) << pub.status().ToString();
        o.signing_public_key = *std::move(pub);
      }
      o.apply_threads = 2;
      auto r = Relay::Start(o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      relays_[node] = *std::move(r);
    }
  }

  // A refit by a root with the hop key, signing with `signing_key` (a file
  // in the test dir; empty: unsigned).
  RefitReport Refit(int target, uint32_t min_commit,
                    const std::string& signing_key = "root.key") {
    RefitOptions o;
    o.topology = MakeTopology(min_commit);
    o.transport_options.frames.authenticator = hop_key_;
    if (!signing_key.empty()) o.signing_key_file = dir_.Path(signing_key);
    o.target = Ckpt(target);
    o.phase_timeout = 10s;
    o.connect_timeout = 2s;
    o.threads = 2;
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    auto report = RunRefit(o);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : RefitReport();
  }

  Digest128 DigestOf(const std::string& path) {
    auto c = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? (*c)->ComputeDigests().version : Digest128();
  }
  void WaitIdle() {
    for (const auto& [node, relay] : relays_) {
      int i = 0;
      for (; i < 500 && relay->Stats().state != "idle"; ++i) {
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_LT(i, 500) << node << " did not become idle";
    }
  }
  const NodeOutcome& Node(const RefitReport& r, const std::string& name) {
    for (const auto& n : r.nodes) {
      if (n.node == name) return n;
    }
    ADD_FAILURE() << "no outcome for " << name;
    static const NodeOutcome kNone;
    return kNone;
  }

  testing::TempDir dir_;
  std::vector<TensorInfo> infos_;
  std::shared_ptr<FakeNetwork> network_;
  std::shared_ptr<const FrameAuthenticator> hop_key_;
  std::map<std::string, std::unique_ptr<Relay>> relays_;
};

TEST_F(SigningTreeTest, SignedRefitCommitsEverywhere) {
  StartRelays(kRelays);
  RefitReport r = Refit(1, 0);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  EXPECT_GT(r.chunks, 1u);
  WaitIdle();
  for (const auto& n : kRelays) {
    EXPECT_TRUE(Node(r, n).committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(1)));
}

// A mixed tree (b0's subtree taken as serving: base-independent chunks;
// ca's context-coded), on Adam-like steps where context coding pays: each
// context-coded chunk goes out twice at one sequence number, the manifest
// lists both encodings, and every relay verifies the one it applied. A
// relay planned without context refuses a context-coded chunk, so a
// commit with no repair round says each subtree got its own encoding.
TEST_F(SigningTreeTest, AMixedTreeSendsEachSubtreeItsEncodingSigned) {
  // BF16 weights about N(0, 0.02) and a step of 3e-6 each: small weights
  // (fine ULPs) change, large ones mostly do not.
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto bf16 = [](float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  };
  std::vector<std::vector<float>> w;
  for (const TensorInfo& t : infos_) {
    w.emplace_back(t.NumElements());
    for (float& x : w.back()) x = normal(rng);
  }
  for (int v = 0; v < 2; ++v) {
    std::vector<Bytes> data;
    for (size_t i = 0; i < infos_.size(); ++i) {
      Bytes b(infos_[i].NumBytes());
      for (size_t e = 0; e < w[i].size(); ++e) {
        if (infos_[i].dtype == DType::kBF16) {
          uint16_t h = bf16(w[i][e]);
          std::memcpy(&b[2 * e], &h, 2);
        } else {
          std::memcpy(&b[4 * e], &w[i][e], 4);
        }
        w[i][e] += normal(rng) > 0 ? 3e-6f : -3e-6f;
      }
      data.push_back(std::move(b));
    }
    Write(Ckpt(v), data);
  }
  for (const auto& n : kRelays) {
    std::filesystem::copy_file(
        Ckpt(0), StorePath(n),
        std::filesystem::copy_options::overwrite_existing);
  }
  std::filesystem::copy_file(Ckpt(0), dir_.Path("base.safetensors"),
                             std::filesystem::copy_options::overwrite_existing);
  StartRelays(kRelays);
  RefitOptions o;
  o.topology = MakeTopology(0);
  o.transport_options.frames.authenticator = hop_key_;
  o.signing_key_file = dir_.Path("root.key");
  o.target = Ckpt(1);
  o.phase_timeout = 10s;
  o.threads = 2;
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  o.context_coding = RefitOptions::ContextCoding::kOn;
  o.TEST_plain_nodes = {"b0"};
  auto report = RunRefit(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const RefitReport& r = *report;
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
  EXPECT_GT(r.context_chunks, 0u) << r.ToJson();
  EXPECT_EQ(r.context_nodes, (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_GT(r.plain_payload_bytes, r.payload_bytes);
  // a0's edge carried the context-coded stream, b0's the other: the WAN
  // class counts each once.
  EXPECT_EQ(r.link_class_bytes.at("wan"),
            2 * r.stream_bytes + r.plain_payload_bytes - r.payload_bytes)
      << r.ToJson();
  WaitIdle();
  for (const auto& n : kRelays) {
    EXPECT_TRUE(Node(r, n).committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

TEST_F(SigningTreeTest, FullSignedRefitCommits) {
  StartRelays(kRelays);
  RefitOptions o;
  RefitReport r = Refit(1, 0);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  // A full refit of the same bits, signed: dense overwrites, each listed.
  o.topology = MakeTopology(0);
  o.transport_options.frames.authenticator = hop_key_;
  o.signing_key_file = dir_.Path("root.key");
  o.target = Ckpt(0);
  o.mode = RefitMode::kFull;
  o.phase_timeout = 10s;
  o.threads = 2;
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  auto full = RunRefit(o);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->outcome, RefitOutcome::kCommitted) << full->reason;
  WaitIdle();
  for (const auto& n : kRelays) {
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(0))) << n;
  }
}

// Row 12 of the fault matrix: a0 holds the hop key, not the signing key,
// and forwards a forged chunk in place of every chunk it got. a1 and a2
// apply well-formed chunks that pass every frame and chunk check, and
// catch them against the manifest.
TEST_F(SigningTreeTest, ForgedChunkFromAMidTreeRelayIsCaughtBelowIt) {
  StartRelays(kRelays);
  ASSERT_TRUE(ArmFailpoints("relay.forward=forge").ok());
  RefitReport r = Refit(1, /*min_commit=*/2);
  DisarmFailpoints();
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  WaitIdle();
  Digest128 v0 = DigestOf(Ckpt(0)), v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a0", "b0"}) {
    EXPECT_TRUE(Node(r, n).committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  for (const char* n : {"a1", "a2"}) {
    const NodeOutcome& o = Node(r, n);
    EXPECT_FALSE(o.committed) << n;
    EXPECT_EQ(o.code, NodeCode::kRejected) << n << ": " << o.detail;
    EXPECT_EQ(o.phase, "vote") << n;
    EXPECT_THAT(o.detail, HasSubstr("applied here with SHA-256"));
    EXPECT_THAT(o.detail, HasSubstr("the signed manifest: it was not the "
                                    "root's"));
    // Restored: the forged bits are gone, the base is back.
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
    RelayStats stats = relays_[n]->Stats();
    EXPECT_FALSE(stats.committed) << n;  // still the unrecorded base
    EXPECT_EQ(stats.refits_aborted, 1u) << n;
  }
  EXPECT_THAT(r.reason, HasSubstr("a1 (rejected at vote)"));
  EXPECT_THAT(r.reason, HasSubstr("a2 (rejected at vote)"));
  EXPECT_GT(relays_["a1"]->Stats().chunks_applied, 0u);
}

// The control: the same forgery without public keys on the relays is
// still refused by the digest check (the plan's target came from the real
// root), but nothing names the chunk or the forger's doing.
TEST_F(SigningTreeTest, WithoutPublicKeysTheForgeryIsOnlyADigestMismatch) {
  StartRelays({});
  ASSERT_TRUE(ArmFailpoints("relay.forward=forge").ok());
  RefitReport r = Refit(1, /*min_commit=*/2);
  DisarmFailpoints();
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  for (const char* n : {"a1", "a2"}) {
    EXPECT_EQ(Node(r, n).code, NodeCode::kDigestMismatch)
        << n << ": " << Node(r, n).detail;
  }
}

TEST_F(SigningTreeTest, UnsignedEndToAKeyedRelayIsRefused) {
  // a2 verifies; the others ignore manifests.
  StartRelays({"a2"});
  RefitReport r = Refit(1, /*min_commit=*/3, /*signing_key=*/"");
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  WaitIdle();
  const NodeOutcome& a2 = Node(r, "a2");
  EXPECT_EQ(a2.code, NodeCode::kRejected);
  EXPECT_EQ(a2.phase, "vote");
  EXPECT_THAT(a2.detail, HasSubstr("END carries no signed manifest"));
  EXPECT_EQ(DigestOf(StorePath("a2")), DigestOf(Ckpt(0)));
  for (const char* n : {"a0", "a1", "b0"}) {
    EXPECT_TRUE(Node(r, n).committed) << n;
  }
}

TEST_F(SigningTreeTest, ManifestSignedWithAnotherKeyIsRefused) {
  StartRelays(kRelays);
  RefitReport r = Refit(1, 0, "other.key");
  ASSERT_EQ(r.outcome, RefitOutcome::kAborted) << r.reason;
  WaitIdle();
  for (const auto& n : kRelays) {
    const NodeOutcome& o = Node(r, n);
    EXPECT_EQ(o.code, NodeCode::kRejected) << n;
    EXPECT_THAT(o.detail, HasSubstr("signature does not verify"));
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(0))) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(0)));
}

TEST_F(SigningTreeTest, RootKeyErrorsStopBeforeAnyRelayIsAsked) {
  StartRelays(kRelays);
  RefitOptions o;
  o.topology = MakeTopology(0);
  o.transport_options.frames.authenticator = hop_key_;
  o.target = Ckpt(1);
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  o.signing_key_file = dir_.Path("missing.key");
  auto r = RunRefit(o);
  EXPECT_TRUE(r.status().IsNotFound());
  EXPECT_THAT(r.status().message(),
              HasSubstr("test.yaml: root.signing_key_file: signing key file"));
  o.signing_key_file = dir_.Path("root.pub");
  r = RunRefit(o);
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(), HasSubstr("chmod 600"));
  // A manifest that could not fit in one END frame: 14 spans of 4096
  // elements, 42 bytes each, beside 3 tensor digests, against a 600-byte
  // frame bound.
  o.signing_key_file = dir_.Path("root.key");
  o.transport_options.frames.max_payload = 600;
  r = RunRefit(o);
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(),
              HasSubstr("test.yaml: a signed refit of 14 chunks needs an END "
                        "of about 854 bytes, above the frame payload limit of "
                        "600 bytes (7 chunks at most); raise "
                        "defaults.span_elems (now 4096)"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("state/epoch")));
}

}  // namespace
}  // namespace dcr

namespace dcr {
namespace {

// A relay whose store a crash left with the mix of a refit is repaired by
// the next refit, and the repair is signed like any refit: a relay that
// holds the root's public key checks its END before voting.
TEST_F(SigningTreeTest, TheRepairOfAMixedStoreIsSigned) {
  StartRelays(kRelays);
  RefitReport one = Refit(1, 0);
  ASSERT_EQ(one.outcome, RefitOutcome::kCommitted) << one.reason;
  WaitIdle();
  // a1 "died" applying that refit: its bits a mix of v0 and v1, its record
  // naming the refit unfinished.
  relays_.erase("a1");
  {
    auto store =
        Checkpoint::Open(StorePath("a1"), Checkpoint::Mode::kReadWrite);
    auto v0 = Checkpoint::Open(Ckpt(0), Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(store.ok() && v0.ok());
    std::mt19937 rng(5);
    for (size_t t = 0; t < (*store)->manifest().size(); ++t) {
      auto to = (*store)->MutableTensorData(t);
      auto from = (*v0)->TensorData(t);
      for (size_t i = 0; i < to.size(); i += 2) {
        if (rng() % 2) std::copy_n(from.data() + i, 2, to.data() + i);
      }
    }
    ASSERT_TRUE((*store)->Flush().ok());
    VersionRecord rec;
    rec.manifest = (*store)->manifest().digest();
    rec.in_progress = RefitInProgress{one.refit, one.base, one.target,
                                      "2026-12-01T00:00:00Z"};
    ASSERT_TRUE(WriteVersionRecord(StorePath("a1") + ".dcr-version", rec).ok());
  }
  RelayOptions o;
  o.name = "a1";
  o.store = *ParseStoreSpec("file:" + StorePath("a1"));
  o.listen_host = "a1";
  o.listen_port = 2;
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  o.transport_options.frames.authenticator = hop_key_;
  auto pub = Ed25519PublicKey::Load(dir_.Path("root.pub"));
  ASSERT_TRUE(pub.ok());
  o.signing_public_key = *std::move(pub);
  o.apply_threads = 2;
  auto started = Relay::Start(o);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  relays_["a1"] = *std::move(started);
  // The tree goes back to v0's bits (step 2): a1 is repaired from the
  // history (the refit it died in and the one after), signed.
  RefitReport two = Refit(0, 0);
  ASSERT_EQ(two.outcome, RefitOutcome::kCommitted) << two.ToJson();
  ASSERT_EQ(two.catch_up.size(), 1u) << two.ToJson();
  EXPECT_EQ(two.catch_up[0].method, "repair");
  EXPECT_EQ(two.catch_up[0].repaired, one.refit);
  EXPECT_EQ(two.catch_up[0].nodes, std::vector<std::string>{"a1"});
  WaitIdle();
  EXPECT_EQ(relays_["a1"]->Stats().repairs_by_root, 1u);
  for (const auto& n : kRelays) {
    EXPECT_TRUE(Node(two, n).committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(0))) << n;
  }
}

}  // namespace
}  // namespace dcr
