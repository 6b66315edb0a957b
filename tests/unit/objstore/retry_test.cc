#include "objstore/retry.h"

#include "gtest/gtest.h"

namespace dcr::objstore_internal {
namespace {

using std::chrono::milliseconds;

TEST(RetryTest, RetriesWhatMayPass) {
  struct Case {
    long status;
    const char* code;
    bool retry;
  };
  for (const Case& c : std::vector<Case>{
           {500, "InternalError", true},
           {502, "", true},
           {503, "SlowDown", true},
           {503, "", true},
           {504, "", true},
           {501, "NotImplemented", false},
           {429, "", true},
           {400, "RequestTimeout", true},
           {400, "InvalidArgument", false},
           {400, "", false},
           {403, "SignatureDoesNotMatch", false},
           {403, "SlowDown", false},
           {404, "NoSuchKey", false},
           {409, "", false},
       }) {
    EXPECT_EQ(IsRetryableHttp(c.status, c.code), c.retry)
        << c.status << " " << c.code;
  }
}

TEST(RetryTest, BackoffIsExponentialCappedAndJittered) {
  const milliseconds base(100), cap(5000);
  EXPECT_EQ(BackoffDelay(0, base, cap, 0.9), milliseconds(0));
  EXPECT_EQ(BackoffDelay(1, base, cap, 0.5), milliseconds(50));
  EXPECT_EQ(BackoffDelay(2, base, cap, 0.5), milliseconds(100));
  EXPECT_EQ(BackoffDelay(4, base, cap, 0.999), milliseconds(799));
  EXPECT_EQ(BackoffDelay(7, base, cap, 0.5), milliseconds(2500));  // capped
  EXPECT_EQ(BackoffDelay(1000, base, cap, 1.0), cap);  // no overflow
  EXPECT_EQ(BackoffDelay(3, base, cap, 0.0), milliseconds(0));
  EXPECT_EQ(BackoffDelay(3, base, cap, -1.0), milliseconds(0));
}

}  // namespace
}  // namespace dcr::objstore_internal
