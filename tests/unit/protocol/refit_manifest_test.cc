// The signed refit manifest: its encoding (bounded, exact) and the check a
// relay makes at vote time (signature, refit binding, applied chunks).
#include "protocol/refit_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace dcr {
namespace {

using ::testing::HasSubstr;

Sha256Digest HashOf(int seed) {
  std::vector<std::byte> b(100, static_cast<std::byte>(seed));
  return Sha256(b);
}

RefitManifest SampleManifest() {
  RefitManifest m;
  for (size_t i = 0; i < m.refit.bytes.size(); ++i) m.refit.bytes[i] = i + 1;
  m.epoch = 7;
  m.mode = RefitMode::kDelta;
  m.base = {4, Digest128{1, 2}};
  m.target = {5, Digest128{3, 4}};
  // (0, 1) twice: a repair round resent it as an overwrite.
  m.chunks = {{{0, 0}, HashOf(1)},
              {{0, 1}, HashOf(2)},
              {{2, 9, 4}, HashOf(3)},  // a producer's part
              {{0, 1}, HashOf(4)}};
  return m;
}

PlanMsg PlanFor(const RefitManifest& m) {
  PlanMsg p;
  p.mode = m.mode;
  p.base = m.base;
  p.target = m.target;
  p.span_elems = 1 << 20;
  p.nodes = {{"a0", "127.0.0.1", 17001, "tcp", -1}};
  return p;
}

std::unique_ptr<Ed25519PrivateKey> NewKey() {
  auto k = Ed25519PrivateKey::Generate();
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return *std::move(k);
}

std::unique_ptr<Ed25519PublicKey> PublicOf(const Ed25519PrivateKey& k) {
  auto pem = k.PublicPem();
  EXPECT_TRUE(pem.ok());
  auto p = Ed25519PublicKey::FromPem(*pem, "test key");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *std::move(p);
}

EndMsg SignedEnd(const RefitManifest& m, const Ed25519PrivateKey& k) {
  EndMsg end(m.chunks.size(), Digest128{9, 9});
  end.manifest = EncodeManifest(m);
  auto sig = SignManifest(end.manifest, k);
  EXPECT_TRUE(sig.ok()) << sig.status().ToString();
  end.signature.assign(sig->begin(), sig->end());
  return end;
}

TEST(RefitManifestTest, RoundTripAndSize) {
  RefitManifest m = SampleManifest();
  auto bytes = EncodeManifest(m);
  EXPECT_EQ(bytes.size(), ManifestEncodedSize(m.chunks.size()));
  EXPECT_EQ(bytes.size(), 74u + 1 + 4 * kManifestEntryBytes);
  auto back = DecodeManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  RefitManifest empty = m;
  empty.chunks.clear();
  EXPECT_EQ(*DecodeManifest(EncodeManifest(empty)), empty);
  // The documented capacity of one END frame.
  EXPECT_LE(ManifestEncodedSize(kMaxManifestChunks) + 128,
            size_t{kMaxEndManifestBytes});
}

TEST(RefitManifestTest, TruncatedTrailingOversizedAndMalformed) {
  auto bytes = EncodeManifest(SampleManifest());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = DecodeManifest(std::span(bytes).first(n));
    EXPECT_TRUE(r.status().IsCorruption()) << n;
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT(DecodeManifest(longer).status().message(),
              HasSubstr("4 entries need 168 bytes, 169 left"));
  auto version = bytes;
  version[0] = std::byte{1};  // before chunk parts
  EXPECT_THAT(DecodeManifest(version).status().message(),
              HasSubstr("unknown manifest version 1"));
  auto mode = bytes;
  mode[1 + 16 + 8] = std::byte{3};
  EXPECT_THAT(DecodeManifest(mode).status().message(),
              HasSubstr("unknown mode 3"));
  // A count above the bound is refused before allocating, whatever follows.
  RefitManifest m = SampleManifest();
  m.chunks.clear();
  auto head = EncodeManifest(m);
  head.pop_back();  // the count 0
  for (std::byte b : {std::byte{0x80}, std::byte{0x80}, std::byte{0x80},
                      std::byte{0x80}, std::byte{0x10}}) {
    head.push_back(b);  // 2^32
  }
  EXPECT_THAT(DecodeManifest(head).status().message(),
              HasSubstr("exceed " + std::to_string(kMaxManifestChunks)));
  // Random damage never crashes and never decodes into something else
  // than what re-encodes to the same bytes.
  std::mt19937 rng(5);
  for (int i = 0; i < 5000; ++i) {
    auto b = bytes;
    b[rng() % b.size()] = std::byte(rng());
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    auto r = DecodeManifest(b);
    if (r.ok()) {
      EXPECT_EQ(EncodeManifest(*r), b);
    }
  }
}

TEST(RefitManifestTest, SignedManifestVerifies) {
  auto key = NewKey();
  auto pub = PublicOf(*key);
  RefitManifest m = SampleManifest();
  EndMsg end = SignedEnd(m, *key);
  std::vector<AppliedChunk> applied = {
      {{0, 0}, HashOf(1)}, {{0, 1}, HashOf(2)}, {{0, 1}, HashOf(4)}};
  EXPECT_TRUE(
      VerifyRefitManifest(end, *pub, m.refit, m.epoch, PlanFor(m), applied)
          .ok());
  // Nothing applied (a relay that got no chunk) is fine too.
  EXPECT_TRUE(
      VerifyRefitManifest(end, *pub, m.refit, m.epoch, PlanFor(m), {}).ok());
  // END survives its own encoding.
  auto back = DecodeEnd(EncodeEnd(end));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(
      VerifyRefitManifest(*back, *pub, m.refit, m.epoch, PlanFor(m), applied)
          .ok());
}

TEST(RefitManifestTest, EveryMismatchIsNamed) {
  auto key = NewKey();
  auto pub = PublicOf(*key);
  RefitManifest m = SampleManifest();
  EndMsg end = SignedEnd(m, *key);
  PlanMsg plan = PlanFor(m);
  auto why = [&](const EndMsg& e, const Ed25519PublicKey& k,
                 const RefitId& refit, uint64_t epoch, const PlanMsg& p,
                 std::vector<AppliedChunk> applied) {
    Status s = VerifyRefitManifest(e, k, refit, epoch, p, applied);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    return std::string(s.message());
  };

  EndMsg unsigned_end(4, Digest128{9, 9});
  EXPECT_THAT(why(unsigned_end, *pub, m.refit, m.epoch, plan, {}),
              HasSubstr("END carries no signed manifest"));

  // Another key, a damaged signature, a manifest changed after signing.
  auto other = PublicOf(*NewKey());
  EXPECT_THAT(why(end, *other, m.refit, m.epoch, plan, {}),
              HasSubstr("signature does not verify"));
  EndMsg bad_sig = end;
  bad_sig.signature[10] ^= std::byte{1};
  EXPECT_THAT(why(bad_sig, *pub, m.refit, m.epoch, plan, {}),
              HasSubstr("signature does not verify"));
  EndMsg edited = end;
  edited.manifest.back() ^= std::byte{1};
  EXPECT_THAT(why(edited, *pub, m.refit, m.epoch, plan, {}),
              HasSubstr("signature does not verify"));

  // Signed, but for another refit, epoch, mode, base or target.
  RefitId other_refit = m.refit;
  other_refit.bytes[0] ^= 1;
  EXPECT_THAT(why(end, *pub, other_refit, m.epoch, plan, {}),
              HasSubstr("for refit " + m.refit.ToHex()));
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch + 1, plan, {}),
              HasSubstr("for epoch 7, this refit's is 8"));
  PlanMsg p = plan;
  p.mode = RefitMode::kFull;
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, p, {}),
              HasSubstr("for mode delta, this refit's is full"));
  p = plan;
  p.base.step = 3;
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, p, {}), HasSubstr("for base"));
  p = plan;
  p.target.digest.low ^= 1;
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, p, {}), HasSubstr("for target"));

  // A chunk applied with a hash the root did not sign, and one the root
  // never sent.
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, plan,
                  {{{0, 0}, HashOf(1)}, {{2, 9, 4}, HashOf(5)}}),
              HasSubstr("chunk (tensor 2, span 9, part 4) applied here with "
                        "SHA-256 " +
                        Sha256Hex(HashOf(5), 8) +
                        "... has another hash in the signed manifest"));
  EXPECT_THAT(
      why(end, *pub, m.refit, m.epoch, plan, {{{1, 0}, HashOf(1)}}),
      HasSubstr("chunk (tensor 1, span 0) applied here with SHA-256 " +
                Sha256Hex(HashOf(1), 8) + "... is not in the signed manifest"));
  // The hash of one chunk does not vouch for another id, nor one part's
  // for another part of its span.
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, plan, {{{2, 9, 3}, HashOf(3)}}),
              HasSubstr("(tensor 2, span 9, part 3) applied here"));
  EXPECT_THAT(why(end, *pub, m.refit, m.epoch, plan, {{{0, 0}, HashOf(2)}}),
              HasSubstr("(tensor 0, span 0)"));
}

}  // namespace
}  // namespace dcr
