// The signed refit manifest (docs/PROTOCOL.md §"Signed refits"): what the
// root states, under its Ed25519 key, about one refit: its id, epoch, mode,
// base and target versions, and the SHA-256 of every chunk it sent. It
// travels in END (EndMsg::manifest, EndMsg::signature) because chunks
// stream while the delta is built. A relay configured with the root's
// public key checks, before it votes, that the signature verifies, that
// the manifest is about the plan it took, and that every chunk it applied
// is listed with the same hash; otherwise it votes no (kRejected).
//
// Byte layout (little-endian, like the refit messages):
//
//   u8   version            2 (1: before parts, refused)
//   16   refit id
//   u64  epoch
//   u8   mode               1 delta, 2 full
//   u64  base step,   u64 base digest high,   u64 base digest low
//   u64  target step, u64 target digest high, u64 target digest low
//   varint count            <= kMaxManifestChunks
//   count x { u32 tensor, u32 span, u16 part, 32 bytes SHA-256 of the
//             chunk }
//
// A chunk id may appear more than once: a later repair round resends a
// span as an overwrite chunk, and the END that follows carries a manifest
// of every chunk sent so far. The signature covers kManifestSigningContext
// followed by the encoded manifest, exactly the bytes END carries.
//
// Thread safety: values and pure functions.
#ifndef DCR_PROTOCOL_REFIT_MANIFEST_H_
#define DCR_PROTOCOL_REFIT_MANIFEST_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/status.h"
#include "dcr/version.h"
#include "protocol/messages.h"
#include "wire/signature.h"

namespace dcr {

// Bytes before the first entry at most (the count's varint takes 1 to 10),
// and per entry.
inline constexpr size_t kManifestFixedBytes = 1 + 16 + 8 + 1 + 24 + 24 + 10;
inline constexpr size_t kManifestEntryBytes = 4 + 4 + 2 + kSha256Size;
// An END frame carries the manifest, so it must fit the default frame
// payload bound (256 MiB): about 6.3 million chunks. A decoder refuses a
// larger count before it allocates.
inline constexpr size_t kMaxManifestChunks = 6'000'000;
// Prepended to the manifest bytes before signing, so that a signature made
// with the root's key for anything else never verifies as a manifest.
inline constexpr std::string_view kManifestSigningContext =
    "dcr refit manifest v1\n";

struct ManifestEntry {
  ChunkId id;
  Sha256Digest sha256{};
  friend bool operator==(const ManifestEntry&, const ManifestEntry&) = default;
};

struct RefitManifest {
  RefitId refit;
  uint64_t epoch = 0;
  RefitMode mode = RefitMode::kDelta;
  Version base;
  Version target;
  std::vector<ManifestEntry> chunks;  // in the order they were sent
  friend bool operator==(const RefitManifest&, const RefitManifest&) = default;
};

// The encoded size of a manifest of `chunks` entries.
size_t ManifestEncodedSize(size_t chunks);

std::vector<std::byte> EncodeManifest(const RefitManifest& m);
// Corruption naming the field on truncated, oversized (count above
// kMaxManifestChunks or above what the bytes hold), malformed or trailing
// input.
Result<RefitManifest> DecodeManifest(std::span<const std::byte> b);

// Signs `encoded` (an EncodeManifest result) with the root's key.
Result<Ed25519Signature> SignManifest(std::span<const std::byte> encoded,
                                      const Ed25519PrivateKey& key);

// A chunk a relay applied: its id and the SHA-256 of its bytes.
struct AppliedChunk {
  ChunkId id;
  Sha256Digest sha256{};
};

// The check a relay makes at vote time. OK iff `end` carries a manifest
// and a signature, the signature verifies with `key`, the manifest is
// about this refit (`refit`, `epoch`, the plan's mode, base and target) and
// every entry of `applied` is listed with the same hash. Otherwise
// Corruption whose message says why: no signature, a bad signature, which
// field differs, or which chunk (tensor, span, hash prefix) is not listed.
Status VerifyRefitManifest(const EndMsg& end, const Ed25519PublicKey& key,
                           const RefitId& refit, uint64_t epoch,
                           const PlanMsg& plan,
                           std::span<const AppliedChunk> applied);

}  // namespace dcr

#endif  // DCR_PROTOCOL_REFIT_MANIFEST_H_
