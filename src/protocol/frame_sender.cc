#include "protocol/frame_sender.h"

#include <utility>

namespace dcr {

FrameSender::FrameSender(FrameOptions options, FrameContext context,
                         uint64_t next_sequence)
    : options_(std::move(options)),
      context_(context),
      next_sequence_(next_sequence) {}

Result<FrameBuffer> FrameSender::Encode(
    FrameType type, uint16_t flags, uint64_t epoch, const RefitId& refit,
    uint64_t sequence, std::span<const std::byte> payload) const {
  FrameHeader h;
  h.type = type;
  h.flags = flags & kFrameFlagsMessageMask;
  h.epoch = epoch;
  h.refit_id = refit;
  h.sequence = sequence;
  return EncodeFrame(h, payload, options_);
}

Result<FrameBuffer> FrameSender::Next(FrameType type,
                                      std::span<const std::byte> payload,
                                      uint16_t flags) {
  return Encode(type, flags, context_.epoch, context_.refit,
                next_sequence_.fetch_add(1), payload);
}

Result<FrameBuffer> FrameSender::NextGather(
    FrameType type, std::span<const std::span<const std::byte>> parts) {
  FrameHeader h;
  h.type = type;
  h.epoch = context_.epoch;
  h.refit_id = context_.refit;
  h.sequence = next_sequence_.fetch_add(1);
  return EncodeFrameGather(h, parts, options_);
}

Result<std::pair<FrameBuffer, FrameBuffer>> FrameSender::NextPair(
    FrameType type, std::span<const std::byte> first,
    std::span<const std::byte> second) {
  const uint64_t sequence = next_sequence_.fetch_add(1);
  DCR_ASSIGN_OR_RETURN(FrameBuffer a, Encode(type, 0, context_.epoch,
                                             context_.refit, sequence, first));
  DCR_ASSIGN_OR_RETURN(FrameBuffer b, Encode(type, 0, context_.epoch,
                                             context_.refit, sequence, second));
  return std::make_pair(std::move(a), std::move(b));
}

Result<FrameBuffer> FrameSender::At(FrameType type, uint64_t sequence,
                                    std::span<const std::byte> payload,
                                    uint16_t flags) const {
  return Encode(type, flags, context_.epoch, context_.refit, sequence, payload);
}

Result<FrameBuffer> FrameSender::Reply(FrameType type, const FrameHeader& about,
                                       std::span<const std::byte> payload) {
  return Encode(type, 0, about.epoch, about.refit_id,
                next_sequence_.fetch_add(1), payload);
}

std::optional<FramePosition> WholeFramePosition(
    std::span<const std::byte> bytes, const FrameOptions& options) {
  if (bytes.size() < kFrameHeaderSize) return std::nullopt;
  auto parsed = ParseFrameHeader(bytes.first<kFrameHeaderSize>(), options);
  if (!parsed.ok() || parsed->frame_size() != bytes.size()) {
    return std::nullopt;
  }
  return FramePosition{parsed->header.epoch, parsed->header.sequence};
}

}  // namespace dcr
