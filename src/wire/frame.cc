// Frame types, encoding and whole-frame parsing (layout in dcr/wire.h).
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>
#include <string>

#include "common/bytes.h"
#include "dcr/wire.h"
#include "wire/frame_internal.h"

namespace dcr {

using namespace wire_internal;  // NOLINT: offsets of this module's layout

bool IsKnownFrameType(uint8_t type) {
  return type >= 1 && type <= kMaxFrameType;
}

std::string FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kPlan:
      return "PLAN";
    case FrameType::kPlanReply:
      return "PLAN_REPLY";
    case FrameType::kChunk:
      return "CHUNK";
    case FrameType::kEnd:
      return "END";
    case FrameType::kVote:
      return "VOTE";
    case FrameType::kCommit:
      return "COMMIT";
    case FrameType::kCommitReply:
      return "COMMIT_REPLY";
    case FrameType::kAbort:
      return "ABORT";
    case FrameType::kAbortReply:
      return "ABORT_REPLY";
    case FrameType::kStatusRequest:
      return "STATUS_REQUEST";
    case FrameType::kStatusReply:
      return "STATUS_REPLY";
    case FrameType::kHeartbeat:
      return "HEARTBEAT";
    case FrameType::kResendRequest:
      return "RESEND_REQUEST";
    case FrameType::kError:
      return "ERROR";
    case FrameType::kProducerHello:
      return "PRODUCER_HELLO";
    case FrameType::kProducerGo:
      return "PRODUCER_GO";
    case FrameType::kProducerDone:
      return "PRODUCER_DONE";
    case FrameType::kProducerDecision:
      return "PRODUCER_DECISION";
    case FrameType::kProducerBaseline:
      return "PRODUCER_BASELINE";
    case FrameType::kStreamMark:
      return "STREAM_MARK";
  }
  return "UNKNOWN(" + std::to_string(static_cast<unsigned>(type)) + ")";
}

size_t ParsedFrameHeader::frame_size() const {
  return kFrameHeaderSize + payload_length +
         ((header.flags & kFrameFlagAuthTag) ? kAuthTagSize : 0);
}

namespace wire_internal {

uint64_t FrameChecksum(std::span<const std::byte> header,
                       std::span<const std::byte> payload) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header.data(), kOffChecksum);
  XXH3_64bits_update(&state, payload.data(), payload.size());
  return XXH3_64bits_digest(&state);
}

namespace {

std::string Describe(const ParsedFrameHeader& p) {
  return FrameTypeName(p.header.type) + " frame (sequence " +
         std::to_string(p.header.sequence) + ", " +
         std::to_string(p.payload_length) + "-byte payload)";
}

}  // namespace

Result<Frame> CheckFrameBody(const ParsedFrameHeader& parsed,
                             std::span<const std::byte> bytes,
                             const FrameOptions& options) {
  const bool tagged = (parsed.header.flags & kFrameFlagAuthTag) != 0;
  Frame f;
  f.header = parsed.header;
  f.checksum = parsed.checksum;
  f.bytes = bytes;
  f.payload = bytes.subspan(kFrameHeaderSize, parsed.payload_length);
  if (tagged) {
    f.auth_tag =
        bytes.subspan(kFrameHeaderSize + parsed.payload_length, kAuthTagSize);
  }
  if (FrameChecksum(bytes.first(kFrameHeaderSize), f.payload) !=
      parsed.checksum) {
    return Status::Corruption("checksum mismatch in " + Describe(parsed));
  }
  if (options.authenticator) {
    if (!tagged) {
      return Status::Corruption("missing authentication tag in " +
                                Describe(parsed));
    }
    std::span<const std::byte, kAuthTagSize> tag(f.auth_tag.data(),
                                                 kAuthTagSize);
    if (!options.authenticator->Verify(
            bytes.first(kFrameHeaderSize + parsed.payload_length), tag)) {
      return Status::Corruption("authentication tag mismatch in " +
                                Describe(parsed));
    }
  }
  return f;
}

}  // namespace wire_internal

Result<FrameBuffer> EncodeFrameGather(
    const FrameHeader& header,
    std::span<const std::span<const std::byte>> parts,
    const FrameOptions& options) {
  if ((header.flags & kFrameFlagsWireMask) != 0) {
    return Status::InvalidArgument(
        "frame flags " + std::to_string(header.flags) +
        " set wire-layer bits; only message-layer bits (0xff00) are the "
        "caller's");
  }
  if (!IsKnownFrameType(static_cast<uint8_t>(header.type))) {
    return Status::InvalidArgument("unknown frame type " +
                                   FrameTypeName(header.type));
  }
  uint64_t length = 0;
  for (const auto& p : parts) length += p.size();
  if (length > options.max_payload) {
    return Status::ResourceExhausted(
        FrameTypeName(header.type) + " payload of " + std::to_string(length) +
        " bytes exceeds the frame limit of " +
        std::to_string(options.max_payload) + " bytes");
  }
  const bool tagged = options.authenticator != nullptr;
  const uint16_t flags =
      static_cast<uint16_t>(header.flags | (tagged ? kFrameFlagAuthTag : 0));
  auto buf = std::make_shared<std::vector<std::byte>>(
      kFrameHeaderSize + length + (tagged ? kAuthTagSize : 0));
  std::byte* h = buf->data();
  std::memcpy(h + kOffMagic, kFrameMagic.data(), kFrameMagic.size());
  StoreLE<uint8_t>(h + kOffVersion, kFrameVersion);
  StoreLE<uint8_t>(h + kOffType, static_cast<uint8_t>(header.type));
  StoreLE<uint16_t>(h + kOffFlags, flags);
  StoreLE<uint32_t>(h + kOffLength, static_cast<uint32_t>(length));
  StoreLE<uint32_t>(h + kOffReserved, 0);
  StoreLE<uint64_t>(h + kOffEpoch, header.epoch);
  StoreLE<uint64_t>(h + kOffSequence, header.sequence);
  std::memcpy(h + kOffRefitId, header.refit_id.bytes.data(), 16);
  std::byte* out = h + kFrameHeaderSize;
  for (const auto& p : parts) {
    if (!p.empty()) std::memcpy(out, p.data(), p.size());
    out += p.size();
  }
  std::span<const std::byte> all(*buf);
  StoreLE<uint64_t>(h + kOffChecksum,
                    FrameChecksum(all.first(kFrameHeaderSize),
                                  all.subspan(kFrameHeaderSize, length)));
  if (tagged) {
    options.authenticator->Sign(
        all.first(kFrameHeaderSize + length),
        std::span<std::byte, kAuthTagSize>(out, kAuthTagSize));
  }
  return FrameBuffer(std::move(buf));
}

Result<FrameBuffer> EncodeFrame(const FrameHeader& header,
                                std::span<const std::byte> payload,
                                const FrameOptions& options) {
  std::span<const std::byte> parts[1] = {payload};
  return EncodeFrameGather(header, parts, options);
}

Result<ParsedFrameHeader> ParseFrameHeader(
    std::span<const std::byte, kFrameHeaderSize> header,
    const FrameOptions& options) {
  const std::byte* h = header.data();
  if (std::memcmp(h + kOffMagic, kFrameMagic.data(), kFrameMagic.size()) != 0) {
    return Status::Corruption("bad frame magic (not a dcr frame)");
  }
  const auto version = LoadLE<uint8_t>(h + kOffVersion);
  if (version != kFrameVersion) {
    return Status::Corruption("unsupported frame version " +
                              std::to_string(version) + " (this build speaks " +
                              std::to_string(kFrameVersion) + ")");
  }
  const auto type = LoadLE<uint8_t>(h + kOffType);
  if (!IsKnownFrameType(type)) {
    return Status::Corruption("unknown frame type " + std::to_string(type));
  }
  const auto flags = LoadLE<uint16_t>(h + kOffFlags);
  if ((flags & kFrameFlagsWireMask & ~kFrameFlagAuthTag) != 0) {
    return Status::Corruption("unknown wire flags in frame header: " +
                              std::to_string(flags));
  }
  if (LoadLE<uint32_t>(h + kOffReserved) != 0) {
    return Status::Corruption("nonzero reserved field in frame header");
  }
  const auto length = LoadLE<uint32_t>(h + kOffLength);
  if (length > options.max_payload) {
    return Status::Corruption("frame payload length " + std::to_string(length) +
                              " exceeds the limit of " +
                              std::to_string(options.max_payload) + " bytes");
  }
  ParsedFrameHeader p;
  p.header.type = static_cast<FrameType>(type);
  p.header.flags = flags;
  p.header.epoch = LoadLE<uint64_t>(h + kOffEpoch);
  p.header.sequence = LoadLE<uint64_t>(h + kOffSequence);
  std::memcpy(p.header.refit_id.bytes.data(), h + kOffRefitId, 16);
  p.payload_length = length;
  p.checksum = LoadLE<uint64_t>(h + kOffChecksum);
  return p;
}

Result<Frame> ParseFrame(std::span<const std::byte> bytes,
                         const FrameOptions& options) {
  if (bytes.size() < kFrameHeaderSize) {
    return Status::Corruption(
        "truncated frame header: " + std::to_string(bytes.size()) + " of " +
        std::to_string(kFrameHeaderSize) + " bytes");
  }
  DCR_ASSIGN_OR_RETURN(
      ParsedFrameHeader parsed,
      ParseFrameHeader(bytes.first<kFrameHeaderSize>(), options));
  if (bytes.size() != parsed.frame_size()) {
    return Status::Corruption("frame size mismatch: header declares " +
                              std::to_string(parsed.frame_size()) +
                              " bytes, got " + std::to_string(bytes.size()));
  }
  return CheckFrameBody(parsed, bytes, options);
}

}  // namespace dcr
