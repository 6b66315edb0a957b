// The relay's forward path under its failpoints: a CHUNK goes to every
// child as received, or, when the relay.forward failpoint fires, dropped,
// damaged, forged or cut (tests/process fault matrix). DCR_FAILPOINT sites
// stay in release binaries; with no failpoint armed ForwardChunk is
// Fanout::Forward.
//
// Thread safety: the relay's actor thread (Fanout is not thread-safe).
#ifndef DCR_RELAY_CHUNK_FORWARD_H_
#define DCR_RELAY_CHUNK_FORWARD_H_

#include <cstddef>
#include <span>

#include "common/failpoint.h"
#include "dcr/transport.h"
#include "protocol/fanout.h"

namespace dcr {

// A damaged copy of `bytes` for a corrupt failpoint: the original buffer is
// shared with the other children's queues and is never written.
FrameBuffer CorruptedCopy(std::span<const std::byte> bytes,
                          const FailpointHit& fp);

// Forwards a CHUNK to the children as the relay.forward failpoint says: as
// is, not at all (drop), a damaged copy (corrupt), a forged chunk (forge;
// `frames` keys it), or its first bytes and then every child link closed
// (cut). A damaged or cut chunk is a fault in this node's forward path: not
// kept for resends either (the repair round covers it). Returns the chunk
// sends.
size_t ForwardChunk(Fanout& fanout, const FrameBuffer& frame,
                    const FailpointHit& fp, const FrameOptions& frames);

}  // namespace dcr

#endif  // DCR_RELAY_CHUNK_FORWARD_H_
