// Context-coded chunks (ChunkEncoding::kContext): round trips for every
// floating dtype, the choice against the base-independent encodings, and
// refusal of a chunk decoded against bits it was not coded against.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/bytes.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/dtype.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;

// A span whose elements change with a probability set by their exponent,
// as a fixed-size optimizer step does: small exponents change often, large
// ones rarely. Changes flip low mantissa bits.
struct Pair {
  Bytes base, target;
};

Pair AdamLike(DType dtype, size_t n, uint32_t seed) {
  const size_t w = DTypeSize(dtype);
  const ExponentField f = ExponentFieldOf(dtype);
  std::mt19937_64 rng(seed);
  Pair p;
  p.base.resize(n * w);
  p.target.resize(n * w);
  const uint32_t classes = 1u << f.bits;
  for (size_t i = 0; i < n; ++i) {
    // Exponents cluster in the upper middle of the field.
    uint32_t e = classes / 2 +
                 static_cast<uint32_t>(rng() % (classes / 4 + 1)) - classes / 8;
    e = std::min(e, classes - 1);
    uint64_t mant = rng() & ((uint64_t{1} << f.shift) - 1);
    uint64_t x = (uint64_t{e} << f.shift) | mant;
    if (rng() & 1) x |= uint64_t{1} << (8 * w - 1);  // sign
    // p(change) halves with every step up in exponent.
    double pc =
        0.3 / static_cast<double>(1u << std::min<uint32_t>(
                                      e - (classes / 2 - classes / 8), 12));
    uint64_t y = x;
    if (std::uniform_real_distribution<double>(0, 1)(rng) < pc) {
      y ^= 1 + rng() % std::min<uint64_t>(3, uint64_t{1} << f.shift);
    }
    std::memcpy(p.base.data() + i * w, &x, w);
    std::memcpy(p.target.data() + i * w, &y, w);
  }
  return p;
}

class ContextTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    enc_ = std::move(*ChunkEncoder::Create(EncodeOptions()));
    dec_ = std::move(*ChunkDecoder::Create());
  }
  std::unique_ptr<ChunkEncoder> enc_;
  std::unique_ptr<ChunkDecoder> dec_;
};

TEST_P(ContextTest, RoundTripIsBitExactAndSmaller) {
  const DType dtype = GetParam();
  const size_t w = DTypeSize(dtype);
  const size_t n = (1 << 16) + 37;  // a ragged tail block
  Pair p = AdamLike(dtype, n, 7);
  for (ChunkKind kind : {ChunkKind::kXor, ChunkKind::kOverwrite}) {
    Bytes ctx, plain, independent;
    ChunkSizes sizes;
    auto r = enc_->EncodeDiffInContext(kind, ChunkId{1, 2}, w,
                                       ExponentFieldOf(dtype), p.base, p.target,
                                       &ctx, &sizes, &independent);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(*r);
    ASSERT_TRUE(
        enc_->EncodeDiff(kind, ChunkId{1, 2}, w, p.base, p.target, &plain)
            .ok());
    auto h = PeekChunkHeader(ctx);
    ASSERT_TRUE(h.ok());
    ASSERT_EQ(h->encoding, ChunkEncoding::kContext)
        << DTypeName(dtype) << " " << ctx.size() << " " << plain.size();
    EXPECT_EQ(h->context, ExponentFieldOf(dtype));
    EXPECT_EQ(sizes.total(), ctx.size());
    EXPECT_LT(ctx.size(), plain.size() * 0.97) << DTypeName(dtype);
    // The base-independent copy is the plain encoding, byte for byte.
    EXPECT_EQ(independent, plain);

    DecodedChunk c, q;
    ASSERT_TRUE(dec_->Decode(ctx, &c, nullptr, p.base).ok());
    ASSERT_TRUE(dec_->Decode(plain, &q).ok());
    EXPECT_EQ(c.positions, q.positions);
    EXPECT_EQ(c.values, q.values);
    Bytes span = p.base;
    ASSERT_TRUE(ApplyChunk(c, span).ok());
    EXPECT_EQ(span, p.target);
  }
}

// The same changes given as positions and values code to the same bytes
// as EncodeDiffInContext's (a producers' root codes its spans this way).
TEST_P(ContextTest, ChangesInContextAreTheDiffsBytes) {
  const DType dtype = GetParam();
  const size_t w = DTypeSize(dtype);
  const size_t n = (1 << 16) + 37;
  const ExponentField field = ExponentFieldOf(dtype);
  for (uint32_t seed : {7u, 8u}) {
    Pair p = AdamLike(dtype, n, seed);
    for (ChunkKind kind : {ChunkKind::kXor, ChunkKind::kOverwrite}) {
      Bytes want, want_independent;
      ChunkSizes want_sizes;
      ASSERT_TRUE(*enc_->EncodeDiffInContext(kind, ChunkId{1, 2}, w, field,
                                             p.base, p.target, &want,
                                             &want_sizes, &want_independent));
      DecodedChunk c;
      ASSERT_TRUE(dec_->Decode(want_independent, &c).ok());
      // Appends, as the other encoders do.
      Bytes got{std::byte{0xAB}}, independent{std::byte{0xCD}};
      ChunkSizes sizes;
      ASSERT_TRUE(enc_->EncodeChangesInContext(kind, ChunkId{1, 2}, w, field,
                                               p.base, c.positions, c.values,
                                               &got, &sizes, &independent)
                      .ok());
      ASSERT_EQ(got.size(), want.size() + 1);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 1))
          << DTypeName(dtype);
      EXPECT_EQ(Bytes(independent.begin() + 1, independent.end()),
                want_independent);
      EXPECT_EQ(sizes.total(), want_sizes.total());
      EXPECT_EQ(sizes.changed, c.positions.size());
    }
  }
  // Where context cannot help (no exponent field): the plain sparse chunk,
  // and nothing in `base_independent`.
  Pair p = AdamLike(dtype, n, 9);
  Bytes plain, independent;
  ASSERT_TRUE(*enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{1, 2}, w,
                                         ExponentField(), p.base, p.target,
                                         &plain));
  DecodedChunk c;
  ASSERT_TRUE(dec_->Decode(plain, &c).ok());
  Bytes got;
  ASSERT_TRUE(enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{1, 2}, w,
                                           ExponentField(), p.base, c.positions,
                                           c.values, &got, nullptr,
                                           &independent)
                  .ok());
  EXPECT_EQ(got, plain);
  EXPECT_TRUE(independent.empty());
  // Without `base_independent`, call after call on one encoder (its
  // scratch reused): each falls back to the same plain chunk, and a dense
  // diff in between leaves nothing behind in it.
  Pair d = AdamLike(dtype, 4096, 10);
  for (size_t i = 0; i < d.target.size(); i += 3) d.target[i] ^= std::byte{1};
  Bytes dense;
  ASSERT_TRUE(*enc_->EncodeDiff(ChunkKind::kXor, ChunkId{1, 2}, w, d.base,
                                d.target, &dense));
  for (int k = 0; k < 3; ++k) {
    got.clear();
    ASSERT_TRUE(enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{1, 2}, w,
                                             ExponentField(), p.base,
                                             c.positions, c.values, &got)
                    .ok());
    EXPECT_EQ(got, plain) << k;
    if (k == 0) {
      ASSERT_TRUE(*enc_->EncodeDiff(ChunkKind::kXor, ChunkId{1, 2}, w, d.base,
                                    d.target, &dense));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ContextTest,
                         ::testing::Values(DType::kBF16, DType::kF16,
                                           DType::kF32, DType::kF8E4M3,
                                           DType::kF8E5M2),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           std::string name(DTypeName(p.param));
                           return name == "F8_E4M3"   ? std::string("E4M3")
                                  : name == "F8_E5M2" ? std::string("E5M2")
                                                      : name;
                         });

class ContextChunkTest : public ContextTest {};

TEST_F(ContextChunkTest, ChangesInContextRefuseWhatDoesNotFit) {
  Pair p = AdamLike(DType::kBF16, 1 << 12, 3);
  const ExponentField f = ExponentFieldOf(DType::kBF16);
  std::vector<uint32_t> pos{3, 9, 40};
  Bytes values(pos.size() * 2, std::byte{1});
  Bytes out;
  // A part carries its own positions: never coded in its span's context.
  Status s = enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{0, 0, 2}, 2,
                                          f, p.base, pos, values, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // Positions past the base span, out of order, or values of another
  // length: refused, nothing appended.
  for (auto bad : {std::vector<uint32_t>{3, 9, 1 << 12},
                   std::vector<uint32_t>{9, 3, 40}}) {
    s = enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{0, 0}, 2, f,
                                     p.base, bad, values, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  }
  s = enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{0, 0}, 2, f, p.base,
                                   pos, std::span(values).first(4), &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // A ragged base.
  s = enc_->EncodeChangesInContext(ChunkKind::kXor, ChunkId{0, 0}, 2, f,
                                   std::span(p.base).first(7), pos, values,
                                   &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(out.empty());
}

TEST_F(ContextChunkTest, NeedsTheExactBase) {
  Pair p = AdamLike(DType::kBF16, 1 << 15, 3);
  Bytes ctx;
  ASSERT_TRUE(*enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{0, 0}, 2,
                                         ExponentFieldOf(DType::kBF16), p.base,
                                         p.target, &ctx));
  DecodedChunk c;
  // No base: refused, not misdecoded.
  Status s = dec_->Decode(ctx, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(c.positions.empty());
  // Other bits of the same shape: refused.
  Pair q = AdamLike(DType::kBF16, 1 << 15, 4);
  s = dec_->Decode(ctx, &c, nullptr, q.base);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  // Exponents changed where the chunk changes nothing: the contexts move
  // other elements' ranks, so the chunk fails its checksum of the decoded
  // changes (or its counts), never writes elsewhere.
  for (size_t i : {size_t{0}, size_t{100}, size_t{20000}}) {
    Bytes other = p.base;
    other[2 * i + 1] ^= std::byte{0x40};
    s = dec_->Decode(ctx, &c, nullptr, other);
    if (s.ok()) {
      Bytes span = p.base;
      ASSERT_TRUE(ApplyChunk(c, span).ok());
      EXPECT_EQ(span, p.target) << i;
    } else {
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    }
  }
  // A base of the wrong length: refused.
  s = dec_->Decode(ctx, &c, nullptr,
                   std::span(p.base).first(p.base.size() - 2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST_F(ContextChunkTest, FallsBackWhereContextCannotHelp) {
  // Integer dtype: no exponent field.
  Pair p = AdamLike(DType::kBF16, 1 << 15, 4);
  Bytes out;
  ASSERT_TRUE(*enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{0, 0}, 2,
                                         ExponentFieldOf(DType::kI16), p.base,
                                         p.target, &out));
  EXPECT_EQ(PeekChunkHeader(out)->encoding, ChunkEncoding::kSparse);
  // Changes independent of the exponent: nothing to gain, plain encoding.
  std::mt19937_64 rng(5);
  Bytes base(2 << 15), target;
  for (auto& b : base) b = static_cast<std::byte>(rng());
  target = base;
  for (size_t i = 0; i < (1 << 15); i += 1 + rng() % 60)
    target[2 * i] ^= std::byte{1};
  out.clear();
  Bytes independent;
  ASSERT_TRUE(*enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{0, 0}, 2,
                                         ExponentFieldOf(DType::kBF16), base,
                                         target, &out, nullptr, &independent));
  EXPECT_EQ(PeekChunkHeader(out)->encoding, ChunkEncoding::kSparse);
  EXPECT_TRUE(independent.empty());
  // A tiny span.
  Pair t = AdamLike(DType::kBF16, 100, 6);
  out.clear();
  auto r = enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{0, 0}, 2,
                                     ExponentFieldOf(DType::kBF16), t.base,
                                     t.target, &out);
  ASSERT_TRUE(r.ok());
  if (*r) {
    EXPECT_NE(PeekChunkHeader(out)->encoding, ChunkEncoding::kContext);
  }
}

TEST_F(ContextChunkTest, MalformedTablesAreRefused) {
  Pair p = AdamLike(DType::kBF16, 1 << 15, 8);
  Bytes ctx;
  ASSERT_TRUE(*enc_->EncodeDiffInContext(ChunkKind::kXor, ChunkId{0, 0}, 2,
                                         ExponentFieldOf(DType::kBF16), p.base,
                                         p.target, &ctx));
  // Every single-byte change of the header and tables, with the trailing
  // checksum fixed up so the decoder's own checks are what refuses it.
  const size_t table = 40 + 13 * static_cast<size_t>(ctx[30]) +
                       5 * 2 * static_cast<size_t>(ctx[31]);
  DecodedChunk c;
  for (size_t at = 4; at < table; ++at) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      Bytes bad = ctx;
      bad[at] ^= std::byte{flip};
      size_t body = bad.size() - 8;
      StoreLE<uint64_t>(bad.data() + body,
                        Hash64(std::span<const std::byte>(bad).first(body)));
      Status s = dec_->Decode(bad, &c, nullptr, p.base);
      if (s.ok()) {
        // Only a change that keeps the decoded changes intact may pass
        // (e.g. the tensor id): then they must equal the real ones.
        Bytes span = p.base;
        ASSERT_TRUE(ApplyChunk(c, span).ok());
        EXPECT_EQ(span, p.target) << "byte " << at;
      }
    }
  }
}

}  // namespace
}  // namespace dcr
