// Re-parenting and the resend buffer on a deeper tree (fake transport).
#include "relay_tree_fixture.h"

namespace dcr {
namespace {

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
namespace {}  // namespace
}  // namespace dcr
