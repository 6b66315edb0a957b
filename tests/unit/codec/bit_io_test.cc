#include "codec/bit_io.h"

#include <gtest/gtest.h>

#include <random>

namespace dcr {
namespace {

std::vector<uint32_t> RandomPositions(uint32_t n, double p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(p);
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    if (pick(rng)) out.push_back(i);
  }
  return out;
}

void RoundTrip(const std::vector<uint32_t>& pos, uint32_t span, uint32_t k) {
  std::vector<std::byte> buf;
  size_t n = RiceEncode(pos, k, &buf);
  EXPECT_EQ(n, buf.size());
  EXPECT_EQ(n, RiceCodedBytes(pos, k));
  size_t coded = buf.size();
  buf.resize(coded + 8);  // the decoder's read-ahead guarantee
  std::vector<uint32_t> back;
  ASSERT_TRUE(RiceDecode(std::span(buf).first(coded), k,
                         static_cast<uint32_t>(pos.size()), span, &back)
                  .ok());
  EXPECT_EQ(back, pos);
}

TEST(RiceTest, RoundTripsAcrossDensitiesAndParameters) {
  for (double p : {0.0005, 0.01, 0.05, 0.3, 0.9, 1.0}) {
    auto pos = RandomPositions(100000, p, 7);
    if (pos.empty()) continue;
    uint32_t best = ChooseRiceK(pos);
    for (uint32_t k : {0u, best, best + 1, 20u, kMaxRiceK}) {
      RoundTrip(pos, 100000, k);
    }
  }
}

TEST(RiceTest, EscapesHugeGaps) {
  std::vector<uint32_t> pos = {0, (1u << 26) - 2, (1u << 26) - 1};
  RoundTrip(pos, 1u << 26, 0);
  RoundTrip(pos, 1u << 26, 3);
}

TEST(RiceTest, ChosenKIsNearOptimal) {
  auto pos = RandomPositions(1 << 20, 0.01, 3);
  uint32_t k = ChooseRiceK(pos);
  uint64_t chosen = RiceCodedBytes(pos, k);
  for (uint32_t other = 0; other <= 16; ++other) {
    EXPECT_LE(chosen, RiceCodedBytes(pos, other));
  }
}

TEST(RiceTest, RejectsPositionsPastSpanAndTruncation) {
  std::vector<uint32_t> pos = {5, 10, 99};
  std::vector<std::byte> buf;
  RiceEncode(pos, 2, &buf);
  size_t coded = buf.size();
  buf.resize(coded + 8);
  std::vector<uint32_t> back;
  EXPECT_TRUE(
      RiceDecode(std::span(buf).first(coded), 2, 3, 99, &back).IsCorruption());
  EXPECT_TRUE(RiceDecode(std::span(buf).first(coded), 2, 50, 1000, &back)
                  .IsCorruption());
  EXPECT_TRUE(
      RiceDecode(std::span(buf).first(0), 2, 1, 1000, &back).IsCorruption());
}

}  // namespace
}  // namespace dcr
