// The coordinator's listener for producers (coord/producer_hub.h) over
// real TCP on 127.0.0.1, with raw clients that send the producers' frames
// by hand: the chunk queue (Fetch) in order and under backpressure,
// producers that leave, stay silent or send heartbeats, a rank without a
// baseline sent its shards, and a second hello during a refit.
//
// Waits for what will happen are generous (kWait); only waits for what
// must not happen (a producer that stays silent) are short.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coord/producer_hub.h"
#include "dcr/layout.h"
#include "dcr/transport.h"
#include "dcr/wire.h"
#include "protocol/producer_messages.h"
#include "unit/coord/producer_clients.h"
#include "unit/transport/transport_test_util.h"

namespace dcr {
namespace {

using namespace producer_test;  // NOLINT: the fixtures of these tests
using std::chrono::milliseconds;

// Fetches until the hub says every producer is done (or fails).
Status FetchAll(ProducerHub& hub, size_t max, milliseconds idle,
                std::map<uint32_t, std::vector<uint8_t>>* got) {
  std::vector<ProducerChunk> out;
  for (int rounds = 0; rounds < 10000; ++rounds) {
    DCR_RETURN_IF_ERROR(hub.impl().Fetch(max, idle, &out));
    if (out.empty()) return Status::OK();
    EXPECT_LE(out.size(), max);
    for (const ProducerChunk& c : out) {
      EXPECT_EQ(c.chunk.size(), 3u);
      if (c.chunk.size() != 3) continue;
      EXPECT_EQ(c.chunk[1], std::byte(c.rank));
      // The payload views into the frame kept alive by the buffer.
      EXPECT_GE(c.chunk.data(), c.buffer->data());
      (*got)[c.rank].push_back(static_cast<uint8_t>(c.chunk[2]));
    }
  }
  return Status::Aborted("Fetch never ended");
}

// GO to both gathered producers, which read it.
Status GoBoth(ProducerHub& hub, Client& c0, Client& c1) {
  hub.impl().Go(SampleGo(), 1 << 20);
  for (Client* c : {&c0, &c1}) DCR_RETURN_IF_ERROR(c->Go().status());
  return Status::OK();
}

std::vector<uint8_t> Iota(uint8_t n) {
  std::vector<uint8_t> v;
  for (uint8_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

// After GO, each producer's chunks come out of Fetch in the order sent,
// then Fetch returns empty once both sent PRODUCER_DONE; `window` 1 pauses
// the links after every chunk (backpressure) and resumes them as Fetch
// drains.
void StreamBoth(uint64_t window) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  const ProducerGoMsg go = SampleGo();
  hub->impl().Go(go, window);
  const uint8_t n0 = 40, n1 = 25;
  for (Client* c : {&c0, &c1}) {
    auto g = c->Go();
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(*g, go);
  }
  for (uint8_t i = 0; i < std::max(n0, n1); ++i) {
    if (i < n0) c0.SendChunk(0, i);
    if (i < n1) c1.SendChunk(1, i);
  }
  c0.SendDone(hub->layout(), n0);
  c1.SendDone(hub->layout(), n1);
  std::map<uint32_t, std::vector<uint8_t>> got;
  Status s = FetchAll(*hub, 4, kLong, &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got[0], Iota(n0));
  EXPECT_EQ(got[1], Iota(n1));
  std::vector<ProducerDoneMsg> done = hub->impl().Done();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].chunks, n0);
  EXPECT_EQ(done[1].chunks, n1);
  EXPECT_EQ(done[1].target_parts.size(), 2u);
  // Once done, Fetch stays empty.
  std::vector<ProducerChunk> out;
  EXPECT_TRUE(hub->impl().Fetch(4, milliseconds(1), &out).ok());
  EXPECT_TRUE(out.empty());

  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kCommitted);
  m.refit = go.refit;
  m.target = {7, Digest128{5, 6}};
  hub->impl().Decide(m);
  for (Client* c : {&c0, &c1}) {
    auto d = c->DecisionThenClose(1);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, m);
  }
}

TEST(ProducerHubTest, FetchReturnsEachProducersChunksInOrder) {
  StreamBoth(/*window=*/1 << 20);
}

TEST(ProducerHubTest, FetchUnderBackpressureKeepsTheOrder) {
  StreamBoth(/*window=*/1);
}

TEST(ProducerHubTest, FetchFailsWhenAProducerLeavesBeforeItIsDone) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  ASSERT_TRUE(GoBoth(*hub, c0, c1).ok());
  c0.SendChunk(0, 0);
  c0.SendDone(hub->layout(), 1);
  c1.SendChunk(1, 0);
  c1.link->Close();
  std::map<uint32_t, std::vector<uint8_t>> got;
  Status s = FetchAll(*hub, 4, kLong, &got);
  EXPECT_TRUE(s.code() == StatusCode::kAborted) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "producer rank 1 (127.0.0.1"))
      << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "left before it was done")) << s.ToString();
  // It stays failed.
  std::vector<ProducerChunk> out;
  EXPECT_TRUE(hub->impl().Fetch(4, kLong, &out).code() == StatusCode::kAborted);
  // The one still connected learns the outcome.
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kAborted);
  m.reason = std::string(s.message());
  hub->impl().Decide(m);
  auto d = c0.DecisionThenClose(1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, m);
}

// A rank that ended is reported once its chunks were all fetched, at once
// while another still streams (the spans that waited on it may go), and
// once only.
TEST(ProducerHubTest, FetchReportsARankThatEndedWhileAnotherStreams) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  ASSERT_TRUE(GoBoth(*hub, c0, c1).ok());
  c1.SendChunk(1, 0);
  c0.SendChunk(0, 0);
  c0.SendChunk(0, 1);
  c0.SendDone(hub->layout(), 2);
  std::vector<ProducerChunk> out;
  std::vector<uint32_t> ended;
  std::map<uint32_t, int> got;
  const auto t0 = std::chrono::steady_clock::now();
  while (ended.empty()) {
    // Rank 1 stays silent meanwhile: an idle limit of kLong would fail the
    // test only if the hub waited for it.
    ASSERT_TRUE(hub->impl().Fetch(1, kLong, &out, &ended).ok());
    for (const ProducerChunk& c : out) ++got[c.rank];
    if (!ended.empty()) {
      // Reported with its last chunk or after it, never before.
      EXPECT_EQ(ended, std::vector<uint32_t>{0});
      EXPECT_EQ(got[0], 2);
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kLong / 2);
  c1.SendChunk(1, 1);
  c1.SendDone(hub->layout(), 2);
  std::vector<uint32_t> later;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(hub->impl().Fetch(4, kLong, &out, &ended).ok());
    for (const ProducerChunk& c : out) ++got[c.rank];
    later.insert(later.end(), ended.begin(), ended.end());
    if (out.empty() && ended.empty()) break;  // every producer is done
  }
  EXPECT_EQ(later, std::vector<uint32_t>{1});
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(got[1], 2);
}

TEST(ProducerHubTest, FetchFailsWhenAProducerStaysSilent) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  const auto t0 = std::chrono::steady_clock::now();
  hub->impl().Go(SampleGo(), 1 << 20);
  // Rank 1 is done at once; rank 0 never sends anything. (Rank 0 is the
  // first the hub checks: it is named even if rank 1's DONE were late.)
  c1.SendDone(hub->layout(), 0);
  std::vector<ProducerChunk> out;
  Status s = hub->impl().Fetch(4, milliseconds(100), &out);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(100));
  EXPECT_TRUE(s.code() == StatusCode::kAborted) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "sent nothing for")) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "producer rank 0 (127.0.0.1"))
      << s.ToString();
  EXPECT_TRUE(out.empty());
}

// A producer that diffs a long run of unchanged weights sends no chunk,
// only HEARTBEATs: it is not taken for gone.
TEST(ProducerHubTest, FetchKeepsAProducerThatSendsHeartbeats) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  hub->impl().Go(SampleGo(), 1 << 20);
  c1.SendDone(hub->layout(), 0);
  std::thread beats([&] {
    // 400 ms of HEARTBEATs every 20 ms against a 150 ms idle limit, then
    // its DONE.
    for (int i = 0; i < 20; ++i) {
      c0.Send(FrameType::kHeartbeat, {});
      std::this_thread::sleep_for(milliseconds(20));
    }
    c0.SendDone(hub->layout(), 0);
  });
  std::vector<ProducerChunk> out;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = hub->impl().Fetch(4, milliseconds(150), &out);
  beats.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(out.empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(300));
  EXPECT_TRUE(hub->impl().Failure().ok());
  EXPECT_EQ(hub->impl().Done().size(), 2u);
}

// The hub tells the producers that wait on the tree (here for GO) that it
// is still there, once a second.
TEST(ProducerHubTest, SendsHeartbeatsToProducersThatWait) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port());
  ASSERT_TRUE(c0.connected());
  c0.SendHello(Hello(hub->layout(), 0, 1));
  EXPECT_TRUE(c0.inbox->WaitFor([&] { return c0.Heartbeats() >= 2; },
                                milliseconds(5000)));
  EXPECT_TRUE(c0.Messages().empty());
}

// A rank that says hello without a baseline joins; the refit sends it its
// shards in pieces (at most 16 MB each, in order), which add up to the
// bytes given.
TEST(ProducerHubTest, SendsARankWithoutABaselineItsShards) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ProducerHelloMsg bare = Hello(hub->layout(), 0, 7);
  bare.base_parts.clear();
  c0.SendHello(bare);
  c1.SendHello(Hello(hub->layout(), 1, 7));
  auto joined = GatherWithin(*hub, kLong);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  ASSERT_EQ(joined->size(), 2u);
  EXPECT_TRUE((*joined)[0].base_parts.empty());
  EXPECT_EQ((*joined)[1].base_parts.size(), hub->layout().tensors.size());
  std::vector<std::byte> shard((size_t{16} << 20) * 2 + 5);
  for (size_t i = 0; i < shard.size(); ++i) shard[i] = std::byte(i * 131);
  Status s = hub->impl().SendBaseline(0, "w", shard, kLong);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> got;
  for (size_t n = 0; n < 3; ++n) {
    auto f = c0.Frame(n);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ(f->frame.type(), FrameType::kProducerBaseline);
    auto m = DecodeProducerBaseline(f->frame.payload);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->shard, "w");
    EXPECT_EQ(m->total, shard.size());
    EXPECT_EQ(m->offset, got.size());
    EXPECT_LE(m->bytes.size(), size_t{16} << 20);
    got.insert(got.end(), m->bytes.begin(), m->bytes.end());
  }
  EXPECT_EQ(got, shard);
  // Only the rank that asked got anything.
  EXPECT_TRUE(c1.Messages().empty());
}

// Cancel (the tree left) ends a Fetch that waits.
TEST(ProducerHubTest, CancelEndsAWaitingFetch) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  hub->impl().Go(SampleGo(), 1 << 20);
  Status s;
  std::thread fetch([&] {
    std::vector<ProducerChunk> out;
    s = hub->impl().Fetch(4, kLong, &out);
  });
  std::this_thread::sleep_for(milliseconds(20));
  hub->impl().Cancel("the tree left the refit");
  fetch.join();
  EXPECT_TRUE(s.code() == StatusCode::kAborted) << s.ToString();
  EXPECT_EQ(s.message(), "the tree left the refit");
}

// A producer that says hello again in the middle of a refit fails that
// refit (as any frame out of turn does); it must not take the hub down.
TEST(ProducerHubTest, ASecondHelloDuringARefitFailsTheRefit) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  c0.SendHello(Hello(hub->layout(), 0, 7));
  hub->impl().Go(SampleGo(), 1 << 20);
  std::map<uint32_t, std::vector<uint8_t>> got;
  Status s = FetchAll(*hub, 4, kLong, &got);
  EXPECT_TRUE(s.code() == StatusCode::kAborted) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "producer rank 0 (127.0.0.1"))
      << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "PRODUCER_HELLO")) << s.ToString();
  EXPECT_EQ(hub->impl().Done().size(), 2u);
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kAborted);
  m.reason = std::string(s.message());
  hub->impl().Decide(m);
  for (Client* c : {&c0, &c1}) {
    // GO came first (if the hub sent it before the hello arrived), then
    // the decision.
    ASSERT_TRUE(c->inbox->WaitClosed(1));
    auto frames = c->inbox->frames();
    ASSERT_FALSE(frames.empty());
    auto d = c->DecisionThenClose(frames.size() - 1);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, m);
  }
}

}  // namespace
}  // namespace dcr
