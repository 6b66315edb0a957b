#include "dcr/status.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

TEST(StatusTest, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(s.WithContext("ctx").ok());
}

TEST(StatusTest, ErrorCarriesCodeMessageAndContext) {
  Status s = Status::Corruption("bad checksum").WithContext("chunk 3");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_EQ(s.message(), "chunk 3: bad checksum");
  EXPECT_EQ(s.ToString(), "corruption: chunk 3: bad checksum");
  Status copy = s;
  EXPECT_EQ(copy.ToString(), s.ToString());
}

TEST(StatusTest, FromErrnoAppendsStrerror) {
  Status s = Status::FromErrno("open 'x'", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("No such file"), std::string_view::npos);
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status UseHalf(int x, int* out) {
  DCR_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::OK();
}

TEST(ResultTest, HoldsValueOrError) {
  auto r = Half(4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 2);
  auto e = Half(3);
  EXPECT_FALSE(e.ok());
  EXPECT_TRUE(e.status().IsInvalidArgument());
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  EXPECT_FALSE(UseHalf(7, &v).ok());
}

TEST(ResultTest, OkStatusIsAnInternalError) {
  Result<int> r{Status::OK()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace dcr
