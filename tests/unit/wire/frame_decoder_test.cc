#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/bytes.h"
#include "dcr/wire.h"
#include "testing/test_util.h"
#include "unit/wire/test_authenticator.h"

namespace dcr {
namespace {

using testing::RandomBytes;

FrameBuffer Make(uint64_t seq, size_t payload_size,
                 const FrameOptions& options = {}) {
  FrameHeader h;
  h.type = static_cast<FrameType>(1 + seq % kMaxFrameType);
  h.epoch = 7;
  h.sequence = seq;
  h.refit_id.bytes[0] = 0x5a;
  Result<FrameBuffer> buf =
      EncodeFrame(h, RandomBytes(payload_size, uint32_t(seq)), options);
  EXPECT_TRUE(buf.ok()) << buf.status().ToString();
  return *buf;
}

// Drains every frame the decoder has; fails the test on corruption.
std::vector<DecodedFrame> Drain(FrameDecoder& d) {
  std::vector<DecodedFrame> out;
  for (;;) {
    Result<std::optional<DecodedFrame>> r = d.Next();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || !r->has_value()) return out;
    out.push_back(std::move(**r));
  }
}

void ExpectSameFrames(const std::vector<FrameBuffer>& sent,
                      const std::vector<DecodedFrame>& got) {
  ASSERT_EQ(sent.size(), got.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(*sent[i], *got[i].buffer) << "frame " << i;
    EXPECT_EQ(got[i].frame.header.sequence, i);
    // Zero-copy: the frame's views point into the owning buffer.
    EXPECT_EQ(got[i].frame.bytes.data(), got[i].buffer->data());
    EXPECT_EQ(got[i].frame.payload.data(),
              got[i].buffer->data() + kFrameHeaderSize);
  }
}

std::vector<FrameBuffer> SampleStream(size_t n, uint32_t seed,
                                      const FrameOptions& options = {}) {
  std::mt19937 rng(seed);
  std::vector<FrameBuffer> frames;
  for (size_t i = 0; i < n; ++i) {
    size_t size = (i % 5 == 0) ? 0 : rng() % ((i % 7 == 0) ? 70000 : 300);
    frames.push_back(Make(i, size, options));
  }
  return frames;
}

std::vector<std::byte> Concat(const std::vector<FrameBuffer>& frames) {
  std::vector<std::byte> all;
  for (const auto& f : frames) all.insert(all.end(), f->begin(), f->end());
  return all;
}

TEST(FrameDecoderTest, ByteByByte) {
  std::vector<FrameBuffer> frames = SampleStream(30, 1);
  std::vector<std::byte> all = Concat(frames);
  FrameDecoder d;
  std::vector<DecodedFrame> got;
  for (std::byte b : all) {
    d.Feed(std::span(&b, 1));
    for (auto& f : Drain(d)) got.push_back(std::move(f));
  }
  EXPECT_FALSE(d.mid_frame());
  ExpectSameFrames(frames, got);
}

TEST(FrameDecoderTest, RandomSplits) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<FrameBuffer> frames = SampleStream(100, seed);
    std::vector<std::byte> all = Concat(frames);
    std::mt19937 rng(seed);
    FrameDecoder d;
    std::vector<DecodedFrame> got;
    size_t pos = 0;
    while (pos < all.size()) {
      size_t n = std::min<size_t>(all.size() - pos, 1 + rng() % 9000);
      d.Feed(std::span(all).subspan(pos, n));
      pos += n;
      if (rng() % 2) {
        for (auto& f : Drain(d)) got.push_back(std::move(f));
      }
    }
    for (auto& f : Drain(d)) got.push_back(std::move(f));
    ExpectSameFrames(frames, got);
  }
}

TEST(FrameDecoderTest, WholeStreamInOneFeed) {
  std::vector<FrameBuffer> frames = SampleStream(50, 3);
  FrameDecoder d;
  d.Feed(Concat(frames));
  EXPECT_EQ(d.ready_frames(), 50u);
  ExpectSameFrames(frames, Drain(d));
}

TEST(FrameDecoderTest, NeedMoreOnTruncatedHeaderAndPayload) {
  FrameBuffer f = Make(0, 100);
  FrameDecoder d;
  d.Feed(std::span(*f).first(10));
  Result<std::optional<DecodedFrame>> r = d.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_TRUE(d.mid_frame());
  EXPECT_EQ(d.partial_bytes(), 10u);
  EXPECT_EQ(d.reserved_bytes(), 0u);  // nothing reserved before a header
  d.Feed(std::span(*f).subspan(10, kFrameHeaderSize + 50 - 10));
  r = d.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(d.partial_bytes(), kFrameHeaderSize + 50);
  EXPECT_EQ(d.reserved_bytes(), f->size());
  d.Feed(std::span(*f).subspan(kFrameHeaderSize + 50));
  r = d.Next();
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->has_value());
  EXPECT_FALSE(d.mid_frame());
}

// A header that claims `length`, correctly sealed except for the bound.
std::vector<std::byte> HeaderClaiming(uint32_t length) {
  FrameBuffer f = Make(0, 0);
  std::vector<std::byte> h(f->begin(), f->begin() + kFrameHeaderSize);
  StoreLE<uint32_t>(&h[8], length);
  return h;
}

TEST(FrameDecoderTest, OversizedLengthRejectedBeforeAllocation) {
  for (uint32_t length : {0xffffffffu, kDefaultMaxFramePayload + 1}) {
    FrameDecoder d;
    d.Feed(HeaderClaiming(length));
    Result<std::optional<DecodedFrame>> r = d.Next();
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().IsCorruption());
    EXPECT_NE(r.status().message().find("exceeds the limit"), std::string::npos)
        << r.status().ToString();
    EXPECT_EQ(d.reserved_bytes(), 0u);
    EXPECT_FALSE(d.mid_frame());
  }
  // A configured bound: max itself is accepted (and reserved), max+1 not.
  FrameOptions small;
  small.max_payload = 4096;
  FrameDecoder ok_dec(small);
  ok_dec.Feed(HeaderClaiming(4096));
  Result<std::optional<DecodedFrame>> r = ok_dec.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(ok_dec.reserved_bytes(), kFrameHeaderSize + 4096);
  FrameDecoder bad_dec(small);
  bad_dec.Feed(HeaderClaiming(4097));
  EXPECT_TRUE(bad_dec.Next().status().IsCorruption());
  EXPECT_EQ(bad_dec.reserved_bytes(), 0u);
}

TEST(FrameDecoderTest, AFirstFrameBoundHoldsForTheFirstFrameOnly) {
  FrameOptions greet;
  greet.first_frame_max_payload = 1000;
  // A large first frame is refused at its header, before any reservation.
  FrameDecoder bad(greet);
  bad.Feed(HeaderClaiming(1001));
  Result<std::optional<DecodedFrame>> r = bad.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_NE(r.status().message().find("first frame"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(bad.reserved_bytes(), 0u);
  EXPECT_EQ(bad.frames_started(), 0u);
  // A small greeting, then frames up to max_payload.
  std::vector<FrameBuffer> sent = {Make(0, 1000), Make(1, 70000),
                                   Make(2, 5000)};
  FrameDecoder good(greet);
  good.Feed(Concat(sent));
  ExpectSameFrames(sent, Drain(good));
  EXPECT_EQ(good.frames_started(), 3u);
}

TEST(FrameDecoderTest, StaysFailedAfterCorruptionButReturnsEarlierFrames) {
  FrameBuffer good0 = Make(0, 10), good1 = Make(1, 20);
  std::vector<std::byte> bad = *Make(2, 30);
  bad[kFrameHeaderSize + 3] ^= std::byte{0x40};
  FrameDecoder d;
  d.Feed(*good0);
  d.Feed(*good1);
  d.Feed(bad);
  d.Feed(*Make(3, 5));
  Result<std::optional<DecodedFrame>> r = d.Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->frame.header.sequence, 0u);
  r = d.Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->frame.header.sequence, 1u);
  for (int i = 0; i < 3; ++i) {
    r = d.Next();
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().IsCorruption());
    EXPECT_NE(r.status().message().find("checksum mismatch"),
              std::string::npos);
  }
  EXPECT_TRUE(d.failed());
  d.Feed(*Make(4, 5));
  EXPECT_FALSE(d.Next().ok());
}

// Feeds `bytes` then enough zeros to complete any frame a damaged length
// could declare, and returns the first outcome.
Status FirstOutcome(std::span<const std::byte> bytes,
                    const FrameOptions& options, bool* got_frame) {
  FrameDecoder d(options);
  d.Feed(bytes);
  std::vector<std::byte> pad(options.max_payload + kAuthTagSize, std::byte{0});
  d.Feed(pad);
  Result<std::optional<DecodedFrame>> r = d.Next();
  *got_frame = r.ok() && r->has_value();
  return r.status();
}

void CheckEveryBitFlipDetected(const FrameBuffer& frame,
                               const FrameOptions& options) {
  std::vector<std::byte> b = *frame;
  for (size_t bit = 0; bit < b.size() * 8; ++bit) {
    b[bit / 8] ^= std::byte(1u << (bit % 8));
    bool got_frame = false;
    Status s = FirstOutcome(b, options, &got_frame);
    EXPECT_FALSE(got_frame) << "flip of bit " << bit << " not detected";
    EXPECT_TRUE(s.IsCorruption()) << "bit " << bit << ": " << s.ToString();
    EXPECT_FALSE(ParseFrame(b, options).ok()) << "bit " << bit;
    b[bit / 8] ^= std::byte(1u << (bit % 8));
  }
  bool got_frame = false;
  EXPECT_TRUE(FirstOutcome(b, options, &got_frame).ok());
  EXPECT_TRUE(got_frame);
}

TEST(FrameDecoderTest, EverySingleBitFlipIsDetected) {
  FrameOptions options;
  options.max_payload = 1024;
  CheckEveryBitFlipDetected(Make(9, 64, options), options);
  CheckEveryBitFlipDetected(Make(10, 0, options), options);
}

TEST(FrameDecoderTest, EverySingleBitFlipOfATaggedFrameIsDetected) {
  FrameOptions options;
  options.max_payload = 1024;
  options.authenticator = std::make_shared<testing::TestAuthenticator>(5);
  CheckEveryBitFlipDetected(Make(11, 40, options), options);
}

TEST(FrameDecoderTest, TaggedFramesAreLengthAccountedWithoutAKey) {
  FrameOptions signing;
  signing.authenticator = std::make_shared<testing::TestAuthenticator>(3);
  std::vector<FrameBuffer> frames = SampleStream(20, 4, signing);
  std::vector<std::byte> all = Concat(frames);
  for (const FrameOptions& opts : {FrameOptions{}, signing}) {
    FrameDecoder d(opts);
    std::vector<DecodedFrame> got;
    for (size_t pos = 0; pos < all.size(); pos += 7) {
      d.Feed(
          std::span(all).subspan(pos, std::min<size_t>(7, all.size() - pos)));
      for (auto& f : Drain(d)) got.push_back(std::move(f));
    }
    ExpectSameFrames(frames, got);
    for (const auto& f : got) {
      EXPECT_EQ(f.frame.auth_tag.size(), kAuthTagSize);
      EXPECT_EQ(f.frame.auth_tag.data() + kAuthTagSize,
                f.buffer->data() + f.buffer->size());
    }
  }
}

TEST(FrameDecoderTest, GarbageIsRejectedAtTheFirstHeader) {
  FrameDecoder d;
  std::vector<std::byte> garbage = RandomBytes(kFrameHeaderSize, 99);
  d.Feed(garbage);
  Status s = d.Next().status();
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("magic"), std::string::npos);
}

}  // namespace
}  // namespace dcr
