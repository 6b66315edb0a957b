// LinkLifecycle (src/transport/link_lifecycle.h), the lifecycle the TCP, UCX
// and fake links share, over a test backend on a real event loop; and the
// default Transport::Connect over AsyncConnect. The per-transport tests
// cover the same contract through real links.
#include "transport/link_lifecycle.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/event_loop.h"

namespace dcr::transport_internal {
namespace {

// Every state below is touched on the event thread only; the test reads it
// through EventLoop::RunSync.
class RecordingHandler : public LinkHandler {
 public:
  explicit RecordingHandler(std::vector<std::string>* log) : log_(log) {}
  void OnFrame(Link&, const Frame&, const FrameBuffer&) override {}
  void OnClosed(Link&, const Status& why) override {
    log_->push_back("closed:" + std::string(StatusCodeName(why.code())));
  }
  void OnDrained(Link& link) override {
    log_->push_back("drained:" + std::to_string(link.QueuedBytes()));
  }

 private:
  std::vector<std::string>* log_;
};

class TestLink final : public LinkLifecycle {
 public:
  TestLink(EventLoop* loop, std::vector<std::string>* log)
      : LinkLifecycle(std::make_shared<RecordingHandler>(log), kHigh, kLow,
                      kMaxQueued),
        loop_(loop),
        log_(log) {}

  static constexpr size_t kHigh = 16u << 20, kLow = 4u << 20;
  static constexpr size_t kMaxQueued = 64u << 20;

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return 1; }

  // Event thread: the write in flight completes.
  void WriteDone() {
    unwritten_ = 0;
    if (FinishFlushClose()) log_->push_back("flush-closed");
  }
  void set_unwritten(int n) { unwritten_ = n; }
  // As a backend's Send (any thread) and write completion (event thread)
  // move its queue.
  void Queue(size_t bytes) { NoteQueued(queued_ += bytes); }
  void Written(size_t bytes) {
    if (NoteWritten(queued_ -= bytes)) log_->push_back("stopped");
  }

  using LinkLifecycle::closed;
  using LinkLifecycle::closing;
  using LinkLifecycle::flush_close;
  using LinkLifecycle::read_paused;

 private:
  bool OnEventThread() const override { return loop_->InThread(); }
  bool PostToEventThread(std::function<void()> fn) override {
    return loop_->Post(std::move(fn));
  }
  bool Flushed() const override { return unwritten_ == 0; }
  void Deliver() override { log_->push_back("deliver"); }
  void Enqueue(FrameBuffer frame) override {
    log_->push_back("enqueue:" + std::to_string(frame->size()));
  }
  void AfterResume() override { log_->push_back("after-resume"); }
  void TearDown(const Status& why) override {
    log_->push_back("teardown:" + std::string(StatusCodeName(why.code())));
  }
  void AfterClosed() override { log_->push_back("after-closed"); }

  EventLoop* loop_;
  std::vector<std::string>* log_;
  const std::string peer_ = "test-peer";
  int unwritten_ = 0;
};

FrameBuffer Bytes(size_t n) {
  return std::make_shared<const std::vector<std::byte>>(n);
}

class LinkLifecycleTest : public ::testing::Test {
 protected:
  // The log as the event thread sees it, after everything posted so far.
  // What a handler posts reaches Asio's queue when the handler returns,
  // which may be after a RunSync posted meanwhile from this thread: one
  // empty turn first, so that those posts run before the copy.
  std::vector<std::string> Log() {
    std::vector<std::string> copy;
    EXPECT_TRUE(loop_.RunSync([] {}));
    EXPECT_TRUE(loop_.RunSync([&] { copy = log_; }));
    return copy;
  }
  void OnLoop(const std::function<void()>& fn) {
    ASSERT_TRUE(loop_.RunSync(fn));
  }

  EventLoop loop_{"test-link"};
  std::vector<std::string> log_;
  std::shared_ptr<TestLink> link_ = std::make_shared<TestLink>(&loop_, &log_);
};

TEST_F(LinkLifecycleTest, ClosesOnceTearingDownBeforeTheHandlerHears) {
  link_->Close();
  link_->Close();
  OnLoop([&] { link_->DoClose(Status::IOError("late")); });
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed"}));
  OnLoop([&] {
    EXPECT_TRUE(link_->closed());
    EXPECT_TRUE(link_->closing());
  });
}

TEST_F(LinkLifecycleTest, TheFirstReasonWins) {
  OnLoop([&] {
    link_->DoClose(Status::ResourceExhausted("queue"));
    link_->DoClose(Status::OK());
  });
  link_->Close();
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:resource exhausted",
                                             "closed:resource exhausted",
                                             "after-closed"}));
}

TEST_F(LinkLifecycleTest, CloseOnTheEventThreadMarksClosingAtOnce) {
  OnLoop([&] {
    link_->Close();
    // No frame in or out from here on, though DoClose runs a turn later.
    EXPECT_TRUE(link_->closing());
    EXPECT_FALSE(link_->closed());
  });
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed"}));
}

TEST_F(LinkLifecycleTest, CloseAfterFlushWaitsForTheQueueToDrain) {
  OnLoop([&] { link_->set_unwritten(2); });
  link_->CloseAfterFlush();
  OnLoop([&] {
    EXPECT_TRUE(link_->flush_close());
    EXPECT_FALSE(link_->closed());
  });
  EXPECT_TRUE(Log().empty());
  OnLoop([&] { link_->WriteDone(); });
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed", "flush-closed"}));
}

TEST_F(LinkLifecycleTest, CloseAfterFlushWithNothingQueuedClosesAtOnce) {
  link_->CloseAfterFlush();
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed"}));
  // A write completing later finds nothing to do.
  OnLoop([&] { link_->WriteDone(); });
  EXPECT_EQ(Log().size(), 3u);
}

TEST_F(LinkLifecycleTest, FinishFlushCloseWithoutCloseAfterFlushDoesNothing) {
  OnLoop([&] { link_->WriteDone(); });
  EXPECT_TRUE(Log().empty());
}

TEST_F(LinkLifecycleTest, PauseAndResumeReading) {
  // Off the event thread the pause is posted; on it, it is immediate.
  link_->PauseReading();
  OnLoop([&] { EXPECT_TRUE(link_->read_paused()); });
  link_->ResumeReading();
  EXPECT_EQ(Log(), (std::vector<std::string>{"deliver", "after-resume"}));
  OnLoop([&] {
    EXPECT_FALSE(link_->read_paused());
    link_->PauseReading();
    EXPECT_TRUE(link_->read_paused());
  });
  link_->ResumeReading();
  // Resuming a link that is not paused delivers nothing.
  link_->ResumeReading();
  EXPECT_EQ(Log(), (std::vector<std::string>{"deliver", "after-resume",
                                             "deliver", "after-resume"}));
}

// A transport whose AsyncConnect answers from another thread, to check the
// default Connect.
class AnswerTransport final : public Transport {
 public:
  std::string_view kind() const override { return "answer"; }
  TransportCapabilities capabilities() const override { return {}; }
  Status Listen(std::string_view, uint16_t,
                std::shared_ptr<LinkHandler>) override {
    return Status::Unsupported("no listen");
  }
  uint16_t BoundPort() const override { return 0; }
  void AsyncConnect(std::string_view host, uint16_t port,
                    std::shared_ptr<LinkHandler>, std::chrono::milliseconds,
                    ConnectCallback done) override {
    std::string where = std::string(host) + ":" + std::to_string(port);
    std::thread([done = std::move(done), where] {
      done(Status::IOError("connect to " + where + ": refused"));
    }).detach();
  }
  bool Post(std::function<void()>) override { return false; }
  bool InEventThread() const override { return on_event_thread; }
  void Stop() override {}

  bool on_event_thread = false;
};

// A window's watermarks (window, window / 2): OnDrained once the queue
// falls to half the window after it exceeded the window, once per crossing,
// and never for a queue that stayed below the window.
TEST_F(LinkLifecycleTest, OwnWatermarksDrainAtHalfAfterReachingHigh) {
  constexpr size_t kWindow = 1000;
  link_->SetWatermarks(kWindow, kWindow / 2);
  link_->Queue(900);  // below the window
  OnLoop([&] { link_->Written(800); });
  link_->Queue(1100);  // 1200: above
  OnLoop([&] {
    link_->Written(600);  // 600: not yet half
    link_->Written(100);  // 500: half
    link_->Written(100);  // 400: fired already
  });
  link_->Queue(300);  // 700: above half, below the window: not armed
  OnLoop([&] { link_->Written(700); });
  EXPECT_EQ(Log(), (std::vector<std::string>{"drained:500"}));
}

TEST_F(LinkLifecycleTest, DefaultWatermarksAreTheTransports) {
  link_->Queue(TestLink::kHigh - 1);
  OnLoop([&] { link_->Written(TestLink::kHigh - 1); });
  link_->Queue(TestLink::kHigh);
  OnLoop([&] {
    link_->Written(TestLink::kHigh - TestLink::kLow - 1);  // kLow + 1
    link_->Written(1);
  });
  EXPECT_EQ(Log(), (std::vector<std::string>{"drained:" +
                                             std::to_string(TestLink::kLow)}));
}

// A handler that closes the link from OnDrained stops the backend's write
// path.
TEST_F(LinkLifecycleTest, NoteWrittenReportsAClosedLink) {
  link_->SetWatermarks(10, 5);
  link_->Queue(10);
  OnLoop([&] {
    link_->DoClose(Status::OK());
    link_->Written(10);
  });
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed", "stopped"}));
}

TEST(TransportConnectTest, WaitsForAsyncConnectsAnswer) {
  AnswerTransport t;
  Result<std::shared_ptr<Link>> r =
      t.Connect("host", 7, std::make_shared<RecordingHandler>(nullptr),
                std::chrono::milliseconds(100));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().ToString().find("connect to host:7: refused"),
            std::string::npos)
      << r.status().ToString();
}

TEST(TransportConnectTest, RefusedOnTheEventThread) {
  AnswerTransport t;
  t.on_event_thread = true;
  Result<std::shared_ptr<Link>> r =
      t.Connect("host", 7, std::make_shared<RecordingHandler>(nullptr),
                std::chrono::milliseconds(100));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LinkLifecycleTest, SendCountsTheFrameAndHandsItToTheEventThread) {
  link_->Send(Bytes(100));                 // from this thread: posted
  OnLoop([&] { link_->Send(Bytes(7)); });  // on the event thread: at once
  link_->Send(nullptr);                    // nothing to send: ignored
  link_->Send(Bytes(0));
  EXPECT_EQ(Log(), (std::vector<std::string>{"enqueue:100", "enqueue:7"}));
  EXPECT_EQ(link_->QueuedBytes(), 107u);  // until the backend writes them
  LinkStats st = link_->stats();
  EXPECT_EQ(st.frames_sent, 0u);
  EXPECT_EQ(st.bytes_received, 0u);
}

TEST_F(LinkLifecycleTest, AClosingLinkDropsWhatIsSentAndUncountsIt) {
  link_->CloseAfterFlush();
  link_->Send(Bytes(50));
  EXPECT_EQ(Log(), (std::vector<std::string>{"teardown:ok", "closed:ok",
                                             "after-closed"}));
  EXPECT_EQ(link_->QueuedBytes(), 0u);
}

TEST_F(LinkLifecycleTest, AQueueOverItsBoundClosesTheLink) {
  // On the event thread each Send is admitted before the next is counted.
  OnLoop([&] {
    link_->Send(Bytes(TestLink::kMaxQueued));  // at the bound: taken
    link_->Send(Bytes(1));                     // over it: the link closes
  });
  EXPECT_EQ(Log(), (std::vector<std::string>{
                       "enqueue:67108864", "teardown:resource exhausted",
                       "closed:resource exhausted", "after-closed"}));
  EXPECT_EQ(link_->QueuedBytes(), TestLink::kMaxQueued);  // the refused byte
                                                          // is not counted
}

}  // namespace
}  // namespace dcr::transport_internal
