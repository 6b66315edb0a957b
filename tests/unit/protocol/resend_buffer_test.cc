#include "protocol/resend_buffer.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace dcr {
namespace {

FrameBuffer Frame(size_t size) {
  return std::make_shared<const std::vector<std::byte>>(size);
}

FramePosition At(uint64_t sequence) { return FramePosition{1, sequence}; }

TEST(ResendBufferTest, ResendsWhatCameAfterLessWhatWasSent) {
  ResendBuffer b(1000);
  std::vector<FrameBuffer> f;
  for (uint64_t s = 1; s <= 5; ++s) {
    f.push_back(Frame(100));
    b.Keep(f.back(), At(s), true);
  }
  EXPECT_EQ(b.frames(), 5u);
  EXPECT_EQ(b.bytes(), 500u);
  ResendBuffer::Resend r = b.For(At(2), {At(4)});
  ASSERT_EQ(r.frames.size(), 2u);
  EXPECT_EQ(r.frames[0], f[2]);  // shared, not copied
  EXPECT_EQ(r.frames[1], f[4]);
  EXPECT_EQ(r.bytes, 200u);
  EXPECT_FALSE(r.miss);
  EXPECT_TRUE(b.For(At(5), {}).frames.empty());
}

TEST(ResendBufferTest, EvictionMakesAMissOnlyForNodesThatNeedIt) {
  ResendBuffer b(250);
  for (uint64_t s = 1; s <= 4; ++s) b.Keep(Frame(100), At(s), true);
  EXPECT_EQ(b.frames(), 2u);  // 1 and 2 evicted
  ResendBuffer::Resend behind = b.For(At(1), {});
  EXPECT_TRUE(behind.miss);
  EXPECT_EQ(behind.lost_through->sequence, 2u);
  EXPECT_EQ(behind.frames.size(), 2u);  // what it still has goes anyway
  ResendBuffer::Resend fine = b.For(At(2), {});
  EXPECT_FALSE(fine.miss);
  EXPECT_EQ(fine.frames.size(), 2u);
}

TEST(ResendBufferTest, AFrameNotKeptOrNotWholeIsLost) {
  ResendBuffer b(1000);
  b.Keep(Frame(10), At(1), true);
  b.Keep(Frame(10), At(2), false);        // a damaged copy
  b.Keep(Frame(10), std::nullopt, true);  // not whole: counts as 3
  b.Keep(Frame(10), At(4), true);
  EXPECT_EQ(b.frames(), 2u);
  EXPECT_TRUE(b.For(At(1), {}).miss);
  ResendBuffer::Resend r = b.For(At(2), {});
  EXPECT_TRUE(r.miss);
  EXPECT_EQ(r.lost_through->sequence, 3u);
  EXPECT_FALSE(b.For(At(3), {}).miss);
}

TEST(ResendBufferTest, ZeroLimitKeepsNothing) {
  ResendBuffer b(0);
  EXPECT_FALSE(b.enabled());
  b.Keep(Frame(10), At(1), true);
  EXPECT_EQ(b.frames(), 0u);
  EXPECT_TRUE(b.For(At(0), {}).frames.empty());
}

}  // namespace
}  // namespace dcr
