#include "coord/end_signer.h"

#include <fmt/format.h>

#include <algorithm>

namespace dcr {

Result<std::unique_ptr<EndSigner>> EndSigner::Load(const std::string& key_file,
                                                   const FrameOptions& frames,
                                                   uint64_t span_elems) {
  DCR_ASSIGN_OR_RETURN(auto key, Ed25519PrivateKey::Load(key_file));
  return std::unique_ptr<EndSigner>(
      new EndSigner(std::move(key), frames, span_elems));
}

Status EndSigner::CheckFits(uint64_t chunks, uint64_t tensors,
                            uint64_t serving) const {
  // END: version, chunk count, ids digest, the target (version, a varint
  // count, a digest per tensor, flags), the serving ranks' bits, manifest
  // length (varint), the manifest, the signature.
  const uint64_t kOverhead = 1 + 8 + 16 + (24 + 10 + 16 * tensors + 1) +
                             ServingBitsBytes(serving, tensors) + 10 +
                             kManifestFixedBytes + kEd25519SignatureSize;
  uint64_t limit =
      std::min<uint64_t>(frames_.max_payload, kMaxEndManifestBytes);
  uint64_t max_chunks = std::min<uint64_t>(
      kMaxManifestChunks,
      limit > kOverhead ? (limit - kOverhead) / kManifestEntryBytes : 0);
  if (limit <= kOverhead) {
    return Status::ResourceExhausted(fmt::format(
        "a signed END names the digests of the {} tensors{}: about {} bytes, "
        "above the frame payload limit of {} bytes",
        tensors,
        serving == 0 ? ""
                     : fmt::format(" and {} serving ranks' regions", serving),
        kOverhead, limit));
  }
  if (chunks > max_chunks) {
    return Status::ResourceExhausted(fmt::format(
        "a signed refit of {} chunks needs an END of about {} bytes, above "
        "the frame payload limit of {} bytes ({} chunks at most); raise "
        "defaults.span_elems (now {})",
        chunks, kOverhead + chunks * kManifestEntryBytes, limit, max_chunks,
        span_elems_));
  }
  return Status::OK();
}

Status EndSigner::Sign(const RefitManifest& manifest, EndMsg* end) const {
  DCR_RETURN_IF_ERROR(CheckFits(manifest.chunks.size(),
                                end->target_tensor_digests.size(),
                                end->serving_target.size()));
  end->manifest = EncodeManifest(manifest);
  DCR_ASSIGN_OR_RETURN(Ed25519Signature sig,
                       SignManifest(end->manifest, *key_));
  end->signature.assign(sig.begin(), sig.end());
  return Status::OK();
}

}  // namespace dcr
