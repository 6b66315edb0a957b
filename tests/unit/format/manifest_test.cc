#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "dcr/checkpoint.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;

Manifest MustCreate(std::vector<TensorInfo> tensors) {
  Result<Manifest> m = Manifest::Create(std::move(tensors));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : Manifest();
}

TEST(ManifestTest, SortsBytewiseAndFinds) {
  Manifest m = MustCreate({{"b", DType::kF32, {2, 3}},
                           {"a.weight", DType::kBF16, {4}},
                           {"B", DType::kU8, {}},
                           {"\xc3\xa9", DType::kI64, {1}},
                           {"a", DType::kBool, {0}}});
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].name, "B");
  EXPECT_EQ(m[1].name, "a");
  EXPECT_EQ(m[2].name, "a.weight");
  EXPECT_EQ(m[3].name, "b");
  EXPECT_EQ(m[4].name, "\xc3\xa9");  // bytes >= 0x80 sort last
  EXPECT_EQ(m.Find("a.weight"), 2);
  EXPECT_EQ(m.Find("B"), 0);
  EXPECT_EQ(m.Find("c"), -1);
  EXPECT_EQ(m.Find(""), -1);
  EXPECT_EQ(m.TotalElements(), 6u + 4u + 1u + 1u + 0u);
  EXPECT_EQ(m.TotalBytes(), 24u + 8u + 1u + 8u + 0u);
}

TEST(ManifestTest, NumElements) {
  EXPECT_EQ((TensorInfo{"s", DType::kF32, {}}).NumElements(), 1u);
  EXPECT_EQ((TensorInfo{"z", DType::kF32, {3, 0, 5}}).NumElements(), 0u);
  EXPECT_EQ((TensorInfo{"m", DType::kF64, {3, 5}}).NumBytes(), 120u);
}

TEST(ManifestTest, DuplicateNameIsInvalidArgument) {
  Result<Manifest> m = Manifest::Create({{"x", DType::kF32, {1}},
                                         {"y", DType::kF32, {1}},
                                         {"x", DType::kF16, {2}}});
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsInvalidArgument());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("'x'"));
}

TEST(ManifestTest, RejectsInvalidDTypeAndOverflow) {
  Result<Manifest> bad_dtype =
      Manifest::Create({{"x", static_cast<DType>(99), {1}}});
  EXPECT_TRUE(bad_dtype.status().IsInvalidArgument());
  Result<Manifest> overflow =
      Manifest::Create({{"x", DType::kF32, {1ull << 62, 2}}});
  EXPECT_TRUE(overflow.status().IsInvalidArgument());
  EXPECT_THAT(std::string(overflow.status().message()), HasSubstr("'x'"));
}

TEST(ManifestTest, DigestMatchesDocumentedSerialization) {
  Manifest m =
      MustCreate({{"w", DType::kBF16, {2, 3}}, {"s", DType::kF32, {}}});
  Hasher128 h;
  for (const TensorInfo& t : m.tensors()) {
    h.UpdateU64(t.name.size());
    h.Update(std::string_view(t.name));
    const std::byte d{static_cast<uint8_t>(t.dtype)};
    h.Update(std::span<const std::byte>(&d, 1));
    h.UpdateU64(t.shape.size());
    for (uint64_t dim : t.shape) h.UpdateU64(dim);
  }
  EXPECT_EQ(m.digest(), h.Finish());
}

TEST(ManifestTest, DigestIsOrderIndependentAndSensitive) {
  std::vector<TensorInfo> base = {{"a", DType::kBF16, {2, 3}},
                                  {"b", DType::kF32, {4}}};
  Manifest m1 = MustCreate(base);
  Manifest m2 = MustCreate({base[1], base[0]});
  EXPECT_EQ(m1.digest(), m2.digest());
  EXPECT_EQ(Manifest::Difference(m1, m2), "");

  auto changed = [&](auto mutate) {
    std::vector<TensorInfo> t = base;
    mutate(t);
    return MustCreate(t).digest();
  };
  EXPECT_NE(changed([](auto& t) { t[0].name = "c"; }), m1.digest());
  EXPECT_NE(changed([](auto& t) { t[0].dtype = DType::kF16; }), m1.digest());
  EXPECT_NE(changed([](auto& t) { t[0].shape = {3, 2}; }), m1.digest());
  EXPECT_NE(changed([](auto& t) { t[0].shape = {6}; }), m1.digest());
  EXPECT_NE(changed([](auto& t) { t.pop_back(); }), m1.digest());
  // Name/shape boundaries cannot be confused.
  EXPECT_NE(
      MustCreate({{"ab", DType::kU8, {}}}).digest(),
      MustCreate({{"a", DType::kU8, {}}, {"b", DType::kU8, {}}}).digest());
}

TEST(ManifestTest, DifferenceNamesFirstDifference) {
  Manifest a = MustCreate({{"x", DType::kF32, {2, 3}}, {"y", DType::kU8, {}}});
  EXPECT_EQ(Manifest::Difference(a, MustCreate({{"x", DType::kF32, {3, 2}},
                                                {"y", DType::kU8, {}}})),
            "tensor 'x' has shape [2, 3] in A but [3, 2] in B");
  EXPECT_EQ(Manifest::Difference(a, MustCreate({{"x", DType::kF16, {2, 3}},
                                                {"y", DType::kU8, {}}})),
            "tensor 'x' has dtype F32 in A but F16 in B");
  EXPECT_EQ(Manifest::Difference(a, MustCreate({{"x", DType::kF32, {2, 3}}})),
            "tensor 'y' is in A but not in B");
  EXPECT_EQ(Manifest::Difference(MustCreate({{"y", DType::kU8, {}}}), a),
            "tensor 'x' is in B but not in A");
  EXPECT_EQ(Manifest::Difference(a, a), "");
}

TEST(ManifestTest, VersionDigestCoversManifestAndEveryTensor) {
  const Digest128 m{1, 2};
  const std::vector<Digest128> t = {{3, 4}, {5, 6}};
  const Digest128 v = VersionDigest(m, t);
  Hasher128 h;
  h.Update(m);
  h.Update(t[0]);
  h.Update(t[1]);
  EXPECT_EQ(v, h.Finish());
  EXPECT_NE(VersionDigest(Digest128{1, 3}, t), v);
  const std::vector<Digest128> swapped = {t[1], t[0]};
  EXPECT_NE(VersionDigest(m, swapped), v);
}

// Manifests come from checkpoints, delta files and PLANs alike: a name with
// a control character is refused wherever it comes from, shown escaped.
TEST(ManifestTest, RejectsControlCharactersInNames) {
  using namespace std::string_literals;
  Result<Manifest> m =
      Manifest::Create({{"ok", DType::kF32, {1}}, {"a\0b"s, DType::kF32, {1}}});
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsInvalidArgument());
  const std::string msg(m.status().message());
  EXPECT_EQ(msg.find('\0'), std::string::npos);
  EXPECT_THAT(msg, HasSubstr(R"(tensor 'a\x00b')"));
  EXPECT_THAT(msg, HasSubstr("control character"));
  EXPECT_FALSE(Manifest::Create({{"tab\there", DType::kF32, {1}}}).ok());
  EXPECT_TRUE(Manifest::Create({{"gewicht_ä", DType::kF32, {1}}}).ok());
}

}  // namespace
}  // namespace dcr
