#include "protocol/refit_manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/bytes.h"

namespace dcr {
namespace {

constexpr uint8_t kManifestVersion = 2;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVersion(ByteWriter* w, const Version& v) {
  w->Put<uint64_t>(v.step);
  w->Put<uint64_t>(v.digest.high);
  w->Put<uint64_t>(v.digest.low);
}

bool GetVersion(ByteReader* r, Version* v) {
  return r->Get(&v->step) && r->Get(&v->digest.high) && r->Get(&v->digest.low);
}

Status Bad(const std::string& field, const std::string& why) {
  return Status::Corruption("refit manifest." + field + ": " + why);
}

std::string VersionText(const Version& v) {
  return fmt::format("step {} ({})", v.step, v.digest.ShortHex());
}

// The bytes the signature covers: the context, then the manifest.
std::vector<std::byte> SignedBytes(std::span<const std::byte> encoded) {
  std::vector<std::byte> out;
  out.reserve(kManifestSigningContext.size() + encoded.size());
  auto ctx = std::as_bytes(std::span<const char>(
      kManifestSigningContext.data(), kManifestSigningContext.size()));
  out.insert(out.end(), ctx.begin(), ctx.end());
  out.insert(out.end(), encoded.begin(), encoded.end());
  return out;
}

}  // namespace

size_t ManifestEncodedSize(size_t chunks) {
  return kManifestFixedBytes - 10 + VarintSize(chunks) +
         chunks * kManifestEntryBytes;
}

std::vector<std::byte> EncodeManifest(const RefitManifest& m) {
  std::vector<std::byte> out;
  out.reserve(ManifestEncodedSize(m.chunks.size()));
  ByteWriter w(&out);
  w.Put<uint8_t>(kManifestVersion);
  w.PutBytes(std::as_bytes(std::span<const uint8_t>(m.refit.bytes)));
  w.Put<uint64_t>(m.epoch);
  w.Put<uint8_t>(static_cast<uint8_t>(m.mode));
  PutVersion(&w, m.base);
  PutVersion(&w, m.target);
  w.PutVarint(m.chunks.size());
  for (const ManifestEntry& e : m.chunks) {
    w.Put<uint32_t>(e.id.tensor);
    w.Put<uint32_t>(e.id.span);
    w.Put<uint16_t>(e.id.part);
    w.PutBytes(e.sha256);
  }
  return out;
}

Result<RefitManifest> DecodeManifest(std::span<const std::byte> b) {
  ByteReader r(b);
  RefitManifest m;
  uint8_t version = 0;
  if (!r.Get(&version)) return Bad("version", "empty");
  if (version != kManifestVersion) {
    return Bad("version",
               "unknown manifest version " + std::to_string(version));
  }
  std::span<const std::byte> id;
  if (!r.GetBytes(m.refit.bytes.size(), &id)) return Bad("refit", "truncated");
  std::memcpy(m.refit.bytes.data(), id.data(), id.size());
  if (!r.Get(&m.epoch)) return Bad("epoch", "truncated");
  uint8_t mode = 0;
  if (!r.Get(&mode)) return Bad("mode", "truncated");
  if (mode != 1 && mode != 2) {
    return Bad("mode", "unknown mode " + std::to_string(mode));
  }
  m.mode = static_cast<RefitMode>(mode);
  if (!GetVersion(&r, &m.base)) return Bad("base", "truncated");
  if (!GetVersion(&r, &m.target)) return Bad("target", "truncated");
  uint64_t count = 0;
  if (!r.GetVarint(&count)) return Bad("chunks", "truncated or malformed");
  if (count > kMaxManifestChunks) {
    return Bad("chunks",
               fmt::format("{} entries exceed {}", count, kMaxManifestChunks));
  }
  // Checked before allocating: the count must be what the bytes hold.
  if (count * kManifestEntryBytes != r.remaining()) {
    return Bad("chunks",
               fmt::format("{} entries need {} bytes, {} left", count,
                           count * kManifestEntryBytes, r.remaining()));
  }
  m.chunks.resize(count);
  for (ManifestEntry& e : m.chunks) {
    std::span<const std::byte> h;
    // Cannot fail: the size was checked above.
    if (!r.Get(&e.id.tensor) || !r.Get(&e.id.span) || !r.Get(&e.id.part) ||
        !r.GetBytes(kSha256Size, &h)) {
      return Bad("chunks", "truncated");
    }
    std::copy(h.begin(), h.end(), e.sha256.begin());
  }
  return m;
}

Result<Ed25519Signature> SignManifest(std::span<const std::byte> encoded,
                                      const Ed25519PrivateKey& key) {
  return key.Sign(SignedBytes(encoded));
}

Status VerifyRefitManifest(const EndMsg& end, const Ed25519PublicKey& key,
                           const RefitId& refit, uint64_t epoch,
                           const PlanMsg& plan,
                           std::span<const AppliedChunk> applied) {
  if (!end.is_signed()) {
    return Status::Corruption(
        "END carries no signed manifest, and this relay takes only refits "
        "the root signed (it has " +
        key.origin() + ")");
  }
  if (!key.Verify(SignedBytes(end.manifest), end.signature)) {
    return Status::Corruption(
        "the refit manifest's signature does not verify with the root's "
        "public key (" +
        key.origin() + ")");
  }
  DCR_ASSIGN_OR_RETURN(RefitManifest m, DecodeManifest(end.manifest));
  auto differs = [](const std::string& field, const std::string& signed_value,
                    const std::string& here) {
    return Status::Corruption(
        fmt::format("the signed manifest is for {} {}, this refit's is {}",
                    field, signed_value, here));
  };
  if (m.refit != refit) return differs("refit", m.refit.ToHex(), refit.ToHex());
  if (m.epoch != epoch) {
    return differs("epoch", std::to_string(m.epoch), std::to_string(epoch));
  }
  if (m.mode != plan.mode) {
    return differs("mode", m.mode == RefitMode::kFull ? "full" : "delta",
                   plan.mode == RefitMode::kFull ? "full" : "delta");
  }
  if (m.base != plan.base) {
    return differs("base", VersionText(m.base), VersionText(plan.base));
  }
  if (m.target != plan.target) {
    return differs("target", VersionText(m.target), VersionText(plan.target));
  }
  auto key_of = [](const ChunkId& id, const Sha256Digest& h) {
    return std::make_pair(id, h);
  };
  std::vector<std::pair<ChunkId, Sha256Digest>> listed;
  listed.reserve(m.chunks.size());
  for (const ManifestEntry& e : m.chunks)
    listed.push_back(key_of(e.id, e.sha256));
  std::sort(listed.begin(), listed.end());
  for (const AppliedChunk& a : applied) {
    if (std::binary_search(listed.begin(), listed.end(),
                           key_of(a.id, a.sha256))) {
      continue;
    }
    bool id_listed =
        std::any_of(m.chunks.begin(), m.chunks.end(),
                    [&](const ManifestEntry& e) { return e.id == a.id; });
    return Status::Corruption(fmt::format(
        "chunk ({}) applied here with SHA-256 {}... {} the signed manifest: "
        "it was not the root's",
        ChunkIdText(a.id), Sha256Hex(a.sha256, 8),
        id_listed ? "has another hash in" : "is not in"));
  }
  return Status::OK();
}

}  // namespace dcr
