// The signed END's size bound (coord/end_signer.h): the serving ranks'
// bits at the target count toward it, and ServingBitsBytes bounds what
// they take in an encoded END.
#include "coord/end_signer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/temp_dir.h"
#include "wire/signature.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

TEST(EndSignerTest, ServingRanksCountTowardTheEndBound) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteNewKeyPair(dir.Path("root.key"), dir.Path("root.pub")).ok());
  FrameOptions frames;
  frames.max_payload = 1u << 20;
  auto signer = EndSigner::Load(dir.Path("root.key"), frames, 1024);
  ASSERT_TRUE(signer.ok()) << signer.status().ToString();
  // 10,000 tensors' digests take 160 KB of the 1 MiB frame; 8 serving
  // ranks' regions take 1.28 MB more.
  EXPECT_TRUE((*signer)->CheckFits(100, 10000).ok());
  EXPECT_TRUE((*signer)->CheckFits(100, 10000, 2).ok());
  Status s = (*signer)->CheckFits(100, 10000, 8);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.ToString(), HasSubstr("and 8 serving ranks' regions"));

  EndMsg end{1, Digest128{1, 2}};
  end.target = Version{3, Digest128{4, 5}};
  const size_t plain = EncodeEnd(end).size();
  for (uint32_t r = 0; r < 3; ++r) {
    ServingBits b{Digest128{9, 9}, r, Digest128{r, 1}, {}};
    b.regions.assign(50, LinearDigest{7, 7});
    end.serving_target.push_back(std::move(b));
  }
  const size_t with = EncodeEnd(end).size();
  EXPECT_GT(with - plain, 3u * 50 * 16);
  EXPECT_LE(with - plain, EndSigner::ServingBitsBytes(3, 50));
  EXPECT_EQ(EndSigner::ServingBitsBytes(0, 50), 0u);
}

}  // namespace
}  // namespace dcr
