// HMAC-SHA256 frame authentication: the authenticator against RFC 4231,
// tagged frames through EncodeFrame / FrameDecoder, every way a frame can be
// forged or altered, and the key file's checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "dcr/digest.h"
#include "dcr/wire.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "wire/hmac_authenticator.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;
using testing::RandomBytes;
using testing::TextBytes;

std::string Hex(std::span<const std::byte> b) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::byte x : b) {
    out += kDigits[static_cast<uint8_t>(x) >> 4];
    out += kDigits[static_cast<uint8_t>(x) & 15];
  }
  return out;
}

std::shared_ptr<const FrameAuthenticator> Key(uint32_t seed) {
  auto a = HmacFrameAuthenticator::Create(RandomBytes(32, seed));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::shared_ptr<const FrameAuthenticator>(*std::move(a))
                : nullptr;
}

FrameOptions With(std::shared_ptr<const FrameAuthenticator> key) {
  FrameOptions o;
  o.authenticator = std::move(key);
  return o;
}

FrameHeader SealedSampleHeader() {
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.flags = 0x0100;
  h.epoch = 7;
  h.sequence = 1234;
  for (size_t i = 0; i < 16; ++i) h.refit_id.bytes[i] = uint8_t(0x30 + i);
  return h;
}

Bytes Encode(const FrameHeader& h, const Bytes& payload,
             const FrameOptions& o) {
  Result<FrameBuffer> buf = EncodeFrame(h, payload, o);
  EXPECT_TRUE(buf.ok()) << buf.status().ToString();
  return buf.ok() ? **buf : Bytes();
}

// Whether a receiver with `o` accepts `bytes` as exactly one frame, both as
// a whole frame and through the incremental decoder (which must neither
// return a frame nor sit waiting in the middle of one).
bool Accepted(const Bytes& bytes, const FrameOptions& o) {
  bool parsed = ParseFrame(bytes, o).ok();
  FrameDecoder d(o);
  d.Feed(bytes);
  Result<std::optional<DecodedFrame>> r = d.Next();
  bool decoded =
      r.ok() && r->has_value() && !d.mid_frame() && d.ready_frames() == 0;
  EXPECT_EQ(parsed, decoded);
  return parsed || decoded;
}

// Recomputes the checksum after an edit, as an attacker without the key
// would: XXH3-64 of header bytes [0, 48) and the payload.
void Reseal(Bytes* frame) {
  uint32_t length = LoadLE<uint32_t>(frame->data() + 8);
  Bytes covered(frame->begin(), frame->begin() + 48);
  covered.insert(covered.end(), frame->begin() + kFrameHeaderSize,
                 frame->begin() + kFrameHeaderSize + length);
  StoreLE<uint64_t>(frame->data() + 48, Hash64(covered));
}

TEST(HmacTest, MatchesRfc4231) {
  // RFC 4231 test case 6: a 131-byte key (longer than SHA-256's block).
  auto a = HmacFrameAuthenticator::Create(Bytes(131, std::byte{0xaa}));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Bytes msg =
      TextBytes("Test Using Larger Than Block-Size Key - Hash Key First");
  std::array<std::byte, kAuthTagSize> tag;
  (*a)->Sign(msg, tag);
  EXPECT_EQ(Hex(tag),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_TRUE((*a)->Verify(msg, tag));
  tag[31] ^= std::byte{0x80};
  EXPECT_FALSE((*a)->Verify(msg, tag));
  // The same key bytes give the same tags; a copy keyed separately agrees.
  Bytes key(32);
  for (size_t i = 0; i < key.size(); ++i) key[i] = std::byte(i);
  auto b = HmacFrameAuthenticator::Create(key);
  ASSERT_TRUE(b.ok());
  (*b)->Sign(TextBytes("dcr"), tag);
  EXPECT_EQ(Hex(tag),
            "ec70f7d3ee76a899c5db8ee8fe33ba01b3939f7bd133db7f47bbaa151be935a8");
}

TEST(HmacTest, CreateRefusesShortAndOversizedKeys) {
  for (size_t n :
       {size_t{0}, size_t{16}, kMinFrameKeyBytes - 1, kMaxFrameKeyBytes + 1}) {
    auto a = HmacFrameAuthenticator::Create(Bytes(n, std::byte{1}));
    ASSERT_FALSE(a.ok()) << n;
    EXPECT_TRUE(a.status().IsInvalidArgument());
    EXPECT_THAT(std::string(a.status().message()),
                HasSubstr("got " + std::to_string(n)));
  }
  EXPECT_TRUE(HmacFrameAuthenticator::Create(Bytes(32, std::byte{1})).ok());
  EXPECT_TRUE(HmacFrameAuthenticator::Create(Bytes(1024, std::byte{1})).ok());
}

TEST(HmacTest, SignedFramesRoundTripThroughTheDecoder) {
  FrameOptions keyed = With(Key(1));
  Bytes payload = RandomBytes(5000, 2);
  Bytes frame = Encode(SealedSampleHeader(), payload, keyed);
  ASSERT_EQ(frame.size(), kFrameHeaderSize + payload.size() + kAuthTagSize);
  EXPECT_EQ(LoadLE<uint16_t>(frame.data() + 6), 0x0100 | kFrameFlagAuthTag);
  // The tag is HMAC-SHA256 over the header and the payload.
  std::array<std::byte, kAuthTagSize> want;
  keyed.authenticator->Sign(
      std::span(frame).first(kFrameHeaderSize + payload.size()), want);
  EXPECT_EQ(0, std::memcmp(want.data(),
                           frame.data() + kFrameHeaderSize + payload.size(),
                           kAuthTagSize));

  // A stream of tagged frames, fed in odd pieces.
  std::vector<Bytes> frames;
  Bytes stream;
  for (uint64_t seq = 0; seq < 20; ++seq) {
    FrameHeader h = SealedSampleHeader();
    h.sequence = seq;
    h.type = seq == 0 ? FrameType::kPlan : FrameType::kChunk;
    frames.push_back(Encode(h, RandomBytes(seq * 37, uint32_t(seq)), keyed));
    stream.insert(stream.end(), frames.back().begin(), frames.back().end());
  }
  FrameDecoder d(keyed);
  std::mt19937 rng(3);
  size_t got = 0;
  for (size_t at = 0; at < stream.size();) {
    size_t n = std::min<size_t>(stream.size() - at, 1 + rng() % 300);
    d.Feed(std::span(stream).subspan(at, n));
    at += n;
    for (;;) {
      auto r = d.Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      const DecodedFrame& f = **r;
      EXPECT_EQ(f.frame.header.sequence, got);
      EXPECT_TRUE(f.frame.has_auth_tag());
      EXPECT_EQ(*f.buffer, frames[got]);  // forwarded verbatim, tag included
      ++got;
    }
  }
  EXPECT_EQ(got, frames.size());
  EXPECT_FALSE(d.mid_frame());
}

TEST(HmacTest, UntaggedAndWronglyKeyedFramesAreRefused) {
  FrameOptions keyed = With(Key(1));
  Bytes payload = RandomBytes(100, 4);
  Bytes untagged = Encode(SealedSampleHeader(), payload, {});
  EXPECT_TRUE(Accepted(untagged, {}));
  EXPECT_FALSE(Accepted(untagged, keyed));
  Status s = ParseFrame(untagged, keyed).status();
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("missing authentication tag"));

  Bytes other_key = Encode(SealedSampleHeader(), payload, With(Key(2)));
  EXPECT_FALSE(Accepted(other_key, keyed));
  s = ParseFrame(other_key, keyed).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("authentication tag mismatch in CHUNK frame"));

  // A tag of zeros (what Sign writes if OpenSSL fails) and a tag taken from
  // another frame are refused too.
  Bytes zeros = Encode(SealedSampleHeader(), payload, keyed);
  std::fill(zeros.end() - kAuthTagSize, zeros.end(), std::byte{0});
  EXPECT_FALSE(Accepted(zeros, keyed));
  Bytes a = Encode(SealedSampleHeader(), payload, keyed);
  FrameHeader h = SealedSampleHeader();
  h.sequence += 1;
  Bytes b = Encode(h, payload, keyed);
  std::copy(b.end() - kAuthTagSize, b.end(), a.end() - kAuthTagSize);
  EXPECT_FALSE(Accepted(a, keyed));

  // The flag set by hand with random bytes as the tag (a key-less sender
  // imitating a signed frame).
  Bytes forged = untagged;
  StoreLE<uint16_t>(forged.data() + 6,
                    LoadLE<uint16_t>(forged.data() + 6) | kFrameFlagAuthTag);
  Reseal(&forged);
  Bytes junk = RandomBytes(kAuthTagSize, 5);
  forged.insert(forged.end(), junk.begin(), junk.end());
  EXPECT_TRUE(Accepted(forged, {}));  // well formed: only the key tells
  EXPECT_FALSE(Accepted(forged, keyed));
}

TEST(HmacTest, EverySingleBitFlipIsRefused) {
  FrameOptions keyed = With(Key(1));
  Bytes frame = Encode(SealedSampleHeader(), RandomBytes(40, 6), keyed);
  ASSERT_TRUE(Accepted(frame, keyed));
  for (size_t bit = 0; bit < frame.size() * 8; ++bit) {
    Bytes bad = frame;
    bad[bit / 8] ^= std::byte(1u << (bit % 8));
    EXPECT_FALSE(Accepted(bad, keyed)) << "bit " << bit;
  }
}

TEST(HmacTest, HeaderEditsWithAResealedChecksumAreRefused) {
  // An attacker without the key rewrites a field the tag binds and fixes
  // the checksum: the checksum alone would accept the frame, the tag not.
  FrameOptions keyed = With(Key(1));
  const Bytes frame = Encode(SealedSampleHeader(), RandomBytes(64, 7), keyed);
  struct Edit {
    const char* field;
    size_t offset;
    size_t size;
  } edits[] = {
      {"type", 5, 1},      {"message flags", 7, 1}, {"epoch", 16, 8},
      {"sequence", 24, 8}, {"refit id", 32, 16},    {"payload", 56, 64},
  };
  for (const Edit& e : edits) {
    Bytes bad = frame;
    if (std::string(e.field) == "type") {
      bad[5] = std::byte(static_cast<uint8_t>(FrameType::kCommit));
    } else if (std::string(e.field) == "epoch") {
      StoreLE<uint64_t>(bad.data() + 16, 8);  // a newer coordinator run
    } else if (std::string(e.field) == "sequence") {
      StoreLE<uint64_t>(bad.data() + 24, 1235);  // a replay as a new frame
    } else {
      for (size_t i = 0; i < e.size; ++i) bad[e.offset + i] ^= std::byte{0x5a};
    }
    Reseal(&bad);
    EXPECT_TRUE(Accepted(bad, {})) << e.field << ": the reseal is valid";
    EXPECT_FALSE(Accepted(bad, keyed)) << e.field;
    Status s = ParseFrame(bad, keyed).status();
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("authentication tag mismatch"))
        << e.field;
  }
}

class FrameKeyFileTest : public ::testing::Test {
 protected:
  // Writes `bytes` to `name` with `mode` and returns its path.
  std::string Write(const std::string& name, const Bytes& bytes,
                    mode_t mode = 0600) {
    std::string path = dir_.Path(name);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }
  testing::TempDir dir_;
};

TEST_F(FrameKeyFileTest, LoadsAKeyThatInteroperates) {
  Bytes key = RandomBytes(32, 8);
  std::string p1 = Write("k1", key);
  std::string p2 = Write("k2", key, 0400);
  auto a = LoadFrameKey(p1);
  auto b = LoadFrameKey(p2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Bytes frame = Encode(SealedSampleHeader(), RandomBytes(10, 9), With(*a));
  EXPECT_TRUE(Accepted(frame, With(*b)));
  // The file's bytes are the key: one more byte is another key.
  Bytes longer = key;
  longer.push_back(std::byte{'\n'});
  auto c = LoadFrameKey(Write("k3", longer));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(Accepted(frame, With(*c)));
  auto big = LoadFrameKey(Write("k4", RandomBytes(kMaxFrameKeyBytes, 10)));
  EXPECT_TRUE(big.ok()) << big.status().ToString();
}

TEST_F(FrameKeyFileTest, RefusesAFileOthersCanReach) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0601, 0610, 0700 | 0044}) {
    std::string p = Write("open", RandomBytes(32, 11), mode);
    auto k = LoadFrameKey(p);
    ASSERT_FALSE(k.ok()) << std::oct << mode;
    EXPECT_TRUE(k.status().IsInvalidArgument());
    std::string msg(k.status().message());
    EXPECT_THAT(msg, HasSubstr("'" + p + "'"));
    EXPECT_THAT(msg, HasSubstr("chmod 600 " + p));
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  std::string p = Write("open", RandomBytes(32, 11), 0644);
  EXPECT_THAT(std::string(LoadFrameKey(p).status().message()),
              HasSubstr("has mode 0644"));
}

TEST_F(FrameKeyFileTest, RefusesShortEmptyHugeMissingAndOddFiles) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}}) {
    std::string p = Write("short", RandomBytes(n, 12));
    auto k = LoadFrameKey(p);
    ASSERT_FALSE(k.ok()) << n;
    EXPECT_TRUE(k.status().IsInvalidArgument());
    EXPECT_THAT(std::string(k.status().message()),
                HasSubstr("'" + p + "' holds " + std::to_string(n) +
                          " bytes; a key needs 32 or more"));
  }
  std::string huge = Write("huge", RandomBytes(kMaxFrameKeyBytes + 1, 13));
  auto k = LoadFrameKey(huge);
  EXPECT_TRUE(k.status().IsInvalidArgument());
  EXPECT_THAT(std::string(k.status().message()), HasSubstr("not a key file"));

  k = LoadFrameKey(dir_.Path("missing"));
  EXPECT_TRUE(k.status().IsNotFound());
  EXPECT_THAT(std::string(k.status().message()),
              HasSubstr("'" + dir_.Path("missing") + "' does not exist"));

  std::string sub = dir_.Path("a-directory");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  k = LoadFrameKey(sub);
  EXPECT_TRUE(k.status().IsInvalidArgument());
  EXPECT_THAT(std::string(k.status().message()),
              HasSubstr("is not a regular file"));

  std::string fifo = dir_.Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  k = LoadFrameKey(fifo);  // must not block waiting for a writer
  EXPECT_TRUE(k.status().IsInvalidArgument());
}

}  // namespace
}  // namespace dcr
