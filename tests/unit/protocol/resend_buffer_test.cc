#include "protocol/resend_buffer.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace dcr {
namespace {

FrameBuffer SizedFrame(size_t size) {
  return std::make_shared<const std::vector<std::byte>>(size);
}

FramePosition At(uint64_t sequence) { return FramePosition{1, sequence}; }

TEST(ResendBufferTest, ResendsWhatCameAfterLessWhatWasSent) {
  ResendBuffer b(1000);
  std::vector<FrameBuffer> f;
  for (uint64_t s = 1; s <= 5; ++s) {
    f.push_back(SizedFrame(100));
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

// The root of a mixed tree keeps a chunk's two encodings at one position:
// a node that takes context-coded chunks gets the first, another the
// base-independent one; both count against the limit and leave together.
TEST(ResendBufferTest, KeepsBothEncodingsOfAChunkAndResendsTheOneAsked) {
  ResendBuffer b(1000);
  FrameBuffer context1 = SizedFrame(100), plain1 = SizedFrame(130);
  FrameBuffer both2 = SizedFrame(50);  // a chunk with one encoding for everyone
  FrameBuffer context3 = SizedFrame(100), plain3 = SizedFrame(130);
  b.Keep(context1, At(1), true, plain1);
  b.Keep(both2, At(2), true);
  b.Keep(context3, At(3), true, plain3);
  EXPECT_EQ(b.bytes(), 510u);
  EXPECT_EQ(b.frames(), 3u);
  ResendBuffer::Resend c = b.For(At(0), {});
  ASSERT_EQ(c.frames.size(), 3u);
  EXPECT_EQ(c.frames[0], context1);
  EXPECT_EQ(c.frames[1], both2);
  EXPECT_EQ(c.frames[2], context3);
  EXPECT_EQ(c.bytes, 250u);
  ResendBuffer::Resend p = b.For(At(0), {At(3)}, /*context=*/false);
  ASSERT_EQ(p.frames.size(), 2u);
  EXPECT_EQ(p.frames[0], plain1);
  EXPECT_EQ(p.frames[1], both2);
  EXPECT_EQ(p.bytes, 180u);
  // 510 + 230 > 600: the oldest pair leaves, whole.
  ResendBuffer small(600);
  small.Keep(context1, At(1), true, plain1);
  small.Keep(both2, At(2), true);
  small.Keep(context3, At(3), true, plain3);
  small.Keep(SizedFrame(100), At(4), true, SizedFrame(130));
  EXPECT_EQ(small.bytes(), 510u);
  ResendBuffer::Resend late = small.For(At(0), {}, /*context=*/false);
  EXPECT_TRUE(late.miss);
  ASSERT_EQ(late.frames.size(), 3u);
  EXPECT_EQ(late.frames[0], both2);
  EXPECT_EQ(late.frames[1], plain3);
}

TEST(ResendBufferTest, EvictionMakesAMissOnlyForNodesThatNeedIt) {
  ResendBuffer b(250);
  for (uint64_t s = 1; s <= 4; ++s) b.Keep(SizedFrame(100), At(s), true);
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
  b.Keep(SizedFrame(10), At(1), true);
  b.Keep(SizedFrame(10), At(2), false);        // a damaged copy
  b.Keep(SizedFrame(10), std::nullopt, true);  // not whole: counts as 3
  b.Keep(SizedFrame(10), At(4), true);
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
  b.Keep(SizedFrame(10), At(1), true);
  EXPECT_EQ(b.frames(), 0u);
  EXPECT_TRUE(b.For(At(0), {}).frames.empty());
}

}  // namespace
}  // namespace dcr
