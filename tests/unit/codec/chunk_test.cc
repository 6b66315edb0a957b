#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/bytes.h"
#include "dcr/codec.h"
#include "dcr/digest.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

// Flips element i of `b` (width w) to a different value.
void Change(Bytes* b, size_t i, size_t w, uint64_t xor_mask) {
  for (size_t j = 0; j < w; ++j) {
    (*b)[i * w + j] ^= static_cast<std::byte>(xor_mask >> (8 * j));
  }
}

class ChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = ChunkEncoder::Create(EncodeOptions());
    ASSERT_TRUE(e.ok());
    enc_ = std::move(*e);
    auto d = ChunkDecoder::Create();
    ASSERT_TRUE(d.ok());
    dec_ = std::move(*d);
  }

  // Encodes base->target as `kind`, decodes, applies to a copy of base and
  // checks the result is target; undoes and checks it is base again.
  void RoundTrip(const Bytes& base, const Bytes& target, size_t w,
                 ChunkKind kind, bool expect_chunk = true) {
    Bytes chunk;
    ChunkSizes sizes;
    auto r =
        enc_->EncodeDiff(kind, ChunkId{3, 9}, w, base, target, &chunk, &sizes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(*r, expect_chunk);
    if (!expect_chunk) {
      EXPECT_TRUE(chunk.empty());
      return;
    }
    EXPECT_EQ(sizes.total(), chunk.size());
    DecodedChunk c;
    ASSERT_TRUE(dec_->Decode(chunk, &c).ok());
    EXPECT_EQ(c.header.id, (ChunkId{3, 9}));
    EXPECT_EQ(c.header.kind, kind);
    EXPECT_EQ(c.header.span_elems, base.size() / w);
    Bytes work = base;
    Bytes undo;
    ASSERT_TRUE(ApplyChunk(c, work, &undo).ok());
    ASSERT_EQ(work, target);
    ASSERT_TRUE(UndoChunk(c, undo, work).ok());
    ASSERT_EQ(work, base);
    if (kind == ChunkKind::kOverwrite) {
      // Overwrites are idempotent.
      ASSERT_TRUE(ApplyChunk(c, work).ok());
      ASSERT_TRUE(ApplyChunk(c, work).ok());
      ASSERT_EQ(work, target);
    } else {
      // XOR applied twice undoes itself.
      ASSERT_TRUE(ApplyChunk(c, work).ok());
      ASSERT_TRUE(ApplyChunk(c, work).ok());
      ASSERT_EQ(work, base);
    }
  }

  std::unique_ptr<ChunkEncoder> enc_;
  std::unique_ptr<ChunkDecoder> dec_;
};

TEST_F(ChunkTest, EveryWidthEveryDensityBothKinds) {
  for (size_t w : {1, 2, 4, 8}) {
    for (double p : {0.0, 0.001, 0.03, 0.2, 0.6, 1.0}) {
      for (size_t n : {1, 63, 64, 65, 1000, 70001}) {
        Bytes base = RandomBytes(n * w, static_cast<uint32_t>(n + w));
        Bytes target = base;
        std::mt19937 rng(static_cast<uint32_t>(n * 31 + w));
        std::bernoulli_distribution pick(p);
        size_t changed = 0;
        for (size_t i = 0; i < n; ++i) {
          if (pick(rng)) {
            Change(&target, i, w,
                   1 + (rng() % 7) + (rng() % 4 == 0 ? 0x100 : 0));
            ++changed;
          }
        }
        for (ChunkKind kind : {ChunkKind::kXor, ChunkKind::kOverwrite}) {
          SCOPED_TRACE(testing::Message()
                       << "w=" << w << " p=" << p << " n=" << n);
          RoundTrip(base, target, w, kind, changed > 0);
        }
      }
    }
  }
}

TEST_F(ChunkTest, EdgePositions) {
  for (size_t w : {1, 2, 4, 8}) {
    const size_t n = 4096;
    Bytes base = RandomBytes(n * w, 11);
    for (std::vector<size_t> idx : std::vector<std::vector<size_t>>{
             {0}, {n - 1}, {0, n - 1}, {1, 2, 3}, {63, 64, 127, 128}}) {
      Bytes target = base;
      for (size_t i : idx) Change(&target, i, w, 0x80);
      RoundTrip(base, target, w, ChunkKind::kXor);
      RoundTrip(base, target, w, ChunkKind::kOverwrite);
    }
    // A single-element span.
    Bytes one = RandomBytes(w, 5);
    Bytes other = one;
    Change(&other, 0, w, 1);
    RoundTrip(one, other, w, ChunkKind::kXor);
  }
}

TEST_F(ChunkTest, SpecialFloatBitPatterns) {
  // NaN payloads, infinities, signed zeros and denormals are just bits.
  std::vector<float> a = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          1.0f,
                          std::nanf("1"),
                          -std::numeric_limits<float>::infinity(),
                          3.0f};
  std::vector<float> b = {-0.0f,
                          0.0f,
                          std::nanf("2"),
                          0.0f,
                          std::numeric_limits<float>::denorm_min(),
                          std::nanf("3"),
                          -std::numeric_limits<float>::infinity(),
                          3.0f};
  Bytes base(a.size() * 4), target(b.size() * 4);
  std::memcpy(base.data(), a.data(), base.size());
  std::memcpy(target.data(), b.data(), target.size());
  RoundTrip(base, target, 4, ChunkKind::kXor);
  RoundTrip(base, target, 4, ChunkKind::kOverwrite);
  // BF16 NaN (0x7fc1) and -0 (0x8000) against +0.
  Bytes b16 = {std::byte{0x00}, std::byte{0x00}, std::byte{0xc1},
               std::byte{0x7f}};
  Bytes t16 = {std::byte{0x00}, std::byte{0x80}, std::byte{0xc2},
               std::byte{0x7f}};
  RoundTrip(b16, t16, 2, ChunkKind::kXor);
}

// The SIMD scan compares whole elements: a change confined to the high
// bytes of a 4- or 8-byte element must be found (n >= 64 takes the vector
// path).
TEST_F(ChunkTest, ChangesInHighBytesOnlyAreFound) {
  for (size_t w : {2, 4, 8}) {
    const size_t n = 256;
    Bytes base = RandomBytes(n * w, 9);
    for (size_t byte = 1; byte < w; ++byte) {
      Bytes target = base;
      for (size_t i = 3; i < n; i += 5) {
        target[i * w + byte] ^= std::byte{0x40};
      }
      SCOPED_TRACE(testing::Message() << "w=" << w << " byte=" << byte);
      RoundTrip(base, target, w, ChunkKind::kXor);
    }
  }
}

TEST_F(ChunkTest, DenseChosenWhenEverythingChanges) {
  const size_t n = 1 << 16;
  Bytes base = RandomBytes(n * 2, 1);
  Bytes target = base;
  for (size_t i = 0; i < n; ++i) Change(&target, i, 2, 1);
  Bytes chunk;
  ASSERT_TRUE(
      enc_->EncodeDiff(ChunkKind::kXor, {0, 0}, 2, base, target, &chunk).ok());
  auto h = PeekChunkHeader(chunk);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->encoding, ChunkEncoding::kDense);
  // Every XOR value is 0x0001: two constant planes, tiny chunk.
  EXPECT_LT(chunk.size(), 100u);
  RoundTrip(base, target, 2, ChunkKind::kXor);
}

TEST_F(ChunkTest, FullAndExplicitOverwrite) {
  const size_t n = 5000;
  Bytes target = RandomBytes(n * 2, 2);
  Bytes chunk;
  ASSERT_TRUE(enc_->EncodeFull({1, 0}, 2, target, &chunk).ok());
  DecodedChunk c;
  ASSERT_TRUE(dec_->Decode(chunk, &c).ok());
  EXPECT_EQ(c.header.kind, ChunkKind::kOverwrite);
  Bytes work(n * 2, std::byte{0});
  ASSERT_TRUE(ApplyChunk(c, work).ok());
  EXPECT_EQ(work, target);

  std::vector<uint32_t> pos = {3, 7, 4999};
  Bytes vals = {std::byte{1}, std::byte{2}, std::byte{3},
                std::byte{4}, std::byte{5}, std::byte{6}};
  chunk.clear();
  ASSERT_TRUE(enc_->EncodeChanges(ChunkKind::kOverwrite, {1, 0}, 2, n, pos,
                                  vals, &chunk)
                  .ok());
  ASSERT_TRUE(dec_->Decode(chunk, &c).ok());
  ASSERT_TRUE(ApplyChunk(c, work).ok());
  EXPECT_EQ(work[6], std::byte{1});
  EXPECT_EQ(work[9999], std::byte{6});
  std::vector<uint32_t> bad = {7, 3};
  EXPECT_FALSE(enc_->EncodeChanges(ChunkKind::kOverwrite, {1, 0}, 2, n, bad,
                                   std::span(vals).first(4), &chunk)
                   .ok());
}

// A producer's part: the changes of its elements of a span, coded in the
// span's coordinates with the part in the header (offset 30, the field
// whole-span chunks leave 0). Parts of one span apply in any order.
TEST_F(ChunkTest, PartsCarryTheirIdAndApplyInAnyOrder) {
  const uint32_t n = 4096;
  Bytes base = RandomBytes(n * 2, 5), target = base;
  std::mt19937_64 rng(6);
  for (int k = 0; k < 300; ++k) Change(&target, rng() % n, 2, 1 + rng() % 255);
  std::vector<Bytes> parts;
  for (uint16_t p = 0; p < 4; ++p) {
    std::vector<uint32_t> pos;
    Bytes masks;
    for (uint32_t e = p; e < n; e += 4) {
      if (base[2 * e] == target[2 * e] && base[2 * e + 1] == target[2 * e + 1])
        continue;
      pos.push_back(e);
      masks.push_back(base[2 * e] ^ target[2 * e]);
      masks.push_back(base[2 * e + 1] ^ target[2 * e + 1]);
    }
    ASSERT_FALSE(pos.empty());
    Bytes chunk;
    ChunkSizes sizes;
    const ChunkId id{2, 7, static_cast<uint16_t>(p + 1)};
    ASSERT_TRUE(enc_->EncodeChanges(ChunkKind::kXor, id, 2, n, pos, masks,
                                    &chunk, &sizes)
                    .ok());
    EXPECT_EQ(sizes.total(), chunk.size());
    EXPECT_EQ(LoadLE<uint16_t>(chunk.data() + 30), p + 1);
    auto h = PeekChunkHeader(chunk);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->id, id);
    EXPECT_EQ(h->changed, pos.size());
    parts.push_back(std::move(chunk));
  }
  Bytes work = base;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    DecodedChunk c;
    ASSERT_TRUE(dec_->Decode(*it, &c).ok());
    ASSERT_TRUE(ApplyChunk(c, work).ok());
  }
  EXPECT_EQ(work, target);
  EXPECT_EQ(ChunkIdText({2, 7, 3}), "tensor 2, span 7, part 3");
  EXPECT_EQ(ChunkIdText({2, 7}), "tensor 2, span 7");
  EXPECT_LT((ChunkId{2, 7, 9}), (ChunkId{2, 8, 0}));
}

TEST_F(ChunkTest, WholeSpanEncodingsRefuseAPartAndADensePartIsCorrupt) {
  const size_t n = 4096;
  Bytes base = RandomBytes(n * 2, 7), target = RandomBytes(n * 2, 8);
  Bytes chunk;
  const ChunkId part{0, 0, 2};
  auto r = enc_->EncodeDiff(ChunkKind::kXor, part, 2, base, target, &chunk);
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("part 2"), std::string::npos);
  EXPECT_TRUE(enc_->EncodeFull(part, 2, target, &chunk).IsInvalidArgument());
  EXPECT_TRUE(chunk.empty());
  // A dense chunk covers every element of its span: it cannot be a part.
  ASSERT_TRUE(enc_->EncodeFull({0, 0}, 2, target, &chunk).ok());
  StoreLE<uint16_t>(chunk.data() + 30, 2);
  auto h = PeekChunkHeader(chunk);
  EXPECT_TRUE(h.status().IsCorruption());
  EXPECT_NE(h.status().message().find("a dense chunk is a whole span"),
            std::string::npos);
}

TEST_F(ChunkTest, UncompressedPlanesCarryTheBytesAsTheyAre) {
  EncodeOptions raw_options;
  raw_options.compress = false;
  auto raw = ChunkEncoder::Create(raw_options);
  ASSERT_TRUE(raw.ok());
  const size_t n = 8192;
  // Zeros (a constant plane when compressed) and a skewed pattern (Huffman
  // or zstd when compressed): raw, each is every byte plus the tables.
  for (Bytes target : {Bytes(n * 2, std::byte{0}), [] {
                         Bytes b(n * 2);
                         for (size_t i = 0; i < b.size(); ++i) {
                           b[i] = static_cast<std::byte>(i % 7 == 0 ? i : 0x3f);
                         }
                         return b;
                       }()}) {
    Bytes packed, plain;
    ASSERT_TRUE(enc_->EncodeFull({1, 0}, 2, target, &packed).ok());
    ASSERT_TRUE((*raw)->EncodeFull({1, 0}, 2, target, &plain).ok());
    EXPECT_LT(packed.size(), n);
    EXPECT_GE(plain.size(), n * 2);
    EXPECT_LT(plain.size(), n * 2 + 128);
    DecodedChunk c;
    ASSERT_TRUE(dec_->Decode(plain, &c).ok());
    Bytes work(n * 2, std::byte{0x55});
    ASSERT_TRUE(ApplyChunk(c, work).ok());
    EXPECT_EQ(work, target);
  }
}

TEST_F(ChunkTest, ApplyRefusesWrongSpanSize) {
  Bytes base = RandomBytes(200, 3), target = base;
  Change(&target, 10, 2, 1);
  Bytes chunk;
  ASSERT_TRUE(
      *enc_->EncodeDiff(ChunkKind::kXor, {0, 0}, 2, base, target, &chunk));
  DecodedChunk c;
  ASSERT_TRUE(dec_->Decode(chunk, &c).ok());
  Bytes shorter(198);
  EXPECT_FALSE(ApplyChunk(c, shorter).ok());
  EXPECT_EQ(shorter, Bytes(198));
}

TEST_F(ChunkTest, EveryBitFlipAndTruncationIsRejected) {
  Bytes base = RandomBytes(4000, 4), target = base;
  for (size_t i = 0; i < 2000; i += 37) Change(&target, i, 2, 3);
  Bytes chunk;
  ASSERT_TRUE(
      *enc_->EncodeDiff(ChunkKind::kXor, {0, 0}, 2, base, target, &chunk));
  DecodedChunk c;
  for (size_t bit = 0; bit < chunk.size() * 8; ++bit) {
    Bytes bad = chunk;
    bad[bit / 8] ^= static_cast<std::byte>(1 << (bit % 8));
    EXPECT_FALSE(dec_->Decode(bad, &c).ok()) << "bit " << bit;
  }
  for (size_t len = 0; len < chunk.size(); ++len) {
    EXPECT_FALSE(dec_->Decode(std::span(chunk).first(len), &c).ok());
  }
}

// A zstd plane that would expand beyond the size the header declares (a
// zstd bomb) is rejected without allocating for it.
TEST_F(ChunkTest, ZstdBombRejected) {
  const size_t n = 1 << 20;
  Bytes base(n * 2, std::byte{0}), target = base;
  for (size_t i = 0; i < n; ++i) Change(&target, i, 2, 1 + i % 3);
  Bytes chunk;
  ASSERT_TRUE(
      *enc_->EncodeDiff(ChunkKind::kXor, {0, 0}, 2, base, target, &chunk));
  auto h = PeekChunkHeader(chunk);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->encoding, ChunkEncoding::kDense);
  // Declare a 16-element span and re-seal the checksum, so only the
  // decompressed-size bound can catch it.
  Bytes bad = chunk;
  StoreLE<uint32_t>(bad.data() + 20, 16);
  StoreLE<uint32_t>(bad.data() + 24, 16);
  size_t body = bad.size() - 8;
  StoreLE<uint64_t>(bad.data() + body, Hash64(std::span(bad).first(body)));
  DecodedChunk c;
  Status s = dec_->Decode(bad, &c);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("decompress"), std::string_view::npos)
      << s.ToString();
}

}  // namespace
}  // namespace dcr
