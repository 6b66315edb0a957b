// A relay keeping a serving process's GPU buffers at its live image
// (relay/device_weights.h, the GPU half of relay/serving_images.h), with
// the buffers faked in host memory: the attach, the pause around each
// commit, and every way it is refused. The CUDA IPC mapping itself runs
// in tests/cuda on a GPU.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/file.h"
#include "dcr/serving.h"
#include "dcr/store.h"
#include "relay/device_weights.h"
#include "relay/serving_images.h"
#include "serving/pause_messages.h"
#include "testing/serving_images_testing.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Op = PauseMsg::Op;

// GPU buffers in host memory, with the faults a real device can show.
class FakeGpu final : public DeviceWeights {
 public:
  explicit FakeGpu(std::vector<TensorInfo> tensors)
      : tensors_(std::move(tensors)) {
    for (const TensorInfo& t : tensors_) {
      bytes_.emplace_back(t.NumBytes(), std::byte{0});
    }
  }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  Result<Digest128> Digest(size_t i) override {
    if (fail_digest) return Status::IOError("the GPU fell off the bus");
    return TensorDigest(bytes_[i]);
  }
  Status Write(size_t i, std::span<const std::byte> b) override {
    writes += 1;
    if (!drop_writes) std::memcpy(bytes_[i].data(), b.data(), b.size());
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }

  std::vector<std::byte>& bytes(size_t i) { return bytes_[i]; }
  int writes = 0;
  bool drop_writes = false;  // a write that reports success and does nothing
  bool fail_digest = false;

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<std::byte>> bytes_;
};

std::vector<std::byte> Filled(size_t n, uint8_t v) {
  return std::vector<std::byte>(n, std::byte{v});
}

TEST(SyncDeviceWeightsTest, RewritesOnlyTheTensorsThatDiffer) {
  auto m = Manifest::Create({{"a", DType::kBF16, {4}},
                             {"b", DType::kU8, {3}},
                             {"c", DType::kF32, {2}}});
  ASSERT_TRUE(m.ok());
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  for (size_t t = 0; t < 3; ++t) {
    auto b = (*host)->MutableTensor(t);
    std::memset(b.data(), 0x30 + static_cast<int>(t), b.size());
  }
  // The device holds "a" and "c" (not every store tensor is computed
  // with); "c" already matches.
  FakeGpu gpu({(*m)[0], (*m)[2]});
  gpu.bytes(1) = Filled(8, 0x32);
  ThreadPool pool(2);
  auto sync = SyncDeviceWeights(gpu, **host, &pool);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->tensors, 2u);
  EXPECT_EQ(sync->rewritten, 1u);
  EXPECT_EQ(sync->rewritten_bytes, 8u);
  EXPECT_EQ(gpu.writes, 1);
  EXPECT_EQ(gpu.bytes(0), Filled(8, 0x30));
  // In step: nothing to write.
  sync = SyncDeviceWeights(gpu, **host, nullptr);
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(sync->rewritten, 0u);
  EXPECT_EQ(gpu.writes, 1);
}

TEST(SyncDeviceWeightsTest, TakesTheHostDigestsGivenInsteadOfHashing) {
  auto m = Manifest::Create({{"a", DType::kU8, {6}}, {"b", DType::kU8, {2}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  std::memset((*host)->MutableTensor(0).data(), 1, 6);
  std::memset((*host)->MutableTensor(1).data(), 2, 2);
  FakeGpu gpu(m->tensors());
  auto digests = HostDigests(gpu, **host, nullptr);
  ASSERT_TRUE(digests.ok()) << digests.status().ToString();
  ASSERT_EQ(digests->size(), 2u);
  EXPECT_EQ((*digests)[1], TensorDigest(Filled(2, 2)));
  auto sync = SyncDeviceWeights(gpu, **host, nullptr, &*digests);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_EQ(sync->rewritten, 2u);
  EXPECT_EQ(gpu.bytes(0), Filled(6, 1));
  // Digests that are not the host's: the check after the write says so,
  // which shows they were used rather than computed again.
  gpu.bytes(0) = Filled(6, 9);
  std::vector<Digest128> wrong = *digests;
  wrong[0] = TensorDigest(Filled(6, 5));
  sync = SyncDeviceWeights(gpu, **host, nullptr, &wrong);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.status().code(), StatusCode::kCorruption);
  // Of another tensor list: refused.
  wrong.pop_back();
  EXPECT_EQ(SyncDeviceWeights(gpu, **host, nullptr, &wrong).status().code(),
            StatusCode::kInternal);
}

TEST(SyncDeviceWeightsTest, RefusesTensorsTheHostDoesNotHoldAlike) {
  auto m = Manifest::Create({{"a", DType::kBF16, {4}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  {
    FakeGpu gpu({{"kv_cache", DType::kBF16, {4}}});
    auto sync = SyncDeviceWeights(gpu, **host, nullptr);
    ASSERT_FALSE(sync.ok());
    EXPECT_EQ(sync.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(sync.status().message(), HasSubstr("'kv_cache' is not in"));
  }
  {
    FakeGpu gpu({{"a", DType::kBF16, {2, 2}}});
    auto sync = SyncDeviceWeights(gpu, **host, nullptr);
    ASSERT_FALSE(sync.ok());
    EXPECT_THAT(sync.status().message(),
                HasSubstr("'a' is [2, 2] BF16, memory: holds it as [4] BF16"));
    EXPECT_EQ(gpu.writes, 0);
  }
}

TEST(SyncDeviceWeightsTest, AWriteTheDeviceDoesNotHoldIsCorruption) {
  auto m = Manifest::Create({{"a", DType::kU8, {5}}});
  auto host = CreateStore(*ParseStoreSpec("memory:"), *m);
  ASSERT_TRUE(host.ok());
  std::memset((*host)->MutableTensor(0).data(), 7, 5);
  FakeGpu gpu({(*m)[0]});
  gpu.drop_writes = true;
  auto sync = SyncDeviceWeights(gpu, **host, nullptr);
  ASSERT_FALSE(sync.ok());
  EXPECT_EQ(sync.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(sync.status().message(),
              HasSubstr("'a' does not hold what was written"));
}

// The server's end of the pause socket, speaking raw lines.
class LineClient {
 public:
  explicit LineClient(const std::string& path) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    connected_ =
        ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  bool connected() const { return connected_; }
  void Send(const PauseMsg& m) {
    const std::string line = EncodePauseMsg(m);
    ASSERT_EQ(::write(fd_.get(), line.data(), line.size()),
              static_cast<ssize_t>(line.size()));
  }
  // The next line within `wait_ms`; nullopt at a timeout or at EOF
  // (closed() says which).
  std::optional<std::string> Line(int wait_ms = 5000) {
    for (;;) {
      if (size_t nl = in_.find('\n'); nl != std::string::npos) {
        std::string line = in_.substr(0, nl);
        in_.erase(0, nl + 1);
        return line;
      }
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, wait_ms) <= 0) return std::nullopt;
      char buf[4096];
      const ssize_t n = ::read(fd_.get(), buf, sizeof(buf));
      if (n <= 0) {
        closed_ = true;
        return std::nullopt;
      }
      in_.append(buf, static_cast<size_t>(n));
    }
  }
  std::optional<PauseMsg> Msg(int wait_ms = 5000) {
    auto line = Line(wait_ms);
    if (!line) return std::nullopt;
    auto m = DecodePauseMsg(*line);
    EXPECT_TRUE(m.ok()) << *line;
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  bool closed() const { return closed_; }

 private:
  UniqueFd fd_;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
};

class GpuServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = testing::UniqueShmSpec("dcr_gpu_serving_test");
    testing::RemoveServingStore(spec_);
    auto m =
        Manifest::Create({{"a", DType::kBF16, {4}}, {"b", DType::kU8, {3}}});
    ASSERT_TRUE(m.ok());
    // Image 0 holds step 1 (bytes 0x10), image 1 step 2 (0x20).
    Status made = testing::CreateServingImages(spec_, *m);
    ASSERT_TRUE(made.ok()) << made.ToString();
    ASSERT_TRUE(
        LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1}).ok());
    socket_ = (dir_.path() / "relay.sock").string();
    ServingImages::Options o = ImagesOptions();
    o.attach_device =
        [this](const std::string& path,
               const Manifest* live) -> Result<std::unique_ptr<DeviceWeights>> {
      attach_paths_.push_back(path);
      if (!refuse_.ok()) return refuse_;
      // No serving layout here: the server holds every live tensor.
      if (live == nullptr) return Status::Unsupported("no live image");
      auto gpu = std::make_unique<FakeGpu>(live->tensors());
      gpu_ = gpu.get();
      gpu_->drop_writes = drop_writes_;
      return std::unique_ptr<DeviceWeights>(std::move(gpu));
    };
    auto images = ServingImages::Open(std::move(o));
    ASSERT_TRUE(images.ok()) << images.status().ToString();
    images_ = *std::move(images);
    ASSERT_TRUE(images_->Listen().ok());
  }
  void TearDown() override {
    images_.reset();
    standby_.reset();
    testing::RemoveServingStore(spec_);
  }
  // The relay's options for the images, but how it attaches GPU buffers.
  ServingImages::Options ImagesOptions() {
    ServingImages::Options o;
    o.node = "n";
    o.store = spec_;
    o.socket = socket_;
    o.deadline = deadline_;
    o.post = [this](std::function<void()> fn) {
      std::lock_guard<std::mutex> l(mu_);
      posted_.push_back(std::move(fn));
    };
    return o;
  }
  // Runs what the port posted (the relay's actor) for `ms` milliseconds.
  void Pump(int ms = 100) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      std::deque<std::function<void()>> run;
      {
        std::lock_guard<std::mutex> l(mu_);
        run.swap(posted_);
      }
      for (auto& fn : run) fn();
      if (images_) images_->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // The next line the relay sends `c`, running the actor meanwhile;
  // nullopt at `wait_ms` or when the relay closed the link.
  std::optional<PauseMsg> NextMsg(LineClient& c, int wait_ms = 5000) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (std::chrono::steady_clock::now() < until && !c.closed()) {
      Pump(5);
      if (auto m = c.Msg(1)) return m;
    }
    return std::nullopt;
  }
  // Runs the actor until `done` holds (true), or 5 s passed (false).
  bool PumpUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 1000; ++i) {
      if (done()) return true;
      Pump(5);
    }
    return done();
  }
  PauseMsg Hello(std::string cuda_ipc) {
    PauseMsg h;
    h.op = Op::kHello;
    h.pid = 77;
    h.cuda_ipc = std::move(cuda_ipc);
    return h;
  }
  // Flips to image 1 (step 2), as a relay's commit does.
  void Flip(const RefitId& refit) {
    auto standby = OpenStore(ServingImageSpec(spec_, 1));
    ASSERT_TRUE(standby.ok()) << standby.status().ToString();
    ASSERT_TRUE(
        images_->Flip(*standby, refit, std::chrono::steady_clock::now()).ok());
    standby_ = *std::move(standby);  // now the old live image
  }

  std::chrono::milliseconds deadline_{5000};
  StoreSpec spec_;
  testing::TempDir dir_;
  std::string socket_;
  std::mutex mu_;
  std::deque<std::function<void()>> posted_;
  std::unique_ptr<ServingImages> images_;
  std::unique_ptr<WeightStore> standby_;
  std::vector<std::string> attach_paths_;
  Status refuse_ = Status::OK();
  bool drop_writes_ = false;
  FakeGpu* gpu_ = nullptr;  // owned by images_ while attached
};

TEST_F(GpuServingTest, AttachBringsTheBuffersToTheLiveImageBeforeLive) {
  LineClient c(socket_);
  ASSERT_TRUE(c.connected());
  c.Send(Hello("/run/server/weights.sock"));
  auto live = NextMsg(c);
  ASSERT_EQ(attach_paths_,
            std::vector<std::string>{"/run/server/weights.sock"});
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->op, Op::kLive);
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->version.step, 1u);
  ASSERT_NE(gpu_, nullptr);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x10));
  EXPECT_EQ(gpu_->writes, 2);
  EXPECT_TRUE(images_->stats().gpu);
  EXPECT_EQ(images_->stats().gpu_syncs, 1u);
  EXPECT_EQ(images_->stats().gpu_rewritten, 2u);
}

TEST_F(GpuServingTest, ACommitWritesTheBuffersOnlyWhileTheServerIsPaused) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());  // live
  const int writes_at_attach = gpu_->writes;
  RefitId refit;
  refit.bytes.fill(0x42);
  Flip(refit);
  auto pause = NextMsg(c);
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  EXPECT_EQ(pause->refit, refit);
  // Nothing is written, nor committed, until the server stopped.
  EXPECT_EQ(gpu_->writes, writes_at_attach);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x10));
  EXPECT_FALSE(c.Line(50).has_value());
  EXPECT_TRUE(images_->AwaitingMove());

  PauseMsg paused;
  paused.op = Op::kPaused;
  paused.refit = refit;
  c.Send(paused);
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
  EXPECT_EQ(commit->image, 1u);
  EXPECT_EQ(commit->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  EXPECT_EQ(gpu_->bytes(1), Filled(3, 0x20));
  EXPECT_EQ(images_->stats().gpu_syncs, 2u);

  PauseMsg flipped;
  flipped.op = Op::kFlipped;
  flipped.image = 1;
  flipped.version.step = 2;
  c.Send(flipped);
  EXPECT_TRUE(PumpUntil([&] { return images_->stats().pauses == 1; }));
  EXPECT_FALSE(images_->AwaitingMove());
  EXPECT_EQ(images_->stats().pauses, 1u);
  EXPECT_THAT(images_->MoveSummary(), HasSubstr("serving process moved in"));
}

class GpuServingDeadlineTest : public GpuServingTest {
 protected:
  GpuServingDeadlineTest() { deadline_ = std::chrono::milliseconds(300); }
};

TEST_F(GpuServingDeadlineTest, AServerThatDoesNotPauseIsDetachedAtIt) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());
  RefitId refit;
  refit.bytes.fill(1);
  Flip(refit);
  Pump(500);  // past the 300 ms deadline
  auto pause = c.Msg();
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->op, Op::kPause);
  EXPECT_FALSE(c.Msg(1000).has_value());
  EXPECT_TRUE(c.closed());
  Pump();
  EXPECT_FALSE(images_->stats().attached);
  EXPECT_FALSE(images_->stats().gpu);

  // Attaching again brings its buffers to the live image (step 2).
  LineClient again(socket_);
  again.Send(Hello("/run/w.sock"));
  auto live = NextMsg(again);
  ASSERT_TRUE(live.has_value());
  EXPECT_TRUE(live->cuda);
  EXPECT_EQ(live->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
}

TEST_F(GpuServingTest, RefusedBuffersAreNamedAndTheServerDetached) {
  refuse_ = Status::InvalidArgument(
      "the GPU buffers serving rank 0 exported do not match the layout: 'a' "
      "is not exported");
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  auto error = NextMsg(c);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->op, Op::kError);
  EXPECT_THAT(error->detail, HasSubstr("/run/w.sock were refused"));
  EXPECT_THAT(error->detail, HasSubstr("'a' is not exported"));
  EXPECT_FALSE(c.Msg(1000).has_value());  // no live: it must not compute
  EXPECT_TRUE(c.closed());
}

TEST_F(GpuServingTest, BuffersThatDoNotTakeTheWriteAreRefused) {
  drop_writes_ = true;
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  auto error = NextMsg(c);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->op, Op::kError);
  EXPECT_THAT(error->detail, HasSubstr("does not hold what was written"));
  EXPECT_THAT(error->detail, HasSubstr("must not compute"));
  EXPECT_FALSE(c.Msg(1000).has_value());
  EXPECT_TRUE(c.closed());
  EXPECT_FALSE(images_->stats().gpu);
}

TEST_F(GpuServingTest, AFlipBeforeTheHelloEndsWhenTheBuffersAttach) {
  LineClient c(socket_);
  ASSERT_TRUE(PumpUntil([&] { return images_->stats().attached; }));
  // Connected, hello not yet sent: the flip sends it a plain commit,
  // which a GPU server ignores.
  RefitId refit;
  refit.bytes.fill(5);
  Flip(refit);
  EXPECT_TRUE(images_->AwaitingMove());
  c.Send(Hello("/run/w.sock"));
  std::optional<PauseMsg> m = NextMsg(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->op, Op::kCommit);
  m = NextMsg(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->op, Op::kLive);
  EXPECT_TRUE(m->cuda);
  EXPECT_EQ(m->version.step, 2u);
  EXPECT_EQ(gpu_->bytes(0), Filled(8, 0x20));
  // The attach ended that pause: the relay's reply need not wait.
  EXPECT_FALSE(images_->AwaitingMove());
  EXPECT_EQ(images_->MoveSummary(),
            "serving process attached its GPU buffers at step 2");
}

TEST_F(GpuServingTest, PausedWithoutAPauseDetaches) {
  LineClient c(socket_);
  c.Send(Hello("/run/w.sock"));
  ASSERT_TRUE(NextMsg(c).has_value());
  PauseMsg paused;
  paused.op = Op::kPaused;
  paused.refit.bytes.fill(9);
  c.Send(paused);
  EXPECT_FALSE(NextMsg(c).has_value());
  EXPECT_TRUE(c.closed());
}

TEST_F(GpuServingTest, AHostServerStillGetsCommitWithoutAPause) {
  LineClient c(socket_);
  c.Send(Hello(""));
  auto live = NextMsg(c);
  ASSERT_TRUE(live.has_value());
  EXPECT_FALSE(live->cuda);
  EXPECT_TRUE(attach_paths_.empty());
  RefitId refit;
  refit.bytes.fill(3);
  Flip(refit);
  auto commit = NextMsg(c);
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op, Op::kCommit);
}

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
