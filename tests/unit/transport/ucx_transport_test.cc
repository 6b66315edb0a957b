// The "ucx" backend against the contract of dcr/transport.h, on loopback
// with UCX_TLS=tcp (no RDMA needed). Peer death is a real process: the
// test binary re-executes itself as a UCX peer (kRanAsPeer) and kills it.
// Connecting, listening and stopping are in ucx_lifecycle_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "unit/transport/transport_test_util.h"
#include "unit/transport/ucx_test_util.h"

namespace dcr {
namespace {

using std::chrono::milliseconds;
using testing::kWait;
using testing::Recorder;
using testing::TestFrame;
using Clock = std::chrono::steady_clock;

using testing::kConnectTimeout;
constexpr char kPeerPortVar[] = "DCR_UCX_TEST_PEER_PORT";

using testing::Make;
using testing::MakeUcx;
using testing::MustConnect;
using testing::Server;

TEST(UcxTransportTest, KindCapabilitiesAndRefusedOptions) {
  auto t = MakeUcx();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->kind(), "ucx");
  EXPECT_TRUE(t->capabilities().network);
  EXPECT_FALSE(t->capabilities().fault_injection);
  EXPECT_FALSE(t->capabilities().rdma);  // UCX_TLS=tcp
  EXPECT_EQ(t->BoundPort(), 0);

  TransportOptions tls;
  tls.tls.ca_file = "/nonexistent/ca.pem";
  Status s = CreateTransport("ucx", tls).status();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("no TLS"), std::string::npos) << s.ToString();
  TransportOptions paced;
  paced.max_send_bps = 1'000'000;
  EXPECT_EQ(CreateTransport("ucx", paced).status().code(),
            StatusCode::kUnsupported);
  TransportOptions bad;
  bad.low_watermark = 10;
  bad.high_watermark = 5;
  EXPECT_TRUE(CreateTransport("ucx", bad).status().IsInvalidArgument());
}

TEST(UcxTransportTest, ProbeListsBothBackends) {
  const auto start = Clock::now();
  std::vector<TransportSupport> probe = ProbeTransports();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  ASSERT_EQ(probe.size(), 2u);
  EXPECT_EQ(probe[0].kind, "tcp");
  EXPECT_TRUE(probe[0].built && probe[0].usable);
  EXPECT_NE(probe[0].detail.find("OpenSSL"), std::string::npos)
      << probe[0].detail;
  EXPECT_EQ(probe[1].kind, "ucx");
  EXPECT_TRUE(probe[1].built);
  EXPECT_TRUE(probe[1].usable) << probe[1].detail;
  EXPECT_EQ(probe[1].version.rfind("UCX 1.", 0), 0u) << probe[1].version;
  EXPECT_NE(probe[1].detail.find("tcp/lo"), std::string::npos)
      << probe[1].detail;
  for (const auto& p : probe) {
    std::printf("%s: built=%d usable=%d version='%s' detail='%s'\n",
                p.kind.c_str(), p.built, p.usable, p.version.c_str(),
                p.detail.c_str());
  }
}

TEST(UcxTransportTest, ExchangeAndForwardVerbatim) {
  Server server;
  server.recorder->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx();
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

  auto opened = server.recorder->opened();
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0]->peer().rfind("127.0.0.1:", 0), 0u) << opened[0]->peer();
  ASSERT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() == 0; }));
  LinkStats s = link->stats();
  EXPECT_EQ(s.frames_sent, 1u);
  EXPECT_EQ(s.bytes_sent, sent->size());
  EXPECT_EQ(s.frames_received, 1u);
  EXPECT_EQ(s.bytes_received, sent->size());
  LinkStats ss = opened[0]->stats();
  EXPECT_EQ(ss.frames_received, 1u);
  EXPECT_EQ(ss.bytes_received, sent->size());
}

TEST(UcxTransportTest, TenThousandFramesInOrder) {
  Server server;
  auto client = MakeUcx();
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

TEST(UcxTransportTest, SendFromManyThreadsKeepsPerThreadOrder) {
  Server server;
  auto client = MakeUcx();
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

// Frames larger than the credit window (8 MiB) and the read buffer.
TEST(UcxTransportTest, LargeFramesBothWays) {
  Server server;
  server.recorder->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, client_rec);
  const size_t sizes[] = {3u << 20, 12u << 20, 1, 8u << 20};
  std::vector<FrameBuffer> sent;
  for (uint64_t i = 0; i < 4; ++i) {
    sent.push_back(TestFrame(i, sizes[i]));
    link->Send(sent.back());
  }
  ASSERT_TRUE(client_rec->WaitFrames(4));
  auto got = client_rec->frames();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(*got[i].buffer, *sent[i]);
}

TEST(UcxTransportTest, ManyLinksToOneListener) {
  Server server;
  auto client = MakeUcx();
  constexpr int kLinks = 16, kEach = 100;
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
}

// A paused reader stops crediting: the sender's queue holds what the
// window does not let through, then drains (OnDrained once) on resume.
TEST(UcxTransportTest, QueuedBytesGrowWhileThePeerIsPausedAndDrain) {
  TransportOptions options;
  options.high_watermark = 8u << 20;
  options.low_watermark = 1u << 20;
  Server server(options, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx(options);
  auto link = MustConnect(*client, server.port, client_rec);
  ASSERT_TRUE(server.recorder->WaitOpened(1));
  constexpr size_t kFrames = 64, kSize = 1u << 20;
  size_t total = 0;
  for (uint64_t i = 0; i < kFrames; ++i) {
    FrameBuffer f = TestFrame(i, kSize);
    total += f->size();
    link->Send(f);
  }
  ASSERT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() < total; }));
  std::this_thread::sleep_for(milliseconds(200));  // let the window fill
  EXPECT_GT(link->QueuedBytes(), total / 2);
  EXPECT_EQ(server.recorder->frames().size(), 0u);
  EXPECT_EQ(client_rec->drained(), 0);

  server.recorder->opened()[0]->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitFrames(kFrames));
  ASSERT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() == 0; }));
  ASSERT_TRUE(client_rec->WaitFor([&] { return client_rec->drained() >= 1; }));
  EXPECT_EQ(client_rec->drained(), 1);
  auto got = server.recorder->frames();
  for (size_t i = 0; i < kFrames; ++i) ASSERT_EQ(got[i].header.sequence, i);
}

TEST(UcxTransportTest, PauseAndResumeReadingMidStream) {
  Server server;
  std::shared_ptr<Link> server_link;
  server.recorder->set_on_frame([&](Link& link, const FrameBuffer&) {
    if (server.recorder->frames().size() == 10) link.PauseReading();
  });
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  for (uint64_t i = 0; i < 50; ++i) link->Send(TestFrame(i, 1000));
  ASSERT_TRUE(server.recorder->WaitFrames(10));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(server.recorder->frames().size(), 10u);  // none while paused
  server.recorder->set_on_frame(nullptr);
  server.recorder->opened()[0]->ResumeReading();
  ASSERT_TRUE(server.recorder->WaitFrames(50));
  auto got = server.recorder->frames();
  for (size_t i = 0; i < 50; ++i) ASSERT_EQ(got[i].header.sequence, i);
}

TEST(UcxTransportTest, MaxQueuedBytesClosesWithResourceExhausted) {
  TransportOptions options;
  options.max_queued_bytes = 24u << 20;
  Server server(TransportOptions{}, /*pause_on_open=*/true);
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx(options);
  auto link = MustConnect(*client, server.port, client_rec);
  for (uint64_t i = 0; i < 64; ++i) link->Send(TestFrame(i, 1u << 20));
  ASSERT_TRUE(client_rec->WaitClosed(1));
  EXPECT_EQ(client_rec->closed()[0].why.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(client_rec->WaitFor([&] { return link->QueuedBytes() == 0; }));
}

TEST(UcxTransportTest, PeerCloseIsReportedOnceOnEachSide) {
  Server server;
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx();
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
  EXPECT_NE(client_why.message().find(link->peer()), std::string::npos);
  EXPECT_TRUE(server.recorder->closed()[0].why.ok());
  link->Close();
  link->Send(TestFrame(1, 10));
  server.recorder->opened()[0]->Close();
  client->Stop();
  server.transport->Stop();
  EXPECT_EQ(client_rec->closed().size(), 1u);
  EXPECT_EQ(server.recorder->closed().size(), 1u);
  EXPECT_EQ(link->QueuedBytes(), 0u);
}

TEST(UcxTransportTest, CloseAfterFlushDeliversEverything) {
  Server server;
  auto client_rec = std::make_shared<Recorder>();
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, client_rec);
  for (uint64_t i = 0; i < 100; ++i) link->Send(TestFrame(i, 5000));
  link->Send(TestFrame(100, 10u << 20));  // beyond the credit window
  link->CloseAfterFlush();
  link->Send(TestFrame(101, 10));  // refused: the link is closing
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  ASSERT_EQ(server.recorder->frames().size(), 101u);
  EXPECT_EQ(server.recorder->frames()[100].header.sequence, 100u);
  EXPECT_EQ(server.recorder->closed()[0].why.code(), StatusCode::kIOError);
  ASSERT_TRUE(client_rec->WaitClosed(1));
  EXPECT_TRUE(client_rec->closed()[0].why.ok());
}

// The peer process of KilledPeerProcessIsDetected, which re-executes this
// binary with kPeerPortVar set: before main (so it is no test of its own)
// it connects to that port, sends frame 0 and waits to be killed.
[[maybe_unused]] const bool kRanAsPeer = [] {
  const char* port = getenv(kPeerPortVar);
  if (port == nullptr) return false;
  TransportOptions options;
  options.name = "peer";
  auto client = CreateTransport("ucx", options);
  if (!client.ok()) _exit(2);
  auto link =
      (*client)->Connect("127.0.0.1", static_cast<uint16_t>(std::atoi(port)),
                         std::make_shared<Recorder>(), std::chrono::seconds(5));
  if (!link.ok()) _exit(2);
  (*link)->Send(TestFrame(0, 4096));
  std::this_thread::sleep_for(std::chrono::seconds(30));
  _exit(3);  // not killed in time
}();

TEST(UcxTransportTest, KilledPeerProcessIsDetected) {
  Server server;
  const std::string port = std::to_string(server.port);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A fresh process runs UCX (exec), quietly.
    setenv(kPeerPortVar, port.c_str(), 1);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDOUT_FILENO);
    execl("/proc/self/exe", "ucx_transport_test", static_cast<char*>(nullptr));
    _exit(127);
  }
  const bool got = server.recorder->WaitFrames(1);
  const auto killed_at = Clock::now();
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(got) << "the peer process sent no frame";
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  const auto detected = Clock::now() - killed_at;
  Status why = server.recorder->closed()[0].why;
  EXPECT_EQ(why.code(), StatusCode::kIOError) << why.ToString();
  EXPECT_NE(why.message().find(server.recorder->opened()[0]->peer()),
            std::string::npos)
      << why.ToString();
  EXPECT_LT(detected, std::chrono::seconds(5));
  std::printf("killed peer detected after %lld ms: %s\n",
              static_cast<long long>(
                  std::chrono::duration_cast<milliseconds>(detected).count()),
              why.ToString().c_str());
  EXPECT_TRUE(server.recorder->ClosedAtMostOnce());
}

TEST(UcxTransportTest, CorruptFrameClosesWithCorruption) {
  Server server;
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  link->Send(TestFrame(0, 100));
  auto bad = std::make_shared<std::vector<std::byte>>(*TestFrame(1, 100));
  (*bad)[kFrameHeaderSize + 10] ^= std::byte{1};
  link->Send(std::move(bad));
  ASSERT_TRUE(server.recorder->WaitClosed(1));
  EXPECT_EQ(server.recorder->frames().size(), 1u);
  Status why = server.recorder->closed()[0].why;
  EXPECT_TRUE(why.IsCorruption()) << why.ToString();
  EXPECT_NE(why.message().find("frame from 127.0.0.1:"), std::string::npos)
      << why.ToString();
}

TEST(UcxTransportTest, OversizedFrameIsRejected) {
  TransportOptions small;
  small.frames.max_payload = 1u << 20;
  Server server(small);
  auto client = MakeUcx();
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

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

// The event thread sleeps in epoll while nothing happens: no busy-wait.
TEST(UcxTransportTest, IdleTransportUsesNoCpu) {
  Server server;
  auto client = MakeUcx();
  auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
  link->Send(TestFrame(0, 10));
  ASSERT_TRUE(server.recorder->WaitFrames(1));
  std::this_thread::sleep_for(milliseconds(100));
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(milliseconds(1000));
  const double cpu = ProcessCpuSeconds() - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("idle: %.1f ms CPU in %.0f ms (two transports, one link)\n",
              cpu * 1e3, wall * 1e3);
  EXPECT_LT(cpu, 0.05 * wall);
}

// Throughput of one large transfer on loopback, UCX (UCX_TLS=tcp) against
// the TCP backend in the same run (printed, not asserted).
TEST(UcxTransportTest, LargeTransferThroughputAgainstTcp) {
  constexpr size_t kFrameSize = 1u << 20, kFrames = 256;
  std::vector<FrameBuffer> frames;
  for (uint64_t i = 0; i < 8; ++i) frames.push_back(TestFrame(i, kFrameSize));
  auto run = [&](std::string_view kind) {
    Server server(TransportOptions{}, false, kind);
    auto client = Make(kind);
    auto link = MustConnect(*client, server.port, std::make_shared<Recorder>());
    if (!link) return 0.0;
    const Clock::time_point start = Clock::now();
    for (size_t i = 0; i < kFrames; ++i) link->Send(frames[i % 8]);
    EXPECT_TRUE(server.recorder->WaitFrames(kFrames));
    const double s =
        std::chrono::duration<double>(Clock::now() - start).count();
    auto got = server.recorder->frames();
    EXPECT_EQ(got.size(), kFrames);
    if (got.size() == kFrames) {
      EXPECT_EQ(*got.back().buffer, *frames[7]);
    }
    return kFrames * static_cast<double>(kFrameSize) / s / 1e6;
  };
  const double tcp = run("tcp");
  const double ucx = run("ucx");
  std::printf(
      "loopback, %zu x %zu MiB frames: tcp %.0f MB/s, ucx (UCX_TLS=tcp) %.0f "
      "MB/s (%.2fx)\n",
      kFrames, kFrameSize >> 20, tcp, ucx, ucx / tcp);
  EXPECT_GT(ucx, 0);
}

}  // namespace
}  // namespace dcr
