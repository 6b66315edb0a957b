// The fixture of the relay tree tests (relay_tree*_test.cc): real Relay
// engines with file stores in a temp dir, a real RunRefit over the fake
// transport, and five relays in two clusters (a0..a2, b0..b1).
#ifndef DCR_TESTS_UNIT_COORD_RELAY_TREE_FIXTURE_H_
#define DCR_TESTS_UNIT_COORD_RELAY_TREE_FIXTURE_H_

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
using Bytes = std::vector<std::byte>;
using namespace std::chrono_literals;

inline const std::vector<std::string> kRelays = {"a0", "a1", "a2", "b0", "b1"};

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
defaults: {{span_elems: {}, fanout: 2, window_bytes: 1MiB, min_commit: {}}}
root: {{name: root, host: root, port: 1, cluster: train,
       state_dir: "{}", baseline: "{}"}}
clusters:
  - name: train
  - name: ca
    bandwidth: 10Gbps
    nodes:
)",
        span_elems_,
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

  // `tweak` changes the options before the relay starts.
  void StartRelay(const std::string& node, const std::string& store = "",
                  const std::function<void(RelayOptions&)>& tweak = {}) {
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
    if (tweak) tweak(o);
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
  // Every relay idle, its store holding `digest`.
  void ExpectRelaysHold(const Digest128& digest) {
    for (const auto& n : kRelays) {
      WaitIdle(n);
      EXPECT_EQ(DigestOf(StorePath(n)), digest) << n;
    }
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
  uint64_t span_elems_ = 4096;  // the topology's defaults.span_elems
};

}  // namespace dcr

#endif  // DCR_TESTS_UNIT_COORD_RELAY_TREE_FIXTURE_H_
