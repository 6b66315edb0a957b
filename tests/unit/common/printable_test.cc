#include "common/printable.h"

#include <gtest/gtest.h>

#include <string>

namespace dcr {
namespace {

using namespace std::string_literals;

TEST(PrintableTest, EscapesControlBytesOnly) {
  EXPECT_EQ(Printable("layers.0.weight"), "layers.0.weight");
  EXPECT_EQ(Printable("a\0b"s), "a\\x00b");
  EXPECT_EQ(Printable("\t\n\x1f\x7f"), "\\x09\\x0a\\x1f\\x7f");
  // UTF-8 stays as it is.
  EXPECT_EQ(Printable("gewicht_ä_中"), "gewicht_ä_中");
}

TEST(PrintableTest, FindsTheFirstControlByte) {
  EXPECT_EQ(FindControlByte("plain"), std::nullopt);
  EXPECT_EQ(FindControlByte("ab\0c\n"s), 2u);
  EXPECT_EQ(FindControlByte("x\x7f"), 1u);
  EXPECT_EQ(FindControlByte("ä"), std::nullopt);
}

TEST(AbbreviatedTest, ShortValuesWhole) {
  EXPECT_EQ(Abbreviated("25Gbps"), "25Gbps");
  EXPECT_EQ(Abbreviated(std::string(80, 'x')), std::string(80, 'x'));
  EXPECT_EQ(Abbreviated("a\0"s), "a\\x00");
}

TEST(AbbreviatedTest, LongValuesCutWithTheirLength) {
  const std::string big(102400, 'x');
  EXPECT_EQ(Abbreviated(big), std::string(80, 'x') + "... (102400 bytes)");
  EXPECT_EQ(Abbreviated("abcdef", 3), "abc... (6 bytes)");
  // Escapes apply to the part shown.
  EXPECT_EQ(Abbreviated("\x01\x02\x03\x04", 2), "\\x01\\x02... (4 bytes)");
}

TEST(AbbreviatedTest, NeverSplitsAUtf8Character) {
  // "ä" is 2 bytes, "中" 3: a cut inside either backs up to its start.
  EXPECT_EQ(Abbreviated("aä", 2), "a... (3 bytes)");
  EXPECT_EQ(Abbreviated("a中b", 3), "a... (5 bytes)");
  EXPECT_EQ(Abbreviated("a中b", 4), "a中... (5 bytes)");
}

}  // namespace
}  // namespace dcr
