// Helpers for transport tests: a LinkHandler that records what it saw and
// lets the test wait for it (no sleeps), and frame builders.
#ifndef DCR_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_UTIL_H_
#define DCR_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"

namespace dcr::testing {

inline constexpr std::chrono::seconds kWait{20};
inline constexpr std::chrono::milliseconds kConnectTimeout{5000};

// A TCP transport with `options` (failing the test if it cannot be made).
inline std::unique_ptr<Transport> MakeTcp(
    const TransportOptions& options = {}) {
  Result<std::unique_ptr<Transport>> t = CreateTransport("tcp", options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

// A frame whose sequence is `seq`, epoch `epoch`, and whose payload is
// `size` bytes derived from both (so corruption or mix-ups show).
inline FrameBuffer TestFrame(uint64_t seq, size_t size, uint64_t epoch = 1,
                             FrameType type = FrameType::kChunk) {
  FrameHeader h;
  h.type = type;
  h.epoch = epoch;
  h.sequence = seq;
  std::vector<std::byte> payload(size);
  uint64_t x = seq * 0x9e3779b97f4a7c15ull + epoch + 1;
  for (auto& b : payload) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  Result<FrameBuffer> f = EncodeFrame(h, payload);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? *f : nullptr;
}

class Recorder : public LinkHandler {
 public:
  struct Received {
    uint64_t link_id;
    FrameHeader header;
    FrameBuffer buffer;
  };
  struct Closed {
    uint64_t link_id;
    std::string peer;
    Status why;
  };

  void OnOpen(Link& link) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    opened_.push_back(link.shared_from_this());
    if (pause_on_open_) link.PauseReading();
    cv_.notify_all();
  }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    // The frame views into the buffer it came with.
    EXPECT_EQ(frame.bytes.data(), buffer->data());
    std::function<void(Link&, const FrameBuffer&)> hook;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      frames_.push_back(Received{link.id(), frame.header, buffer});
      hook = on_frame_;
      cv_.notify_all();
    }
    if (hook) hook(link, buffer);
  }
  void OnClosed(Link& link, const Status& why) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    closed_.push_back(Closed{link.id(), link.peer(), why});
    ++closes_per_link_[link.id()];
    cv_.notify_all();
  }
  void OnDrained(Link& link) override {
    (void)link;
    std::lock_guard<std::recursive_mutex> lock(mu_);
    ++drained_;
    cv_.notify_all();
  }

  // Waits until `pred` (called under the lock) holds; false on timeout.
  bool WaitFor(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = kWait) {
    std::unique_lock<std::recursive_mutex> lock(mu_);
    // Re-checked at least every 10 ms, for conditions no callback signals
    // (such as Link::QueuedBytes).
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    return true;
  }
  bool WaitFrames(size_t n) {
    return WaitFor([&] { return frames_.size() >= n; });
  }
  bool WaitClosed(size_t n) {
    return WaitFor([&] { return closed_.size() >= n; });
  }
  bool WaitOpened(size_t n) {
    return WaitFor([&] { return opened_.size() >= n; });
  }

  void set_pause_on_open(bool p) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    pause_on_open_ = p;
  }
  void set_on_frame(std::function<void(Link&, const FrameBuffer&)> f) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    on_frame_ = std::move(f);
  }

  std::vector<Received> frames() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return frames_;
  }
  std::vector<Closed> closed() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return closed_;
  }
  std::vector<std::shared_ptr<Link>> opened() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return opened_;
  }
  int drained() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return drained_;
  }
  // Every link closed at most once.
  bool ClosedAtMostOnce() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (const auto& [id, n] : closes_per_link_) {
      if (n != 1) return false;
    }
    return true;
  }

 private:
  // Recursive: WaitFor predicates run under the lock and may call the
  // accessors below.
  std::recursive_mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::shared_ptr<Link>> opened_;
  std::vector<Received> frames_;
  std::vector<Closed> closed_;
  std::map<uint64_t, int> closes_per_link_;
  int drained_ = 0;
  bool pause_on_open_ = false;
  std::function<void(Link&, const FrameBuffer&)> on_frame_;
};

}  // namespace dcr::testing

#endif  // DCR_TESTS_UNIT_TRANSPORT_TRANSPORT_TEST_UTIL_H_
