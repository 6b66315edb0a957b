// Raw producers for the coordinator's listener tests (producer_hub_test,
// producer_feed_test): a hub on 127.0.0.1 with a two-rank test layout, and
// clients that send the producers' frames by hand and record what came
// back.
#ifndef DCR_TESTS_UNIT_COORD_PRODUCER_CLIENTS_H_
#define DCR_TESTS_UNIT_COORD_PRODUCER_CLIENTS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "coord/producer_hub.h"
#include "dcr/layout.h"
#include "dcr/transport.h"
#include "dcr/wire.h"
#include "protocol/producer_messages.h"
#include "unit/transport/transport_test_util.h"

namespace dcr::producer_test {

using std::chrono::milliseconds;
using Joined = ProducerHub::Impl::Joined;
using dcr::testing::kWait;
using dcr::testing::Recorder;

inline constexpr milliseconds kConnectTimeout{5000};
// What a Fetch or Gather may wait for something that will come.
inline constexpr milliseconds kLong{20000};

// Two tp ranks, two canonical tensors.
inline constexpr const char* kLayoutYaml = R"(version: 1
parallel: {tp: 2}
tensors:
  - name: model.norm.weight
    shard: norm
    split: replicated
    shape: [4]
  - name: model.proj.weight
    shard: proj
    split: column
    shape: [4, 2]
)";

inline Layout TestLayout() {
  auto l = ParseLayout(kLayoutYaml, "hub.yaml");
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *std::move(l) : Layout();
}

inline std::unique_ptr<ProducerHub> Listen() {
  Layout layout = TestLayout();
  EXPECT_EQ(layout.ranks(), 2u);
  EXPECT_EQ(layout.tensors.size(), 2u);
  auto hub = ProducerHub::Listen(std::move(layout), "127.0.0.1", 0,
                                 TransportOptions());
  EXPECT_TRUE(hub.ok()) << hub.status().ToString();
  if (!hub.ok()) return nullptr;
  EXPECT_NE((*hub)->port(), 0);
  return *std::move(hub);
}

// A well-formed hello of `rank` for the test layout.
inline ProducerHelloMsg Hello(const Layout& layout, uint32_t rank,
                              uint64_t step) {
  ProducerHelloMsg h;
  h.rank = rank;
  h.world = layout.ranks();
  h.step = step;
  h.layout = layout.Fingerprint();
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    h.base_parts.push_back(LinearDigest{rank * 100 + t, t + 1});
  }
  return h;
}

// A producer by hand: one TCP link to the hub, and what came back on it.
struct Client {
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Recorder> inbox = std::make_shared<Recorder>();
  std::shared_ptr<Link> link;

  explicit Client(uint16_t port) {
    auto t = CreateTransport("tcp", TransportOptions());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return;
    transport = *std::move(t);
    auto l = transport->Connect("127.0.0.1", port, inbox, kConnectTimeout);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (l.ok()) link = *std::move(l);
  }
  bool connected() const { return link != nullptr; }

  void Send(FrameType type, std::span<const std::byte> payload) {
    FrameHeader h;
    h.type = type;
    auto f = EncodeFrame(h, payload);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    link->Send(*std::move(f));
  }
  void SendHello(const ProducerHelloMsg& h) {
    Send(FrameType::kProducerHello, EncodeProducerHello(h));
  }
  void SendChunk(uint32_t rank, uint8_t i) {
    const std::vector<std::byte> payload = {std::byte{0xc0}, std::byte(rank),
                                            std::byte(i)};
    Send(FrameType::kChunk, payload);
  }
  void SendDone(const Layout& layout, uint64_t chunks) {
    ProducerDoneMsg d;
    d.chunks = chunks;
    d.changed = chunks * 10;
    d.target_parts.assign(layout.tensors.size(), LinearDigest{chunks, 7});
    Send(FrameType::kProducerDone, EncodeProducerDone(d));
  }

  // What the hub sent but HEARTBEATs (one a second while it waits).
  std::vector<Recorder::Received> Messages() {
    std::vector<Recorder::Received> out;
    for (const Recorder::Received& r : inbox->frames()) {
      if (r.header.type != FrameType::kHeartbeat) out.push_back(r);
    }
    return out;
  }
  size_t Heartbeats() { return inbox->frames().size() - Messages().size(); }
  // The `n`th frame the hub sent (0-based, HEARTBEATs left out), once it
  // came.
  Result<DecodedFrame> Frame(size_t n) {
    if (!inbox->WaitFor([&] { return Messages().size() >= n + 1; })) {
      return Status::Aborted("no frame " + std::to_string(n) + " from the hub");
    }
    const Recorder::Received r = Messages()[n];
    auto f = ParseFrame(*r.buffer);
    if (!f.ok()) return f.status();
    return DecodedFrame{*f, r.buffer};
  }
  Result<ProducerGoMsg> Go() {
    DCR_ASSIGN_OR_RETURN(DecodedFrame f, Frame(0));
    if (f.frame.type() != FrameType::kProducerGo) {
      return Status::Corruption("got " + FrameTypeName(f.frame.type()));
    }
    return DecodeProducerGo(f.frame.payload);
  }
  // The decision, frame `n`, after which the hub closed the link.
  Result<ProducerDecisionMsg> DecisionThenClose(size_t n = 0) {
    DCR_ASSIGN_OR_RETURN(DecodedFrame f, Frame(n));
    if (f.frame.type() != FrameType::kProducerDecision) {
      return Status::Corruption("got " + FrameTypeName(f.frame.type()));
    }
    if (!inbox->WaitClosed(1)) return Status::Aborted("the link stays open");
    if (Messages().size() != n + 1) {
      return Status::Corruption("more frames after the decision");
    }
    return DecodeProducerDecision(f.frame.payload);
  }
};

inline bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Gather, with a watchdog: a Gather that would wait for a first hello
// forever returns "stopped" after kWait instead of hanging the test.
inline Result<std::vector<Joined>> GatherWithin(ProducerHub& hub,
                                                milliseconds wait) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, kWait, [&] { return done; })) {
      ADD_FAILURE() << "Gather still waiting after " << kWait.count() << " s";
      hub.Stop();
    }
  });
  auto r = hub.impl().Gather(wait);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  return r;
}

// Gathers both ranks of the test layout at `step`.
inline Result<std::vector<Joined>> GatherBoth(ProducerHub& hub, Client& c0,
                                              Client& c1, uint64_t step = 7) {
  c0.SendHello(Hello(hub.layout(), 0, step));
  c1.SendHello(Hello(hub.layout(), 1, step));
  return GatherWithin(hub, kLong);
}

inline ProducerGoMsg SampleGo() {
  ProducerGoMsg go;
  go.refit.bytes[0] = 0xab;
  go.span_elems = 1024;
  go.base = {6, Digest128{1, 2}};
  go.target_step = 7;
  return go;
}

}  // namespace dcr::producer_test

#endif  // DCR_TESTS_UNIT_COORD_PRODUCER_CLIENTS_H_
