// The small vocabulary a refit's caller and its messages share: how a refit
// moves the bits (RefitMode) and how one node fared in a phase (NodeCode).
// The wire encodes both as the u8 values below (docs/PROTOCOL.md §"Refit
// messages"); they never change meaning.
//
// Thread safety: values and pure functions.
#ifndef DCR_REFIT_CODES_H_
#define DCR_REFIT_CODES_H_

#include <cstdint>
#include <string_view>

namespace dcr {

enum class RefitMode : uint8_t {
  kDelta = 1,  // XOR chunks (overwrites on retry) against the base version
  kFull = 2,   // dense overwrite chunks of every span; the base is ignored
};

// How one node fared in a phase. Replies aggregate their subtree: a relay
// answers with its own result followed by its children's.
enum class NodeCode : uint8_t {
  kOk = 0,
  kNeedsCatchUp = 1,      // committed version is not the plan's base
  kManifestMismatch = 2,  // the store holds other tensors
  kBusy = 3,              // another refit is in progress
  kUnreachable = 4,       // its parent could not reach it
  kStoreError = 5,        // applying or persisting failed
  kDigestMismatch = 6,    // after END the bits are not the target's
  kIncomplete = 7,        // END arrived but chunks are missing
  kTimeout = 8,           // it did not answer within the phase deadline
  kRejected = 9,          // the frame or plan was refused (reason in detail)
};
// "ok", "needs catch-up", ...; "unknown" for a value outside the enum.
std::string_view NodeCodeName(NodeCode code);

}  // namespace dcr

#endif  // DCR_REFIT_CODES_H_
