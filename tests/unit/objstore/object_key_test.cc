#include "dcr/objstore.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcr {
namespace {

TEST(ObjectKeyTest, AcceptsPortableSegments) {
  for (const char* k :
       {"a", "refits/0a1b/c/00000017", "x.y-z_1/2", "..a/b..", "a/.hidden"}) {
    EXPECT_TRUE(ValidateObjectKey(k).ok()) << k;
  }
}

TEST(ObjectKeyTest, RefusesWithTheReason) {
  struct Case {
    std::string key;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {"/a", "empty segment"},
           {"a/", "empty segment"},
           {"a//b", "empty segment"},
           {".", "'.' or '..'"},
           {"a/../b", "'.' or '..'"},
           {"a b", "[A-Za-z0-9._-]"},
           {"a%2Fb", "[A-Za-z0-9._-]"},
           {std::string("a\0b", 3), "[A-Za-z0-9._-]"},
           {std::string(513, 'a'), "longer than 512"},
       }) {
    Status s = ValidateObjectKey(c.key);
    EXPECT_TRUE(s.IsInvalidArgument()) << c.key;
    EXPECT_THAT(s.message(), ::testing::HasSubstr(c.why)) << c.key;
  }
}

}  // namespace
}  // namespace dcr
