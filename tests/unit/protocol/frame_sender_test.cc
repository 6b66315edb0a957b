#include "protocol/frame_sender.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "testing/test_util.h"
#include "wire/hmac_authenticator.h"

namespace dcr {
namespace {

using testing::TextBytes;

RefitId Id(uint8_t a, uint8_t b) {
  RefitId id;
  id.bytes[0] = a;
  id.bytes[15] = b;
  return id;
}

Frame Parse(const FrameBuffer& b, const FrameOptions& options = {}) {
  auto f = ParseFrame(*b, options);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return *f;
}

TEST(FrameSenderTest, NextNumbersFramesInTheSendersContext) {
  RefitId refit = Id(7, 9);
  FrameSender sender({}, FrameContext{4, refit}, 1);
  auto a = sender.Next(FrameType::kChunk, TextBytes("abc"));
  auto b = sender.Next(FrameType::kEnd, TextBytes("d"));
  ASSERT_TRUE(a.ok() && b.ok());
  Frame fa = Parse(*a), fb = Parse(*b);
  EXPECT_EQ(fa.header.type, FrameType::kChunk);
  EXPECT_EQ(fa.header.epoch, 4u);
  EXPECT_EQ(fa.header.refit_id, refit);
  EXPECT_EQ(fa.header.sequence, 1u);
  EXPECT_EQ(fb.header.sequence, 2u);
  EXPECT_EQ(fb.header.type, FrameType::kEnd);
  EXPECT_EQ(sender.next_sequence(), 3u);
}

TEST(FrameSenderTest, AtKeepsTheCounterAndMessageFlagsOnly) {
  FrameSender sender({}, FrameContext{2, Id(1, 1)}, 5);
  auto f = sender.At(FrameType::kPlan, 0, TextBytes("p"), 0xff01);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Frame p = Parse(*f);
  EXPECT_EQ(p.header.sequence, 0u);
  EXPECT_EQ(p.header.flags & kFrameFlagsMessageMask, 0xff00);
  EXPECT_EQ(sender.next_sequence(), 5u);
}

TEST(FrameSenderTest, ReplyTakesTheRefitOfWhatItAnswers) {
  FrameSender sender;
  FrameHeader about;
  about.type = FrameType::kPlan;
  about.epoch = 11;
  about.refit_id = Id(3, 4);
  about.sequence = 99;
  auto r = sender.Reply(FrameType::kPlanReply, about, TextBytes("ok"));
  ASSERT_TRUE(r.ok());
  Frame f = Parse(*r);
  EXPECT_EQ(f.header.type, FrameType::kPlanReply);
  EXPECT_EQ(f.header.epoch, 11u);
  EXPECT_EQ(f.header.refit_id, about.refit_id);
  EXPECT_EQ(f.header.sequence, 0u);  // the sender's own counter
}

// A chunk in two encodings (the root of a mixed tree): one sequence number
// for both, each frame authenticated on its own, the counter advanced once.
TEST(FrameSenderTest, NextPairNumbersBothFramesOnceAndTagsEach) {
  std::vector<std::byte> key(32, std::byte{7});
  auto auth = HmacFrameAuthenticator::Create(key);
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  FrameOptions options;
  options.authenticator =
      std::shared_ptr<const FrameAuthenticator>(std::move(*auth).release());
  FrameSender sender(options, FrameContext{3, Id(2, 5)}, 9);
  auto pair = sender.NextPair(FrameType::kChunk, TextBytes("context"),
                              TextBytes("base-independent"));
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  Frame a = Parse(pair->first, options), b = Parse(pair->second, options);
  EXPECT_EQ(a.header.sequence, 9u);
  EXPECT_EQ(b.header.sequence, 9u);
  EXPECT_EQ(a.header.type, FrameType::kChunk);
  EXPECT_EQ(b.header.epoch, 3u);
  EXPECT_EQ(a.payload.size(), 7u);
  EXPECT_EQ(b.payload.size(), 16u);
  EXPECT_EQ(sender.next_sequence(), 10u);
  // A tag is over its own frame: swapping payloads breaks it.
  std::vector<std::byte> forged(*pair->second);
  forged[kFrameHeaderSize] = std::byte{'X'};
  EXPECT_FALSE(ParseFrame(forged, options).ok());
  auto next = sender.Next(FrameType::kEnd, {});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Parse(*next, options).header.sequence, 10u);
}

TEST(FrameSenderTest, APayloadOverTheBoundIsRefused) {
  FrameOptions options;
  options.max_payload = 4;
  FrameSender sender(options);
  EXPECT_FALSE(sender.Next(FrameType::kChunk, TextBytes("12345")).ok());
  EXPECT_TRUE(sender.Next(FrameType::kChunk, TextBytes("1234")).ok());
}

TEST(FrameSenderTest, ConcurrentSendersNeverShareASequenceNumber) {
  FrameSender sender;
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::vector<uint64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto f = sender.Next(FrameType::kHeartbeat, {});
        ASSERT_TRUE(f.ok());
        seen[t].push_back(Parse(*f).header.sequence);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), size_t{kThreads * kEach});
  EXPECT_EQ(*all.rbegin(), uint64_t{kThreads * kEach - 1});
}

TEST(FrameSenderTest, WholeFramePositionReadsOnlyExactlyOneFrame) {
  FrameSender sender({}, FrameContext{6, Id(2, 2)}, 41);
  auto f = sender.Next(FrameType::kChunk, TextBytes("payload"));
  ASSERT_TRUE(f.ok());
  auto pos = WholeFramePosition(**f, {});
  ASSERT_TRUE(pos.has_value());
  EXPECT_EQ(pos->epoch, 6u);
  EXPECT_EQ(pos->sequence, 41u);

  std::vector<std::byte> longer = **f;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(WholeFramePosition(longer, {}).has_value());
  std::vector<std::byte> shorter(longer.begin(), longer.end() - 2);
  EXPECT_FALSE(WholeFramePosition(shorter, {}).has_value());
  std::vector<std::byte> bad = **f;
  bad[0] = std::byte{'X'};  // magic
  EXPECT_FALSE(WholeFramePosition(bad, {}).has_value());
  EXPECT_FALSE(WholeFramePosition({}, {}).has_value());
}

}  // namespace
}  // namespace dcr
