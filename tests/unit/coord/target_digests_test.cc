// The target's digests hashed in the encoder's pass (coord/target_digests.h):
// spans offered in any order, from any threads, some twice, some never,
// give exactly the digests of a whole pass over the checkpoint.
#include "coord/target_digests.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "dcr/thread_pool.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;
constexpr uint64_t kDigestSpan = 1000;

class TargetDigestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short last spans, a one-span tensor, an empty tensor, an F32 one.
    const std::vector<std::pair<DType, uint64_t>> shapes = {
        {DType::kBF16, 7 * kDigestSpan + 13},
        {DType::kBF16, 999},
        {DType::kF32, 0},
        {DType::kF32, 3 * kDigestSpan},
        {DType::kU8, 2 * kDigestSpan + 1}};
    std::mt19937 rng(7);
    std::vector<Bytes> data;
    std::vector<TensorToWrite> w;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Bytes b(shapes[i].second * DTypeSize(shapes[i].first));
      for (auto& x : b) x = static_cast<std::byte>(rng());
      data.push_back(std::move(b));
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      w.push_back(
          {TensorInfo{
               "t" + std::to_string(i), shapes[i].first, {shapes[i].second}},
           data[i]});
    }
    ASSERT_TRUE(WriteSafetensors(dir_.Path("t.safetensors"), w, {}).ok());
    target_ = *Checkpoint::Open(dir_.Path("t.safetensors"),
                                Checkpoint::Mode::kReadOnly);
    want_ = target_->ComputeDigests();
    const Manifest& m = target_->manifest();
    for (uint32_t t = 0; t < m.size(); ++t) {
      for (uint32_t s = 0; s < SpanCount(m[t].NumElements(), kDigestSpan);
           ++s) {
        ids_.push_back({t, s});
      }
      total_ += m[t].NumBytes();
    }
  }

  void ExpectDigests(const CheckpointDigests& got) const {
    EXPECT_EQ(got.tensors, want_.tensors);
    EXPECT_EQ(got.manifest, want_.manifest);
    EXPECT_EQ(got.version, want_.version);
  }

  testing::TempDir dir_;
  std::unique_ptr<Checkpoint> target_;
  CheckpointDigests want_;
  std::vector<ChunkId> ids_;
  uint64_t total_ = 0;
};

TEST_F(TargetDigestsTest, InOrderOffersHashEverySpanThere) {
  TargetDigests d(target_.get(), kDigestSpan);
  for (const ChunkId& id : ids_) d.Offer(id);
  EXPECT_EQ(d.offered_bytes(), total_);
  ExpectDigests(d.Finish(nullptr));
}

TEST_F(TargetDigestsTest, ShuffledOffersFromManyThreadsGiveTheSameDigests) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<ChunkId> order = ids_;
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    TargetDigests d(target_.get(), kDigestSpan);
    std::vector<std::thread> threads;
    constexpr size_t kThreads = 4;
    for (size_t k = 0; k < kThreads; ++k) {
      threads.emplace_back([&, k] {
        for (size_t i = k; i < order.size(); i += kThreads) d.Offer(order[i]);
      });
    }
    for (auto& t : threads) t.join();
    // Every span was offered: all of it was hashed by the offers.
    EXPECT_EQ(d.offered_bytes(), total_);
    ExpectDigests(d.Finish(nullptr));
  }
}

TEST_F(TargetDigestsTest, FinishHashesWhatWasNeverOffered) {
  ThreadPool pool(3);
  // Nothing offered.
  {
    TargetDigests d(target_.get(), kDigestSpan);
    ExpectDigests(d.Finish(&pool));
    EXPECT_EQ(d.offered_bytes(), 0u);
  }
  // Every other span, in reverse: the offers behind a gap wait for Finish.
  {
    TargetDigests d(target_.get(), kDigestSpan);
    for (size_t i = ids_.size(); i-- > 0;) {
      if (i % 2 == 0) d.Offer(ids_[i]);
    }
    ExpectDigests(d.Finish(&pool));
  }
}

TEST_F(TargetDigestsTest, RepeatedAndOutOfRangeOffersAreIgnored) {
  TargetDigests d(target_.get(), kDigestSpan);
  for (const ChunkId& id : ids_) {
    d.Offer(id);
    d.Offer(id);
  }
  d.Offer({0, 1u << 30});
  d.Offer({1u << 20, 0});
  ExpectDigests(d.Finish(nullptr));
}

}  // namespace
}  // namespace dcr
