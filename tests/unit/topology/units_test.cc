#include <gtest/gtest.h>
#include <stdlib.h>

#include "dcr/topology.h"

namespace dcr {
namespace {

TEST(UnitsTest, Bandwidth) {
  struct Case {
    const char* text;
    uint64_t bps;
  } cases[] = {
      {"25Gbps", 25000000000ull},
      {"200Mbps", 200000000ull},
      {"3Gbit/s", 3000000000ull},
      {"100MB/s", 800000000ull},
      {"1GiB/s", 8ull << 30},
      {"1.5Gbps", 1500000000ull},
      {"2.5 Gb/s", 2500000000ull},
      {"10Kbps", 10000ull},
      {"1Tbps", 1000000000000ull},
      {"1000", 1000ull},
      {"64bps", 64},
      {"1MiBps", 8ull << 20},
      {"200Mbit/s", 200000000ull},
      {"5mbps", 5000000ull},
  };
  for (const Case& c : cases) {
    auto v = ParseBandwidth(c.text);
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status().ToString();
    EXPECT_EQ(*v, c.bps) << c.text;
  }
  for (const char* bad :
       {"", "fast", "Gbps", "1.Gbps", "-1Gbps", "1Gbpss", "1 Gbps ", "0",
        "0Gbps", "1e9", "1Xbps", "99999999999999999999", "99999999999Tbps"}) {
    EXPECT_FALSE(ParseBandwidth(bad).ok()) << bad;
  }
}

TEST(UnitsTest, Size) {
  EXPECT_EQ(*ParseSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseSize("1GB"), 1000000000ull);
  EXPECT_EQ(*ParseSize("4096"), 4096ull);
  EXPECT_EQ(*ParseSize("4096B"), 4096ull);
  EXPECT_EQ(*ParseSize("1KiB"), 1024ull);
  EXPECT_EQ(*ParseSize("1.5KiB"), 1536ull);
  EXPECT_EQ(*ParseSize("2TiB"), 2ull << 40);
  EXPECT_EQ(*ParseSize("0"), 0ull);
  for (const char* bad : {"", "MiB", "1MiBps", "1.5", "64 MiBs", "x"}) {
    EXPECT_FALSE(ParseSize(bad).ok()) << bad;
  }
}

TEST(UnitsTest, Duration) {
  EXPECT_EQ(*ParseDurationNs("70ms"), 70000000ull);
  EXPECT_EQ(*ParseDurationNs("1s"), 1000000000ull);
  EXPECT_EQ(*ParseDurationNs("250us"), 250000ull);
  EXPECT_EQ(*ParseDurationNs("10ns"), 10ull);
  EXPECT_EQ(*ParseDurationNs("10min"), 600000000000ull);
  EXPECT_EQ(*ParseDurationNs("1.5h"), 5400000000000ull);
  EXPECT_EQ(*ParseDurationNs("1.5ms"), 1500000ull);
  EXPECT_EQ(*ParseDurationNs("0"), 0ull);
  for (const char* bad : {"", "70", "1m", "ms", "1 d", "-1s"}) {
    EXPECT_FALSE(ParseDurationNs(bad).ok()) << bad;
  }
}

TEST(UnitsTest, FormatRoundTrips) {
  for (uint64_t v : {1ull, 999ull, 1000ull, 2500000000ull, 3000000000ull,
                     200000000ull, 123456789ull, 1ull << 40}) {
    EXPECT_EQ(*ParseBandwidth(FormatBandwidth(v)), v) << FormatBandwidth(v);
  }
  EXPECT_EQ(FormatBandwidth(3000000000ull), "3Gbps");
  EXPECT_EQ(FormatBandwidth(2500000000ull), "2500Mbps");
  for (uint64_t v :
       {0ull, 1ull, 4096ull, 64ull << 20, 1000000000ull, 12345ull}) {
    EXPECT_EQ(*ParseSize(FormatSize(v)), v) << FormatSize(v);
  }
  EXPECT_EQ(FormatSize(64ull << 20), "64MiB");
  for (uint64_t v :
       {0ull, 1ull, 250000ull, 70000000ull, 1000000000ull, 1234567ull}) {
    EXPECT_EQ(*ParseDurationNs(FormatDuration(v)), v) << FormatDuration(v);
  }
  EXPECT_EQ(FormatDuration(70000000ull), "70ms");
}

TEST(UnitsTest, ExpandEnv) {
  ::setenv("DCR_TOPO_TEST_DIR", "/data", 1);
  ::unsetenv("DCR_TOPO_TEST_UNSET");
  ::setenv("DCR_TOPO_TEST_EMPTY", "", 1);
  EXPECT_EQ(*ExpandEnv("${DCR_TOPO_TEST_DIR}/a0"), "/data/a0");
  EXPECT_EQ(*ExpandEnv("${DCR_TOPO_TEST_DIR:-/tmp}/a0"), "/data/a0");
  EXPECT_EQ(*ExpandEnv("${DCR_TOPO_TEST_UNSET:-/tmp/x}/a0"), "/tmp/x/a0");
  EXPECT_EQ(*ExpandEnv("${DCR_TOPO_TEST_EMPTY:-d}"), "d");
  EXPECT_EQ(*ExpandEnv("${DCR_TOPO_TEST_EMPTY}"), "");
  EXPECT_EQ(*ExpandEnv("a$b $$ $"), "a$b $ $");
  EXPECT_EQ(*ExpandEnv("$${DCR_TOPO_TEST_DIR}"), "${DCR_TOPO_TEST_DIR}");
  auto unset = ExpandEnv("${DCR_TOPO_TEST_UNSET}/x");
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find("DCR_TOPO_TEST_UNSET is not set"),
            std::string_view::npos);
  EXPECT_FALSE(ExpandEnv("${DCR_TOPO_TEST_DIR").ok());
  EXPECT_FALSE(ExpandEnv("${1X}").ok());
  EXPECT_FALSE(ExpandEnv("${}").ok());
}

}  // namespace
}  // namespace dcr
