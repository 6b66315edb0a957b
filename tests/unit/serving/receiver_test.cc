// ServingReceiver against real shm images and the relay's end of the
// socket (relay/serving_port.h).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "dcr/serving.h"
#include "dcr/store.h"
#include "relay/serving_images.h"
#include "relay/serving_port.h"
#include "testing/serving_images_testing.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Kind = ServingPort::Event::Kind;

class ReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = testing::UniqueShmSpec("dcr_receiver_test");
    testing::RemoveServingStore(spec_);
    auto m =
        Manifest::Create({{"a", DType::kBF16, {4}}, {"b", DType::kU8, {3}}});
    ASSERT_TRUE(m.ok());
    Status made = testing::CreateServingImages(spec_, *m);
    ASSERT_TRUE(made.ok()) << made.ToString();
  }
  void TearDown() override { testing::RemoveServingStore(spec_); }
  ServingReceiver::Options Options(std::string socket = "") {
    ServingReceiver::Options o;
    o.store = spec_;
    o.socket = std::move(socket);
    return o;
  }
  StoreSpec spec_;
};

TEST_F(ReceiverTest, WaitsForTheFirstCommit) {
  EXPECT_EQ(ServingReceiver::Open(Options()).status().code(),
            StatusCode::kNotFound);
  std::thread relay([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(
        LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1}).ok());
  });
  auto o = Options();
  o.wait = std::chrono::seconds(5);
  auto r = ServingReceiver::Open(o);
  relay.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->live().version.step, 1u);
}

TEST_F(ReceiverTest, TensorsMoveOnlyInPoll) {
  auto h = LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1});
  ASSERT_TRUE(h.ok());
  auto r = ServingReceiver::Open(Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ServingReceiver& rc = **r;
  ASSERT_EQ(rc.manifest().size(), 2u);
  EXPECT_EQ(rc.Tensor(0).size(), 8u);
  EXPECT_EQ(rc.Tensor(0)[0], std::byte{0x10});
  EXPECT_FALSE(*rc.Poll());
  std::shared_ptr<const void> pin = rc.Pin();
  const std::span<const std::byte> old = rc.Tensor(1);
  h->Write({1, {2, {1, 1}}, 2});
  // Not before Poll.
  EXPECT_EQ(rc.Tensor(0)[0], std::byte{0x10});
  EXPECT_EQ(rc.live().image, 0u);
  EXPECT_TRUE(*rc.Poll());
  EXPECT_EQ(rc.live(), (LiveState{1, {2, {1, 1}}, 2}));
  EXPECT_EQ(rc.Tensor(0)[0], std::byte{0x20});
  EXPECT_EQ(old[2], std::byte{0x10});  // the old image stays mapped
  EXPECT_FALSE(*rc.Poll());
}

TEST_F(ReceiverTest, RefusesImagesOfDifferentTensors) {
  auto m = Manifest::Create({{"a", DType::kBF16, {5}}});
  ASSERT_TRUE(RemoveStore(ServingImageSpec(spec_, 1)).ok());
  ASSERT_TRUE(CreateStore(ServingImageSpec(spec_, 1), *m).ok());
  auto h = LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1});
  auto r = ServingReceiver::Open(Options());
  ASSERT_TRUE(r.ok());
  h->Write({1, {2, {1, 1}}, 2});
  auto moved = (*r)->Poll();
  ASSERT_FALSE(moved.ok());
  EXPECT_THAT(moved.status().message(), HasSubstr("different tensors"));
}

TEST_F(ReceiverTest, ATornHeaderIsRebuiltInPlaceFromTheImages) {
  // Image 1 committed step 2, image 0 step 1 (SetUp); the header says
  // image 0 and a relay died writing it (an odd sequence).
  const std::string name = LiveHeaderName(spec_);
  ASSERT_TRUE(LiveHeader::Create(name, {0, {1, {0, 0}}, 1}).ok());
  auto r = ServingReceiver::Open(Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    uint64_t odd = 7;
    ASSERT_EQ(::pwrite(fd, &odd, 8, 8), 8);
    ::close(fd);
  }
  ASSERT_EQ(LiveHeader::Open(name)->Read().status().code(),
            StatusCode::kCorruption);
  // The server stays where it is meanwhile.
  EXPECT_FALSE(*(*r)->Poll());
  EXPECT_EQ((*r)->live().image, 0u);
  // The relay's receiver holds image 0: release it so the relay may open.
  r->reset();
  auto images = ServingImages::Open({.node = "n",
                                     .store = spec_,
                                     .socket = "",
                                     .post = [](auto) {},
                                     .attach_device = nullptr});
  ASSERT_TRUE(images.ok()) << images.status().ToString();
  ASSERT_TRUE((*images)->live().has_value());
  EXPECT_EQ((*images)->live()->image, 1u);
  EXPECT_EQ((*images)->live()->version.step, 2u);
  auto again = LiveHeader::Open(name);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Read()->image, 1u);
}

// The relay's end: events queued for the test thread.
class Events {
 public:
  void Push(ServingPort::Event e) {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(e));
    cv_.notify_all();
  }
  // The next event, within 5 s.
  ServingPort::Event Next() {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(
        cv_.wait_for(l, std::chrono::seconds(5), [&] { return !q_.empty(); }));
    if (q_.empty()) return {};
    ServingPort::Event e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ServingPort::Event> q_;
};

TEST_F(ReceiverTest, SpeaksThePauseProtocol) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "s.sock").string();
  Events events;
  auto port = ServingPort::Listen(
      path, [&](ServingPort::Event e) { events.Push(std::move(e)); });
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  auto h = LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1});
  auto r = ServingReceiver::Open(Options(path));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->attached());
  ServingPort::Event e = events.Next();
  ASSERT_EQ(e.kind, Kind::kAttached);
  const uint64_t conn = e.connection;
  e = events.Next();
  ASSERT_EQ(e.kind, Kind::kMessage);
  EXPECT_EQ(e.msg.op, PauseMsg::Op::kHello);
  EXPECT_EQ(e.msg.pid, static_cast<uint64_t>(::getpid()));
  EXPECT_EQ(e.msg.image, 0u);

  // A second server is turned away; the first stays.
  auto second = ServingReceiver::Open(Options(path));
  ASSERT_TRUE(second.ok());

  PauseMsg prepare;
  prepare.op = PauseMsg::Op::kPrepare;
  prepare.refit.bytes.fill(5);
  prepare.version.step = 2;
  (*port)->Send(conn, prepare);
  for (int i = 0; i < 200 && (*r)->prepares() == 0; ++i) {
    ASSERT_TRUE((*r)->Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  e = events.Next();
  ASSERT_EQ(e.kind, Kind::kMessage);
  EXPECT_EQ(e.msg.op, PauseMsg::Op::kReady);
  EXPECT_EQ(e.msg.refit, prepare.refit);

  h->Write({1, {2, {1, 1}}, 2});
  EXPECT_TRUE(*(*r)->Poll());
  e = events.Next();
  ASSERT_EQ(e.kind, Kind::kMessage);
  EXPECT_EQ(e.msg.op, PauseMsg::Op::kFlipped);
  EXPECT_EQ(e.msg.image, 1u);
  EXPECT_EQ(e.msg.version.step, 2u);

  // A server that sends garbage is detached.
  (*port)->Detach(conn, "test");
  e = events.Next();
  EXPECT_EQ(e.kind, Kind::kDetached);
  EXPECT_EQ(e.detail, "test");
  for (int i = 0; i < 100 && (*r)->attached(); ++i) {
    ASSERT_TRUE((*r)->Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE((*r)->attached());
  r->reset();
  second->reset();
}

}  // namespace
}  // namespace dcr
