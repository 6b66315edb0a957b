// GpuReceiver (include/dcr/serving.h), the server's side of the GPU pause
// protocol, against a relay's ServingImages whose actor runs on a thread,
// with the buffers faked in host memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "unit/serving/gpu_serving_testing.h"

namespace dcr {
namespace {

using serving_testing::FakeGpu;
using serving_testing::Filled;
using serving_testing::GpuServingTest;
using ::testing::HasSubstr;

// The relay's actor on a thread of its own, so that a GpuReceiver can
// block in its pause while the relay syncs.
class GpuReceiverTest : public GpuServingTest {
 protected:
  void SetUp() override {
    GpuServingTest::SetUp();
    actor_ = std::thread([this] {
      while (!stop_) Pump(5);
    });
  }
  void TearDown() override {
    stop_ = true;
    actor_.join();
    GpuServingTest::TearDown();
  }
  // Runs `fn` on the actor and waits for it.
  void OnActor(std::function<void()> fn) {
    std::atomic<bool> done{false};
    {
      std::lock_guard<std::mutex> l(mu_);
      posted_.push_back([&] {
        fn();
        done = true;
      });
    }
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  GpuReceiver::Options Options() {
    GpuReceiver::Options o;
    o.socket = socket_;
    o.cuda_ipc = "/run/w.sock";
    o.wait = std::chrono::seconds(5);
    o.quiesce = [this] {
      quiesced_ += 1;
      // What the buffers held when the server stopped using them.
      OnActor([&] { bytes_at_quiesce_ = gpu_->bytes(0); });
      return Status::OK();
    };
    return o;
  }
  int quiesced_ = 0;
  std::vector<std::byte> bytes_at_quiesce_;
  std::atomic<bool> stop_{false};
  std::thread actor_;
};

TEST_F(GpuReceiverTest, ComputesOnlyOnBuffersTheRelayBroughtToACommit) {
  auto r = GpuReceiver::Open(Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  GpuReceiver& rc = **r;
  EXPECT_TRUE(rc.usable());
  EXPECT_EQ(rc.version().step, 1u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_FALSE(*rc.Poll());

  RefitId refit;
  refit.bytes.fill(0x42);
  OnActor([&] { Flip(refit); });
  // The pause line is on its way: the next Poll answers it, waits for
  // the relay to write the buffers, and comes back on the new version.
  ASSERT_TRUE(rc.Poll().ok());
  for (int i = 0; i < 100 && rc.version().step != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(rc.Poll().ok());
  }
  EXPECT_TRUE(rc.usable());
  EXPECT_EQ(rc.version().step, 2u);
  EXPECT_EQ(rc.pauses(), 1u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  // It quiesced once, before the relay wrote anything.
  EXPECT_EQ(quiesced_, 1);
  EXPECT_EQ(bytes_at_quiesce_, Filled(8, 0x10));
  // The relay counts the pause once flipped reached it.
  bool moved = false;
  for (int i = 0; i < 200 && !moved; ++i) {
    OnActor([&] { moved = images_->stats().pauses == 1; });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(moved);
}

TEST_F(GpuReceiverTest, ARefusalIsTheRelaysReason) {
  refuse_ = Status::InvalidArgument("'a' is not exported");
  auto o = Options();
  o.wait = std::chrono::milliseconds(500);
  auto r = GpuReceiver::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_THAT(r.status().message(),
              HasSubstr("did not attach the GPU buffers"));
  EXPECT_THAT(r.status().message(), HasSubstr("'a' is not exported"));
  // Refused, it does not come back at once: one attach in 500 ms.
  size_t tries = 0;
  OnActor([&] { tries = attach_paths_.size(); });
  EXPECT_EQ(tries, 1u);
}

TEST_F(GpuReceiverTest, AQuiesceThatFailsFailsThePoll) {
  auto o = Options();
  o.quiesce = [] { return Status::Internal("cudaStreamSynchronize failed"); };
  auto r = GpuReceiver::Open(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  RefitId refit;
  refit.bytes.fill(0x43);
  OnActor([&] { Flip(refit); });
  Result<bool> polled = false;
  for (int i = 0; i < 200 && polled.ok(); ++i) {
    polled = (*r)->Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(polled.ok());
  EXPECT_THAT(polled.status().message(), HasSubstr("cudaStreamSynchronize"));
  EXPECT_FALSE((*r)->usable());
  // Nothing was written: the relay never got paused.
  std::vector<std::byte> now;
  OnActor([&] { now = gpu_->bytes(0); });
  EXPECT_EQ(now, Filled(8, 0x10));
}

TEST_F(GpuReceiverTest, BadOptionsAreRefused) {
  auto o = Options();
  o.cuda_ipc = "relative.sock";
  EXPECT_EQ(GpuReceiver::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.socket = "";
  EXPECT_EQ(GpuReceiver::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GpuReceiverTest, ALostRelayMakesTheBuffersUnusableUntilReattached) {
  auto r = GpuReceiver::Open(Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  GpuReceiver& rc = **r;
  ASSERT_TRUE(rc.usable());
  // Something wrote the buffers behind the relay's back; then the relay
  // restarts (its port closes and listens again).
  gpu_->bytes(1) = Filled(3, 0x77);
  // The buffers outlive the relay: the server owns them.
  const std::vector<TensorInfo> tensors = gpu_->tensors();
  const std::vector<std::byte> held[2] = {gpu_->bytes(0), gpu_->bytes(1)};
  OnActor([&] {
    images_.reset();
    gpu_ = nullptr;
  });
  for (int i = 0; i < 100 && rc.attached(); ++i) {
    ASSERT_TRUE(rc.Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(rc.attached());
  EXPECT_FALSE(rc.usable());
  OnActor([&] {
    ServingImages::Options o = ImagesOptions();
    o.attach_device =
        [&](const std::string&,
            const Manifest*) -> Result<std::unique_ptr<DeviceWeights>> {
      // The same buffers, mapped again.
      auto again = std::make_unique<FakeGpu>(tensors);
      for (size_t i = 0; i < 2; ++i) again->bytes(i) = held[i];
      gpu_ = again.get();
      return std::unique_ptr<DeviceWeights>(std::move(again));
    };
    auto images = ServingImages::Open(std::move(o));
    ASSERT_TRUE(images.ok()) << images.status().ToString();
    ASSERT_TRUE((*images)->Listen().ok());
    images_ = *std::move(images);
  });
  for (int i = 0; i < 200 && !rc.usable(); ++i) {
    ASSERT_TRUE(rc.Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(rc.usable());
  EXPECT_EQ(rc.version().step, 1u);
  bool repaired = false;
  OnActor([&] { repaired = images_->stats().gpu_rewritten == 1; });
  EXPECT_TRUE(repaired) << "only the tensor changed behind its back";
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x10));
}

}  // namespace
}  // namespace dcr
