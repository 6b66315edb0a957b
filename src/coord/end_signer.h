// Signed refits at the root (docs/PROTOCOL.md §"Signed refits"): with
// root.signing_key_file, END carries the refit manifest (every chunk sent
// and its SHA-256) signed with the root's Ed25519 key. The manifest must
// fit in one END frame: CheckFits refuses a refit that would not, before
// any relay is asked.
//
// Thread safety: const methods may run concurrently.
#ifndef DCR_COORD_END_SIGNER_H_
#define DCR_COORD_END_SIGNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/transport.h"
#include "protocol/messages.h"
#include "protocol/refit_manifest.h"
#include "wire/signature.h"

namespace dcr {

class EndSigner {
 public:
  // Loads the key. `frames` bounds END's payload; `span_elems` is named in
  // the error that suggests a larger span.
  static Result<std::unique_ptr<EndSigner>> Load(const std::string& key_file,
                                                 const FrameOptions& frames,
                                                 uint64_t span_elems);

  // ResourceExhausted when a manifest of `chunks` entries would not fit in
  // one END frame beside the digests of `tensors` tensors and `serving`
  // ranks' bits at the target (ServingBitsBytes).
  Status CheckFits(uint64_t chunks, uint64_t tensors,
                   uint64_t serving = 0) const;
  // At most the bytes END takes for `ranks` serving ranks' bits at the
  // target, each with `tensors` region digests.
  static uint64_t ServingBitsBytes(uint64_t ranks, uint64_t tensors) {
    return ranks == 0 ? 0 : 10 + ranks * (16 + 4 + 16 + 10 + 16 * tensors);
  }

  // Puts `manifest` (its chunks the ones sent, in order), encoded and
  // signed, into `end` (its target already set, if it names one).
  // ResourceExhausted as CheckFits.
  Status Sign(const RefitManifest& manifest, EndMsg* end) const;

 private:
  EndSigner(std::unique_ptr<Ed25519PrivateKey> key, const FrameOptions& frames,
            uint64_t span_elems)
      : key_(std::move(key)), frames_(frames), span_elems_(span_elems) {}

  std::unique_ptr<Ed25519PrivateKey> key_;
  FrameOptions frames_;
  uint64_t span_elems_;
};

}  // namespace dcr

#endif  // DCR_COORD_END_SIGNER_H_
