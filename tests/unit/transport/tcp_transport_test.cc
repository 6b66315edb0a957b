#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <map>
#include <thread>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "unit/transport/transport_test_util.h"

namespace dcr {
namespace {

using std::chrono::milliseconds;
using testing::kWait;
using testing::Recorder;
using testing::TestFrame;

using testing::kConnectTimeout;
using testing::MakeTcp;

// A listening server with a recorder.
struct Server {
  explicit Server(TransportOptions options = {}, bool pause_on_open = false)
      : transport(MakeTcp(options)), recorder(std::make_shared<Recorder>()) {
    recorder->set_pause_on_open(pause_on_open);
    Status s = transport->Listen("127.0.0.1", 0, recorder);
    EXPECT_TRUE(s.ok()) << s.ToString();
    port = transport->BoundPort();
    EXPECT_NE(port, 0);
  }
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Recorder> recorder;
  uint16_t port = 0;
};

std::shared_ptr<Link> MustConnect(Transport& t, uint16_t port,
                                  std::shared_ptr<LinkHandler> handler,
                                  std::string_view host = "127.0.0.1") {
  Result<std::shared_ptr<Link>> link =
      t.Connect(host, port, std::move(handler), kConnectTimeout);
  EXPECT_TRUE(link.ok()) << link.status().ToString();
  return link.ok() ? *link : nullptr;
}

// A plain blocking socket connected to 127.0.0.1:port (no dcr code).
int RawConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(TcpTransportTest, KindCapabilitiesAndFactory) {
  auto t = MakeTcp();
  EXPECT_EQ(t->kind(), "tcp");
  EXPECT_TRUE(t->capabilities().network);
  EXPECT_FALSE(t->capabilities().fault_injection);
  EXPECT_EQ(t->BoundPort(), 0);

  // "ucx" exists iff this build has it (ucx_transport_test covers it).
  const bool ucx_built = ProbeTransports().at(1).built;
  Status ucx = CreateTransport("ucx", {}).status();
  if (ucx_built) {
    EXPECT_TRUE(ucx.ok()) << ucx.ToString();
  } else {
    EXPECT_EQ(ucx.code(), StatusCode::kUnsupported);
    EXPECT_NE(ucx.message().find("rebuild with -DDCR_UCX=ON"),
              std::string::npos)
        << ucx.ToString();
  }
  EXPECT_TRUE(
      CreateTransport("carrier-pigeon", {}).status().IsInvalidArgument());
  EXPECT_TRUE(CreateTransport("fake", {}).status().IsInvalidArgument());
  TransportOptions bad;
  bad.low_watermark = bad.high_watermark + 1;
  EXPECT_TRUE(CreateTransport("tcp", bad).status().IsInvalidArgument());
}

TEST(TcpTransportTest, ProbeTransportsListsTcpThenUcx) {
  std::vector<TransportSupport> probe = ProbeTransports();
  ASSERT_EQ(probe.size(), 2u);
  EXPECT_EQ(probe[0].kind, "tcp");
  EXPECT_TRUE(probe[0].built);
  EXPECT_TRUE(probe[0].usable);
  EXPECT_EQ(probe[1].kind, "ucx");
  if (!probe[1].built) {
    EXPECT_FALSE(probe[1].usable);
    EXPECT_NE(probe[1].detail.find("-DDCR_UCX=ON"), std::string::npos)
        << probe[1].detail;
  }
}

TEST(TcpTransportTest, ExchangeAndForwardVerbatim) {
  Server server;
  // The server forwards every frame back on the same link, same buffer.
  server.recorder->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, client_rec);
  ASSERT_TRUE(link);
  EXPECT_EQ(link->peer(), "127.0.0.1:" + std::to_string(server.port));
  ASSERT_TRUE(client_rec->WaitOpened(1));

  FrameBuffer sent = TestFrame(7, 1000, 3, FrameType::kPlan);
  link->Send(sent);
  ASSERT_TRUE(client_rec->WaitFrames(1));
  auto got = client_rec->frames();
  EXPECT_EQ(*got[0].buffer, *sent);
  EXPECT_EQ(got[0].header.type, FrameType::kPlan);
  EXPECT_EQ(got[0].header.sequence, 7u);
  EXPECT_EQ(got[0].header.epoch, 3u);

  auto server_frames = server.recorder->frames();
  ASSERT_EQ(server_frames.size(), 1u);
  auto opened = server.recorder->opened();
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0]->peer().rfind("127.0.0.1:", 0), 0u) << opened[0]->peer();
  LinkStats s = link->stats();
  EXPECT_EQ(s.frames_sent, 1u);
  EXPECT_EQ(s.bytes_sent, sent->size());
  EXPECT_EQ(s.frames_received, 1u);
  EXPECT_EQ(s.bytes_received, sent->size());
}

TEST(TcpTransportTest, TenThousandFramesInOrder) {
  Server server;
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  constexpr size_t kFrames = 10000;
  std::vector<FrameBuffer> sent;
  for (size_t i = 0; i < kFrames; ++i) {
    sent.push_back(TestFrame(i, (i * 37) % 600));
    link->Send(sent.back());
  }
  ASSERT_TRUE(server.recorder->WaitFrames(kFrames));
  auto got = server.recorder->frames();
  ASSERT_EQ(got.size(), kFrames);
  for (size_t i = 0; i < kFrames; ++i) {
    ASSERT_EQ(got[i].header.sequence, i);
    ASSERT_EQ(*got[i].buffer, *sent[i]);
  }
  EXPECT_TRUE(
      server.recorder->WaitFor([&] { return link->QueuedBytes() == 0; }));
}

TEST(TcpTransportTest, SendFromManyThreadsKeepsPerThreadOrder) {
  Server server;
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  constexpr int kThreads = 4, kEach = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) link->Send(TestFrame(i, 64, t));
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(server.recorder->WaitFrames(kThreads * kEach));
  std::map<uint64_t, uint64_t> next;  // epoch (thread) -> next sequence
  for (const auto& f : server.recorder->frames()) {
    ASSERT_EQ(f.header.sequence, next[f.header.epoch]++);
  }
}

TEST(TcpTransportTest, LargeFramesBothWays) {
  TransportOptions options;
  Server server(options);
  server.recorder->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp(options);
  auto link = MustConnect(*client, server.port, client_rec);
  constexpr size_t kSize = 8u << 20;
  std::vector<FrameBuffer> sent;
  for (uint64_t i = 0; i < 4; ++i) {
    sent.push_back(TestFrame(i, kSize));
    link->Send(sent.back());
  }
  ASSERT_TRUE(client_rec->WaitFrames(4));
  auto got = client_rec->frames();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(*got[i].buffer, *sent[i]);
}

TEST(TcpTransportTest, ManyLinksToOneListener) {
  Server server;
  auto client = MakeTcp();
  constexpr int kLinks = 32, kEach = 100;
  std::vector<std::shared_ptr<Link>> links;
  for (int i = 0; i < kLinks; ++i) {
    links.push_back(
        MustConnect(*client, server.port, std::make_shared<Recorder>()));
  }
  for (int j = 0; j < kEach; ++j) {
    for (int i = 0; i < kLinks; ++i) links[i]->Send(TestFrame(j, 100, i));
  }
  ASSERT_TRUE(server.recorder->WaitFrames(kLinks * kEach));
  EXPECT_EQ(server.recorder->opened().size(), size_t{kLinks});
  std::map<uint64_t, uint64_t> next;  // link id -> next sequence
  std::map<uint64_t, uint64_t> epoch_of;
  for (const auto& f : server.recorder->frames()) {
    ASSERT_EQ(f.header.sequence, next[f.link_id]++);
    auto [it, fresh] = epoch_of.emplace(f.link_id, f.header.epoch);
    ASSERT_EQ(it->second, f.header.epoch);  // one client per server link
  }
  EXPECT_EQ(next.size(), size_t{kLinks});
}

TEST(TcpTransportTest, QueuedBytesGrowWhileThePeerDoesNotReadAndDrain) {
  TransportOptions options;
  options.high_watermark = 8u << 20;
  options.low_watermark = 1u << 20;
  Server server(options, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp(options);
  auto link = MustConnect(*client, server.port, client_rec);
  ASSERT_TRUE(server.recorder->WaitOpened(1));
  constexpr size_t kFrames = 64, kSize = 1u << 20;
  size_t total = 0;
  std::vector<FrameBuffer> frames;
  for (uint64_t i = 0; i < kFrames; ++i) {
    frames.push_back(TestFrame(i, kSize));
    total += frames.back()->size();
  }
  // All at once on the event thread: the first write takes one frame, the
  // next one gathers the other 63.
  std::atomic<bool> sent{false};
  client->Post([&] {
    for (const FrameBuffer& f : frames) link->Send(f);
    sent = true;
  });
  ASSERT_TRUE(client_rec->WaitFor([&] { return sent.load(); }));
  // Some bytes reach the kernel buffers; the rest must wait for the reader.
  ASSERT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() < total; }));
  EXPECT_GT(link->QueuedBytes(), total / 2);
  // What the kernel took counts as sent as it goes, not once a gathered
  // write of many frames is out (a parent judges a slow child by it): the
  // buffers on both ends hold several frames.
  ASSERT_TRUE(client_rec->WaitFor([&] {
    return link->stats().bytes_sent > 2 * kSize &&
           link->stats().bytes_sent + link->QueuedBytes() == total;
  })) << link->stats().bytes_sent
      << " sent, " << link->QueuedBytes() << " queued";
  EXPECT_EQ(server.recorder->frames().size(), 0u);
  EXPECT_EQ(client_rec->drained(), 0);

  server.recorder->opened()[0]->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitFrames(kFrames));
  ASSERT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() == 0; }));
  ASSERT_TRUE(client_rec->WaitFor([&] { return client_rec->drained() >= 1; }));
  EXPECT_EQ(client_rec->drained(), 1);
}

TEST(TcpTransportTest, MaxQueuedBytesClosesWithResourceExhausted) {
  TransportOptions options;
  options.max_queued_bytes = 24u << 20;
  Server server(TransportOptions{}, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp(options);
  auto link = MustConnect(*client, server.port, client_rec);
  for (uint64_t i = 0; i < 64; ++i) link->Send(TestFrame(i, 1u << 20));
  ASSERT_TRUE(client_rec->WaitClosed(1));
  EXPECT_EQ(client_rec->closed()[0].why.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() == 0; }));
}

TEST(TcpTransportTest, PeerCloseIsReportedOnceOnEachSide) {
  Server server;
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, client_rec);
  ASSERT_TRUE(server.recorder->WaitOpened(1));
  server.recorder->opened()[0]->Close();
  ASSERT_TRUE(client_rec->WaitClosed(1));
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  Status client_why = client_rec->closed()[0].why;
  EXPECT_EQ(client_why.code(), StatusCode::kIOError);
  EXPECT_NE(client_why.message().find("closed the connection"),
            std::string::npos)
      << client_why.ToString();
  EXPECT_TRUE(server.recorder->closed()[0].why.ok());
  // Closing again, sending after close: no second report, no effect.
  link->Close();
  link->Send(TestFrame(1, 10));
  server.recorder->opened()[0]->Close();
  client->Stop();
  server.transport->Stop();
  EXPECT_EQ(client_rec->closed().size(), 1u);
  EXPECT_EQ(server.recorder->closed().size(), 1u);
  EXPECT_EQ(link->QueuedBytes(), 0u);
}

TEST(TcpTransportTest, CloseAfterFlushDeliversEverything) {
  Server server;
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, client_rec);
  for (uint64_t i = 0; i < 100; ++i) link->Send(TestFrame(i, 5000));
  link->CloseAfterFlush();
  link->Send(TestFrame(100, 10));  // refused: the link is closing
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  EXPECT_EQ(server.recorder->frames().size(), 100u);
  EXPECT_EQ(server.recorder->closed()[0].why.code(), StatusCode::kIOError);
  ASSERT_TRUE(client_rec->WaitClosed(1));
  EXPECT_TRUE(client_rec->closed()[0].why.ok());
}

TEST(TcpTransportTest, PeerProcessDeathMidFrameIsDetected) {
  Server server;
  FrameBuffer frame = TestFrame(0, 4096);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: only async-signal-safe calls.
    int fd = RawConnect(server.port);
    if (fd < 0) _exit(2);
    ssize_t n = ::write(fd, frame->data(), 100);
    _exit(n == 100 ? 0 : 3);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  Status why = server.recorder->closed()[0].why;
  EXPECT_EQ(why.code(), StatusCode::kIOError);
  EXPECT_NE(why.message().find("mid-frame (100 bytes"), std::string::npos)
      << why.ToString();
  EXPECT_EQ(server.recorder->opened().size(), 1u);
  EXPECT_TRUE(server.recorder->ClosedAtMostOnce());
}

TEST(TcpTransportTest, GarbageFromPeerClosesWithCorruption) {
  Server server;
  int fd = RawConnect(server.port);
  ASSERT_GE(fd, 0);
  std::string garbage(200, 'x');
  ASSERT_EQ(::write(fd, garbage.data(), garbage.size()), ssize_t(200));
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  Status why = server.recorder->closed()[0].why;
  EXPECT_TRUE(why.IsCorruption()) << why.ToString();
  EXPECT_NE(why.message().find("frame from 127.0.0.1:"), std::string::npos)
      << why.ToString();
  // The server closed the socket: the raw peer reads EOF.
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0);
  ::close(fd);
}

TEST(TcpTransportTest, OversizedFrameIsRejected) {
  TransportOptions small;
  small.frames.max_payload = 1u << 20;
  Server server(small);
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  link->Send(TestFrame(0, 100));
  link->Send(TestFrame(1, 2u << 20));
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  EXPECT_EQ(server.recorder->frames().size(), 1u);
  Status why = server.recorder->closed()[0].why;
  EXPECT_TRUE(why.IsCorruption());
  EXPECT_NE(why.message().find("exceeds the limit"), std::string::npos)
      << why.ToString();
}

TEST(TcpTransportTest, ConnectToClosedPortNamesHostAndPort) {
  uint16_t port;
  {
    Server gone;
    port = gone.port;
  }
  auto client = MakeTcp();
  Result<std::shared_ptr<Link>> link = client->Connect(
      "127.0.0.1", port, std::make_shared<Recorder>(), kConnectTimeout);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kIOError);
  EXPECT_NE(link.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << link.status().ToString();
  EXPECT_NE(link.status().message().find("refused"), std::string::npos)
      << link.status().ToString();
}

TEST(TcpTransportTest, ConnectByHostName) {
  Server server;
  auto client = MakeTcp();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>(),
                          "localhost");
  ASSERT_TRUE(link);
  link->Send(TestFrame(0, 10));
  EXPECT_TRUE(server.recorder->WaitFrames(1));
}

TEST(TcpTransportTest, ConnectTimesOut) {
  // A listener that never accepts and whose backlog is full: the kernel
  // drops further SYNs, so a connect hangs.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 0), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  uint16_t port = ntohs(addr.sin_port);
  int filler = RawConnect(port);
  ASSERT_GE(filler, 0);

  auto client = MakeTcp();
  auto start = std::chrono::steady_clock::now();
  Result<std::shared_ptr<Link>> link = client->Connect(
      "127.0.0.1", port, std::make_shared<Recorder>(), milliseconds(200));
  auto elapsed = std::chrono::steady_clock::now() - start;
  ::close(filler);
  ::close(lfd);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("timed out after 200 ms"),
            std::string::npos)
      << link.status().ToString();
  EXPECT_NE(link.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos);
  EXPECT_GE(elapsed, milliseconds(190));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

TEST(TcpTransportTest, ListenErrors) {
  Server server;
  auto again =
      server.transport->Listen("127.0.0.1", 0, std::make_shared<Recorder>());
  EXPECT_TRUE(again.IsInvalidArgument()) << again.ToString();
  auto other = MakeTcp();
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

TEST(TcpTransportTest, EventThreadRulesAndAsyncConnect) {
  Server server;
  auto client = MakeTcp();
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

TEST(TcpTransportTest, StopWithLinksOpenAndFramesInFlight) {
  TransportOptions options;
  Server server(options, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeTcp(options);
  std::vector<std::shared_ptr<Link>> links;
  for (int i = 0; i < 4; ++i) {
    links.push_back(MustConnect(*client, server.port, client_rec));
  }
  for (auto& link : links) {
    for (uint64_t j = 0; j < 16; ++j) link->Send(TestFrame(j, 1u << 20));
  }
  // A connect still pending when the transport stops.
  std::promise<Status> pending;
  client->AsyncConnect(
      "127.0.0.1", server.port, client_rec, kConnectTimeout,
      [&](Result<std::shared_ptr<Link>> r) { pending.set_value(r.status()); });
  client->Stop();
  client->Stop();  // idempotent
  auto p = pending.get_future();
  ASSERT_EQ(p.wait_for(kWait), std::future_status::ready);
  // Either it finished before Stop (and its link was then closed) or it
  // was aborted; it never hangs.
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
  // Paused server links notice the closed peers once they read again (and
  // the server may still be accepting some of them).
  server.recorder->set_pause_on_open(false);
  ASSERT_TRUE(server.recorder->WaitOpened(opened));
  for (const auto& l : server.recorder->opened()) l->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitClosed(opened));
  server.transport->Stop();
  EXPECT_TRUE(server.recorder->ClosedAtMostOnce());
}

TEST(TcpTransportTest, DestroyWithoutStop) {
  auto server = std::make_unique<Server>();
  auto client = MakeTcp();
  auto link = MustConnect(*client, server->port, std::make_shared<Recorder>());
  link->Send(TestFrame(0, 1u << 20));
  server.reset();
  client.reset();
  link->Send(TestFrame(1, 10));  // the link outlives its transport safely
  EXPECT_EQ(link->QueuedBytes(), 0u);
}

}  // namespace
}  // namespace dcr
