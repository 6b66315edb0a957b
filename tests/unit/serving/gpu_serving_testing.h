// What the GPU serving tests share (gpu_serving_test.cc,
// gpu_receiver_test.cc, device_weights_test.cc): GPU buffers faked in
// host memory, a server speaking raw lines, and a relay's ServingImages
// on two shm images (step 1 live, step 2 staged) whose actor the test
// runs.
#ifndef DCR_TESTS_UNIT_SERVING_GPU_SERVING_TESTING_H_
#define DCR_TESTS_UNIT_SERVING_GPU_SERVING_TESTING_H_

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

namespace dcr::serving_testing {

// GPU buffers in host memory, with the faults a real device can show.
class FakeGpu final : public DeviceWeights {
 public:
  explicit FakeGpu(std::vector<TensorInfo> tensors)
      : tensors_(std::move(tensors)) {
    for (const TensorInfo& t : tensors_) {
      bytes_.emplace_back(t.NumBytes(), std::byte{0});
    }
  }
  ~FakeGpu() override {
    if (on_destroy) on_destroy();
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
  Status Patch(size_t i, uint64_t first, std::span<const uint32_t> positions,
               std::span<const std::byte> values) override {
    const size_t w = DTypeSize(tensors_[i].dtype);
    const uint64_t n = tensors_[i].NumElements();
    if (first > n || values.size() != positions.size() * w) {
      return Status::InvalidArgument("a patch that does not fit");
    }
    for (uint32_t p : positions) {
      if (p >= n - first) return Status::InvalidArgument("past the tensor");
    }
    patches += 1;
    for (size_t k = 0; k < positions.size() && !drop_writes; ++k) {
      std::memcpy(bytes_[i].data() + (first + positions[k]) * w,
                  values.data() + k * w, w);
    }
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }

  std::vector<std::byte>& bytes(size_t i) { return bytes_[i]; }
  int patches = 0;  // Patch calls
  int writes = 0;
  bool drop_writes = false;  // a write that reports success and does nothing
  bool fail_digest = false;
  std::function<void()> on_destroy;  // the relay closed the buffers

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<std::byte>> bytes_;
};

inline std::vector<std::byte> Filled(size_t n, uint8_t v) {
  return std::vector<std::byte>(n, std::byte{v});
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
    auto m = Manifest::Create(tensors_);
    ASSERT_TRUE(m.ok());
    // Image 0 holds step 1 (bytes 0x10), image 1 step 2 (0x20).
    Status made = testing::CreateServingImages(spec_, *m);
    ASSERT_TRUE(made.ok()) << made.ToString();
    ASSERT_TRUE(
        LiveHeader::Create(LiveHeaderName(spec_), {0, {1, {0, 0}}, 1}).ok());
    socket_ = (dir_.path() / "relay.sock").string();
    ServingImages::Options o = ImagesOptions();
    o.on_diff_start = [this] {
      if (hold_diff_) hold_diff_();
    };
    o.on_attach_sync_start = [this] {
      if (hold_attach_) hold_attach_();
    };
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
      gpu_->on_destroy = [this] { gpus_closed_ += 1; };
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
    h.op = PauseMsg::Op::kHello;
    h.pid = 77;
    h.cuda_ipc = std::move(cuda_ipc);
    return h;
  }
  PauseMsg Paused(const RefitId& refit) {
    PauseMsg m;
    m.op = PauseMsg::Op::kPaused;
    m.refit = refit;
    return m;
  }
  PauseMsg Flipped(uint32_t image, uint64_t step) {
    PauseMsg m;
    m.op = PauseMsg::Op::kFlipped;
    m.image = image;
    m.version.step = step;
    return m;
  }
  // Makes tensor `t` of image 1 (step 2, before the flip) hold `bytes`.
  void SetStagedTensor(size_t t, const std::vector<std::byte>& bytes) {
    auto image = OpenStore(ServingImageSpec(spec_, 1));
    ASSERT_TRUE(image.ok()) << image.status().ToString();
    auto to = (*image)->MutableTensor(t);
    ASSERT_EQ(to.size(), bytes.size());
    std::memcpy(to.data(), bytes.data(), bytes.size());
  }
  // Flips to image 1 (step 2), as a relay's commit does.
  void Flip(const RefitId& refit) {
    auto standby = OpenStore(ServingImageSpec(spec_, 1));
    ASSERT_TRUE(standby.ok()) << standby.status().ToString();
    ASSERT_TRUE(
        images_->Flip(*standby, refit, std::chrono::steady_clock::now()).ok());
    standby_ = *std::move(standby);  // now the old live image
  }

  // The images' tensors; a derived fixture may set others in its
  // constructor.
  std::vector<TensorInfo> tensors_ = {{"a", DType::kBF16, {4}},
                                      {"b", DType::kU8, {3}}};
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
  std::atomic<int> gpus_closed_{0};
  // Run on the relay's diff thread before it diffs, and on its attach
  // sync's before it syncs (a test holds them; set before they start).
  std::function<void()> hold_diff_;
  std::function<void()> hold_attach_;
};

}  // namespace dcr::serving_testing

#endif  // DCR_TESTS_UNIT_SERVING_GPU_SERVING_TESTING_H_
