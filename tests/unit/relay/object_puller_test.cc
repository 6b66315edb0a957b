// A cluster head's puller (relay/object_puller.h) over a directory store:
// objects delivered in order as they appear, a backlog read kParallel at a
// time (a store with a round trip per request), the relay's mailbox
// bounded, a refused read ending the pull.
#include "relay/object_puller.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kRefit = "00112233445566778899aabbccddeeff";

// Every Get takes `rtt` (a store far away), or is refused once `refuse`.
class SlowStore final : public ObjectStore {
 public:
  SlowStore(ObjectStore* base, std::chrono::milliseconds rtt)
      : base_(base), rtt_(rtt) {}
  Status Put(std::string_view key, std::span<const std::byte> d) override {
    return base_->Put(key, d);
  }
  Result<std::vector<std::byte>> Get(std::string_view key) override {
    gets_.fetch_add(1);
    const int now = inflight_.fetch_add(1) + 1;
    for (int peak = peak_.load(); now > peak;) {
      if (peak_.compare_exchange_weak(peak, now)) break;
    }
    {
      MutexLock lock(&mu_);
      ++gets_of_[std::string(key)];
    }
    std::this_thread::sleep_for(rtt_);
    inflight_.fetch_sub(1);
    if (refuse_.load()) return Status::InvalidArgument("access denied");
    return base_->Get(key);
  }
  Status Delete(std::string_view key) override { return base_->Delete(key); }
  Result<std::vector<std::string>> List(std::string_view prefix) override {
    return base_->List(prefix);
  }
  std::string describe() const override { return "slow"; }
  ObjectStoreStats stats() const override { return {}; }
  int gets() const { return gets_.load(); }
  int peak() const { return peak_.load(); }
  int GetsOf(const std::string& key) {
    MutexLock lock(&mu_);
    return gets_of_[key];
  }
  void Refuse() { refuse_.store(true); }

 private:
  ObjectStore* base_;
  const std::chrono::milliseconds rtt_;
  std::atomic<int> gets_{0};
  std::atomic<int> inflight_{0};
  std::atomic<int> peak_{0};
  std::atomic<bool> refuse_{false};
  Mutex mu_;
  std::map<std::string, int> gets_of_ DCR_GUARDED_BY(mu_);
};

class ObjectPullerTest : public ::testing::Test {
 protected:
  ObjectPullerTest() {
    auto s = OpenDirObjectStore(dir_.Path("bucket"));
    EXPECT_TRUE(s.ok());
    store_ = std::move(*s);
  }
  void Put(uint64_t ordinal, size_t size = 16) {
    std::vector<std::byte> data(size, std::byte(ordinal));
    ASSERT_TRUE(store_->Put(RefitObjectKey(kRefit, ordinal), data).ok());
  }
  // What the puller delivered, in order (the first byte of each).
  std::vector<int> Got() {
    MutexLock lock(&mu_);
    return got_;
  }
  void Record(const FrameBuffer& f) {
    MutexLock lock(&mu_);
    got_.push_back(static_cast<int>((*f)[0]));
  }
  bool WaitFor(size_t n, std::chrono::milliseconds limit = 5s) {
    const auto until = Clock::now() + limit;
    while (Got().size() < n && Clock::now() < until) {
      std::this_thread::sleep_for(2ms);
    }
    return Got().size() >= n;
  }

  testing::TempDir dir_;
  std::unique_ptr<ObjectStore> store_;
  Mutex mu_;
  std::vector<int> got_;
};

TEST_F(ObjectPullerTest, DeliversInOrderAsObjectsAppear) {
  for (uint64_t i = 0; i < 5; ++i) Put(i);
  ObjectPuller p(
      store_.get(), kRefit, [&](FrameBuffer f) { Record(f); },
      [](Status) { FAIL(); });
  p.Pause(false);
  ASSERT_TRUE(WaitFor(5));
  // Later objects, uploaded out of order (parallel uploads).
  Put(7);
  Put(5);
  std::this_thread::sleep_for(30ms);
  Put(6);
  ASSERT_TRUE(WaitFor(8));
  EXPECT_EQ(Got(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.pulled(), 8u);
  EXPECT_EQ(p.skipped(), 0u);
}

TEST_F(ObjectPullerTest, ReadsABacklogInParallel) {
  // 32 objects behind a 20 ms round trip: one at a time takes 640 ms.
  SlowStore slow(store_.get(), 20ms);
  for (uint64_t i = 0; i < 32; ++i) Put(i);
  ObjectPuller p(
      &slow, kRefit, [&](FrameBuffer f) { Record(f); }, [](Status) { FAIL(); });
  const auto t0 = Clock::now();
  p.Pause(false);
  ASSERT_TRUE(WaitFor(32));
  const auto took = Clock::now() - t0;
  p.Stop();
  std::vector<int> want(32);
  for (int i = 0; i < 32; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(Got(), want);
  // Up to kParallel reads in flight (the window grows 1, 2, 4, ...): a
  // few round trips, not 32.
  EXPECT_EQ(slow.peak(), ObjectPuller::kParallel);
  EXPECT_LT(took, 480ms);
}

TEST_F(ObjectPullerTest, WaitsWhileTheRelayHoldsTooMuch) {
  for (uint64_t i = 0; i < 10; ++i) Put(i, 1000);
  ObjectPuller p(
      store_.get(), kRefit, [&](FrameBuffer f) { Record(f); },
      [](Status) { FAIL(); }, /*max_unconsumed_bytes=*/2500);
  p.Pause(false);
  ASSERT_TRUE(WaitFor(3));
  std::this_thread::sleep_for(50ms);  // time to read more, if it would
  // Over 2500 bytes after the read that crossed it, then nothing more.
  const size_t held = Got().size();
  EXPECT_EQ(held, 3u);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Got().size(), held);
  // The relay takes them as they come: the rest comes.
  size_t consumed = 0;
  const auto until = Clock::now() + 5s;
  while (Got().size() < 10 && Clock::now() < until) {
    for (const size_t n = Got().size(); consumed < n; ++consumed) {
      p.Consumed(1000);
    }
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(Got().size(), 10u);
}

TEST_F(ObjectPullerTest, ObjectsReadPastAGapAreKeptNotReadAgain) {
  SlowStore slow(store_.get(), 1ms);
  Put(0);
  Put(2);
  Put(3);
  ObjectPuller p(
      &slow, kRefit, [&](FrameBuffer f) { Record(f); }, [](Status) { FAIL(); });
  p.Pause(false);
  ASSERT_TRUE(WaitFor(1));
  std::this_thread::sleep_for(300ms);  // polls for 1 up to 100 ms apart
  EXPECT_EQ(Got().size(), 1u);
  Put(1);
  ASSERT_TRUE(WaitFor(4));
  EXPECT_EQ(Got(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(slow.GetsOf(RefitObjectKey(kRefit, 2)), 1);
  EXPECT_EQ(slow.GetsOf(RefitObjectKey(kRefit, 3)), 1);
  EXPECT_LE(slow.peak(), ObjectPuller::kParallel);
}

TEST_F(ObjectPullerTest, ARefusedReadEndsThePull) {
  SlowStore slow(store_.get(), 0ms);
  Put(0);
  std::atomic<int> failures{0};
  ObjectPuller p(
      &slow, kRefit, [&](FrameBuffer f) { Record(f); },
      [&](Status s) {
        EXPECT_TRUE(s.IsInvalidArgument());
        failures.fetch_add(1);
      });
  p.Pause(false);
  ASSERT_TRUE(WaitFor(1));
  slow.Refuse();
  Put(1);
  for (int i = 0; i < 500 && failures.load() == 0; ++i) {
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(failures.load(), 1);
  const int gets = slow.gets();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(slow.gets(), gets);  // nothing read after it
  EXPECT_EQ(Got().size(), 1u);
}

}  // namespace
}  // namespace dcr
