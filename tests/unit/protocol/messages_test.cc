#include "protocol/messages.h"

#include <gtest/gtest.h>

#include <random>

namespace dcr {
namespace {

PlanMsg SamplePlan() {
  PlanMsg p;
  p.mode = RefitMode::kDelta;
  p.base = {4, Digest128{1, 2}};
  p.target = {5, Digest128{3, 4}};
  p.manifest = Digest128{5, 6};
  p.span_elems = 1 << 20;
  p.chunk_window_bytes = 64 << 20;
  p.phase_timeout_ms = 30000;
  // a0 -> {a1 -> {a3}, a2}
  p.nodes = {{"a0", "127.0.0.1", 17001, "tcp", -1, 0},
             {"a1", "127.0.0.1", 17002, "tcp", 0, 2000000000},
             {"a2", "127.0.0.1", 17003, "ucx", 0, 0},
             {"a3", "127.0.0.1", 17004, "tcp", 1, 200000000}};
  p.target_tensor_digests = {Digest128{11, 12}, Digest128{13, 14}};
  p.heartbeat_ms = 500;
  p.adopt = true;
  p.resume = true;
  p.sender_depth = 2;
  return p;
}

TEST(MessagesTest, RoundTripEveryMessage) {
  HelloMsg h{"a0", kRoleRelay, 7};
  EXPECT_EQ(*DecodeHello(EncodeHello(h)), h);
  PlanMsg p = SamplePlan();
  EXPECT_EQ(*DecodePlan(EncodePlan(p)), p);
  ResultsMsg r;
  r.nodes = {{"a0", NodeCode::kOk, {5, Digest128{3, 4}}, 12, "", {}, {}},
             {"a1",
              NodeCode::kNeedsCatchUp,
              {3, Digest128{9, 9}},
              0,
              "committed step 3",
              {},
              {}}};
  r.nodes[1].repair = {0, 3, 70000};
  EXPECT_EQ(*DecodeResults(EncodeResults(r)), r);
  // Repair lists ascend.
  r.nodes[1].repair = {3, 3};
  EXPECT_TRUE(DecodeResults(EncodeResults(r)).status().IsCorruption());
  EndMsg e{42, Digest128{7, 8}};
  EXPECT_EQ(*DecodeEnd(EncodeEnd(e)), e);
  CommitMsg c{{5, Digest128{3, 4}}, {"a0", "a2"}};
  EXPECT_EQ(*DecodeCommit(EncodeCommit(c)), c);
  AbortMsg a{"a1 voted no"};
  EXPECT_EQ(*DecodeAbort(EncodeAbort(a)), a);
  StreamMarkMsg m{70000};
  const auto mark = EncodeStreamMark(m);
  EXPECT_EQ(mark.size(), 5u);  // version, u32 tensor
  EXPECT_EQ(*DecodeStreamMark(mark), m);
  EXPECT_TRUE(DecodeStreamMark(std::span(mark).first(4))
                  .status()
                  .IsCorruption());  // truncated
  auto longer = mark;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(DecodeStreamMark(longer).status().IsCorruption());  // trailing
}

TEST(MessagesTest, StoreConditionIsVersion3) {
  ResultsMsg r;
  r.nodes.resize(3);
  r.nodes[0].node = "a0";
  r.nodes[1].node = "a1";
  r.nodes[1].code = NodeCode::kNeedsCatchUp;
  r.nodes[1].store.unfinished = RefitId{};
  r.nodes[1].store.unfinished->bytes[3] = 7;
  r.nodes[1].store.base = {4, Digest128{1, 2}};
  r.nodes[1].store.target = {5, Digest128{3, 4}};
  r.nodes[1].store.prepared = true;
  r.nodes[2].node = "a2";
  r.nodes[2].store.missing = true;
  auto v3 = EncodeResults(r);
  EXPECT_EQ(v3[0], std::byte{3});
  EXPECT_EQ(*DecodeResults(v3), r);
  // With a position too.
  r.received_through = FramePosition{2, 9};
  EXPECT_EQ(*DecodeResults(EncodeResults(r)), r);
  // Without a condition, the bytes stay version 2 (or 1).
  r.nodes[1].store = {};
  r.nodes[2].store = {};
  EXPECT_EQ(EncodeResults(r)[0], std::byte{2});
  // Unknown flags, and prepared without an unfinished refit, are refused.
  r.received_through.reset();
  r.nodes[2].store.missing = true;
  auto bytes = EncodeResults(r);
  // Flags of a0, a1, a2 then the position flag close the message.
  ASSERT_EQ(bytes[bytes.size() - 2], std::byte{4});
  bytes[bytes.size() - 2] = std::byte{8};
  EXPECT_TRUE(DecodeResults(bytes).status().IsCorruption());
  bytes[bytes.size() - 2] = std::byte{2};
  EXPECT_TRUE(DecodeResults(bytes).status().IsCorruption());
  bytes[bytes.size() - 2] = std::byte{4};
  bytes[bytes.size() - 1] = std::byte{2};
  EXPECT_TRUE(DecodeResults(bytes).status().IsCorruption());
  // Version 3 is only for a message with a condition (one encoding per
  // message): found by fuzz_messages.
  bytes[bytes.size() - 1] = std::byte{0};
  bytes[bytes.size() - 2] = std::byte{0};
  EXPECT_TRUE(DecodeResults(bytes).status().IsCorruption());
  const std::vector<std::byte> empty_v3 = {std::byte{3}, std::byte{0},
                                           std::byte{0}};
  EXPECT_TRUE(DecodeResults(empty_v3).status().IsCorruption());
}

TEST(MessagesTest, ResendFlagAndReceivedThrough) {
  PlanMsg p = SamplePlan();
  p.resend = true;
  auto plan = EncodePlan(p);
  EXPECT_EQ(*DecodePlan(plan), p);
  // Flags byte: adopt 1, resume 2, resend 4, context 8 (then u32
  // sender_depth).
  EXPECT_EQ(plan[plan.size() - 5], std::byte{7});
  plan[plan.size() - 5] = std::byte{16};
  EXPECT_TRUE(DecodePlan(plan).status().IsCorruption());
  // The context flag round-trips on a delta plan and is refused on a full
  // one.
  p.context_coded = true;
  p.mode = RefitMode::kDelta;
  auto ctx = EncodePlan(p);
  EXPECT_EQ(ctx[ctx.size() - 5], std::byte{15});
  EXPECT_EQ(*DecodePlan(ctx), p);
  p.mode = RefitMode::kFull;
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
  p.mode = RefitMode::kDelta;
  p.context_coded = false;

  // Without a position, RESULTS is version 1 byte for byte; with one,
  // version 2 with epoch and sequence appended.
  ResultsMsg r;
  r.nodes = {{"a0", NodeCode::kOk, {5, Digest128{3, 4}}, 12, "", {}, {}}};
  auto v1 = EncodeResults(r);
  EXPECT_EQ(v1[0], std::byte{1});
  r.received_through = FramePosition{3, 1234};
  auto v2 = EncodeResults(r);
  EXPECT_EQ(v2[0], std::byte{2});
  ASSERT_EQ(v2.size(), v1.size() + 16);
  EXPECT_TRUE(std::equal(v1.begin() + 1, v1.end(), v2.begin() + 1));
  EXPECT_EQ(*DecodeResults(v2), r);
  EXPECT_FALSE(DecodeResults(v1)->received_through);
  v2.pop_back();
  EXPECT_TRUE(DecodeResults(v2).status().IsCorruption());
  v1[0] = std::byte{3};
  EXPECT_TRUE(DecodeResults(v1).status().IsCorruption());
  EXPECT_LT((FramePosition{1, 9}), (FramePosition{2, 0}));
  EXPECT_LT((FramePosition{2, 0}), (FramePosition{2, 1}));
}

// END's digest names every id with its part, in any order given.
TEST(MessagesTest, ChunkIdsDigestCoversPartsInAnyOrder) {
  const Digest128 d = ChunkIdsDigest({{0, 1, 2}, {0, 1, 1}, {3, 0, 0}});
  EXPECT_EQ(d, ChunkIdsDigest({{3, 0, 0}, {0, 1, 1}, {0, 1, 2}}));
  EXPECT_NE(d, ChunkIdsDigest({{0, 1, 2}, {0, 1, 3}, {3, 0, 0}}));
  EXPECT_NE(ChunkIdsDigest({{0, 1, 0}}), ChunkIdsDigest({{0, 1, 1}}));
}

TEST(MessagesTest, SubPlanKeepsTheSubtree) {
  PlanMsg p = SamplePlan();
  PlanMsg s = SubPlan(p, 1);
  ASSERT_EQ(s.nodes.size(), 2u);
  EXPECT_EQ(s.nodes[0].name, "a1");
  EXPECT_EQ(s.nodes[0].parent, -1);
  EXPECT_EQ(s.nodes[1].name, "a3");
  EXPECT_EQ(s.nodes[1].parent, 0);
  EXPECT_EQ(s.target, p.target);
  EXPECT_TRUE(DecodePlan(EncodePlan(s)).ok());
  EXPECT_EQ(SubPlan(p, 2).nodes.size(), 1u);
  EXPECT_EQ(SubPlan(p, 0), p);
}

TEST(MessagesTest, NodesThatPullFromTheObjectStoreTravelInFlagBit5) {
  PlanMsg p = SamplePlan();
  const std::vector<std::byte> without = EncodePlan(p);
  p.nodes[1].pulls_objects = true;
  p.nodes[2].pulls_objects = true;
  std::vector<std::byte> with = EncodePlan(p);
  // The indices follow the rest: count 2, then 1 and 2.
  ASSERT_EQ(with.size(), without.size() + 3);
  EXPECT_EQ(with[with.size() - 3], std::byte{2});
  auto back = DecodePlan(with);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  // A sub-plan keeps the flag on the node it names, and only there.
  PlanMsg sub = SubPlan(p, 1);
  EXPECT_TRUE(sub.nodes[0].pulls_objects);
  EXPECT_FALSE(sub.nodes[1].pulls_objects);
  EXPECT_EQ(*DecodePlan(EncodePlan(sub)), sub);

  std::vector<std::byte> bad = with;
  bad.back() = std::byte{1};  // 1, 1: not increasing
  EXPECT_TRUE(DecodePlan(bad).status().IsCorruption());
  bad.back() = std::byte{4};  // no node 4
  EXPECT_TRUE(DecodePlan(bad).status().IsCorruption());
  bad = with;
  bad[bad.size() - 3] = std::byte{0};  // announced, none sent
  bad.resize(bad.size() - 2);
  EXPECT_TRUE(DecodePlan(bad).status().IsCorruption());
}

TEST(MessagesTest, RejectsMalformedPlans) {
  PlanMsg p = SamplePlan();
  p.nodes[2].parent = 3;  // a parent after its child
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
  p = SamplePlan();
  p.nodes[3].name = "a1";
  auto dup = DecodePlan(EncodePlan(p));
  EXPECT_TRUE(dup.status().IsCorruption());
  EXPECT_NE(dup.status().message().find("repeated"), std::string::npos);
  p = SamplePlan();
  p.span_elems = 0;
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
  p = SamplePlan();
  p.nodes.clear();
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
}

TEST(MessagesTest, FullPlansCarryTheManifest) {
  PlanMsg p = SamplePlan();
  p.mode = RefitMode::kFull;
  p.tensors = {{"a", DType::kBF16, {3, 4}}, {"s", DType::kF32, {}}};
  auto back = DecodePlan(EncodePlan(p));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  // Only a full refit carries tensors; a dtype must be known.
  p.mode = RefitMode::kDelta;
  auto delta = DecodePlan(EncodePlan(p));
  EXPECT_TRUE(delta.status().IsCorruption());
  EXPECT_NE(delta.status().message().find("tensors"), std::string::npos);
  p.mode = RefitMode::kFull;
  p.tensors[0].dtype = static_cast<DType>(99);
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
  p.tensors[0].dtype = DType::kBF16;
  p.tensors[0].shape.assign(kMaxTensorRank + 1, 1);
  EXPECT_TRUE(DecodePlan(EncodePlan(p)).status().IsCorruption());
}

TEST(MessagesTest, TruncationTrailingBytesAndVersion) {
  auto bytes = EncodePlan(SamplePlan());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodePlan(std::span(bytes).first(n)).ok()) << n;
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  auto s = DecodePlan(longer);
  EXPECT_NE(s.status().message().find("trailing"), std::string::npos);
  auto v3 = bytes;
  v3[0] = std::byte{3};
  EXPECT_NE(DecodePlan(v3).status().message().find("unknown message version 3"),
            std::string::npos);
}

// A PLAN whose target digest comes at END is version 2 (an older relay
// refuses it by its version), and only such a PLAN has a zero digest.
TEST(MessagesTest, PlanWithTheTargetDigestAtEndIsVersion2) {
  PlanMsg p = SamplePlan();
  p.target.digest = Digest128{};
  p.target_tensor_digests.clear();
  ASSERT_TRUE(p.target_at_end());
  auto v2 = EncodePlan(p);
  EXPECT_EQ(v2[0], std::byte{2});
  auto back = DecodePlan(v2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(EncodePlan(SamplePlan())[0], std::byte{1});
  // The same bytes as version 1: a PLAN without its target's digest.
  auto relabeled = v2;
  relabeled[0] = std::byte{1};
  EXPECT_NE(DecodePlan(relabeled).status().message().find(
                "version-1 PLAN without the target's digest"),
            std::string::npos);
  // A version 2 naming the digest, or carrying tensor digests.
  auto named = EncodePlan(SamplePlan());
  named[0] = std::byte{2};
  EXPECT_NE(DecodePlan(named).status().message().find(
                "version-2 PLAN names the target's digest"),
            std::string::npos);
  p.target_tensor_digests = {Digest128{1, 1}};
  EXPECT_NE(DecodePlan(EncodePlan(p))
                .status()
                .message()
                .find("PLAN.target_tensor_digests"),
            std::string::npos);
}

// END version 3 names the target and its tensor digests, signed or not.
TEST(MessagesTest, EndNamingTheTargetIsVersion3) {
  EndMsg e{42, Digest128{7, 8}};
  e.target = Version{5, Digest128{3, 4}};
  e.target_tensor_digests = {Digest128{11, 12}, Digest128{13, 14}};
  auto v3 = EncodeEnd(e);
  EXPECT_EQ(v3[0], std::byte{3});
  EXPECT_EQ(v3.size(), 1u + 8 + 16 + 24 + 1 + 32 + 1);
  auto back = DecodeEnd(v3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, e);
  EXPECT_FALSE(back->is_signed());

  e.manifest = std::vector<std::byte>(300, std::byte{0x5a});
  e.signature = std::vector<std::byte>(kEndSignatureBytes, std::byte{0xa5});
  auto s3 = EncodeEnd(e);
  EXPECT_EQ(s3[0], std::byte{3});
  back = DecodeEnd(s3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, e);
  EXPECT_TRUE(back->is_signed());
  for (size_t n = 0; n < s3.size(); ++n) {
    EXPECT_TRUE(DecodeEnd(std::span(s3).first(n)).status().IsCorruption()) << n;
  }
  // No digests at all is allowed (a manifest of no tensors); a zero target
  // digest and unknown flag bits are not.
  e.target_tensor_digests.clear();
  EXPECT_EQ(*DecodeEnd(EncodeEnd(e)), e);
  EndMsg zero{1, Digest128{7, 8}};
  zero.target = Version{5, Digest128{}};
  EXPECT_NE(DecodeEnd(EncodeEnd(zero))
                .status()
                .message()
                .find("END.target: no digest"),
            std::string::npos);
  auto flags = v3;
  flags.back() = std::byte{4};
  EXPECT_NE(DecodeEnd(flags).status().message().find("END.flags"),
            std::string::npos);
}

// Serving ranks' bits: PLAN carries the bases (and the targets when it
// names the target), END the targets; one entry per layout's rank.
TEST(MessagesTest, ServingBitsTravelInPlanAndEnd) {
  const ServingBits base0{Digest128{1, 9}, 0, Digest128{2, 2}, {}};
  const ServingBits base1{Digest128{1, 9}, 1, Digest128{3, 3}, {}};
  ServingBits target0{Digest128{1, 9}, 0, Digest128{4, 4}, {}};
  target0.regions = {LinearDigest{5, 6}, LinearDigest{}, LinearDigest{7, 8}};
  PlanMsg p = SamplePlan();
  p.serving_base = {base0, base1};
  p.serving_target = {target0};
  auto back = DecodePlan(EncodePlan(p));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, p);
  EXPECT_EQ(FindServing(back->serving_base, Digest128{1, 9}, 1)->bits,
            (Digest128{3, 3}));
  EXPECT_EQ(FindServing(back->serving_base, Digest128{1, 9}, 2), nullptr);
  EXPECT_EQ(FindServing(back->serving_base, Digest128{1, 8}, 0), nullptr);
  // A sub-plan keeps them.
  EXPECT_EQ(SubPlan(p, 1).serving_base, p.serving_base);
  auto refused = [](const PlanMsg& bad) {
    return std::string(DecodePlan(EncodePlan(bad)).status().message());
  };
  PlanMsg twice = p;
  twice.serving_base.push_back(base1);
  EXPECT_NE(refused(twice).find("named twice"), std::string::npos);
  PlanMsg base_regions = p;
  base_regions.serving_base[0].regions = {LinearDigest{1, 1}};
  EXPECT_NE(refused(base_regions).find("a base's entry with region digests"),
            std::string::npos);
  PlanMsg bare_target = p;
  bare_target.serving_target[0].regions.clear();
  EXPECT_NE(refused(bare_target).find("a target's entry without region"),
            std::string::npos);
  PlanMsg at_end = p;
  at_end.target.digest = Digest128{};
  at_end.target_tensor_digests.clear();
  EXPECT_NE(refused(at_end).find("serving_target: sent without the target"),
            std::string::npos);
  at_end.serving_target.clear();
  EXPECT_EQ(*DecodePlan(EncodePlan(at_end)), at_end);
  // Without serving bits the bytes are those of before.
  PlanMsg plain = p;
  plain.serving_base.clear();
  plain.serving_target.clear();
  EXPECT_EQ(EncodePlan(plain), EncodePlan(SamplePlan()));

  EndMsg e{42, Digest128{7, 8}};
  e.target = Version{5, Digest128{3, 4}};
  const auto without = EncodeEnd(e);
  e.serving_target = {target0};
  auto end = DecodeEnd(EncodeEnd(e));
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(*end, e);
  e.manifest = std::vector<std::byte>(30, std::byte{0x5a});
  e.signature = std::vector<std::byte>(kEndSignatureBytes, std::byte{0xa5});
  auto bytes = EncodeEnd(e);
  EXPECT_EQ(*DecodeEnd(bytes), e);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_TRUE(DecodeEnd(std::span(bytes).first(n)).status().IsCorruption())
        << n;
  }
  // The flag without entries is refused: an encoding is canonical.
  auto flagged = without;
  flagged.back() = std::byte{2};
  flagged.push_back(std::byte{0});
  EXPECT_NE(DecodeEnd(flagged).status().message().find("none sent"),
            std::string::npos);
}

TEST(MessagesTest, OversizedCountsAreRefusedBeforeAllocation) {
  // A results message claiming 2^40 nodes, and a 1 MiB string.
  std::vector<std::byte> b = {std::byte{1},    std::byte{0x80}, std::byte{0x80},
                              std::byte{0x80}, std::byte{0x80}, std::byte{0x80},
                              std::byte{0x20}};
  EXPECT_TRUE(DecodeResults(b).status().IsCorruption());
  std::vector<std::byte> s = {std::byte{1}, std::byte{0x80}, std::byte{0x80},
                              std::byte{0x40}};
  EXPECT_TRUE(DecodeAbort(s).status().IsCorruption());
}

TEST(MessagesTest, RandomBytesNeverCrash) {
  std::mt19937 rng(3);
  auto plan = EncodePlan(SamplePlan());
  for (int i = 0; i < 20000; ++i) {
    auto b = plan;
    for (int f = 0; f < 3; ++f) b[rng() % b.size()] = std::byte(rng());
    auto p = DecodePlan(b);
    if (p.ok()) {
      EXPECT_EQ(EncodePlan(*p), b);
    }
    (void)DecodeResults(b);
    (void)DecodeCommit(b);
    (void)DecodeHello(b);
  }
}

// END: version 1 without a manifest (the bytes of before signed refits),
// version 2 with the manifest and signature, both bounded.
TEST(MessagesTest, EndWithAndWithoutTheSignedManifest) {
  EndMsg plain{42, Digest128{7, 8}};
  auto v1 = EncodeEnd(plain);
  ASSERT_EQ(v1.size(), 1u + 8 + 16);
  EXPECT_EQ(v1[0], std::byte{1});
  EXPECT_FALSE(DecodeEnd(v1)->is_signed());

  EndMsg s = plain;
  s.manifest = std::vector<std::byte>(300, std::byte{0x5a});
  s.signature = std::vector<std::byte>(kEndSignatureBytes, std::byte{0xa5});
  auto v2 = EncodeEnd(s);
  EXPECT_EQ(v2[0], std::byte{2});
  EXPECT_EQ(v2.size(), 1u + 8 + 16 + 2 + 300 + kEndSignatureBytes);
  auto back = DecodeEnd(v2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  EXPECT_TRUE(back->is_signed());

  for (size_t n = 0; n < v2.size(); ++n) {
    EXPECT_TRUE(DecodeEnd(std::span(v2).first(n)).status().IsCorruption()) << n;
  }
  auto longer = v2;
  longer.push_back(std::byte{0});
  EXPECT_NE(DecodeEnd(longer).status().message().find("trailing"),
            std::string::npos);
  // A version-1 END followed by manifest bytes is trailing garbage, not a
  // manifest.
  auto relabeled = v2;
  relabeled[0] = std::byte{1};
  EXPECT_TRUE(DecodeEnd(relabeled).status().IsCorruption());
  auto v4 = v2;
  v4[0] = std::byte{4};
  EXPECT_NE(DecodeEnd(v4).status().message().find("unknown message version 4"),
            std::string::npos);
  // Other messages stay at version 1.
  auto hello = EncodeHello(HelloMsg{"a0", kRoleRelay, 1});
  hello[0] = std::byte{2};
  EXPECT_TRUE(DecodeHello(hello).status().IsCorruption());

  // A signed END with an empty manifest, and one declaring a manifest
  // larger than any frame, are refused before anything is allocated.
  std::vector<std::byte> empty(v1);
  empty[0] = std::byte{2};
  empty.push_back(std::byte{0});
  empty.insert(empty.end(), kEndSignatureBytes, std::byte{0});
  auto e = DecodeEnd(empty);
  EXPECT_NE(e.status().message().find("END.manifest: empty"), std::string::npos)
      << e.status().ToString();
  std::vector<std::byte> huge(v1);
  huge[0] = std::byte{2};
  for (std::byte b : {std::byte{0xff}, std::byte{0xff}, std::byte{0xff},
                      std::byte{0xff}, std::byte{0x0f}}) {
    huge.push_back(b);  // varint 2^32 - 1
  }
  auto h = DecodeEnd(huge);
  EXPECT_NE(h.status().message().find("END.manifest: 4294967295 exceeds"),
            std::string::npos)
      << h.status().ToString();
}

}  // namespace
}  // namespace dcr
