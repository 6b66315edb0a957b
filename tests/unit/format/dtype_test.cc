#include "dcr/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dcr {
namespace {

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
  };
  const Case cases[] = {
      {DType::kBF16, "BF16", 2},      {DType::kF16, "F16", 2},
      {DType::kF32, "F32", 4},        {DType::kF64, "F64", 8},
      {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
      {DType::kI8, "I8", 1},          {DType::kI16, "I16", 2},
      {DType::kI32, "I32", 4},        {DType::kI64, "I64", 8},
      {DType::kU8, "U8", 1},          {DType::kBool, "BOOL", 1},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(DTypeName(c.dtype), c.name);
    EXPECT_EQ(DTypeSize(c.dtype), c.size) << c.name;
    Result<DType> parsed = ParseDType(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name;
    EXPECT_EQ(*parsed, c.dtype);
    EXPECT_TRUE(IsValidDType(static_cast<uint8_t>(c.dtype)));
  }
}

TEST(DTypeTest, UnknownNameIsInvalidArgumentListingSupported) {
  for (const char* name : {"U16", "bf16", "", "F8_E4M3FN", "F32 "}) {
    Result<DType> parsed = ParseDType(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_TRUE(parsed.status().IsInvalidArgument());
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::HasSubstr("'" + std::string(name) + "'"));
    EXPECT_THAT(std::string(parsed.status().message()),
                ::testing::HasSubstr("BF16, F16, F32"));
  }
}

TEST(DTypeTest, ValidEnumValues) {
  EXPECT_FALSE(IsValidDType(0));
  for (uint8_t v = 1; v <= 12; ++v) EXPECT_TRUE(IsValidDType(v)) << int{v};
  EXPECT_FALSE(IsValidDType(13));
  EXPECT_FALSE(IsValidDType(255));
}

}  // namespace
}  // namespace dcr
