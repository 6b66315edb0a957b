#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/bytes.h"
#include "dcr/digest.h"
#include "dcr/wire.h"
#include "testing/test_util.h"
#include "unit/wire/test_authenticator.h"

namespace dcr {
namespace {

using testing::RandomBytes;

FrameHeader SampleHeader() {
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.flags = 0x0300;
  h.epoch = 0x0102030405060708ull;
  h.sequence = 42;
  for (size_t i = 0; i < 16; ++i) h.refit_id.bytes[i] = uint8_t(0xa0 + i);
  return h;
}

TEST(FrameTest, HeaderLayoutIsLittleEndianAtDocumentedOffsets) {
  auto payload = RandomBytes(100, 1);
  Result<FrameBuffer> buf = EncodeFrame(SampleHeader(), payload);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  const std::vector<std::byte>& b = **buf;
  ASSERT_EQ(b.size(), kFrameHeaderSize + 100);
  EXPECT_EQ(0, std::memcmp(b.data(), "DCRF", 4));
  EXPECT_EQ(LoadLE<uint8_t>(&b[4]), 4);
  EXPECT_EQ(LoadLE<uint8_t>(&b[5]), 4);  // CHUNK
  EXPECT_EQ(LoadLE<uint16_t>(&b[6]), 0x0300);
  EXPECT_EQ(LoadLE<uint32_t>(&b[8]), 100u);
  EXPECT_EQ(LoadLE<uint32_t>(&b[12]), 0u);
  EXPECT_EQ(LoadLE<uint64_t>(&b[16]), 0x0102030405060708ull);
  EXPECT_EQ(LoadLE<uint64_t>(&b[24]), 42u);
  EXPECT_EQ(LoadLE<uint8_t>(&b[32]), 0xa0);
  EXPECT_EQ(LoadLE<uint8_t>(&b[47]), 0xaf);
  // The checksum covers the header before it and the payload.
  std::vector<std::byte> covered(b.begin(), b.begin() + 48);
  covered.insert(covered.end(), payload.begin(), payload.end());
  EXPECT_EQ(LoadLE<uint64_t>(&b[48]), Hash64(covered));
  EXPECT_EQ(0, std::memcmp(&b[56], payload.data(), payload.size()));
}

TEST(FrameTest, EncodeParseRoundTrip) {
  auto payload = RandomBytes(1000, 2);
  Result<FrameBuffer> buf = EncodeFrame(SampleHeader(), payload);
  ASSERT_TRUE(buf.ok());
  Result<Frame> f = ParseFrame(**buf);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header, SampleHeader());
  EXPECT_EQ(f->type(), FrameType::kChunk);
  EXPECT_FALSE(f->has_auth_tag());
  ASSERT_EQ(f->payload.size(), payload.size());
  EXPECT_EQ(0, std::memcmp(f->payload.data(), payload.data(), 1000));
  EXPECT_EQ(f->payload.data(), (*buf)->data() + kFrameHeaderSize);
  EXPECT_EQ(f->bytes.size(), (*buf)->size());
}

TEST(FrameTest, EmptyPayload) {
  FrameHeader h;
  h.type = FrameType::kHeartbeat;
  Result<FrameBuffer> buf = EncodeFrame(h, {});
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ((*buf)->size(), kFrameHeaderSize);
  Result<Frame> f = ParseFrame(**buf);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->payload.empty());
  EXPECT_EQ(f->type(), FrameType::kHeartbeat);
}

TEST(FrameTest, GatherEqualsContiguous) {
  auto a = RandomBytes(10, 3), b = RandomBytes(0, 4), c = RandomBytes(77, 5);
  std::vector<std::byte> all = a;
  all.insert(all.end(), c.begin(), c.end());
  std::span<const std::byte> parts[] = {a, b, c};
  Result<FrameBuffer> g = EncodeFrameGather(SampleHeader(), parts);
  Result<FrameBuffer> s = EncodeFrame(SampleHeader(), all);
  ASSERT_TRUE(g.ok() && s.ok());
  EXPECT_EQ(**g, **s);
}

TEST(FrameTest, EncodeRejectsWireFlagsUnknownTypeAndOversizedPayload) {
  FrameHeader h = SampleHeader();
  h.flags = kFrameFlagAuthTag;
  EXPECT_TRUE(EncodeFrame(h, {}).status().IsInvalidArgument());
  h.flags = 0x0002;
  EXPECT_TRUE(EncodeFrame(h, {}).status().IsInvalidArgument());
  h.flags = 0;
  h.type = static_cast<FrameType>(0);
  EXPECT_TRUE(EncodeFrame(h, {}).status().IsInvalidArgument());
  h.type = FrameType::kChunk;
  FrameOptions small;
  small.max_payload = 64;
  auto payload = RandomBytes(65, 6);
  Status s = EncodeFrame(h, payload, small).status();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(EncodeFrame(h, std::span(payload).first(64), small).ok());
}

TEST(FrameTest, TypeNamesAreStable) {
  const char* names[] = {"HELLO",
                         "PLAN",
                         "PLAN_REPLY",
                         "CHUNK",
                         "END",
                         "VOTE",
                         "COMMIT",
                         "COMMIT_REPLY",
                         "ABORT",
                         "ABORT_REPLY",
                         "STATUS_REQUEST",
                         "STATUS_REPLY",
                         "HEARTBEAT",
                         "RESEND_REQUEST",
                         "ERROR",
                         "PRODUCER_HELLO",
                         "PRODUCER_GO",
                         "PRODUCER_DONE",
                         "PRODUCER_DECISION",
                         "PRODUCER_BASELINE",
                         "STREAM_MARK"};
  for (int t = 1; t <= kMaxFrameType; ++t) {
    EXPECT_TRUE(IsKnownFrameType(uint8_t(t)));
    EXPECT_EQ(FrameTypeName(static_cast<FrameType>(t)), names[t - 1]);
  }
  EXPECT_FALSE(IsKnownFrameType(0));
  EXPECT_FALSE(IsKnownFrameType(kMaxFrameType + 1));
  EXPECT_EQ(FrameTypeName(static_cast<FrameType>(200)), "UNKNOWN(200)");
}

// Rewrites one header field of an encoded frame and re-seals the checksum,
// so only the field check can catch it.
std::vector<std::byte> WithField(const FrameBuffer& buf, size_t offset,
                                 std::span<const std::byte> value) {
  std::vector<std::byte> b = *buf;
  std::memcpy(&b[offset], value.data(), value.size());
  std::vector<std::byte> covered(b.begin(), b.begin() + 48);
  covered.insert(covered.end(), b.begin() + 56, b.end());
  StoreLE<uint64_t>(&b[48], Hash64(covered));
  return b;
}

template <typename T>
std::vector<std::byte> WithFieldValue(const FrameBuffer& buf, size_t offset,
                                      T v) {
  std::byte raw[sizeof(T)];
  StoreLE<T>(raw, v);
  return WithField(buf, offset, raw);
}

TEST(FrameTest, HeaderFieldChecksNameTheField) {
  Result<FrameBuffer> buf = EncodeFrame(SampleHeader(), RandomBytes(8, 7));
  ASSERT_TRUE(buf.ok());
  struct Case {
    std::vector<std::byte> bytes;
    const char* needle;
  };
  std::vector<Case> cases = {
      {WithFieldValue<uint32_t>(*buf, 0, 0x46524358), "magic"},
      {WithFieldValue<uint8_t>(*buf, 4, 1), "version 1"},
      {WithFieldValue<uint8_t>(*buf, 4, 2), "version 2"},
      {WithFieldValue<uint8_t>(*buf, 4, 3), "version 3"},
      {WithFieldValue<uint8_t>(*buf, 4, 0), "version 0"},
      {WithFieldValue<uint8_t>(*buf, 5, 0), "type 0"},
      {WithFieldValue<uint8_t>(*buf, 5, 22), "type 22"},
      {WithFieldValue<uint8_t>(*buf, 5, 255), "type 255"},
      {WithFieldValue<uint16_t>(*buf, 6, 0x0002), "wire flags"},
      {WithFieldValue<uint16_t>(*buf, 6, 0x0080), "wire flags"},
      {WithFieldValue<uint32_t>(*buf, 12, 1), "reserved"},
  };
  for (const Case& c : cases) {
    Status s = ParseFrame(c.bytes).status();
    EXPECT_TRUE(s.IsCorruption()) << c.needle;
    EXPECT_NE(s.message().find(c.needle), std::string_view::npos)
        << s.ToString();
    FrameDecoder d;
    d.Feed(c.bytes);
    Status ds = d.Next().status();
    EXPECT_TRUE(ds.IsCorruption()) << c.needle;
    EXPECT_NE(ds.message().find(c.needle), std::string_view::npos)
        << ds.ToString();
  }
  // Message-layer flags are carried through.
  Result<Frame> f =
      ParseFrame(WithFieldValue<uint16_t>(*buf, 6, uint16_t{0xff00}));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->header.flags, 0xff00);
}

TEST(FrameTest, ParseFrameChecksExactSizeAndTruncatedHeader) {
  Result<FrameBuffer> buf = EncodeFrame(SampleHeader(), RandomBytes(8, 8));
  ASSERT_TRUE(buf.ok());
  std::span<const std::byte> all(**buf);
  Status s = ParseFrame(all.first(20)).status();
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("truncated frame header"), std::string::npos);
  EXPECT_TRUE(ParseFrame(all.first(all.size() - 1)).status().IsCorruption());
  std::vector<std::byte> longer(all.begin(), all.end());
  longer.push_back(std::byte{0});
  EXPECT_TRUE(ParseFrame(longer).status().IsCorruption());
}

TEST(FrameTest, AuthTagLayoutAndVerification) {
  auto key_a = std::make_shared<testing::TestAuthenticator>(1);
  auto key_b = std::make_shared<testing::TestAuthenticator>(2);
  FrameOptions signing;
  signing.authenticator = key_a;
  auto payload = RandomBytes(33, 9);
  Result<FrameBuffer> buf = EncodeFrame(SampleHeader(), payload, signing);
  ASSERT_TRUE(buf.ok());
  ASSERT_EQ((*buf)->size(), kFrameHeaderSize + 33 + kAuthTagSize);
  EXPECT_EQ(LoadLE<uint16_t>(&(**buf)[6]), 0x0300 | kFrameFlagAuthTag);
  EXPECT_EQ(LoadLE<uint32_t>(&(**buf)[8]), 33u);  // length excludes the tag

  // Without a key the tag is carried, unchecked.
  Result<Frame> plain = ParseFrame(**buf);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->auth_tag.size(), kAuthTagSize);
  EXPECT_EQ(plain->payload.size(), 33u);
  EXPECT_EQ(plain->header.flags & kFrameFlagsMessageMask, 0x0300);

  EXPECT_TRUE(ParseFrame(**buf, signing).ok());
  FrameOptions other;
  other.authenticator = key_b;
  Status s = ParseFrame(**buf, other).status();
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("authentication tag mismatch"), std::string::npos);

  // A key configured makes the tag mandatory.
  Result<FrameBuffer> untagged = EncodeFrame(SampleHeader(), payload);
  ASSERT_TRUE(untagged.ok());
  s = ParseFrame(**untagged, signing).status();
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(s.message().find("missing authentication tag"), std::string::npos);
}

}  // namespace
}  // namespace dcr
