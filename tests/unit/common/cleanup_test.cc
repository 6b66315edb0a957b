#include "common/cleanup.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

TEST(CleanupTest, RunsOnScopeExit) {
  int runs = 0;
  {
    Cleanup c([&] { ++runs; });
  }
  EXPECT_EQ(runs, 1);
}

TEST(CleanupTest, CancelKeepsWhatWasMade) {
  int runs = 0;
  {
    Cleanup c([&] { ++runs; });
    c.Cancel();
  }
  EXPECT_EQ(runs, 0);
}

TEST(CleanupTest, RunsOnAnEarlyReturn) {
  int runs = 0;
  auto f = [&](bool fail) {
    Cleanup c([&] { ++runs; });
    if (fail) return false;
    c.Cancel();
    return true;
  };
  EXPECT_FALSE(f(true));
  EXPECT_TRUE(f(false));
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace dcr
