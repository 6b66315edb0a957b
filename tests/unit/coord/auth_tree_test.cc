// Frame authentication in a running tree: real Relay engines and RunRefit
// over the fake transport, keyed with HMAC-SHA256 from key files. Nodes
// with the key refit as usual; a node without it, or with another key, is
// cut off at its first frame; an endpoint without the key that talks to a
// relay directly (a forged PLAN) changes nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "coord/coordinator.h"
#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "protocol/messages.h"
#include "relay/relay.h"
#include "testing/temp_dir.h"
#include "transport/fake_transport.h"
#include "wire/hmac_authenticator.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;
using Key = std::shared_ptr<const FrameAuthenticator>;
using namespace std::chrono_literals;

const std::vector<std::string> kRelays = {"a0", "a1", "a2", "b0", "b1"};

// The client end of a link opened by a test: records what arrives.
class Recorder : public LinkHandler {
 public:
  void OnFrame(Link&, const Frame& frame, const FrameBuffer&) override {
    std::lock_guard lock(mu_);
    types_.push_back(frame.type());
    cv_.notify_all();
  }
  void OnClosed(Link&, const Status& why) override {
    std::lock_guard lock(mu_);
    closed_ = true;
    why_ = why;
    cv_.notify_all();
  }
  // True once the link closed, or `n` frames arrived, within `timeout`.
  bool WaitClosed(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return closed_; });
  }
  bool WaitFrames(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return types_.size() >= n; });
  }
  std::vector<FrameType> types() {
    std::lock_guard lock(mu_);
    return types_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FrameType> types_;
  bool closed_ = false;
  Status why_;
};

class AuthTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    infos_ = {{"layer.0.w", DType::kBF16, {30000}},
              {"layer.1.w", DType::kBF16, {20000}},
              {"norm", DType::kF32, {2000}}};
    std::mt19937 rng(11);
    std::vector<Bytes> data;
    for (const auto& t : infos_) {
      Bytes b(t.NumBytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
      data.push_back(std::move(b));
    }
    for (int v = 0; v < 3; ++v) {
      Write(Ckpt(v), data);
      for (auto& b : data) {
        for (size_t i = rng() % 64; i < b.size(); i += 1 + rng() % 64) {
          b[i] ^= std::byte{1};
        }
      }
    }
    network_ = FakeNetwork::Create();
    key_file_ = WriteKey("tree.key", 1);
    other_key_file_ = WriteKey("other.key", 2);
  }
  void TearDown() override {
    relays_.clear();
    network_.reset();
  }

  // A key file of 32 random bytes, mode 0600.
  std::string WriteKey(const std::string& name, uint32_t seed) {
    std::mt19937 rng(seed);
    std::string bytes(32, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    std::string path = dir_.Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
    return path;
  }
  // Each node loads the file itself, as each process does.
  Key Load(const std::string& path) {
    auto k = LoadFrameKey(path);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return k.ok() ? *k : nullptr;
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
  void SeedAll(int v) {
    for (const auto& n : kRelays) {
      std::filesystem::copy_file(
          Ckpt(v), StorePath(n),
          std::filesystem::copy_options::overwrite_existing);
    }
    std::filesystem::copy_file(
        Ckpt(v), dir_.Path("base.safetensors"),
        std::filesystem::copy_options::overwrite_existing);
  }

  // The tree of relay_tree_test: ca = a0 -> {a1, a2}, cb = b0 -> b1, with
  // `key_file` as defaults.auth_key_file (empty: none).
  Topology MakeTopology(uint32_t min_commit, const std::string& key_file) {
    std::string yaml = fmt::format(
        R"(version: 1
defaults: {{span_elems: 4096, fanout: 2, window_bytes: 1MiB, min_commit: {}, auth_key_file: "{}"}}
root: {{name: root, host: root, port: 1, cluster: train,
       state_dir: "{}", baseline: "{}"}}
clusters:
  - name: train
  - name: ca
    bandwidth: 10Gbps
    nodes:
)",
        min_commit == 0 ? std::string("all") : std::to_string(min_commit),
        key_file, dir_.Path("state"), dir_.Path("base.safetensors"));
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

  // Starts `node` keyed from `key_file` (empty: no key).
  void StartRelay(const std::string& node, const std::string& key_file) {
    RelayOptions o;
    o.name = node;
    o.store = *ParseStoreSpec("file:" + StorePath(node));
    o.listen_host = node;
    o.listen_port = 2;
    o.transport = "fake";
    o.transport_options.fake_network = network_;
    if (!key_file.empty())
      o.transport_options.frames.authenticator = Load(key_file);
    o.apply_threads = 2;
    o.apply_window_bytes = 256 << 10;
    auto r = Relay::Start(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    relays_[node] = *std::move(r);
  }

  // A refit by a root keyed, as `dcr refit` is, from the topology's
  // auth_key_file; `root_key_file` replaces it when given.
  RefitReport Refit(int target, uint32_t min_commit = 0,
                    std::optional<std::string> root_key_file = std::nullopt) {
    RefitOptions o;
    o.topology = MakeTopology(min_commit, key_file_);
    std::string key = root_key_file.value_or(o.topology.defaults.auth_key_file);
    if (!key.empty()) o.transport_options.frames.authenticator = Load(key);
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
  // A relay cut off from its parent waits to be adopted (up to the plan's
  // phase timeout) before it restores its base and goes idle.
  void WaitIdle(const std::string& node) {
    for (int i = 0; i < 1500; ++i) {
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
    ADD_FAILURE() << "no outcome for " << name;
    static const NodeOutcome kNone;
    return &kNone;
  }
  static bool CutOff(const NodeOutcome* n) {
    return !n->committed && (n->code == NodeCode::kUnreachable ||
                             n->code == NodeCode::kRejected);
  }

  // What an endpoint without the tree's key would send to take over `node`:
  // HELLO as the root, then a PLAN from a coordinator run far in the future
  // (had it been accepted, the relay would refuse the real coordinator's
  // older epoch from then on). `key` signs the frames (null: no tag).
  std::shared_ptr<Recorder> SendForgedPlan(const std::string& node, Key key,
                                           std::unique_ptr<Transport>* out) {
    TransportOptions to;
    to.name = "mallory";
    to.fake_network = network_;
    to.frames.authenticator = std::move(key);
    auto t = network_->CreateTransport(to);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return nullptr;
    auto recorder = std::make_shared<Recorder>();
    auto link = (*t)->Connect(node, 2, recorder, 2s);
    EXPECT_TRUE(link.ok()) << link.status().ToString();
    if (!link.ok()) return nullptr;
    FrameHeader h;
    h.epoch = 1000;
    for (size_t i = 0; i < 16; ++i) h.refit_id.bytes[i] = uint8_t(0xe0 + i);
    h.type = FrameType::kHello;
    auto hello = EncodeFrame(h, EncodeHello(HelloMsg{"root", kRoleRoot, 1000}),
                             to.frames);
    PlanMsg plan;
    plan.mode = RefitMode::kDelta;
    plan.base = Version{0, DigestOf(Ckpt(0))};
    plan.target = Version{1, DigestOf(Ckpt(2))};
    plan.span_elems = 4096;
    plan.chunk_window_bytes = 1 << 20;
    plan.phase_timeout_ms = 2000;
    plan.nodes = {PlanNode{node, node, 2, "tcp", -1}};
    h.type = FrameType::kPlan;
    h.sequence = 1;
    auto plan_frame = EncodeFrame(h, EncodePlan(plan), to.frames);
    EXPECT_TRUE(hello.ok() && plan_frame.ok());
    (*link)->Send(*hello);
    (*link)->Send(*plan_frame);
    *out = *std::move(t);
    return recorder;
  }

  testing::TempDir dir_;
  std::vector<TensorInfo> infos_;
  std::shared_ptr<FakeNetwork> network_;
  std::map<std::string, std::unique_ptr<Relay>> relays_;
  std::string key_file_;
  std::string other_key_file_;
};

TEST_F(AuthTreeTest, SameKeyEverywhereDeltaRefitsCommit) {
  SeedAll(0);
  for (const auto& n : kRelays) StartRelay(n, key_file_);
  for (int v = 1; v <= 2; ++v) {
    RefitReport r = Refit(v);
    ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
    EXPECT_EQ(r.mode, RefitMode::kDelta);
    EXPECT_GT(r.chunks, 0u);
    Digest128 want = DigestOf(Ckpt(v));
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_TRUE(Node(r, n)->committed) << n;
      EXPECT_EQ(DigestOf(StorePath(n)), want) << n;
    }
  }
  // a0 forwarded the root's tagged frames verbatim to its children, whose
  // decoders verified them.
  EXPECT_GT(relays_["a0"]->Stats().chunks_forwarded, 0u);
}

// A frame damaged on the a0 -> a1 link closes it; a0 adopts a1 again and
// resends, on the new link, the root's tagged chunks a1 missed: a1's
// decoder verifies them (the tag names no link), so no repair round.
TEST_F(AuthTreeTest, ChunksResentAfterReadoptionVerifyOnTheNewLink) {
  SeedAll(0);
  for (const auto& n : kRelays) StartRelay(n, key_file_);
  FakeFaults f;
  f.corrupt_frame = 5;
  network_->SetFaults("a0", "a1", f);
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  EXPECT_EQ(r.repair_rounds, 0);
  EXPECT_GT(relays_["a0"]->Stats().resent_chunks, 0u);
  Digest128 want = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), want) << n;
  }
}

// `dcr status` against a keyed tree: QueryStatus signs its requests.
TEST_F(AuthTreeTest, StatusQueryWithTheKey) {
  SeedAll(0);
  for (const auto& n : kRelays) StartRelay(n, key_file_);
  TransportOptions to;
  to.name = "status-client";
  to.fake_network = network_;
  to.frames.authenticator = Load(key_file_);
  auto status = QueryStatus(MakeTopology(0, key_file_), 5s, "fake", to);
  ASSERT_EQ(status.size(), kRelays.size());
  for (const auto& s : status) {
    EXPECT_TRUE(s.reachable) << s.node << ": " << s.error;
  }
  // Without the key nobody answers.
  to.name = "status-client-2";
  to.frames.authenticator = nullptr;
  status = QueryStatus(MakeTopology(0, key_file_), 2s, "fake", to);
  for (const auto& s : status) EXPECT_FALSE(s.reachable) << s.node;
}

TEST_F(AuthTreeTest, RelaysWithAnotherKeyOrNoneAreCutOff) {
  SeedAll(0);
  for (const auto& n : kRelays) {
    if (n == "a2") {
      StartRelay(n, "");  // no key: its untagged replies are refused
    } else if (n == "b1") {
      StartRelay(n, other_key_file_);  // refuses b0's tagged frames
    } else {
      StartRelay(n, key_file_);
    }
  }
  RefitReport r = Refit(1, /*min_commit=*/3);
  ASSERT_EQ(r.outcome, RefitOutcome::kPartial) << r.reason;
  Digest128 v0 = DigestOf(Ckpt(0)), v1 = DigestOf(Ckpt(1));
  for (const auto& n : kRelays) WaitIdle(n);
  for (const char* n : {"a0", "a1", "b0"}) {
    EXPECT_TRUE(Node(r, n)->committed) << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v1) << n;
  }
  for (const char* n : {"a2", "b1"}) {
    const NodeOutcome* o = Node(r, n);
    EXPECT_TRUE(CutOff(o)) << n << ": " << NodeCodeName(o->code) << " "
                           << o->detail;
    EXPECT_EQ(o->phase, "plan") << n;
    EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
    EXPECT_FALSE(relays_[n]->Stats().committed) << n;
  }
  // The wrongly keyed b1 never saw a valid frame: nothing reached its refit.
  EXPECT_EQ(relays_["b1"]->Stats().bytes_in, 0u);
  EXPECT_EQ(relays_["b1"]->Stats().chunks_received, 0u);
}

TEST_F(AuthTreeTest, RootWithoutTheKeyReachesNobody) {
  SeedAll(0);
  for (const auto& n : kRelays) StartRelay(n, key_file_);
  Digest128 v0 = DigestOf(Ckpt(0));
  for (const std::string& root_key : {std::string(), other_key_file_}) {
    RefitReport r = Refit(1, /*min_commit=*/1, root_key);
    EXPECT_EQ(r.outcome, RefitOutcome::kAborted) << root_key;
    EXPECT_EQ(r.chunks, 0u);
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_TRUE(CutOff(Node(r, n))) << n;
      EXPECT_EQ(DigestOf(StorePath(n)), v0) << n;
      auto s = relays_[n]->Stats();
      EXPECT_EQ(s.bytes_in, 0u) << n;
      EXPECT_FALSE(s.committed) << n;
    }
  }
  EXPECT_EQ(DigestOf(dir_.Path("base.safetensors")), v0);
  // The keyed root then refits the same tree.
  RefitReport r = Refit(1);
  EXPECT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
}

TEST_F(AuthTreeTest, ForgedPlanFromAnEndpointWithoutTheKeyChangesNothing) {
  SeedAll(0);
  for (const auto& n : kRelays) StartRelay(n, key_file_);
  RelayStats before = relays_["a0"]->Stats();
  for (Key key : {Key(), Load(other_key_file_)}) {
    std::unique_ptr<Transport> mallory;
    auto rec = SendForgedPlan("a0", key, &mallory);
    ASSERT_NE(rec, nullptr);
    // a0's decoder refuses the first frame and closes the link; not a
    // frame comes back.
    EXPECT_TRUE(rec->WaitClosed(5s));
    EXPECT_TRUE(rec->types().empty());
    mallory->Stop();
    RelayStats after = relays_["a0"]->Stats();
    EXPECT_EQ(after.state, "idle");
    EXPECT_EQ(after.bytes_in, before.bytes_in);
    EXPECT_EQ(after.chunks_received, 0u);
    EXPECT_EQ(after.refits_aborted, before.refits_aborted);
    EXPECT_EQ(after.committed, before.committed);
    EXPECT_EQ(after.last_result, before.last_result);
  }
  EXPECT_EQ(DigestOf(StorePath("a0")), DigestOf(Ckpt(0)));
  // The forged epoch (1000) was never seen: the real coordinator, at epoch
  // 1, still refits everything.
  RefitReport r = Refit(1);
  ASSERT_EQ(r.outcome, RefitOutcome::kCommitted) << r.reason;
  EXPECT_LT(r.epoch, 1000u);
  for (const auto& n : kRelays) {
    WaitIdle(n);
    EXPECT_EQ(DigestOf(StorePath(n)), DigestOf(Ckpt(1))) << n;
  }
}

// The control for the test above: without keys, the same forged frames are
// taken as a coordinator's (the relay answers the PLAN).
TEST_F(AuthTreeTest, WithoutKeysTheForgedPlanIsAnswered) {
  SeedAll(0);
  StartRelay("a0", "");
  std::unique_ptr<Transport> mallory;
  auto rec = SendForgedPlan("a0", nullptr, &mallory);
  ASSERT_NE(rec, nullptr);
  ASSERT_TRUE(rec->WaitFrames(2, 5s));
  std::vector<FrameType> got = rec->types();
  EXPECT_EQ(got[0], FrameType::kHello);
  EXPECT_EQ(got[1], FrameType::kPlanReply);
  mallory->Stop();
  WaitIdle("a0");
}

}  // namespace
}  // namespace dcr
