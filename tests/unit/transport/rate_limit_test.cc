// TransportOptions::max_send_bps on the TCP backend: the pace, frame
// integrity across writes that end mid-frame, QueuedBytes/OnDrained, and
// closing or stopping while a link waits for tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "unit/transport/transport_test_util.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::Recorder;
using testing::TestFrame;

constexpr uint64_t kBps = 40'000'000;  // 40 Mbit/s: 5 MB/s
constexpr size_t kTotalPayload = 5'000'000;
using testing::kConnectTimeout;
using testing::MakeTcp;

TransportOptions Limited(uint64_t bps = kBps) {
  TransportOptions o;
  o.max_send_bps = bps;
  return o;
}

// About 5 MB of frames of mixed sizes (1 B to 250 KB), so paced writes end
// mid-frame and also gather several small frames.
std::vector<FrameBuffer> Frames(size_t* total_bytes) {
  std::vector<FrameBuffer> frames;
  size_t payload = 0;
  *total_bytes = 0;
  for (uint64_t i = 0; payload < kTotalPayload; ++i) {
    const size_t size = i % 5 == 4 ? 1 : 1 + (i * 104729) % 250000;
    frames.push_back(TestFrame(i, size));
    payload += size;
    *total_bytes += frames.back()->size();
  }
  return frames;
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A listener (unlimited) and a client transport with `client_options`,
// one link between them.
struct Pair {
  explicit Pair(const TransportOptions& client_options,
                TransportOptions server_options = {})
      : server(MakeTcp(server_options)),
        client(MakeTcp(client_options)),
        server_rec(std::make_shared<Recorder>()),
        client_rec(std::make_shared<Recorder>()) {
    Status s = server->Listen("127.0.0.1", 0, server_rec);
    EXPECT_TRUE(s.ok()) << s.ToString();
    Result<std::shared_ptr<Link>> l = client->Connect(
        "127.0.0.1", server->BoundPort(), client_rec, kConnectTimeout);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (l.ok()) link = *l;
    EXPECT_TRUE(server_rec->WaitOpened(1));
  }
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  std::shared_ptr<Recorder> server_rec;
  std::shared_ptr<Recorder> client_rec;
  std::shared_ptr<Link> link;
};

// Every received frame is the sent frame of the same index.
void ExpectPrefixIntact(const std::vector<Recorder::Received>& got,
                        const std::vector<FrameBuffer>& sent) {
  ASSERT_LE(got.size(), sent.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].header.sequence, i);
    ASSERT_EQ(*got[i].buffer, *sent[i]) << "frame " << i;
  }
}

TEST(TcpRateLimitTest, PacedLinkDeliversEverythingInOrderAtTheRate) {
  size_t total = 0;
  const std::vector<FrameBuffer> frames = Frames(&total);
  Pair p(Limited());
  ASSERT_TRUE(p.link);
  const double ideal = static_cast<double>(total) * 8 / kBps;  // ~1.0 s

  const Clock::time_point start = Clock::now();
  for (const FrameBuffer& f : frames) p.link->Send(f);
  ASSERT_TRUE(p.server_rec->WaitFrames(frames.size()));
  const double elapsed = Seconds(Clock::now() - start);

  auto got = p.server_rec->frames();
  ASSERT_EQ(got.size(), frames.size());
  ExpectPrefixIntact(got, frames);
  EXPECT_GE(elapsed, 0.7 * ideal) << "ideal " << ideal << " s";
  EXPECT_LE(elapsed, 2.0 * ideal) << "ideal " << ideal << " s";
  ASSERT_TRUE(
      p.client_rec->WaitFor([&] { return p.link->QueuedBytes() == 0; }));
  LinkStats s = p.link->stats();
  EXPECT_EQ(s.frames_sent, frames.size());
  EXPECT_EQ(s.bytes_sent, total);
}

TEST(TcpRateLimitTest, UnlimitedLinkIsMuchFaster) {
  size_t total = 0;
  const std::vector<FrameBuffer> frames = Frames(&total);
  Pair p(TransportOptions{});
  ASSERT_TRUE(p.link);
  const double ideal = static_cast<double>(total) * 8 / kBps;

  const Clock::time_point start = Clock::now();
  for (const FrameBuffer& f : frames) p.link->Send(f);
  ASSERT_TRUE(p.server_rec->WaitFrames(frames.size()));
  const double elapsed = Seconds(Clock::now() - start);
  ExpectPrefixIntact(p.server_rec->frames(), frames);
  EXPECT_LT(elapsed, 0.5 * ideal);
}

TEST(TcpRateLimitTest, QueuedBytesCountUnsentBytesAndDrainFires) {
  size_t total = 0;
  const std::vector<FrameBuffer> frames = Frames(&total);
  TransportOptions o = Limited();
  o.high_watermark = 2u << 20;
  o.low_watermark = 1u << 20;
  Pair p(o);
  ASSERT_TRUE(p.link);
  for (const FrameBuffer& f : frames) p.link->Send(f);
  // Only the burst may leave at once; the rest waits in the queue.
  ASSERT_TRUE(p.client_rec->WaitFor([&] {
    return p.link->QueuedBytes() > 0 && p.link->QueuedBytes() < total;
  }));
  std::this_thread::sleep_for(milliseconds(300));
  const size_t queued = p.link->QueuedBytes();
  EXPECT_GT(queued, total / 4);
  EXPECT_LT(queued, total - total / 10);
  EXPECT_EQ(p.client_rec->drained(), 0);

  ASSERT_TRUE(p.server_rec->WaitFrames(frames.size()));
  ExpectPrefixIntact(p.server_rec->frames(), frames);
  ASSERT_TRUE(
      p.client_rec->WaitFor([&] { return p.link->QueuedBytes() == 0; }));
  ASSERT_TRUE(
      p.client_rec->WaitFor([&] { return p.client_rec->drained() > 0; }));
  EXPECT_EQ(p.client_rec->drained(), 1);
}

TEST(TcpRateLimitTest, CloseMidTransferIsClean) {
  size_t total = 0;
  const std::vector<FrameBuffer> frames = Frames(&total);
  Pair p(Limited());
  ASSERT_TRUE(p.link);
  for (const FrameBuffer& f : frames) p.link->Send(f);
  std::this_thread::sleep_for(milliseconds(300));
  p.link->Close();
  ASSERT_TRUE(p.client_rec->WaitClosed(1));
  EXPECT_TRUE(p.client_rec->closed()[0].why.ok());
  EXPECT_EQ(p.link->QueuedBytes(), 0u);
  // The peer sees the connection end, possibly mid-frame, after a prefix
  // of intact frames.
  ASSERT_TRUE(p.server_rec->WaitClosed(1));
  EXPECT_EQ(p.server_rec->closed()[0].why.code(), StatusCode::kIOError);
  auto got = p.server_rec->frames();
  EXPECT_GT(got.size(), 0u);
  EXPECT_LT(got.size(), frames.size());
  ExpectPrefixIntact(got, frames);
  // Nothing more happens on the closed link (the Send is counted until
  // the event thread drops it).
  p.link->Send(frames[0]);
  EXPECT_TRUE(
      p.client_rec->WaitFor([&] { return p.link->QueuedBytes() == 0; }));
  std::this_thread::sleep_for(milliseconds(100));
  p.client->Stop();
  EXPECT_EQ(p.client_rec->closed().size(), 1u);
  EXPECT_TRUE(p.client_rec->ClosedAtMostOnce());
  EXPECT_GE(p.link->stats().frames_sent, got.size());
}

TEST(TcpRateLimitTest, StopWhileWaitingForTokens) {
  size_t total = 0;
  const std::vector<FrameBuffer> frames = Frames(&total);
  // 1 Mbit/s: the link waits on its timer for the whole test.
  Pair p(Limited(1'000'000));
  ASSERT_TRUE(p.link);
  for (const FrameBuffer& f : frames) p.link->Send(f);
  std::this_thread::sleep_for(milliseconds(100));
  const Clock::time_point start = Clock::now();
  p.client->Stop();
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  ASSERT_EQ(p.client_rec->closed().size(), 1u);
  EXPECT_TRUE(p.client_rec->closed()[0].why.ok());
  EXPECT_EQ(p.link->QueuedBytes(), 0u);
  p.client.reset();
  p.link->Send(frames[0]);  // the link outlives its transport safely
  EXPECT_EQ(p.link->QueuedBytes(), 0u);
  ASSERT_TRUE(p.server_rec->WaitClosed(1));
  ExpectPrefixIntact(p.server_rec->frames(), frames);
}

TEST(TcpRateLimitTest, CloseAfterFlushWritesTheWholeQueueFirst) {
  std::vector<FrameBuffer> frames;
  size_t total = 0;
  for (uint64_t i = 0; i < 10; ++i) {
    frames.push_back(TestFrame(i, 100000));
    total += frames.back()->size();
  }
  Pair p(Limited());
  ASSERT_TRUE(p.link);
  const Clock::time_point start = Clock::now();
  for (const FrameBuffer& f : frames) p.link->Send(f);
  p.link->CloseAfterFlush();
  ASSERT_TRUE(p.client_rec->WaitClosed(1));
  EXPECT_TRUE(p.client_rec->closed()[0].why.ok());
  // 1 MB at 5 MB/s, less the first burst.
  EXPECT_GE(Seconds(Clock::now() - start),
            0.7 * static_cast<double>(total) * 8 / kBps);
  ASSERT_TRUE(p.server_rec->WaitClosed(1));
  auto got = p.server_rec->frames();
  EXPECT_EQ(got.size(), frames.size());
  ExpectPrefixIntact(got, frames);
}

}  // namespace
}  // namespace dcr
