// The split of a relay's memory cap (relay/memory_budget.h).
#include "relay/memory_budget.h"

#include <gtest/gtest.h>

#include "dcr/wire.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using testing::kGiB;
using testing::kMiB;

TEST(MemoryBudgetTest, EveryBoundFitsUnderTheLimit) {
  for (uint64_t limit : {256 * kMiB, 400 * kMiB, 512 * kMiB, 1 * kGiB,
                         3 * kGiB + 7, 16 * kGiB, 256 * kGiB}) {
    for (size_t threads : {1u, 2u, 8u}) {
      if (limit < 512 * kMiB && threads == 8)
        continue;  // too small (see below)
      auto b = PlanMemoryBudget(limit, threads, kDefaultMaxFramePayload);
      ASSERT_TRUE(b.ok()) << limit << " " << threads << ": "
                          << b.status().ToString();
      SCOPED_TRACE(b->ToString());
      EXPECT_LE(b->Total(), limit);
      EXPECT_EQ(b->limit, limit);
      EXPECT_EQ(b->reserve, kReserveBase + threads * kReservePerThread);
      EXPECT_GE(b->max_frame_payload, kMinFramePayloadUnderLimit);
      EXPECT_LE(b->max_frame_payload, kDefaultMaxFramePayload);
      EXPECT_GE(b->max_inbound_links, kMinInboundLinks);
      EXPECT_LE(b->max_inbound_links, kMaxInboundLinks);
      EXPECT_GT(b->forward_window_bytes, 0u);
      EXPECT_GT(b->apply_window_bytes, 0u);
      EXPECT_GT(b->resend_buffer_bytes, 0u);
      EXPECT_GE(b->inbound_quota_bytes, b->max_frame_payload);
    }
  }
}

TEST(MemoryBudgetTest, ALargerLimitNeverShrinksABound) {
  auto prev = PlanMemoryBudget(512 * kMiB, 2, kDefaultMaxFramePayload);
  ASSERT_TRUE(prev.ok());
  for (uint64_t limit = 640 * kMiB; limit <= 64 * kGiB; limit *= 2) {
    auto b = PlanMemoryBudget(limit, 2, kDefaultMaxFramePayload);
    ASSERT_TRUE(b.ok());
    EXPECT_GE(b->forward_window_bytes, prev->forward_window_bytes);
    EXPECT_GE(b->apply_window_bytes, prev->apply_window_bytes);
    EXPECT_GE(b->resend_buffer_bytes, prev->resend_buffer_bytes);
    EXPECT_GE(b->max_frame_payload, prev->max_frame_payload);
    prev = b;
  }
  // The frame bound stops at what the transport allows.
  EXPECT_EQ(prev->max_frame_payload, kDefaultMaxFramePayload);
}

TEST(MemoryBudgetTest, ASmallerFrameBoundIsKept) {
  auto b = PlanMemoryBudget(4 * kGiB, 2, 1u << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->max_frame_payload, 1u << 20);
  EXPECT_LE(b->Total(), 4 * kGiB);
  // Small frames make a small cap possible.
  EXPECT_TRUE(PlanMemoryBudget(96 * kMiB, 2, 1u << 20).ok());
}

TEST(MemoryBudgetTest, TooSmallALimitNamesTheSmallestThatWorks) {
  auto b = PlanMemoryBudget(200 * kMiB, 2, kDefaultMaxFramePayload);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("too small"), std::string::npos)
      << b.status().ToString();
  EXPECT_NE(b.status().message().find("at least 227.00 MiB"), std::string::npos)
      << b.status().ToString();
  EXPECT_TRUE(PlanMemoryBudget(227 * kMiB, 2, kDefaultMaxFramePayload).ok());
  EXPECT_FALSE(PlanMemoryBudget(226 * kMiB, 2, kDefaultMaxFramePayload).ok());
  EXPECT_FALSE(PlanMemoryBudget(0, 2, kDefaultMaxFramePayload).ok());
}

}  // namespace
}  // namespace dcr
