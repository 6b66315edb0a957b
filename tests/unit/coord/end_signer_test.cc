// The signed END's size bound (coord/end_signer.h): the serving ranks'
// bits at the target count toward it, and ServingBitsBytes bounds what
// they take in an encoded END.
#include "coord/end_signer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coord/sent_chunks.h"
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

// A mixed tree sends a context-coded chunk in two encodings: the manifest
// lists it once per encoding (each relay finds the bytes it applied), END
// names the id once.
TEST(SentChunksTest, AChunkSentInTwoEncodingsIsListedTwiceAndEndedOnce) {
  SentChunks sent;
  sent.set_sign(true);
  Sha256Digest a{}, b{}, c{};
  a[0] = std::byte{1};
  b[0] = std::byte{2};
  c[0] = std::byte{3};
  ChunkSizes sizes;
  sizes.changed = 5;
  sent.Add(ChunkId{0, 0, 0}, a, sizes, /*repair=*/false, &b);
  sent.Add(ChunkId{0, 1, 0}, c, sizes, /*repair=*/false);
  ASSERT_EQ(sent.manifest().size(), 3u);
  EXPECT_EQ(sent.manifest()[0].sha256, a);
  EXPECT_EQ(sent.manifest()[1].sha256, b);
  EXPECT_EQ(sent.manifest()[1].id, (ChunkId{0, 0, 0}));
  EXPECT_EQ(sent.manifest()[2].sha256, c);
  EXPECT_EQ(sent.End().chunk_count, 2u);
  EXPECT_EQ(sent.changed_elements(), 10u);
  // Unsigned: nothing listed.
  SentChunks unsigned_;
  unsigned_.Add(ChunkId{0, 0, 0}, a, sizes, false, &b);
  EXPECT_TRUE(unsigned_.manifest().empty());
}

}  // namespace
}  // namespace dcr
