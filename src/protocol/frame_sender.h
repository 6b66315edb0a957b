// FrameSender: the one place a node builds the frames it originates. It
// fills a header (type, epoch, refit id, sequence number) and encodes it
// with the node's frame options (size bounds, authentication tag). Frames a
// node forwards are never rebuilt: they travel as received.
//
// Sequence numbers come from one counter per sender. The root numbers PLAN
// 0 and everything after it (chunks, END, votes, COMMIT) from 1 in the
// order sent, so that an adopted node can name the last frame it received
// (PlanReplyMsg::received_through). A relay numbers the frames it
// originates (replies, errors) from 0.
//
// Thread safety: Next, At and Reply may be called from several threads at
// once (the counter is atomic); set_context and set_next_sequence need
// external synchronization with every other call.
#ifndef DCR_PROTOCOL_FRAME_SENDER_H_
#define DCR_PROTOCOL_FRAME_SENDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "dcr/status.h"
#include "dcr/version.h"
#include "dcr/wire.h"
#include "protocol/messages.h"

namespace dcr {

// The refit a frame belongs to: the coordinator run's epoch and the refit
// id. Zero for frames outside a refit (HELLO, STATUS_REQUEST, ERROR).
struct FrameContext {
  uint64_t epoch = 0;
  RefitId refit;
};

class FrameSender {
 public:
  explicit FrameSender(FrameOptions options = {}, FrameContext context = {},
                       uint64_t next_sequence = 0);

  FrameSender(const FrameSender&) = delete;
  FrameSender& operator=(const FrameSender&) = delete;

  // A frame of `type` in this sender's context with the next sequence
  // number. `flags` are message-layer bits (kFrameFlagsMessageMask); wire
  // bits are the encoder's. Fails as EncodeFrame does (payload too large).
  Result<FrameBuffer> Next(FrameType type, std::span<const std::byte> payload,
                           uint16_t flags = 0);
  // The gather form of Next: the payload is the concatenation of `parts`.
  Result<FrameBuffer> NextGather(
      FrameType type, std::span<const std::span<const std::byte>> parts);
  // Two frames of `type` at one (the next) sequence number: the same
  // message in two encodings, for different receivers (the root of a tree
  // where some subtrees take context-coded chunks and others the
  // base-independent ones). Each carries its own authentication tag; the
  // counter advances once.
  Result<std::pair<FrameBuffer, FrameBuffer>> NextPair(
      FrameType type, std::span<const std::byte> first,
      std::span<const std::byte> second);
  // A frame with a given sequence number, which the counter does not
  // advance: a fan-out sends one PLAN (and the HELLO before it) at the
  // sequence its own PLAN arrived with.
  Result<FrameBuffer> At(FrameType type, uint64_t sequence,
                         std::span<const std::byte> payload,
                         uint16_t flags = 0) const;
  // A reply to the frame whose header is `about`: its epoch and refit id,
  // this sender's next sequence number.
  Result<FrameBuffer> Reply(FrameType type, const FrameHeader& about,
                            std::span<const std::byte> payload);

  const FrameContext& context() const { return context_; }
  void set_context(const FrameContext& context) { context_ = context; }
  uint64_t next_sequence() const { return next_sequence_.load(); }
  void set_next_sequence(uint64_t next) { next_sequence_.store(next); }
  const FrameOptions& options() const { return options_; }

 private:
  Result<FrameBuffer> Encode(FrameType type, uint16_t flags, uint64_t epoch,
                             const RefitId& refit, uint64_t sequence,
                             std::span<const std::byte> payload) const;

  FrameOptions options_;
  FrameContext context_;
  std::atomic<uint64_t> next_sequence_;
};

// The position of `bytes` if they are exactly one whole frame (header,
// payload, tag) whose header passes ParseFrameHeader under `options`; the
// checksum and tag are the receiver's to check. std::nullopt otherwise.
std::optional<FramePosition> WholeFramePosition(
    std::span<const std::byte> bytes, const FrameOptions& options);

}  // namespace dcr

#endif  // DCR_PROTOCOL_FRAME_SENDER_H_
