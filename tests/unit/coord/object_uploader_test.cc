// The root's uploader (coord/object_uploader.h) over a directory store
// wrapped to fail: every frame stored under its ordinal, a store that is
// down for a while retried until it is back, one that stays down given
// up after the deadline, a refusal not retried, Stop cutting a retry
// short.
#include "coord/object_uploader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "testing/temp_dir.h"

namespace dcr {
namespace {

using namespace std::chrono_literals;

// Fails the first `fail_puts` Puts with `failure`, then passes them on.
class FailingStore final : public ObjectStore {
 public:
  FailingStore(ObjectStore* base, int fail_puts, Status failure)
      : base_(base), fail_left_(fail_puts), failure_(std::move(failure)) {}
  Status Put(std::string_view key, std::span<const std::byte> d) override {
    puts_.fetch_add(1);
    if (fail_left_.fetch_sub(1) > 0) return failure_;
    return base_->Put(key, d);
  }
  Result<std::vector<std::byte>> Get(std::string_view key) override {
    return base_->Get(key);
  }
  Status Delete(std::string_view key) override { return base_->Delete(key); }
  Result<std::vector<std::string>> List(std::string_view prefix) override {
    return base_->List(prefix);
  }
  std::string describe() const override { return "failing"; }
  ObjectStoreStats stats() const override { return {}; }
  int puts() const { return puts_.load(); }

 private:
  ObjectStore* base_;
  std::atomic<int> fail_left_;
  const Status failure_;
  std::atomic<int> puts_{0};
};

FrameBuffer FilledFrame(uint8_t fill, size_t n = 64) {
  return std::make_shared<const std::vector<std::byte>>(n, std::byte{fill});
}

const std::string kRefit = "00112233445566778899aabbccddeeff";

class ObjectUploaderTest : public ::testing::Test {
 protected:
  ObjectUploaderTest() {
    auto s = OpenDirObjectStore(dir_.Path("bucket"));
    EXPECT_TRUE(s.ok());
    store_ = std::move(*s);
  }
  // Waits (up to 10 s) until `n` objects were stored or failed for good.
  static void WaitUploaded(const ObjectUploader& u, uint64_t n) {
    for (int i = 0; i < 1000 && u.uploaded() < n; ++i) {
      std::this_thread::sleep_for(10ms);
    }
  }
  testing::TempDir dir_;
  std::unique_ptr<ObjectStore> store_;
};

TEST_F(ObjectUploaderTest, StoresEveryFrameUnderItsOrdinal) {
  std::atomic<int> wakes{0};
  ObjectUploader u(
      store_.get(), kRefit, 4, [&] { wakes.fetch_add(1); }, 10s);
  for (uint8_t i = 0; i < 20; ++i) u.Push(FilledFrame(i));
  EXPECT_EQ(u.pushed(), 20u);
  WaitUploaded(u, 20);
  EXPECT_EQ(u.uploaded(), 20u);
  EXPECT_EQ(u.uploaded_bytes(), 20u * 64);
  EXPECT_EQ(u.QueuedBytes(), 0u);
  for (uint8_t i = 0; i < 20; ++i) {
    auto got = store_->Get(RefitObjectKey(kRefit, i));
    ASSERT_TRUE(got.ok()) << i;
    EXPECT_EQ(*got, *FilledFrame(i));
  }
  EXPECT_GE(wakes.load(), 20);
}

TEST_F(ObjectUploaderTest, RetriesAStoreThatIsDownUntilItIsBack) {
  FailingStore down(store_.get(), 2, Status::IOError("connection refused"));
  ObjectUploader u(&down, kRefit, 1, nullptr, 10s);
  u.Push(FilledFrame(7));  // the END object, say: it must get there
  WaitUploaded(u, 1);
  EXPECT_EQ(u.uploaded(), 1u);
  EXPECT_EQ(u.failures(), 2u);
  EXPECT_EQ(down.puts(), 3);
  EXPECT_TRUE(store_->Get(RefitObjectKey(kRefit, 0)).ok());
}

TEST_F(ObjectUploaderTest, ARefusalIsNotRetried) {
  FailingStore refusing(store_.get(), 1,
                        Status::InvalidArgument("access denied"));
  ObjectUploader u(&refusing, kRefit, 1, nullptr, 10s);
  u.Push(FilledFrame(1));
  u.Push(FilledFrame(2));
  WaitUploaded(u, 1);
  u.Stop();
  EXPECT_EQ(refusing.puts(), 2);
  EXPECT_EQ(u.failures(), 1u);
  EXPECT_FALSE(store_->Get(RefitObjectKey(kRefit, 0)).ok());
  EXPECT_TRUE(store_->Get(RefitObjectKey(kRefit, 1)).ok());
}

TEST_F(ObjectUploaderTest, StopCutsARetryShortAndDropsTheQueue) {
  FailingStore down(store_.get(), 1 << 20, Status::IOError("down"));
  ObjectUploader u(&down, kRefit, 1, nullptr, 60s);
  for (uint8_t i = 0; i < 5; ++i) u.Push(FilledFrame(i));
  while (down.puts() < 2) std::this_thread::sleep_for(5ms);
  const auto t0 = std::chrono::steady_clock::now();
  u.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(u.uploaded(), 0u);
  EXPECT_EQ(u.QueuedBytes(), 0u);
  u.Push(FilledFrame(9));  // ignored after Stop
  EXPECT_EQ(u.pushed(), 5u);
}

TEST_F(ObjectUploaderTest, AStoreThatStaysDownIsGivenUpAfterTheDeadline) {
  // A full disk or a bucket gone: the object is given up, and its bytes
  // leave the queue the root's stream waits on.
  FailingStore down(store_.get(), 1 << 20, Status::IOError("no space left"));
  ObjectUploader u(&down, kRefit, 1, nullptr, 500ms);
  const auto t0 = std::chrono::steady_clock::now();
  u.Push(FilledFrame(1));
  u.Push(FilledFrame(2));
  while (u.QueuedBytes() > 0 && std::chrono::steady_clock::now() - t0 < 5s) {
    std::this_thread::sleep_for(10ms);
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(u.QueuedBytes(), 0u);
  EXPECT_EQ(u.uploaded(), 0u);
  EXPECT_GE(took, 1s);  // each object had its 500 ms of retries
  EXPECT_LT(took, 3s);
  EXPECT_GE(u.failures(), 6u);  // 200 + 400 ms waits, then the deadline
}

}  // namespace
}  // namespace dcr
