// Helpers shared by the frame encoder, parser and decoder.
#ifndef DCR_WIRE_FRAME_INTERNAL_H_
#define DCR_WIRE_FRAME_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "dcr/status.h"
#include "dcr/wire.h"

namespace dcr::wire_internal {

// Byte offsets of the header fields (the table in dcr/wire.h).
inline constexpr size_t kOffMagic = 0;
inline constexpr size_t kOffVersion = 4;
inline constexpr size_t kOffType = 5;
inline constexpr size_t kOffFlags = 6;
inline constexpr size_t kOffLength = 8;
inline constexpr size_t kOffReserved = 12;
inline constexpr size_t kOffEpoch = 16;
inline constexpr size_t kOffSequence = 24;
inline constexpr size_t kOffRefitId = 32;
inline constexpr size_t kOffChecksum = 48;
static_assert(kOffChecksum + 8 == kFrameHeaderSize);
static_assert(kFrameHeaderSize % 8 == 0);

// XXH3-64 of header bytes [0, kOffChecksum) followed by `payload`.
uint64_t FrameChecksum(std::span<const std::byte> header,
                       std::span<const std::byte> payload);

// Checks the checksum (and the tag when options carry an authenticator) of
// a frame whose header already passed ParseFrameHeader and whose bytes are
// all in `bytes`; returns views into `bytes`.
Result<Frame> CheckFrameBody(const ParsedFrameHeader& parsed,
                             std::span<const std::byte> bytes,
                             const FrameOptions& options);

}  // namespace dcr::wire_internal

#endif  // DCR_WIRE_FRAME_INTERNAL_H_
