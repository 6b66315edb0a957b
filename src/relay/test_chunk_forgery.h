// Test-only: the forgery behind the relay.forward failpoint's `forge`
// action (tests/process fault matrix, signing tests). It shows what a relay
// that holds the hop key but not the root's signing key can make, so that
// the tests can check that signed refits refuse it. Nothing outside a
// failpoint calls it.
//
// Thread safety: a pure function; it makes its codec contexts per call (a
// test hook, off the data path).
#ifndef DCR_RELAY_TEST_CHUNK_FORGERY_H_
#define DCR_RELAY_TEST_CHUNK_FORGERY_H_

#include "dcr/transport.h"

namespace dcr {

// A well-formed forgery of the CHUNK frame `frame`: the chunk decoded, the
// low bit of its first value flipped, re-encoded with a valid chunk
// checksum and framed (tagged with `options`' frame key) as the original
// was. Null if the frame is not a chunk that decodes.
FrameBuffer TEST_ForgeChunkFrame(const FrameBuffer& frame,
                                 const FrameOptions& options);

}  // namespace dcr

#endif  // DCR_RELAY_TEST_CHUNK_FORGERY_H_
