// The "ucx" backend's connections, listeners and shutdown against the
// contract of dcr/transport.h, on loopback with UCX_TLS=tcp: refused and
// timed-out connects, host names, listen errors, the event thread's rules,
// asynchronous connects, and stopping or destroying a transport with links
// open and frames in flight.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "unit/transport/transport_test_util.h"
#include "unit/transport/ucx_test_util.h"

namespace dcr {
namespace {

using std::chrono::milliseconds;
using testing::kConnectTimeout;
using testing::kWait;
using testing::MakeUcx;
using testing::MustConnect;
using testing::Recorder;
using testing::Server;
using testing::TestFrame;
using Clock = std::chrono::steady_clock;

TEST(UcxTransportTest, ConnectToClosedPortFailsNamingHostAndPort) {
  uint16_t port;
  {
    Server gone;
    port = gone.port;
  }
  auto client = MakeUcx();
  const auto start = Clock::now();
  Result<std::shared_ptr<Link>> link = client->Connect(
      "127.0.0.1", port, std::make_shared<Recorder>(), milliseconds(3000));
  EXPECT_LT(Clock::now() - start, milliseconds(3500));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kIOError);
  EXPECT_NE(link.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << link.status().ToString();
  std::printf("connect to a closed port: %s\n",
              link.status().ToString().c_str());
}

TEST(UcxTransportTest, ConnectByHostName) {
  Server server;
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>(),
                          "localhost");
  ASSERT_TRUE(link);
  link->Send(TestFrame(0, 10));
  EXPECT_TRUE(server.recorder->WaitFrames(1));
}

// A TCP listener that never speaks UCX: the connect waits for the hello
// and gives up at the timeout.
TEST(UcxTransportTest, ConnectTimesOut) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  uint16_t port = ntohs(addr.sin_port);

  auto client = MakeUcx();
  auto start = Clock::now();
  Result<std::shared_ptr<Link>> link = client->Connect(
      "127.0.0.1", port, std::make_shared<Recorder>(), milliseconds(300));
  auto elapsed = Clock::now() - start;
  ::close(lfd);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("timed out after 300 ms"),
            std::string::npos)
      << link.status().ToString();
  EXPECT_NE(link.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos);
  EXPECT_GE(elapsed, milliseconds(290));
  EXPECT_LT(elapsed, std::chrono::seconds(3));
}

TEST(UcxTransportTest, ListenErrors) {
  Server server;
  auto again =
      server.transport->Listen("127.0.0.1", 0, std::make_shared<Recorder>());
  EXPECT_TRUE(again.IsInvalidArgument()) << again.ToString();
  auto other = MakeUcx();
  Status in_use =
      other->Listen("127.0.0.1", server.port, std::make_shared<Recorder>());
  EXPECT_EQ(in_use.code(), StatusCode::kIOError);
  EXPECT_NE(in_use.message().find("127.0.0.1:" + std::to_string(server.port)),
            std::string::npos)
      << in_use.ToString();
  Status bad_host =
      other->Listen("no.such.host.invalid", 0, std::make_shared<Recorder>());
  EXPECT_FALSE(bad_host.ok());
}

TEST(UcxTransportTest, EventThreadRulesAndAsyncConnect) {
  Server server;
  auto client = MakeUcx();
  EXPECT_FALSE(client->InEventThread());
  std::promise<Status> on_thread;
  std::promise<Result<std::shared_ptr<Link>>> async;
  auto rec = std::make_shared<Recorder>();
  ASSERT_TRUE(client->Post([&] {
    EXPECT_TRUE(client->InEventThread());
    on_thread.set_value(
        client->Connect("127.0.0.1", server.port, rec, kConnectTimeout)
            .status());
    client->AsyncConnect("127.0.0.1", server.port, rec, kConnectTimeout,
                         [&](Result<std::shared_ptr<Link>> r) {
                           EXPECT_TRUE(client->InEventThread());
                           async.set_value(std::move(r));
                         });
  }));
  auto s = on_thread.get_future();
  ASSERT_EQ(s.wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(s.get().IsInvalidArgument());
  auto a = async.get_future();
  ASSERT_EQ(a.wait_for(kWait), std::future_status::ready);
  Result<std::shared_ptr<Link>> link = a.get();
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  (*link)->Send(TestFrame(0, 1));
  EXPECT_TRUE(server.recorder->WaitFrames(1));
}

TEST(UcxTransportTest, StopWithLinksOpenFramesInFlightAndPendingConnects) {
  Server server(TransportOptions{}, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx();
  std::vector<std::shared_ptr<Link>> links;
  for (int i = 0; i < 4; ++i) {
    links.push_back(MustConnect(*client, server.port, client_rec));
  }
  for (auto& link : links) {
    for (uint64_t j = 0; j < 16; ++j) link->Send(TestFrame(j, 1u << 20));
  }
  // Connects still pending when the transport stops: one to the server,
  // one to a TCP listener that never answers the UCX handshake.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::promise<Status> pending, silent;
  client->AsyncConnect(
      "127.0.0.1", server.port, client_rec, kConnectTimeout,
      [&](Result<std::shared_ptr<Link>> r) { pending.set_value(r.status()); });
  client->AsyncConnect(
      "127.0.0.1", ntohs(addr.sin_port), client_rec, kConnectTimeout,
      [&](Result<std::shared_ptr<Link>> r) { silent.set_value(r.status()); });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  client->Stop();
  client->Stop();  // idempotent
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  ::close(lfd);
  auto p = pending.get_future();
  ASSERT_EQ(p.wait_for(kWait), std::future_status::ready);
  auto q = silent.get_future();
  ASSERT_EQ(q.wait_for(kWait), std::future_status::ready);
  EXPECT_EQ(q.get().code(), StatusCode::kAborted);
  size_t opened = client_rec->opened().size();
  EXPECT_EQ(client_rec->closed().size(), opened);
  EXPECT_TRUE(client_rec->ClosedAtMostOnce());
  for (const auto& c : client_rec->closed()) EXPECT_TRUE(c.why.ok());
  for (auto& link : links) {
    EXPECT_EQ(link->QueuedBytes(), 0u);
    link->Send(TestFrame(99, 10));  // after Stop: dropped
    link->Close();
    EXPECT_EQ(link->QueuedBytes(), 0u);
  }
  EXPECT_FALSE(client->Post([] {}));
  Result<std::shared_ptr<Link>> late =
      client->Connect("127.0.0.1", server.port, client_rec, kConnectTimeout);
  EXPECT_EQ(late.status().code(), StatusCode::kAborted);
  // The server's links see their peers gone once they read again.
  server.recorder->set_pause_on_open(false);
  ASSERT_TRUE(server.recorder->WaitOpened(opened));
  for (const auto& l : server.recorder->opened()) l->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitClosed(server.recorder->opened().size()));
  for (const auto& c : server.recorder->closed()) {
    EXPECT_EQ(c.why.code(), StatusCode::kIOError) << c.why.ToString();
  }
  server.transport->Stop();
  EXPECT_TRUE(server.recorder->ClosedAtMostOnce());
}

TEST(UcxTransportTest, DestroyWithoutStop) {
  auto server = std::make_unique<Server>();
  auto client = MakeUcx();
  auto link = MustConnect(*client, server->port, std::make_shared<Recorder>());
  link->Send(TestFrame(0, 1u << 20));
  server.reset();
  client.reset();
  link->Send(TestFrame(1, 10));  // the link outlives its transport safely
  EXPECT_EQ(link->QueuedBytes(), 0u);
}

}  // namespace
}  // namespace dcr
