// The coordinator's listener for producers (coord/producer_hub.h) over
// real TCP on 127.0.0.1, with raw clients that send the producers' frames
// by hand: refused hellos, Gather and Decide. The chunk queue (Fetch) is
// in producer_hub_fetch_test.cc.
//
// Waits for what will happen are generous (kWait); only waits for what
// must not happen (a rank that never connects, a producer that stays
// silent) are short.
#include "coord/producer_hub.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

// Each hello the hub cannot take gets a PRODUCER_DECISION "refused" naming
// why, and its link closes.
TEST(ProducerHubTest, RefusesBadHellos) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  const Layout& layout = hub->layout();
  struct Case {
    const char* what;
    std::function<void(Client&)> send;
    std::vector<std::string> reason;
  };
  const std::vector<Case> cases = {
      {"wrong world size",
       [&](Client& c) {
         ProducerHelloMsg h = Hello(layout, 0, 7);
         h.world = 3;
         c.SendHello(h);
       },
       {"rank 0 says the world has 3 ranks", "hub.yaml has 2"}},
      {"wrong layout fingerprint",
       [&](Client& c) {
         ProducerHelloMsg h = Hello(layout, 1, 7);
         h.layout = Digest128{1, 2};
         c.SendHello(h);
       },
       {"rank 1 runs another layout", "hub.yaml",
        layout.Fingerprint().ShortHex(), Digest128{1, 2}.ShortHex()}},
      {"wrong number of base digest parts",
       [&](Client& c) {
         ProducerHelloMsg h = Hello(layout, 0, 7);
         h.base_parts.push_back(LinearDigest{9, 9});
         c.SendHello(h);
       },
       {"rank 0 sent digest parts of 3 tensors; the layout has 2"}},
      {"garbage payload",
       [&](Client& c) {
         const std::vector<std::byte> junk = {std::byte{1}, std::byte{2},
                                              std::byte{3}};
         c.Send(FrameType::kProducerHello, junk);
       },
       {"PRODUCER_HELLO.rank: truncated"}},
      {"hello payload of a rank beyond the world",
       [&](Client& c) {
         ProducerHelloMsg h = Hello(layout, 0, 7);
         h.rank = 2;
         c.SendHello(h);
       },
       {"PRODUCER_HELLO.rank: not below world"}},
      {"CHUNK before any refit (no hello)",
       [&](Client& c) { c.SendChunk(0, 0); },
       {"a CHUNK before the refit began"}},
      {"PRODUCER_DONE before any refit",
       [&](Client& c) { c.SendDone(layout, 0); },
       {"a PRODUCER_DONE before the refit began"}},
      {"a frame a producer never sends",
       [&](Client& c) {
         c.Send(FrameType::kProducerGo, EncodeProducerGo(SampleGo()));
       },
       {"unexpected PRODUCER_GO"}},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.what);
    Client c(hub->port());
    ASSERT_TRUE(c.connected());
    tc.send(c);
    auto d = c.DecisionThenClose();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->outcome, static_cast<uint8_t>(ProducerOutcome::kRefused));
    for (const std::string& what : tc.reason) {
      EXPECT_TRUE(Contains(d->reason, what))
          << "'" << d->reason << "' does not name '" << what << "'";
    }
  }
}

// A CHUNK (or a second hello) from a producer that said hello while no
// refit runs: refused, and its rank is free again.
TEST(ProducerHubTest, RefusesAChunkAfterHelloBeforeTheRefit) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  {
    Client c(hub->port());
    ASSERT_TRUE(c.connected());
    c.SendHello(Hello(hub->layout(), 0, 7));
    c.SendChunk(0, 0);
    auto d = c.DecisionThenClose();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->outcome, 4);
    EXPECT_EQ(d->reason, "a CHUNK before the refit began");
  }
  {
    Client c(hub->port());
    ASSERT_TRUE(c.connected());
    c.SendHello(Hello(hub->layout(), 0, 7));
    c.SendHello(Hello(hub->layout(), 0, 7));
    auto d = c.DecisionThenClose();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->outcome, 4);
    EXPECT_EQ(d->reason, "a second PRODUCER_HELLO on one link");
  }
  // Neither refused link holds rank 0.
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  auto joined = GatherBoth(*hub, c0, c1);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined->size(), 2u);
}

// A rank that waits, then Gather gives up on the one missing; the waiting
// producer is told why by Decide, and a second hello for its rank from
// elsewhere is refused meanwhile.
TEST(ProducerHubTest, GatherNamesTheMissingRankAndRefusesADuplicate) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port());
  ASSERT_TRUE(c0.connected());
  c0.SendHello(Hello(hub->layout(), 0, 7));
  // Gather waits for the first hello as long as it takes, then 50 ms for
  // rank 1, which never comes.
  auto joined = GatherWithin(*hub, milliseconds(50));
  ASSERT_FALSE(joined.ok());
  EXPECT_TRUE(joined.status().code() == StatusCode::kAborted)
      << joined.status().ToString();
  EXPECT_TRUE(Contains(joined.status().message(), "rank 1 did not connect"))
      << joined.status().ToString();
  EXPECT_TRUE(Contains(joined.status().message(), "for all 2"))
      << joined.status().ToString();

  // Rank 0 is still connected (the hub processed its hello: Gather saw it).
  Client dup(hub->port());
  ASSERT_TRUE(dup.connected());
  dup.SendHello(Hello(hub->layout(), 0, 7));
  auto refused = dup.DecisionThenClose();
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->outcome, 4);
  EXPECT_TRUE(Contains(refused->reason, "rank 0 is already connected from"))
      << refused->reason;
  EXPECT_TRUE(Contains(refused->reason, "127.0.0.1")) << refused->reason;

  // The refit failed before it gathered: the producer waiting is told.
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kRefused);
  m.reason = std::string(joined.status().message());
  hub->impl().Decide(m);
  auto told = c0.DecisionThenClose();
  ASSERT_TRUE(told.ok()) << told.status().ToString();
  EXPECT_EQ(*told, m);
}

// A producer that said hello and left does not start the next Gather's
// clock: Gather waits for a first hello again, then `wait` for the rest.
TEST(ProducerHubTest, GatherClockStartsAgainAfterTheFirstProducerLeft) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  {
    // Said hello (the clock started), then refused for a CHUNK: gone.
    Client gone(hub->port());
    ASSERT_TRUE(gone.connected());
    gone.SendHello(Hello(hub->layout(), 0, 7));
    gone.SendChunk(0, 0);
    ASSERT_TRUE(gone.DecisionThenClose().ok());
  }
  // Longer than the wait below: a clock left running would have run out.
  std::this_thread::sleep_for(milliseconds(150));
  constexpr milliseconds kShort{100};
  Client c0(hub->port());
  ASSERT_TRUE(c0.connected());
  Result<std::vector<Joined>> joined = std::vector<Joined>();
  std::chrono::steady_clock::time_point returned;
  std::thread gather([&] {
    joined = GatherWithin(*hub, kShort);
    returned = std::chrono::steady_clock::now();
  });
  const auto sent = std::chrono::steady_clock::now();
  c0.SendHello(Hello(hub->layout(), 0, 8));
  gather.join();
  ASSERT_FALSE(joined.ok());
  EXPECT_TRUE(Contains(joined.status().message(), "rank 1 did not connect"))
      << joined.status().ToString();
  // Not before `wait` after rank 0's hello.
  EXPECT_GE(returned - sent, kShort);
}

TEST(ProducerHubTest, GatherRefusesProducersAtDifferentSteps) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  c0.SendHello(Hello(hub->layout(), 0, 5));
  c1.SendHello(Hello(hub->layout(), 1, 6));
  auto joined = GatherWithin(*hub, kLong);
  ASSERT_FALSE(joined.ok());
  EXPECT_TRUE(joined.status().IsInvalidArgument())
      << joined.status().ToString();
  EXPECT_TRUE(Contains(joined.status().message(),
                       "different trainer steps: step 5 (rank 0), "
                       "step 6 (rank 1)"))
      << joined.status().ToString();
  // Both are told, as RefitRun does after a failed Gather.
  ProducerDecisionMsg m;
  m.outcome = 4;
  m.reason = std::string(joined.status().message());
  hub->impl().Decide(m);
  for (Client* c : {&c0, &c1}) {
    auto d = c->DecisionThenClose();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, m);
  }
}

TEST(ProducerHubTest, GatherReturnsTheRanksInOrder) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  // Rank 1 first.
  c1.SendHello(Hello(hub->layout(), 1, 9));
  c0.SendHello(Hello(hub->layout(), 0, 9));
  auto joined = GatherWithin(*hub, kLong);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  ASSERT_EQ(joined->size(), 2u);
  for (uint32_t r = 0; r < 2; ++r) {
    const Joined& j = (*joined)[r];
    EXPECT_EQ(j.rank, r);
    EXPECT_EQ(j.step, 9u);
    EXPECT_TRUE(Contains(j.peer, "127.0.0.1")) << j.peer;
    EXPECT_EQ(j.base_parts, Hello(hub->layout(), r, 9).base_parts);
  }
  EXPECT_NE((*joined)[0].peer, (*joined)[1].peer);
}

TEST(ProducerHubTest, StopEndsAWaitingGather) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  EXPECT_FALSE(hub->stopped());
  Result<std::vector<Joined>> joined = std::vector<Joined>();
  std::thread gather([&] { joined = hub->impl().Gather(kLong); });
  // Whether Gather waits already or not, it returns "stopped".
  std::this_thread::sleep_for(milliseconds(20));
  hub->Stop();
  gather.join();
  EXPECT_TRUE(hub->stopped());
  EXPECT_TRUE(joined.status().code() == StatusCode::kAborted)
      << joined.status().ToString();
  EXPECT_EQ(joined.status().message(), "stopped");
  // And every later one, even with its producers there.
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  auto again = GatherBoth(*hub, c0, c1);
  EXPECT_TRUE(again.status().code() == StatusCode::kAborted)
      << again.status().ToString();
  EXPECT_EQ(again.status().message(), "stopped");
}

// Decide tells every gathered producer, closes their links, and frees the
// ranks for the next refit.
TEST(ProducerHubTest, DecideTellsEveryGatheredProducer) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  {
    Client c0(hub->port()), c1(hub->port());
    ASSERT_TRUE(c0.connected() && c1.connected());
    auto joined = GatherBoth(*hub, c0, c1);
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    ProducerDecisionMsg m;
    m.outcome = static_cast<uint8_t>(ProducerOutcome::kAborted);
    m.refit.bytes[3] = 0x42;
    m.target = {8, Digest128{3, 4}};
    m.reason = "the tree said no";
    hub->impl().Decide(m);
    for (Client* c : {&c0, &c1}) {
      auto d = c->DecisionThenClose();
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      EXPECT_EQ(*d, m);
    }
  }
  // The next refit: the same ranks from new links.
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  auto joined = GatherBoth(*hub, c0, c1, 8);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  ASSERT_EQ(joined->size(), 2u);
  EXPECT_EQ((*joined)[0].step, 8u);
}

// The hub's destructor lets the last decisions reach their producers, and
// returns as soon as their links closed (not after its 2 s bound).
TEST(ProducerHubTest, DestroyingTheHubFlushesTheLastDecisions) {
  auto hub = Listen();
  ASSERT_TRUE(hub);
  Client c0(hub->port()), c1(hub->port());
  ASSERT_TRUE(c0.connected() && c1.connected());
  ASSERT_TRUE(GatherBoth(*hub, c0, c1).ok());
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kCommitted);
  m.reason = "last";
  hub->impl().Decide(m);
  const auto t0 = std::chrono::steady_clock::now();
  hub.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1500));
  for (Client* c : {&c0, &c1}) {
    auto d = c->DecisionThenClose();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, m);
  }
}

}  // namespace
}  // namespace dcr
