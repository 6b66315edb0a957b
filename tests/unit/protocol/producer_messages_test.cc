// The payloads between a trainer rank's producer and the coordinator
// (protocol/producer_messages.h): round trips, truncation, trailing bytes,
// unknown versions and out-of-range values.
#include "protocol/producer_messages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/producer.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;

ProducerHelloMsg SampleHello() {
  ProducerHelloMsg m;
  m.rank = 2;
  m.world = 4;
  m.step = 1234567;
  m.layout = Digest128{0x1111, 0x2222};
  m.base_parts = {{1, 2}, {3, 4}, {0xffffffffffffffffull, 5}};
  return m;
}

ProducerGoMsg SampleGo() {
  ProducerGoMsg m;
  m.refit.bytes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  m.span_elems = 1 << 20;
  m.base = {41, Digest128{7, 8}};
  m.target_step = 42;
  return m;
}

ProducerDoneMsg SampleDone() {
  ProducerDoneMsg m;
  m.chunks = 17;
  m.changed = 123456789;
  m.target_parts = {{9, 10}, {11, 12}};
  return m;
}

ProducerDecisionMsg SampleDecision() {
  ProducerDecisionMsg m;
  m.outcome = 1;  // partial
  m.refit = SampleGo().refit;
  m.target = {42, Digest128{13, 14}};
  m.reason = "a2 excluded: voted no";
  return m;
}

const Bytes kBaselineBytes = {std::byte{1}, std::byte{2}, std::byte{3}};

ProducerBaselineMsg SampleBaseline() {
  ProducerBaselineMsg m;
  m.shard = "decoder.layers.1.self_attention.linear_qkv.weight";
  m.total = 100;
  m.offset = 97;
  m.bytes = kBaselineBytes;
  return m;
}

// One message's sample encoding and its decoder's status.
struct Codec {
  const char* name;
  Bytes (*encode_sample)();
  Status (*decode)(std::span<const std::byte>);
};

template <typename Decode>
Status StatusOf(Decode decode, std::span<const std::byte> b) {
  return decode(b).status();
}

const Codec kCodecs[] = {
    {"PRODUCER_HELLO", [] { return EncodeProducerHello(SampleHello()); },
     [](std::span<const std::byte> b) {
       return StatusOf(DecodeProducerHello, b);
     }},
    {"PRODUCER_GO", [] { return EncodeProducerGo(SampleGo()); },
     [](std::span<const std::byte> b) {
       return StatusOf(DecodeProducerGo, b);
     }},
    {"PRODUCER_DONE", [] { return EncodeProducerDone(SampleDone()); },
     [](std::span<const std::byte> b) {
       return StatusOf(DecodeProducerDone, b);
     }},
    {"PRODUCER_DECISION",
     [] { return EncodeProducerDecision(SampleDecision()); },
     [](std::span<const std::byte> b) {
       return StatusOf(DecodeProducerDecision, b);
     }},
    {"PRODUCER_BASELINE",
     [] { return EncodeProducerBaseline(SampleBaseline()); },
     [](std::span<const std::byte> b) {
       return StatusOf(DecodeProducerBaseline, b);
     }},
};

// LEB128 of `v`.
void PutVarint(Bytes* b, uint64_t v) {
  while (v >= 0x80) {
    b->push_back(std::byte(static_cast<uint8_t>(v) | 0x80));
    v >>= 7;
  }
  b->push_back(std::byte(static_cast<uint8_t>(v)));
}

// Expects `s` to be Corruption whose message contains `what`.
void ExpectCorruption(const Status& s, const std::string& what) {
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(std::string(s.message()).find(what), std::string::npos)
      << "'" << s.ToString() << "' does not name '" << what << "'";
}

TEST(ProducerMessagesTest, RoundTripEveryMessage) {
  ProducerHelloMsg h = SampleHello();
  auto hb = EncodeProducerHello(h);
  EXPECT_EQ(hb[0], std::byte{1});
  EXPECT_EQ(hb.size(), 1u + 4 + 4 + 8 + 16 + 1 + 3 * 16);
  auto h2 = DecodeProducerHello(hb);
  ASSERT_TRUE(h2.ok()) << h2.status().ToString();
  EXPECT_EQ(*h2, h);

  ProducerGoMsg g = SampleGo();
  auto gb = EncodeProducerGo(g);
  EXPECT_EQ(gb.size(), 1u + 16 + 8 + 24 + 8);
  auto g2 = DecodeProducerGo(gb);
  ASSERT_TRUE(g2.ok()) << g2.status().ToString();
  EXPECT_EQ(*g2, g);

  ProducerDoneMsg d = SampleDone();
  auto db = EncodeProducerDone(d);
  EXPECT_EQ(db.size(), 1u + 8 + 8 + 1 + 2 * 16);
  auto d2 = DecodeProducerDone(db);
  ASSERT_TRUE(d2.ok()) << d2.status().ToString();
  EXPECT_EQ(*d2, d);

  ProducerDecisionMsg c = SampleDecision();
  auto cb = EncodeProducerDecision(c);
  EXPECT_EQ(cb.size(), 1u + 1 + 16 + 24 + 1 + c.reason.size());
  auto c2 = DecodeProducerDecision(cb);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_EQ(*c2, c);
}

// The edges of what is allowed: no parts, the last rank, the span bounds,
// every outcome, an empty reason.
TEST(ProducerMessagesTest, RoundTripAtTheBounds) {
  ProducerHelloMsg h = SampleHello();
  h.base_parts.clear();  // no baseline: allowed on the wire
  h.rank = h.world - 1;
  EXPECT_EQ(*DecodeProducerHello(EncodeProducerHello(h)), h);
  h.world = 1;
  h.rank = 0;
  EXPECT_EQ(*DecodeProducerHello(EncodeProducerHello(h)), h);
  // 200 parts: a varint count of two bytes.
  h.base_parts.assign(200, LinearDigest{5, 6});
  EXPECT_EQ(*DecodeProducerHello(EncodeProducerHello(h)), h);

  ProducerGoMsg g = SampleGo();
  for (uint64_t span : {uint64_t{1}, kMaxSpanElems}) {
    g.span_elems = span;
    EXPECT_EQ(*DecodeProducerGo(EncodeProducerGo(g)), g) << span;
  }

  ProducerDoneMsg d;  // nothing changed, no parts
  EXPECT_EQ(*DecodeProducerDone(EncodeProducerDone(d)), d);

  ProducerDecisionMsg c = SampleDecision();
  c.reason.clear();
  for (uint8_t o = 0; o <= kMaxProducerOutcome; ++o) {
    c.outcome = o;
    EXPECT_EQ(*DecodeProducerDecision(EncodeProducerDecision(c)), c) << int(o);
  }
  // The outcome byte is ProducerOutcome's value.
  EXPECT_EQ(static_cast<uint8_t>(ProducerOutcome::kRefused),
            kMaxProducerOutcome);
  EXPECT_EQ(ProducerDecisionMsg().outcome,
            static_cast<uint8_t>(ProducerOutcome::kRefused));
}

TEST(ProducerMessagesTest, EveryTruncationIsRefusedNamingTheMessage) {
  for (const Codec& codec : kCodecs) {
    SCOPED_TRACE(codec.name);
    Bytes b = codec.encode_sample();
    ASSERT_TRUE(codec.decode(b).ok()) << codec.decode(b).ToString();
    for (size_t n = 0; n < b.size(); ++n) {
      Status s = codec.decode(std::span(b).first(n));
      ExpectCorruption(s, std::string(codec.name) + ".");
      if (n == 0) ExpectCorruption(s, "empty payload");
    }
  }
}

TEST(ProducerMessagesTest, TrailingBytesAndUnknownVersionsAreRefused) {
  for (const Codec& codec : kCodecs) {
    SCOPED_TRACE(codec.name);
    Bytes b = codec.encode_sample();
    Bytes longer = b;
    longer.push_back(std::byte{0});
    ExpectCorruption(codec.decode(longer),
                     std::string(codec.name) + ".end: 1 trailing bytes");
    longer.push_back(std::byte{0});
    ExpectCorruption(codec.decode(longer), "2 trailing bytes");
    for (uint8_t v : {0, 2, 255}) {
      Bytes other = b;
      other[0] = std::byte{v};
      ExpectCorruption(codec.decode(other),
                       std::string(codec.name) +
                           ".version: unknown message version " +
                           std::to_string(v));
    }
  }
}

TEST(ProducerMessagesTest, HelloWorldAndRankOutOfRangeAreRefused) {
  ProducerHelloMsg h = SampleHello();
  h.world = 0;
  h.rank = 0;
  ExpectCorruption(DecodeProducerHello(EncodeProducerHello(h)).status(),
                   "PRODUCER_HELLO.world: 0");
  h = SampleHello();
  h.rank = h.world;
  ExpectCorruption(DecodeProducerHello(EncodeProducerHello(h)).status(),
                   "PRODUCER_HELLO.rank: not below world");
  h.rank = 0xffffffffu;
  ExpectCorruption(DecodeProducerHello(EncodeProducerHello(h)).status(),
                   "PRODUCER_HELLO.rank");
}

TEST(ProducerMessagesTest, GoSpanOutOfRangeIsRefused) {
  ProducerGoMsg g = SampleGo();
  for (uint64_t span : {uint64_t{0}, kMaxSpanElems + 1, ~uint64_t{0}}) {
    g.span_elems = span;
    ExpectCorruption(DecodeProducerGo(EncodeProducerGo(g)).status(),
                     "PRODUCER_GO.span_elems: out of range");
  }
}

TEST(ProducerMessagesTest, BaselinePieceRoundTripsAndViewsItsPayload) {
  Bytes b = EncodeProducerBaseline(SampleBaseline());
  auto m = DecodeProducerBaseline(b);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->shard, SampleBaseline().shard);
  EXPECT_EQ(m->total, 100u);
  EXPECT_EQ(m->offset, 97u);
  EXPECT_TRUE(std::equal(m->bytes.begin(), m->bytes.end(),
                         kBaselineBytes.begin(), kBaselineBytes.end()));
  // No copy: the bytes are the payload's last three.
  EXPECT_EQ(m->bytes.data(), b.data() + b.size() - 3);
}

// A piece that passes its shard's end, or one over the piece bound, is
// refused before anything is read.
TEST(ProducerMessagesTest, BaselinePieceOutOfItsShardIsRefused) {
  ProducerBaselineMsg m = SampleBaseline();
  m.offset = 98;  // 98 + 3 > 100
  ExpectCorruption(
      DecodeProducerBaseline(EncodeProducerBaseline(m)).status(),
      "PRODUCER_BASELINE.bytes: offset 98 + 3 bytes pass the shard's 100");
  m.offset = 101;
  ExpectCorruption(DecodeProducerBaseline(EncodeProducerBaseline(m)).status(),
                   "PRODUCER_BASELINE.bytes");
  // A count over the bound, without the bytes behind it.
  Bytes b = {std::byte{1}};
  b.push_back(std::byte{1});
  b.push_back(std::byte{'w'});
  for (int i = 0; i < 8; ++i) b.push_back(std::byte{0xff});  // total
  for (int i = 0; i < 8; ++i) b.push_back(std::byte{0});     // offset
  PutVarint(&b, kMaxProducerBaselinePiece + 1);
  ExpectCorruption(DecodeProducerBaseline(b).status(),
                   "PRODUCER_BASELINE.bytes: " +
                       std::to_string(kMaxProducerBaselinePiece + 1) +
                       " exceeds");
}

TEST(ProducerMessagesTest, DecisionUnknownOutcomeIsRefused) {
  ProducerDecisionMsg c = SampleDecision();
  for (unsigned o : {kMaxProducerOutcome + 1u, 255u}) {
    c.outcome = static_cast<uint8_t>(o);
    ExpectCorruption(
        DecodeProducerDecision(EncodeProducerDecision(c)).status(),
        "PRODUCER_DECISION.outcome: unknown value " + std::to_string(o));
  }
}

// A count of digest parts over kMaxProducerTensors is refused by its value,
// before anything is allocated; one at the bound fails only as truncated.
TEST(ProducerMessagesTest, PartCountsOverTheBoundAreRefused) {
  ProducerHelloMsg h = SampleHello();
  h.base_parts.clear();
  Bytes hello = EncodeProducerHello(h);
  ASSERT_EQ(hello.back(), std::byte{0});  // the count, last
  hello.pop_back();
  ProducerDoneMsg d = SampleDone();
  d.target_parts.clear();
  Bytes done = EncodeProducerDone(d);
  ASSERT_EQ(done.back(), std::byte{0});
  done.pop_back();

  for (uint64_t n :
       {uint64_t{kMaxProducerTensors} + 1, uint64_t{1} << 40, ~uint64_t{0}}) {
    Bytes hb = hello;
    PutVarint(&hb, n);
    ExpectCorruption(
        DecodeProducerHello(hb).status(),
        "PRODUCER_HELLO.base_parts: " + std::to_string(n) + " exceeds");
    Bytes db = done;
    PutVarint(&db, n);
    ExpectCorruption(
        DecodeProducerDone(db).status(),
        "PRODUCER_DONE.target_parts: " + std::to_string(n) + " exceeds");
  }
  Bytes hb = hello;
  PutVarint(&hb, kMaxProducerTensors);
  ExpectCorruption(DecodeProducerHello(hb).status(),
                   "PRODUCER_HELLO.base_parts: truncated");
  Bytes db = done;
  PutVarint(&db, kMaxProducerTensors);
  ExpectCorruption(DecodeProducerDone(db).status(),
                   "PRODUCER_DONE.target_parts: truncated");
}

// One encoding per message: a count written with a redundant varint group
// is refused (the fuzz target's round trip relies on it).
TEST(ProducerMessagesTest, OverlongCountsAreRefused) {
  ProducerDoneMsg d = SampleDone();
  d.target_parts.clear();
  Bytes done = EncodeProducerDone(d);
  done.back() = std::byte{0x80};
  done.push_back(std::byte{0x00});
  ExpectCorruption(DecodeProducerDone(done).status(),
                   "PRODUCER_DONE.target_parts");
}

}  // namespace
}  // namespace dcr
