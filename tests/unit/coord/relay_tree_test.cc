// The relay state machine and the coordinator together, over the fake
// transport: real Relay engines with file stores in a temp dir, a real
// RunRefit, and faults injected on the simulated links.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "common/failpoint.h"
#include "common/file.h"
#include "coord/coordinator.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "relay/relay.h"
#include "testing/temp_dir.h"
#include "transport/fake_transport.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;
using namespace std::chrono_literals;

const std::vector<std::string> kRelays = {"a0", "a1", "a2", "b0", "b1"};

class RelayTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    infos_ = {{"layer.0.w", DType::kBF16, {40000}},
              {"layer.1.w", DType::kBF16, {25000}},
              {"norm", DType::kF32, {3000}}};
    std::mt19937 rng(7);
    std::vector<Bytes> data;
    for (const auto& t : infos_) {
      Bytes b(t.NumBytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
      data.push_back(std::move(b));
    }
    for (int v = 0; v < 3; ++v) {
      versions_.push_back(data);
      Write(Ckpt(v), data);
      // About 3% of the elements change per step.
      for (auto& b : data) {
        for (size_t i = rng() % 64; i < b.size(); i += 1 + rng() % 64) {
          b[i] ^= std::byte{1};
        }
      }
    }
    network_ = FakeNetwork::Create();
  }
  void TearDown() override {
    relays_.clear();
    network_.reset();
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
  void Seed(const std::string& node, int v) {
    std::filesystem::remove(StorePath(node) + ".dcr-version");
    std::filesystem::copy_file(
        Ckpt(v), StorePath(node),
        std::filesystem::copy_options::overwrite_existing);
  }
  void SeedAll(int v) {
    for (const auto& n : kRelays) Seed(n, v);
    std::filesystem::copy_file(
        Ckpt(v), dir_.Path("base.safetensors"),
        std::filesystem::copy_options::overwrite_existing);
  }

  Topology MakeTopology(uint32_t min_commit = 0) {
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
    yaml += "  - name: cb\n    bandwidth: 10Gbps\n    nodes:\n";
    for (const char* n : {"b0", "b1"}) {
      yaml += fmt::format(
          "      - {{name: {0}, host: {0}, port: 2, store: {{kind: file, "
          "path: \"{1}\"}}}}\n",
          n, StorePath(n));
    }
    yaml +=
        "links:\n  - {from: train, to: ca, bandwidth: 1Gbps, latency: 1ms}\n"
        "  - {from: train, to: cb, bandwidth: 1Gbps, latency: 1ms}\n";
    auto topo = ParseTopology(yaml, "test.yaml");
    EXPECT_TRUE(topo.ok()) << topo.status().ToString() << "\n" << yaml;
    return *topo;
  }

  void StartRelay(const std::string& node, const std::string& store = "") {
    RelayOptions o;
    o.name = node;
    o.store =
        *ParseStoreSpec(store.empty() ? "file:" + StorePath(node) : store);
    o.listen_host = node;
    o.listen_port = 2;
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    o.apply_threads = 2;
    o.apply_window_bytes = 256 << 10;
    o.prepared_wait = prepared_wait_;
    o.resend_buffer_bytes = resend_buffer_bytes_;
    o.undo_dir = undo_dir_;
    auto r = Relay::Start(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    relays_[node] = *std::move(r);
  }
  void StartAll() {
    for (const auto& n : kRelays) StartRelay(n);
  }

  // Refits to v1 (min_commit 4) while a0, once it took the plan, stops
  // talking to the root both ways, as if its process were stopped:
  // heartbeats (every 100 ms) find it silent and the root routes around
  // it. An orphaned a0 waits up to `phase_timeout` to be adopted.
  RefitReport RefitWithA0Silenced(std::chrono::milliseconds phase_timeout) {
    auto refit = std::async(std::launch::async, [&] {
      return Refit(1, RefitMode::kDelta, /*min_commit=*/4,
                   [&](RefitOptions& o) {
                     o.heartbeat = 100ms;
                     o.connect_timeout = 1s;
                     o.phase_timeout = phase_timeout;
                   });
    });
    for (int i = 0; i < 1000 && relays_["a0"]->Stats().state == "idle"; ++i) {
      std::this_thread::sleep_for(1ms);
    }
    network_->Pause("a0", "root");
    network_->Pause("root", "a0");
    RefitReport r = refit.get();
    network_->Resume("a0", "root");
    network_->Resume("root", "a0");
    return r;
  }
  // A refit to Ckpt(target) through this tree over the fake network.
  RefitOptions OptionsFor(int target, uint32_t min_commit = 0) {
    RefitOptions o;
    o.topology = MakeTopology(min_commit);
    o.target = Ckpt(target);
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    return o;
  }
  RefitReport Refit(int target, RefitMode mode = RefitMode::kDelta,
                    uint32_t min_commit = 0,
                    const std::function<void(RefitOptions&)>& tweak = {}) {
    RefitOptions o = OptionsFor(target, min_commit);
    o.mode = mode;
    o.phase_timeout = 10s;
    o.threads = 2;
    if (tweak) tweak(o);
    auto report = RunRefit(o);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : RefitReport();
  }

  // The digest of the bits of `path` (a store or checkpoint file).
  Digest128 DigestOf(const std::string& path) {
    auto c = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? (*c)->ComputeDigests().version : Digest128();
  }
  // Options for ResumeRefit of this tree (10 s phases).
  RefitOptions ResumeOptions() {
    RefitOptions o;
    o.topology = MakeTopology();
    o.phase_timeout = 10s;
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    return o;
  }
  // Polls `ready` every 5 ms for up to 30 s; whether it became true.
  static bool WaitUntil(const std::function<bool()>& ready) {
    for (int i = 0; i < 6000 && !ready(); ++i) {
      std::this_thread::sleep_for(5ms);
    }
    return ready();
  }
  // A delta refit to a copy of v1 at `*copy` (so a test may change the
  // target under it), run in the background with `failpoints` armed.
  std::future<RefitReport> RefitToACopyOfV1(const char* failpoints,
                                            std::string* copy) {
    *copy = dir_.Path("v1-copy.safetensors");
    std::filesystem::copy_file(Ckpt(1), *copy);
    EXPECT_TRUE(ArmFailpoints(failpoints).ok());
    return std::async(std::launch::async, [this, path = *copy] {
      return Refit(1, RefitMode::kDelta, 0,
                   [&](RefitOptions& o) { o.target = path; });
    });
  }
  // Waits until `node`'s relay is idle (a refit it was part of ended).
  void WaitIdle(const std::string& node) {
    for (int i = 0; i < 500; ++i) {
      auto s = relays_[node]->Stats();
      if (s.state == "idle" || s.state == "no store") return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL() << node << " did not become idle";
  }
  const NodeOutcome* Node(const RefitReport& r, const std::string& name) {
    for (const auto& n : r.nodes) {
      if (n.node == name) return &n;
    }
    return nullptr;
  }

  testing::TempDir dir_;
  std::vector<TensorInfo> infos_;
  std::vector<std::vector<Bytes>> versions_;
  std::shared_ptr<FakeNetwork> network_;
  std::map<std::string, std::unique_ptr<Relay>> relays_;
  std::chrono::milliseconds prepared_wait_{600000};
  std::string undo_dir_;  // RelayOptions::undo_dir of relays started next
  std::optional<uint64_t> resend_buffer_bytes_;  // relays' (unset: default)
};

TEST_F(RelayTreeTest, ConsecutiveDeltaRefitsCommitEverywhere) {
  SeedAll(0);
  StartAll();
  for (int v = 1; v <= 2; ++v) {
    RefitReport r = Refit(v);
    ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
    EXPECT_EQ(r.base.step, uint64_t(v - 1));
    EXPECT_EQ(r.target.step, uint64_t(v));
    EXPECT_GT(r.chunks, 0u);
    EXPECT_LT(r.payload_bytes, r.checkpoint_bytes / 4);
    EXPECT_GT(r.link_class_bytes["wan"], 0u);
    EXPECT_GT(r.link_class_bytes["lan"], 0u);
    Digest128 want = DigestOf(Ckpt(v));
    EXPECT_EQ(r.target.digest, want);
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n;
      EXPECT_TRUE(Node(r, n)->committed) << n;
      auto s = relays_[n]->Stats();
      ASSERT_TRUE(s.committed) << n;
      EXPECT_EQ(*s.committed, r.target) << n;
    }
    EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), want);
  }
  // A relay forwards each chunk once per child: a0 has children, a2 none.
  EXPECT_GT(relays_["a0"]->Stats().chunks_forwarded, 0u);
  EXPECT_EQ(relays_["a2"]->Stats().chunks_forwarded, 0u);
  // The decision was written before COMMIT.
  EXPECT_FALSE(std::filesystem::is_empty(dir_.Path("state/decisions")));

  TransportOptions to;
  to.name = "status-client";
  to.fake_network = network_;
  auto status = QueryStatus(MakeTopology(), 5s, "fake", to);
  ASSERT_EQ(status.size(), kRelays.size());
  for (const auto& s : status) {
    EXPECT_TRUE(s.reachable) << s.node << ": " << s.error;
    ASSERT_TRUE(s.committed) << s.node;
    EXPECT_EQ(s.committed->step, 2u);
  }
}

// The target file changes after the decision (the trainer wrote the next
// step over it): root.baseline took the target's bits while the refit
// streamed, so the relays and the baseline commit the bits the relays
// verified, and the history keeps the delta.
TEST_F(RelayTreeTest, ATargetChangedAfterTheDecisionChangesNothing) {
  SeedAll(0);
  StartAll();
  std::string a = *ReadFileToString(Ckpt(0)), b = *ReadFileToString(Ckpt(1));
  ASSERT_EQ(a.size(), b.size());
  size_t at = a.size() - 1;
  while (at > 0 && a[at] == b[at]) --at;
  ASSERT_NE(a[at], b[at]);
  std::string v1_copy;
  auto refit = RefitToACopyOfV1("coord.before_commit=delay(1500)", &v1_copy);
  const std::string decisions = dir_.Path("state/decisions");
  ASSERT_TRUE(WaitUntil([&] {
    std::error_code ec;
    return std::filesystem::exists(decisions, ec) &&
           !std::filesystem::is_empty(decisions, ec);
  })) << "no decision within 30 s";
  {
    std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(b[at] ^ 0x01));
  }
  RefitReport r = refit.get();
  DisarmFailpoints();
  EXPECT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(r.reason, "");
  EXPECT_GT(r.baseline_in_stream_seconds, 0);
  const Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  bool recorded = false;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(dir_.Path("state/history"), ec)) {
    recorded |= e.path().filename().string().find("000000000001-") == 0;
  }
  EXPECT_TRUE(recorded) << "no history file for step 1";
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

// The target file changes while the refit runs, after the baseline took
// some of its bits: the refit aborts before deciding and root.baseline goes
// back to the base from its undo log (the history record) and the target.
// Replaced by a rename (how checkpoints are written), the mapped old file
// still holds the bits the baseline took: restored at once, checked by
// digest. Rewritten in place, the undo cannot be exact: the baseline stays
// flagged until the file is put back and --resume restores it.
class TargetChangedTest : public RelayTreeTest,
                          public ::testing::WithParamInterface<bool> {};

TEST_P(TargetChangedTest, DuringTheRefitAbortsAndRestoresTheBase) {
  const bool in_place = GetParam();
  SeedAll(0);
  StartAll();
  std::string v1_copy;
  auto refit = RefitToACopyOfV1("coord.after_stream=delay(1500)", &v1_copy);
  // The baseline flags the refit before its first write (this model's
  // writes all come at the end of the stream); then the failpoint holds
  // the run before the vote while the target changes.
  const std::string record = dir_.Path("base.safetensors.dcr-version");
  ASSERT_TRUE(WaitUntil([&] {
    auto rec = ReadVersionRecord(record);
    return rec.ok() && *rec && (*rec)->in_progress.has_value();
  })) << "root.baseline never flagged the refit";
  std::string v1 = *ReadFileToString(Ckpt(1));
  std::string changed = v1;
  changed.back() = static_cast<char>(changed.back() ^ 0x7f);
  if (in_place) {
    std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put(changed.back());
  } else {
    ASSERT_TRUE(WriteFileAtomic(v1_copy, std::as_bytes(std::span(changed)))
                    .ok());  // tmp + rename
  }
  RefitReport r = refit.get();
  DisarmFailpoints();
  EXPECT_EQ(r.outcome, RefitOutcome::kAborted) << r.ToJson();
  EXPECT_THAT(r.reason, ::testing::HasSubstr("changed during the refit"));
  const Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
  }
  auto rec = ReadVersionRecord(record);
  ASSERT_TRUE(rec.ok() && *rec);
  if (in_place) {
    // Flagged, and resumable once the target holds its bits again.
    EXPECT_TRUE((*rec)->in_progress.has_value());
    EXPECT_TRUE(std::filesystem::exists(dir_.Path("state/current.json")));
    EXPECT_FALSE(RunRefit(OptionsFor(1)).ok());
    {
      std::fstream f(v1_copy, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-1, std::ios::end);
      f.put(v1.back());
    }
    RefitOptions o = ResumeOptions();
    auto resumed = ResumeRefit(o);
    ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
    EXPECT_EQ(resumed->outcome, RefitOutcome::kAborted);
    rec = ReadVersionRecord(record);
    ASSERT_TRUE(rec.ok() && *rec);
  }
  EXPECT_FALSE((*rec)->in_progress.has_value());
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("state/current.json")));
  EXPECT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
}

INSTANTIATE_TEST_SUITE_P(ReplacedOrRewritten, TargetChangedTest,
                         ::testing::Values(false, true),
                         [](const auto& param_info) {
                           return param_info.param ? "InPlace" : "Renamed";
                         });

TEST_F(RelayTreeTest, BaseMismatchAbortsAndLeavesEveryStoreAtItsBase) {
  SeedAll(0);
  Seed("a1", 1);  // holds other bits than the baseline
  StartAll();
  RefitReport r = Refit(1);
  EXPECT_EQ(r.outcome, RefitOutcome::kAborted);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kNeedsCatchUp);
  EXPECT_EQ(Node(r, "a1")->phase, "plan");
  EXPECT_EQ(r.chunks, 0u);  // nothing sent before min_commit could be met
  Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    if (n != "a1") {
      EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
    }
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
}

TEST_F(RelayTreeTest, MinCommitLetsTheRestCommitAndReportsTheStaleNode) {
  SeedAll(0);
  Seed("a1", 1);
  StartAll();
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_FALSE(Node(r, "a1")->committed);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kNeedsCatchUp);
  // a1 forwards to its subtree although it does not apply.
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;  // a1 was already at v1 bits
    if (n != "a1") {
      EXPECT_TRUE(Node(r, n)->committed) << n;
    }
  }
  EXPECT_FALSE(relays_["a1"]->Stats().committed);  // no record: not bound
}

// A cluster head that is down before the refit starts (its connection is
// refused at PLAN) is routed around like one that fails mid-refit: the root
// adopts its live child, which commits.
TEST_F(RelayTreeTest, AHeadDownAtPlanHasItsLiveChildrenAdopted) {
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b0") StartRelay(n);  // b0 heads cluster cb; b1 is behind it
  }
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_EQ(Node(r, "b0")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b0")->phase, "plan");
  EXPECT_THAT(Node(r, "b0")->detail,
              ::testing::HasSubstr("its children were adopted"));
  EXPECT_EQ(r.adoptions, 1u) << r.ToJson();  // b1, once: no rejoin tries
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a0", "a1", "a2", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

// A whole cluster down at PLAN: the root adopts b1, which cannot be reached
// either. Neither took the plan, so neither is tried again (the vote does
// not wait for rejoin tries); b1 is reported unreachable, not split.
TEST_F(RelayTreeTest, AClusterDownAtPlanIsReportedWithoutRejoinTries) {
  SeedAll(0);
  for (const char* n : {"a0", "a1", "a2"}) StartRelay(n);
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/3);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_THAT(Node(r, "b0")->detail,
              ::testing::HasSubstr("its children were adopted"));
  EXPECT_EQ(Node(r, "b1")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b1")->detail.find("adopted"), std::string::npos)
      << Node(r, "b1")->detail;
  EXPECT_EQ(r.adoptions, 1u) << r.ToJson();
}

// A leaf that is down at PLAN has nobody to hand on: it is reported alone.
TEST_F(RelayTreeTest, ALeafDownAtPlanIsReportedUnreachable) {
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b1") StartRelay(n);
  }
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  EXPECT_EQ(Node(r, "b1")->code, NodeCode::kUnreachable);
  EXPECT_EQ(Node(r, "b1")->phase, "plan");
  EXPECT_EQ(Node(r, "b1")->detail.find("adopted"), std::string::npos);
  EXPECT_EQ(r.adoptions, 0u) << r.ToJson();
}

TEST_F(RelayTreeTest, AMissingStoreIsSeededByTheNextRefit) {
  SeedAll(0);
  std::filesystem::remove(StorePath("b1"));
  StartAll();
  EXPECT_EQ(relays_["b1"]->Stats().state, "no store");
  // A delta refit (min_commit: all) counts the missing store as one the
  // root seeds, commits the others, then seeds b1 with a dense copy.
  RefitReport delta = Refit(1);
  ASSERT_EQ(delta.outcome, RefitOutcome::kCommitted) << delta.reason;
  ASSERT_EQ(delta.catch_up.size(), 1u);
  EXPECT_EQ(delta.catch_up[0].method, "seed");
  EXPECT_EQ(delta.catch_up[0].nodes, std::vector<std::string>{"b1"});
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  // The tree continues with deltas from there.
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(2))) << n;
  }
}

TEST_F(RelayTreeTest, CorruptChunkOnOneLinkIsResentByTheParentAndCommits) {
  SeedAll(0);
  StartAll();
  // The 5th frame from a0 to its first child is corrupted: the child's
  // decoder refuses it and closes the link. a0 connects to a1 again (an
  // adoption); a1 says which chunk it took last and a0 resends the rest
  // from its resend buffer: no repair round.
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(network_->Stats("a0", "a1").frames_corrupted, 1u);
  EXPECT_EQ(r.repair_rounds, 0);
  RelayStats a0 = relays_["a0"]->Stats();
  EXPECT_GT(a0.resent_chunks, 0u);
  EXPECT_GT(a0.resent_bytes, 0u);
  EXPECT_EQ(a0.resend_misses, 0u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, CorruptChunkWithoutAResendBufferIsRepairedAndCommits) {
  resend_buffer_bytes_ = 0;
  SeedAll(0);
  StartAll();
  // As above without a resend buffer: a1 misses the chunks in between,
  // votes no naming the tensors that differ, and the root's repair round
  // overwrites them.
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_EQ(network_->Stats("a0", "a1").frames_corrupted, 1u);
  EXPECT_EQ(r.repair_rounds, 1);
  EXPECT_GT(r.repair_bytes, 0u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, WithoutRepairRoundsTheDamagedNodeIsExcluded) {
  resend_buffer_bytes_ = 0;  // nor a resend: a1 keeps what it missed
  SeedAll(0);
  StartAll();
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1, RefitMode::kDelta, /*min_commit=*/4,
                        [](RefitOptions& o) { o.repair_rounds = 0; });
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_EQ(r.repair_rounds, 0);
  EXPECT_FALSE(Node(r, "a1")->committed);
  EXPECT_EQ(Node(r, "a1")->code, NodeCode::kIncomplete);
  EXPECT_EQ(Node(r, "a1")->phase, "vote");
  WaitIdle("a1");
  EXPECT_EQ(DigestOf(StorePath("a1")), DigestOf(Ckpt(0)));  // base restored
  for (const char* n : {"a0", "a2", "b0", "b1"}) {
    EXPECT_TRUE(Node(r, n)->committed) << n;
  }
}

TEST_F(RelayTreeTest, ALinkCutAfterTheVoteIsReconnected) {
  SeedAll(0);
  StartAll();
  // a0's link to the root is cut after three frames (HELLO, PLAN_REPLY,
  // VOTE). The root connects to a0 again (an adoption PLAN for the same
  // refit): a0 repeats its answers, gets COMMIT, and its subtree commits.
  FakeFaults f;
  f.cut_after_frames = 3;
  network_->SetFaults("a0", "root", f);
  RefitReport r = Refit(1);
  EXPECT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  EXPECT_GE(network_->Stats("a0", "root").cuts, 1u);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, SlowChildBackpressureStillDelivers) {
  SeedAll(0);
  StartAll();
  // Every frame towards b1 is delayed: b0's queue to it grows past the
  // window, b0 stops reading from the root, and the root's own window
  // throttles the encoder. Everything still arrives, in order.
  FakeFaults f;
  f.delay = 2ms;
  network_->SetFaults("b0", "b1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

TEST_F(RelayTreeTest, AStoppedMidTreeRelaysChildrenAreAdoptedAndCommit) {
  SeedAll(0);
  StartAll();
  // Frames from a0 to its children arrive late, so the refit is still
  // streaming into a0's subtree when a0 stops.
  FakeFaults slow;
  slow.delay = 100ms;
  network_->SetFaults("a0", "a1", slow);
  network_->SetFaults("a0", "a2", slow);
  auto refit = std::async(std::launch::async, [&] {
    return Refit(1, RefitMode::kDelta, /*min_commit=*/4);
  });
  for (int i = 0; i < 1000 && relays_["a0"]->Stats().chunks_received == 0;
       ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_GT(relays_["a0"]->Stats().chunks_received, 0u);
  relays_["a0"]->Stop();  // restores its own base
  // The root cannot reach a0 again, so it adopts a1 and a2; they vote no
  // (chunks missed), get a repair round and commit. a0 is excluded.
  RefitReport r = refit.get();
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_EQ(Node(r, "a0")->code, NodeCode::kUnreachable);
  EXPECT_NE(Node(r, "a0")->detail.find("children were adopted"),
            std::string::npos)
      << Node(r, "a0")->detail;
  EXPECT_GE(r.adoptions, 3u);  // a0 again, then a1 and a2
  relays_.erase("a0");         // release its store lock
  EXPECT_EQ(DigestOf(StorePath("a0")), DigestOf(Ckpt(0)));
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a1", "a2", "b0", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, ASilentRelayIsFoundByHeartbeatsAndRoutedAround) {
  SeedAll(0);
  prepared_wait_ = 1s;
  StartAll();
  // Once a0 took the plan it stops talking to the root both ways (as if
  // its process were stopped): the root hears no heartbeat for 4
  // intervals, cannot adopt a0 again (the new link is held too), and
  // adopts a1 and a2, which leave a0 (the root is above it) and commit.
  FakeFaults slow;
  slow.delay = 50ms;
  network_->SetFaults("a0", "a1", slow);
  network_->SetFaults("a0", "a2", slow);
  RefitReport r = RefitWithA0Silenced(3s);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_FALSE(Node(r, "a0")->committed);
  EXPECT_EQ(Node(r, "a0")->code, NodeCode::kTimeout) << Node(r, "a0")->detail;
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const char* n : {"a1", "a2", "b0", "b1"}) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  // a0, orphaned and not adopted, restores its base (after the phase
  // timeout, or prepared_wait once it voted).
  for (int i = 0; i < 500 && relays_["a0"]->Stats().state != "idle"; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  WaitIdle("a0");
  EXPECT_EQ(DigestOf(StorePath("a0")), DigestOf(Ckpt(0)));
}

// a0 stops hearing anyone, as a stopped process would: first its parent
// (it orphans itself: it adopts nobody while it has no parent), then its
// children (they fail while a0 is an orphan). The root tries a0 again;
// the links come back before that try times out, so a0 is adopted, and
// then recovers its children (once, they were given up for good and the
// refit went on without them).
TEST_F(RelayTreeTest, AHeadAdoptedAfterItsLinksFellSilentRecoversItsChildren) {
  SeedAll(0);
  StartAll();
  auto refit = std::async(std::launch::async, [&] {
    return Refit(1, RefitMode::kDelta, /*min_commit=*/4, [](RefitOptions& o) {
      o.heartbeat = 100ms;
      o.connect_timeout = 4s;
    });
  });
  for (int i = 0; i < 1000 && relays_["a0"]->Stats().state == "idle"; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  network_->Pause("a0", "root");
  network_->Pause("root", "a0");
  std::this_thread::sleep_for(250ms);  // a0 finds its parent silent first
  for (const char* c : {"a1", "a2"}) {
    network_->Pause("a0", c);
    network_->Pause(c, "a0");
  }
  // a0 is an orphan at 0.4 s, its children fail at 0.65 s; the root tries
  // a0 again at about 0.45 s and gives that try 4 s.
  std::this_thread::sleep_for(1200ms);
  for (const char* c : {"root", "a1", "a2"}) {
    network_->Resume("a0", c);
    network_->Resume(c, "a0");
  }
  RefitReport r = refit.get();
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
}

TEST_F(RelayTreeTest, AnOrphanTakesTheNextRefitAndCatchesUp) {
  SeedAll(0);
  StartAll();
  // As above: a0 falls silent once it took the plan and is routed around.
  // It waits to be adopted for as long as the phase may last (30 s).
  RefitReport r = RefitWithA0Silenced(30s);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
  EXPECT_FALSE(Node(r, "a0")->committed);
  // a0 is still an orphan of that run, but the next coordinator run (a
  // higher epoch) replaces it: a0 restores its base, takes the plan,
  // answers needs catch-up (it holds v0, the base is v1), counts towards
  // min_commit (all) as it will catch up, and is caught up from the
  // history after the commit.
  EXPECT_NE(relays_["a0"]->Stats().state, "idle");
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.ToJson();
  ASSERT_EQ(next.catch_up.size(), 1u) << next.ToJson();
  EXPECT_EQ(next.catch_up[0].method, "history");
  EXPECT_EQ(next.catch_up[0].nodes, std::vector<std::string>{"a0"});
  Digest128 v2 = DigestOf(Ckpt(2));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v2) << n;
  }
}

// A history file torn after its header (a crash mid-write, a bad disk) is
// moved to history/quarantine/ and treated as absent: the relay that
// needed it is caught up with a dense copy, and the refit commits.
TEST_F(RelayTreeTest,
       ATornHistoryFileIsQuarantinedAndTheNextRefitStillCommits) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  for (const auto& n : kRelays) WaitIdle(n);
  // a2 (a leaf) misses the refit to step 2 (its relay is down).
  relays_.erase("a2");
  RefitReport two = Refit(2, RefitMode::kDelta, /*min_commit=*/4);
  ASSERT_EQ(two.outcome, RefitOutcome::kPartial) << two.ToJson();
  const std::string history = dir_.Path("state/history");
  std::string torn;
  for (const auto& e : std::filesystem::directory_iterator(history)) {
    if (e.path().filename().string().rfind("000000000002-", 0) == 0) {
      torn = e.path().string();
    }
  }
  ASSERT_FALSE(torn.empty());
  std::filesystem::resize_file(torn, kDeltaHeaderBytes + 10);
  // a2 comes back at step 1; the next refit (to step 3, v0's bits) finds
  // it behind, and the chain from step 1 runs through the torn file.
  StartRelay("a2");
  RefitReport three = Refit(0);
  ASSERT_EQ(three.outcome, RefitOutcome::kCommitted) << three.ToJson();
  ASSERT_EQ(three.catch_up.size(), 1u) << three.ToJson();
  EXPECT_EQ(three.catch_up[0].method, "dense");
  EXPECT_EQ(three.catch_up[0].nodes, std::vector<std::string>{"a2"});
  EXPECT_FALSE(std::filesystem::exists(torn));
  EXPECT_TRUE(
      std::filesystem::exists(history + "/quarantine/" +
                              std::filesystem::path(torn).filename().string()));
  Digest128 v3 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v3) << n;
  }
}

TEST_F(RelayTreeTest, ShmStoreIsSeededAndRefitLikeAFileStore) {
  // b1 keeps its weights in POSIX shared memory, as a serving process on
  // the node would map them: created by a full refit, then refit in place.
  std::string name = "/dcr-tree-test-" + std::to_string(::getpid());
  StoreSpec spec = *ParseStoreSpec("shm:" + name);
  ASSERT_TRUE(RemoveStore(spec).ok());
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n != "b1") StartRelay(n);
  }
  // Its undo logs go to a directory of their own (on a disk, in real use),
  // which Start checks.
  {
    RelayOptions bad;
    bad.name = "b1";
    bad.store = spec;
    bad.transport = "fake";
    bad.transport_options.fake_network = network_;
    bad.undo_dir = dir_.Path("no-such-dir");
    auto r = Relay::Start(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::HasSubstr("undo directory '" + bad.undo_dir + "'"));
  }
  undo_dir_ = dir_.Path("undo");
  ASSERT_TRUE(std::filesystem::create_directory(undo_dir_));
  StartRelay("b1", "shm:" + name);
  undo_dir_.clear();
  EXPECT_EQ(relays_["b1"]->Stats().state, "no store");
  RefitReport seed = Refit(0, RefitMode::kFull);
  ASSERT_EQ(seed.outcome, RefitOutcome::kCommitted) << seed.reason;
  WaitIdle("b1");
  EXPECT_EQ(DigestOf("/dev/shm" + name), DigestOf(Ckpt(0)));
  RefitReport delta = Refit(1);
  ASSERT_EQ(delta.outcome, RefitOutcome::kCommitted) << delta.reason;
  WaitIdle("b1");
  EXPECT_EQ(DigestOf("/dev/shm" + name), DigestOf(Ckpt(1)));
  relays_.clear();
  EXPECT_TRUE(RemoveStore(spec).ok());
  // The relay's epoch file is its own, beside the store's record: not the
  // store's to remove.
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::remove("/dev/shm" + name + ".dcr-epoch", ec))
      << ec.message();
}

TEST_F(RelayTreeTest, OlderCoordinatorEpochIsFencedAcrossRelayRestarts) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);  // epoch 1
  // The relays restart: the epoch they accepted is on disk beside the store.
  relays_.clear();
  StartAll();
  EXPECT_TRUE(std::filesystem::exists(StorePath("a0") + ".dcr-epoch"));
  // A coordinator whose state_dir is behind (a stale copy, or an old
  // process waking up) runs at epoch 1 again: nobody takes its plan.
  std::filesystem::remove(dir_.Path("state/epoch"));
  RefitReport stale = Refit(2);
  EXPECT_EQ(stale.epoch, 1u);
  EXPECT_EQ(stale.outcome, RefitOutcome::kAborted);
  EXPECT_EQ(stale.chunks, 0u);
  for (const auto& n : kRelays) {
    const NodeOutcome* o = Node(stale, n);
    EXPECT_EQ(o->code, NodeCode::kRejected) << n;
    EXPECT_EQ(o->phase, "plan") << n;
    // The heads refuse for their whole subtree.
    EXPECT_NE(
        o->detail.find(n == "a0" || n == "b0" ? "stale coordinator epoch 1"
                                              : "which refused the plan"),
        std::string::npos)
        << n << ": " << o->detail;
  }
  // Refusing subtrees are not waited for in later phases.
  EXPECT_LT(stale.total_seconds, 5.0);
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  // Past the relays' epoch, the same refit goes through.
  std::ofstream(dir_.Path("state/epoch")) << "7\n";
  RefitReport r = Refit(2);
  EXPECT_EQ(r.epoch, 8u);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
}

TEST_F(RelayTreeTest, FullRefitOfANamedNodeSeedsItAtTheCurrentVersion) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  // a1 loses its store; only a1 is refit, from the root, at step 1.
  relays_.erase("a1");
  std::filesystem::remove(StorePath("a1"));
  std::filesystem::remove(StorePath("a1") + ".dcr-version");
  StartRelay("a1");
  auto only_a1 = [](RefitOptions& o) { o.only_nodes = {"a1"}; };
  // The target must be the tree's current version.
  {
    RefitOptions o = OptionsFor(2);
    o.mode = RefitMode::kFull;
    only_a1(o);
    auto bad = RunRefit(o);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("must hold the bits of "
                                          "root.baseline"),
              std::string::npos)
        << bad.status().ToString();
    o.target = Ckpt(1);
    o.only_nodes = {"a9"};
    bad = RunRefit(o);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("no relay named 'a9'"),
              std::string::npos);
  }
  Digest128 base_before = DigestOf(dir_.Path("base.safetensors"));
  RefitReport r = Refit(1, RefitMode::kFull, 0, only_a1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.ToJson();
  ASSERT_EQ(r.nodes.size(), 1u);
  EXPECT_EQ(r.nodes[0].node, "a1");
  EXPECT_EQ(r.target.step, 1u);
  WaitIdle("a1");
  EXPECT_EQ(DigestOf(StorePath("a1")), DigestOf(Ckpt(1)));
  EXPECT_EQ(*relays_["a1"]->Stats().committed, r.target);
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), base_before);
  // The tree moves on together.
  RefitReport next = Refit(2);
  ASSERT_EQ(next.outcome, RefitOutcome::kCommitted) << next.reason;
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(2))) << n;
  }
}

TEST_F(RelayTreeTest, ResumeCommitsWhatTheStoppedCoordinatorDecided) {
  SeedAll(0);
  StartAll();
  RefitReport stopped = Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.TEST_crash_after_decision = true;
  });
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("state/current.json")));
  // The relays voted and wait for the decision (prepared), at the target's
  // bits but not committed.
  for (const auto& n : kRelays) {
    for (int i = 0; i < 500 && relays_[n]->Stats().state != "voted"; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(relays_[n]->Stats().state, "voted") << n;
    EXPECT_FALSE(relays_[n]->Stats().committed.has_value()) << n;
  }
  // root.baseline took the target's bits while streaming and still flags
  // the refit in progress: nothing is committed before the decision is
  // carried out.
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), DigestOf(Ckpt(1)));
  {
    auto rec = ReadVersionRecord(dir_.Path("base.safetensors.dcr-version"));
    ASSERT_TRUE(rec.ok() && *rec && (*rec)->in_progress);
    EXPECT_EQ((*rec)->in_progress->refit, stopped.refit);
  }
  RefitOptions o = ResumeOptions();
  auto r = ResumeRefit(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, RefitOutcome::kCommitted) << r->ToJson();
  EXPECT_EQ(r->refit, stopped.refit);
  EXPECT_GT(r->epoch, stopped.epoch);
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("state/current.json")));
  Digest128 v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    EXPECT_EQ(*relays_[n]->Stats().committed, stopped.target) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v1);
  // Nothing left to resume; the tree moves on.
  EXPECT_TRUE(ResumeRefit(o).status().IsNotFound());
  EXPECT_EQ(Refit(2).outcome, RefitOutcome::kCommitted);
}

TEST_F(RelayTreeTest, ResumeWithoutADecisionAbortsAndRestoresEveryBase) {
  SeedAll(0);
  StartAll();
  RefitReport stopped = Refit(1, RefitMode::kDelta, 0, [](RefitOptions& o) {
    o.TEST_crash_after_decision = true;
  });
  // As if it had stopped just before writing its decision.
  std::filesystem::remove(
      dir_.Path("state/decisions/" + stopped.refit.ToHex() + ".json"));
  RefitOptions o = ResumeOptions();
  auto r = ResumeRefit(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, RefitOutcome::kAborted) << r->ToJson();
  Digest128 v0 = DigestOf(Ckpt(0));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  EXPECT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
}

TEST_F(RelayTreeTest, PlanForAnotherNodeIsRefused) {
  SeedAll(0);
  StartAll();
  // Swap a1 and a2's names in the topology: a1's address now gets a2's
  // plan, which names a2.
  Topology topo = MakeTopology(/*min_commit=*/1);
  for (auto& c : topo.clusters) {
    for (auto& n : c.nodes) {
      if (n.name == "a1")
        n.host = "a2";
      else if (n.name == "a2")
        n.host = "a1";
    }
  }
  RefitOptions o;
  o.topology = topo;
  o.target = Ckpt(1);
  o.phase_timeout = 10s;
  o.transport = "fake";
  o.transport_options.fake_network = network_;
  auto r = RunRefit(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, RefitOutcome::kPartial);
  EXPECT_EQ(Node(*r, "a1")->code, NodeCode::kRejected);
  EXPECT_EQ(Node(*r, "a2")->code, NodeCode::kRejected);
}

// Re-parenting within the fanout, and the resend buffer, on a deeper tree:
// one cluster of seven relays under fanout 2 (c0 -> c1, c2; c1 -> c3, c4;
// c2 -> c5, c6) and a step that changes every element of a 16 MB tensor,
// so that the windows (1 MiB, the least a plan gets) hold the stream back
// behind a stalled relay.
class ReparentTest : public RelayTreeTest {
 protected:
  void SetUp() override {
    RelayTreeTest::SetUp();
    infos_ = {{"big.w", DType::kBF16, {8u << 20}}};
    std::mt19937 rng(11);
    Bytes b(infos_[0].NumBytes());
    for (auto& x : b) x = static_cast<std::byte>(rng());
    Write(Big(0), {b});
    for (size_t i = 0; i < b.size(); i += 2) {
      b[i] ^= static_cast<std::byte>(1 + rng() % 255);
    }
    Write(Big(1), {b});
    for (const auto& n : kNodes) {
      std::filesystem::copy_file(Big(0), StorePath(n));
    }
    std::filesystem::copy_file(
        Big(0), dir_.Path("base.safetensors"),
        std::filesystem::copy_options::overwrite_existing);
  }
  std::string Big(int v) const {
    return dir_.Path("big" + std::to_string(v) + ".safetensors");
  }
  RefitOptions Options() {
    std::string yaml = fmt::format(
        R"(version: 1
defaults: {{span_elems: 65536, fanout: 2, window_bytes: 1MiB, min_commit: 6}}
root: {{name: root, host: root, port: 1, cluster: train,
       state_dir: "{}", baseline: "{}"}}
clusters:
  - name: train
  - name: cc
    bandwidth: 10Gbps
    fanout: 2
    nodes:
)",
        dir_.Path("state"), dir_.Path("base.safetensors"));
    for (const auto& n : kNodes) {
      yaml += fmt::format(
          "      - {{name: {0}, host: {0}, port: 2, store: {{kind: file, "
          "path: \"{1}\"}}}}\n",
          n, StorePath(n));
    }
    yaml += "links:\n  - {from: train, to: cc, bandwidth: 1Gbps}\n";
    auto topo = ParseTopology(yaml, "test.yaml");
    EXPECT_TRUE(topo.ok()) << topo.status().ToString() << "\n" << yaml;
    RefitOptions o;
    if (topo.ok()) o.topology = *topo;
    o.target = Big(1);
    o.phase_timeout = 10s;
    o.threads = 2;
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    return o;
  }
  void WaitFor(const std::function<bool()>& done, const std::string& what) {
    for (int i = 0; i < 6000 && !done(); ++i) {
      std::this_thread::sleep_for(5ms);
    }
    ASSERT_TRUE(done()) << what;
  }
  // Streams v0 -> v1 and stops c1 mid-stream: frames from c1 to its
  // children arrive 2 s late, so c1's queues fill past the window and
  // backpressure holds the rest of the stream (END too) above it; then c1
  // stops, and c0 re-parents c3 and c4, which miss what c1 held.
  // With `phase_timeout`, c1 stops no earlier than `not_before` after the
  // refit began; `tweak` changes the refit's options.
  RefitReport StopC1MidStream(
      std::optional<std::chrono::seconds> phase_timeout = std::nullopt,
      std::chrono::milliseconds not_before = 0ms,
      const std::function<void(RefitOptions&)>& tweak = {}) {
    for (const auto& n : kNodes) StartRelay(n);
    FakeFaults late;
    late.delay = 2s;
    network_->SetFaults("c1", "c3", late);
    network_->SetFaults("c1", "c4", late);
    RefitOptions o = Options();
    if (phase_timeout) o.phase_timeout = *phase_timeout;
    if (tweak) tweak(o);
    auto started = std::chrono::steady_clock::now();
    auto refit = std::async(std::launch::async, [&] { return RunRefit(o); });
    WaitFor(
        [&] {
          for (const auto& [child, bytes] :
               relays_["c1"]->Stats().child_queue_bytes) {
            // Half the window: every queued byte is a chunk c3 and c4
            // have not got (their links are 2 s late). The queue hovers
            // at the window while backpressure holds the stream, so a
            // check for more than the window can miss it for seconds.
            if (bytes >= (1u << 19)) return true;
          }
          return false;
        },
        "c1's queue did not fill");
    std::this_thread::sleep_until(started + not_before);
    EXPECT_EQ(relays_["c0"]->Stats().state, "receiving");
    relays_["c1"]->Stop();
    auto r = refit.get();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : RefitReport();
  }
  void ExpectEveryoneButC1Committed(const RefitReport& r) {
    ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.ToJson();
    // Every node reported once.
    ASSERT_EQ(r.nodes.size(), kNodes.size()) << r.ToJson();
    for (const auto& n : kNodes) {
      ASSERT_NE(Node(r, n), nullptr) << n;
    }
    EXPECT_FALSE(Node(r, "c1")->committed);
    EXPECT_EQ(Node(r, "c1")->code, NodeCode::kUnreachable);
    Digest128 v1 = DigestOf(Big(1));
    for (const auto& n : kNodes) {
      if (n == "c1") continue;
      WaitIdle(n);
      EXPECT_TRUE(Node(r, n)->committed) << n << ": " << Node(r, n)->detail;
      EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
    }
  }
  // No relay had more children at once than its capacity: 2 everywhere
  // (fanout 2). c0 took c3 into c1's slot and placed c4 under c3.
  void ExpectFanoutKept() {
    for (const auto& n : kNodes) {
      if (n == "c1") continue;
      EXPECT_LE(relays_[n]->Stats().peak_children, 2u) << n;
    }
    EXPECT_EQ(relays_["c0"]->Stats().peak_children, 2u);
    EXPECT_EQ(relays_["c3"]->Stats().peak_children, 1u);
    EXPECT_EQ(relays_["c4"]->Stats().peak_children, 0u);
    // c1 again, c3, and c4 placed under c3.
    EXPECT_EQ(relays_["c0"]->Stats().adoptions, 3u);
  }

  const std::vector<std::string> kNodes = {"c0", "c1", "c2", "c3",
                                           "c4", "c5", "c6"};
};

TEST_F(ReparentTest, OrphansArePlacedWithinFanoutAndResentWhatTheyMissed) {
  resend_buffer_bytes_ = 64 << 20;  // all of it
  RefitReport r = StopC1MidStream();
  ExpectEveryoneButC1Committed(r);
  ExpectFanoutKept();
  // c0 resent what c1 had not passed on, from its buffer (c3 passed it on
  // to c4, or resent it from its own): no repair round. c3 takes c0's
  // resends after live chunks, so what it forwards to c4 while adopting
  // it is out of order; its resend to c4 skips exactly what went on c4's
  // link (a single "first chunk" bound once lost chunks here under load).
  EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
  RelayStats c0 = relays_["c0"]->Stats();
  EXPECT_GT(c0.resent_chunks, 0u);
  EXPECT_GT(c0.resent_bytes, 0u);
  EXPECT_EQ(c0.resend_misses, 0u);
}

// The plan phase's deadline is long past when c1 stops: c0 adopts c3 and
// c4 all the same (once a stale deadline failed each adoption at once, and
// the refit aborted when a loaded machine filled c1's queue slowly).
TEST_F(ReparentTest, OrphansAreAdoptedAfterThePlanPhaseDeadline) {
  resend_buffer_bytes_ = 64 << 20;
  // Planning takes 2 s (c1's PLANs to c3 and c4 are late); c0's plan
  // deadline is 0.8 x 7 s, c1's for c3 and c4 0.8 x 0.8 x 7 s = 4.5 s.
  RefitReport r = StopC1MidStream(7s, 6500ms);
  ExpectEveryoneButC1Committed(r);
  ExpectFanoutKept();
  EXPECT_EQ(r.repair_rounds, 0) << r.ToJson();
}

// Without heartbeats only the connect timeout bounds an adoption while
// chunks flow (there is no phase deadline then): c0 adopts c3, which never
// answers (the fake links between them are paused both ways), and c0
// drops it after its connect timeout instead of holding the tree behind
// c3's full queue for good.
TEST_F(ReparentTest, WithoutHeartbeatsAnAdoptionThatNeverAnswersTimesOut) {
  resend_buffer_bytes_ = 64 << 20;
  network_->Pause("c0", "c3");
  network_->Pause("c3", "c0");
  auto t0 = std::chrono::steady_clock::now();
  RefitReport r = StopC1MidStream(std::nullopt, 0ms, [](RefitOptions& o) {
    o.heartbeat = 0ms;
    o.phase_timeout = 30s;
  });
  network_->Resume("c0", "c3");
  network_->Resume("c3", "c0");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 25s) << r.ToJson();
  ASSERT_NE(Node(r, "c3"), nullptr) << r.ToJson();
  EXPECT_FALSE(Node(r, "c3")->committed);
  EXPECT_THAT(r.ToJson(), ::testing::HasSubstr("did not accept the adoption"));
  // The rest of the tree went on without c3.
  for (const char* n : {"c0", "c2", "c5", "c6"}) {
    ASSERT_NE(Node(r, n), nullptr) << n;
    EXPECT_EQ(Node(r, n)->code, NodeCode::kOk) << n << ": " << r.ToJson();
  }
}

TEST_F(ReparentTest, ATinyResendBufferFallsBackToTheRepairRound) {
  resend_buffer_bytes_ = 64;  // smaller than any CHUNK frame: keeps none
  RefitReport r = StopC1MidStream();
  ExpectEveryoneButC1Committed(r);
  ExpectFanoutKept();
  EXPECT_GE(r.repair_rounds, 1) << r.ToJson();
  EXPECT_GT(r.repair_bytes, 0u);
  RelayStats c0 = relays_["c0"]->Stats();
  EXPECT_EQ(c0.resent_chunks, 0u);
  EXPECT_GE(c0.resend_misses, 1u);
}

}  // namespace
}  // namespace dcr

namespace dcr {
namespace {

// Going back to earlier bits (v1 -> v2 -> v1's bits as step 3): a relay
// that missed step 2 holds step 1, the same bits as the target. Its
// catch-up composes masks that cancel: it is relabelled to step 3 with
// nothing sent, reported as coming from step 1 (not a dense copy from
// "step 0").
TEST_F(RelayTreeTest, ARelayAlreadyHoldingTheTargetBitsIsRelabelled) {
  SeedAll(0);
  StartAll();
  ASSERT_EQ(Refit(1).outcome, RefitOutcome::kCommitted);
  for (const auto& n : kRelays) WaitIdle(n);
  relays_.erase("a2");
  ASSERT_EQ(Refit(2, RefitMode::kDelta, /*min_commit=*/4).outcome,
            RefitOutcome::kPartial);
  StartRelay("a2");
  RefitReport three = Refit(1);  // step 3, v1's bits
  ASSERT_EQ(three.outcome, RefitOutcome::kCommitted) << three.ToJson();
  EXPECT_EQ(three.target.step, 3u);
  ASSERT_EQ(three.catch_up.size(), 1u) << three.ToJson();
  const CatchUpReport& c = three.catch_up[0];
  EXPECT_EQ(c.method, "history");
  EXPECT_EQ(c.nodes, std::vector<std::string>{"a2"});
  EXPECT_EQ(c.from.step, 1u);
  EXPECT_EQ(c.from.digest, DigestOf(Ckpt(1)));
  EXPECT_EQ(c.chunks, 0u);
  EXPECT_EQ(c.payload_bytes, 0u);
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

}  // namespace
}  // namespace dcr
