#include "transport/fake_transport.h"

#include <gtest/gtest.h>

#include <future>

#include "dcr/transport.h"
#include "unit/transport/transport_test_util.h"

namespace dcr {
namespace {

using std::chrono::milliseconds;
using testing::kWait;
using testing::Recorder;
using testing::TestFrame;

// Two endpoints on one fake network: "root" connected to "child", which
// listens on child:17001.
class FakeTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    net_ = FakeNetwork::Create();
    TransportOptions o;
    o.fake_network = net_;
    o.high_watermark = 4u << 20;
    o.low_watermark = 1u << 20;
    o.name = "root";
    root_ = Make(o);
    o.name = "child";
    child_ = Make(o);
    ASSERT_TRUE(child_->Listen("child", 17001, child_rec_).ok());
    Connect();
  }

  std::unique_ptr<Transport> Make(const TransportOptions& o) {
    Result<std::unique_ptr<Transport>> t = CreateTransport("fake", o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  void Connect() {
    Result<std::shared_ptr<Link>> link =
        root_->Connect("child", 17001, root_rec_, milliseconds(100));
    ASSERT_TRUE(link.ok()) << link.status().ToString();
    link_ = *link;
  }

  void SendFrames(uint64_t first, uint64_t count, size_t size = 100) {
    for (uint64_t i = first; i < first + count; ++i) {
      link_->Send(TestFrame(i, size));
    }
  }

  std::vector<uint64_t> ChildSequences() {
    std::vector<uint64_t> seqs;
    for (const auto& f : child_rec_->frames())
      seqs.push_back(f.header.sequence);
    return seqs;
  }

  std::shared_ptr<FakeNetwork> net_;
  std::shared_ptr<Recorder> root_rec_ = std::make_shared<Recorder>();
  std::shared_ptr<Recorder> child_rec_ = std::make_shared<Recorder>();
  std::unique_ptr<Transport> root_;
  std::unique_ptr<Transport> child_;
  std::shared_ptr<Link> link_;
};

TEST_F(FakeTransportTest, ExchangesFramesInOrderBothWays) {
  EXPECT_EQ(root_->kind(), "fake");
  EXPECT_TRUE(root_->capabilities().fault_injection);
  EXPECT_EQ(child_->BoundPort(), 17001);
  EXPECT_EQ(link_->peer(), "child:17001");
  child_rec_->set_on_frame(
      [](Link& link, const FrameBuffer& buf) { link.Send(buf); });
  SendFrames(0, 500);
  ASSERT_TRUE(root_rec_->WaitFrames(500));
  auto got = root_rec_->frames();
  for (uint64_t i = 0; i < 500; ++i) {
    EXPECT_EQ(got[i].header.sequence, i);
    EXPECT_EQ(*got[i].buffer, *TestFrame(i, 100));
  }
  ASSERT_EQ(child_rec_->opened().size(), 1u);
  EXPECT_EQ(child_rec_->opened()[0]->peer(), "root");
  FakeDirectionStats s = net_->Stats("root", "child");
  EXPECT_EQ(s.frames_sent, 500u);
  EXPECT_EQ(s.frames_delivered, 500u);
  EXPECT_EQ(link_->stats().frames_sent, 500u);
  EXPECT_EQ(link_->stats().frames_received, 500u);
}

TEST_F(FakeTransportTest, DelayHoldsFramesBack) {
  FakeFaults f;
  f.delay = milliseconds(60);
  net_->SetFaults("root", "child", f);
  auto start = std::chrono::steady_clock::now();
  SendFrames(0, 3);
  ASSERT_TRUE(child_rec_->WaitFrames(3));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(60));
  EXPECT_EQ(ChildSequences(), (std::vector<uint64_t>{0, 1, 2}));
  // The other direction is not delayed.
  EXPECT_EQ(net_->Stats("child", "root").frames_sent, 0u);
}

TEST_F(FakeTransportTest, DropsTheNthFrame) {
  FakeFaults f;
  f.drop_frame = 3;
  net_->SetFaults("root", "child", f);
  SendFrames(0, 5);
  ASSERT_TRUE(child_rec_->WaitFrames(4));
  EXPECT_EQ(ChildSequences(), (std::vector<uint64_t>{0, 1, 3, 4}));
  EXPECT_EQ(net_->Stats("root", "child").frames_dropped, 1u);
  // Fires once.
  SendFrames(5, 5);
  ASSERT_TRUE(child_rec_->WaitFrames(9));
  EXPECT_TRUE(child_rec_->closed().empty());
}

TEST_F(FakeTransportTest, CorruptsTheNthFrameAndTheReceiverCloses) {
  FakeFaults f;
  f.corrupt_frame = 2;
  f.corrupt_offset = kFrameHeaderSize + 10;
  net_->SetFaults("root", "child", f);
  SendFrames(0, 4);
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_EQ(ChildSequences(), (std::vector<uint64_t>{0}));
  Status child_why = child_rec_->closed()[0].why;
  EXPECT_TRUE(child_why.IsCorruption()) << child_why.ToString();
  EXPECT_NE(child_why.message().find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(root_rec_->closed()[0].why.code(), StatusCode::kIOError);
  EXPECT_EQ(net_->Stats("root", "child").frames_corrupted, 1u);
  EXPECT_TRUE(root_rec_->WaitFor([&] { return link_->QueuedBytes() == 0; }));
}

TEST_F(FakeTransportTest, CutsAfterNBytesMidFrame) {
  const size_t frame_size = TestFrame(0, 100)->size();
  FakeFaults f;
  f.cut_after_bytes = frame_size + 20;
  net_->SetFaults("root", "child", f);
  SendFrames(0, 3);
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_EQ(ChildSequences(), (std::vector<uint64_t>{0}));
  for (const auto& c : {child_rec_->closed()[0], root_rec_->closed()[0]}) {
    EXPECT_EQ(c.why.code(), StatusCode::kIOError);
    EXPECT_NE(c.why.message().find("cut after " +
                                   std::to_string(frame_size + 20) + " bytes"),
              std::string::npos)
        << c.why.ToString();
  }
  FakeDirectionStats s = net_->Stats("root", "child");
  EXPECT_EQ(s.bytes_delivered, frame_size + 20);
  EXPECT_EQ(s.cuts, 1u);
  EXPECT_EQ(child_rec_->opened()[0]->stats().bytes_received, frame_size + 20);

  // The fault fired once: a new link works.
  Connect();
  SendFrames(10, 2);
  ASSERT_TRUE(child_rec_->WaitFrames(3));
}

TEST_F(FakeTransportTest, CutsAfterNFrames) {
  FakeFaults f;
  f.cut_after_frames = 2;
  net_->SetFaults("root", "child", f);
  SendFrames(0, 2);  // the cut follows the 2nd frame without more traffic
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_EQ(ChildSequences(), (std::vector<uint64_t>{0, 1}));
  EXPECT_NE(child_rec_->closed()[0].why.message().find("cut after 2 frames"),
            std::string::npos);
  EXPECT_TRUE(child_rec_->ClosedAtMostOnce());
  EXPECT_TRUE(root_rec_->ClosedAtMostOnce());
}

TEST_F(FakeTransportTest, PauseBuildsBackpressureAndResumeDrains) {
  net_->Pause("root", "child");
  constexpr size_t kFrames = 10, kSize = 1u << 20;
  size_t total = 0;
  for (uint64_t i = 0; i < kFrames; ++i) {
    FrameBuffer f = TestFrame(i, kSize);
    total += f->size();
    link_->Send(f);
  }
  net_->Sync();
  EXPECT_EQ(link_->QueuedBytes(), total);  // nothing moves while paused
  EXPECT_TRUE(child_rec_->frames().empty());
  EXPECT_EQ(root_rec_->drained(), 0);
  net_->Resume("root", "child");
  ASSERT_TRUE(child_rec_->WaitFrames(kFrames));
  ASSERT_TRUE(root_rec_->WaitFor([&] { return root_rec_->drained() == 1; }));
  EXPECT_EQ(link_->QueuedBytes(), 0u);
}

// A link's own watermarks (a plan's window and half of it) replace the
// transport's: OnDrained once the queue fell to half the window after it
// passed the window, and not for a queue that never reached the window.
TEST_F(FakeTransportTest, OwnWatermarksFireAtHalfTheWindow) {
  constexpr size_t kSize = 100u << 10;
  const size_t frame = TestFrame(0, kSize)->size();
  const size_t window = 5 * frame;
  link_->SetWatermarks(window, window / 2);
  net_->Pause("root", "child");
  SendFrames(0, 4, kSize);  // below the window
  net_->Sync();
  net_->Resume("root", "child");
  ASSERT_TRUE(child_rec_->WaitFrames(4));
  net_->Sync();
  EXPECT_EQ(root_rec_->drained(), 0);
  net_->Pause("root", "child");
  SendFrames(4, 6, kSize);  // 6 frames: above the window
  net_->Sync();
  EXPECT_GE(link_->QueuedBytes(), window);
  net_->Resume("root", "child");
  ASSERT_TRUE(child_rec_->WaitFrames(10));
  ASSERT_TRUE(root_rec_->WaitFor([&] { return root_rec_->drained() == 1; }));
  net_->Sync();
  EXPECT_EQ(root_rec_->drained(), 1);
  EXPECT_EQ(link_->QueuedBytes(), 0u);
}

TEST_F(FakeTransportTest, ReceiverPauseReadingBackpressuresTheSender) {
  ASSERT_TRUE(child_rec_->WaitOpened(1));
  std::shared_ptr<Link> child_end = child_rec_->opened()[0];
  child_end->PauseReading();
  net_->Sync();
  SendFrames(0, 8, 1u << 20);
  net_->Sync();
  EXPECT_GT(link_->QueuedBytes(), 8u << 20);
  EXPECT_TRUE(child_rec_->frames().empty());
  child_end->ResumeReading();
  ASSERT_TRUE(child_rec_->WaitFrames(8));
  ASSERT_TRUE(root_rec_->WaitFor([&] { return root_rec_->drained() == 1; }));
  EXPECT_EQ(link_->QueuedBytes(), 0u);
}

TEST_F(FakeTransportTest, MaxQueuedBytes) {
  TransportOptions o;
  o.fake_network = net_;
  o.name = "bounded";
  o.max_queued_bytes = 3u << 20;
  auto bounded = Make(o);
  auto rec = std::make_shared<Recorder>();
  Result<std::shared_ptr<Link>> link =
      bounded->Connect("child", 17001, rec, milliseconds(100));
  ASSERT_TRUE(link.ok());
  net_->Pause("bounded", "child");
  for (uint64_t i = 0; i < 4; ++i) (*link)->Send(TestFrame(i, 1u << 20));
  ASSERT_TRUE(rec->WaitClosed(1));
  EXPECT_EQ(rec->closed()[0].why.code(), StatusCode::kResourceExhausted);
  // Frames sent after the limit tripped are dropped as they reach the loop.
  EXPECT_TRUE(rec->WaitFor([&] { return (*link)->QueuedBytes() == 0; }));
}

TEST_F(FakeTransportTest, CloseReportsOkHereAndIOErrorAtThePeer) {
  ASSERT_TRUE(child_rec_->WaitOpened(1));
  link_->Close();
  link_->Close();
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  EXPECT_TRUE(root_rec_->closed()[0].why.ok());
  Status why = child_rec_->closed()[0].why;
  EXPECT_EQ(why.code(), StatusCode::kIOError);
  EXPECT_NE(why.message().find("peer root closed"), std::string::npos);
  net_->Sync();
  EXPECT_EQ(root_rec_->closed().size(), 1u);
  EXPECT_EQ(child_rec_->closed().size(), 1u);
}

TEST_F(FakeTransportTest, CloseAfterFlushDeliversQueuedFrames) {
  SendFrames(0, 20);
  link_->CloseAfterFlush();
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  EXPECT_EQ(child_rec_->frames().size(), 20u);
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_TRUE(root_rec_->closed()[0].why.ok());
}

TEST_F(FakeTransportTest, ConnectAndNamingErrors) {
  Result<std::shared_ptr<Link>> r =
      root_->Connect("nobody", 1, root_rec_, milliseconds(100));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().message().find("nobody:1"), std::string::npos);
  TransportOptions o;
  o.fake_network = net_;
  o.name = "root";
  EXPECT_TRUE(CreateTransport("fake", o).status().IsInvalidArgument());
  o.name = "other";
  auto other = Make(o);
  Status in_use = other->Listen("child", 17001, root_rec_);
  EXPECT_EQ(in_use.code(), StatusCode::kIOError);
  ASSERT_TRUE(other->Listen("other", 0, root_rec_).ok());
  EXPECT_NE(other->BoundPort(), 0);
}

TEST_F(FakeTransportTest, StopClosesLinksAndRefusesWork) {
  ASSERT_TRUE(child_rec_->WaitOpened(1));
  SendFrames(0, 5);
  root_->Stop();
  root_->Stop();
  ASSERT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_TRUE(root_rec_->closed()[0].why.ok());
  ASSERT_TRUE(child_rec_->WaitClosed(1));
  EXPECT_FALSE(root_->Post([] {}));
  EXPECT_EQ(root_->Connect("child", 17001, root_rec_, milliseconds(100))
                .status()
                .code(),
            StatusCode::kAborted);
  link_->Send(TestFrame(9, 10));  // dropped by the closed link
  net_->Sync();
  EXPECT_EQ(link_->QueuedBytes(), 0u);
  // The name is free again.
  TransportOptions o;
  o.fake_network = net_;
  o.name = "root";
  EXPECT_TRUE(CreateTransport("fake", o).ok());
}

TEST_F(FakeTransportTest, NetworkShutdownWithLiveTransports) {
  SendFrames(0, 5);
  net_.reset();  // the transports hold only the core: this stops the loop
  EXPECT_TRUE(root_rec_->WaitClosed(1));
  EXPECT_FALSE(root_->Post([] {}));
  link_->Send(TestFrame(9, 10));
  root_->Stop();
  child_.reset();
}

// The same program of sends, issued on the event thread, gives the same
// interleaving of deliveries every time.
std::vector<std::pair<std::string, uint64_t>> RunScenario() {
  auto net = FakeNetwork::Create();
  TransportOptions o;
  o.fake_network = net;
  o.name = "hub";
  auto hub_rec = std::make_shared<Recorder>();
  auto hub = std::move(CreateTransport("fake", o)).value();
  EXPECT_TRUE(hub->Listen("hub", 1, hub_rec).ok());
  std::vector<std::unique_ptr<Transport>> senders;
  std::vector<std::shared_ptr<Link>> links;
  for (int i = 0; i < 3; ++i) {
    o.name = "s" + std::to_string(i);
    senders.push_back(std::move(CreateTransport("fake", o)).value());
    links.push_back(*senders.back()->Connect(
        "hub", 1, std::make_shared<Recorder>(), milliseconds(100)));
  }
  EXPECT_TRUE(hub_rec->WaitOpened(3));
  std::promise<void> sent;
  hub->Post([&] {
    for (uint64_t j = 0; j < 20; ++j) {
      for (size_t i = 0; i < links.size(); ++i) {
        links[(i + j) % links.size()]->Send(TestFrame(j, 10 + j, i));
      }
    }
    sent.set_value();
  });
  sent.get_future().wait();
  EXPECT_TRUE(hub_rec->WaitFrames(60));
  std::vector<std::pair<std::string, uint64_t>> order;
  std::map<uint64_t, std::string> peer_of;
  for (const auto& l : hub_rec->opened()) peer_of[l->id()] = l->peer();
  for (const auto& f : hub_rec->frames()) {
    order.emplace_back(peer_of[f.link_id], f.header.sequence);
  }
  return order;
}

TEST(FakeNetworkTest, DeliveryOrderIsDeterministic) {
  auto first = RunScenario();
  ASSERT_EQ(first.size(), 60u);
  for (int run = 0; run < 3; ++run) EXPECT_EQ(RunScenario(), first);
}

}  // namespace
}  // namespace dcr
