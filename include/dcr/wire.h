// Frames: the unit every dcr link carries, and an I/O-free decoder for them.
//
// A frame is a fixed 56-byte little-endian header, `payload length` bytes of
// payload and, iff the header's kFrameFlagAuthTag flag is set, a 32-byte
// authentication tag:
//
//   offset size field
//        0    4 magic "DCRF"
//        4    1 version (kFrameVersion = 4)
//        5    1 type (FrameType)
//        6    2 flags (kFrameFlag...)
//        8    4 payload length L, at most the receiver's max_payload
//       12    4 reserved, zero (keeps the header 8-byte aligned)
//       16    8 epoch: the coordinator run that produced the frame
//       24    8 sequence: numbered by the frame's originator (below)
//       32   16 refit id (all zero for frames outside a refit)
//       48    8 checksum: XXH3-64 (seed 0) of bytes [0, 48) then the payload
//       56    L payload (meaning defined by the relay, per type)
//     56+L   32 authentication tag, iff flags & kFrameFlagAuthTag; computed
//              by a FrameAuthenticator over bytes [0, 56 + L)
//
// Frames are forwarded verbatim: a relay passes the bytes it received (one
// FrameBuffer shared by every child's queue) to its children, so the
// checksum and tag stay valid and no per-link field is rewritten. The
// sequence number therefore names a frame end to end: the originator (the
// root for PLAN, CHUNK, END, COMMIT, ABORT; a relay for the frames it
// creates itself, such as VOTE) numbers its frames of one refit 0, 1, 2, ...
// and receivers detect duplicates and gaps by (refit id, sequence).
//
// docs/PROTOCOL.md is the reference for the layout and its rules.
//
// Thread safety: the functions are thread-safe. A FrameDecoder is not; use
// one per link direction. A FrameBuffer is immutable and may be shared by
// any number of threads.
#ifndef DCR_WIRE_H_
#define DCR_WIRE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/status.h"
#include "dcr/version.h"  // RefitId

namespace dcr {

inline constexpr size_t kFrameHeaderSize = 56;
inline constexpr std::array<std::byte, 4> kFrameMagic = {
    std::byte{'D'}, std::byte{'C'}, std::byte{'R'}, std::byte{'F'}};
// 2: versions are named by linear tensor digests (dcr/digest.h); a build
// of version 1 computes XXH3 digests, so the two refuse each other's frames
// instead of failing the vote. 3: chunk ids have parts (dcr/codec.h
// ChunkId): END's id digest and the signed manifest carry them. 4: the
// STREAM_MARK frame, which a relay of version 3 would take for a damaged
// frame and close its link on.
inline constexpr uint8_t kFrameVersion = 4;
inline constexpr size_t kAuthTagSize = 32;
inline constexpr uint32_t kDefaultMaxFramePayload = 256u << 20;  // 256 MiB

// Flag bits 0-7 belong to the wire layer; a frame with a wire bit this
// version does not know is rejected, since such a bit may change the layout.
// Bits 8-15 belong to the message layer (the relay) and are carried
// through uninterpreted.
inline constexpr uint16_t kFrameFlagAuthTag = 0x0001;
inline constexpr uint16_t kFrameFlagsWireMask = 0x00ff;
inline constexpr uint16_t kFrameFlagsMessageMask = 0xff00;

// Frame types. Values are on the wire: append only, never renumber.
enum class FrameType : uint8_t {
  kHello = 1,
  kPlan = 2,
  kPlanReply = 3,
  kChunk = 4,
  kEnd = 5,
  kVote = 6,
  kCommit = 7,
  kCommitReply = 8,
  kAbort = 9,
  kAbortReply = 10,
  kStatusRequest = 11,
  kStatusReply = 12,
  kHeartbeat = 13,
  kResendRequest = 14,
  kError = 15,
  // Between a trainer rank's producer and the coordinator
  // (protocol/producer_messages.h), never on a tree link.
  kProducerHello = 16,
  kProducerGo = 17,
  kProducerDone = 18,
  kProducerDecision = 19,
  kProducerBaseline = 20,
  // Root to the tree, between CHUNKs: no chunk of a tensor below the one it
  // names follows (protocol/messages.h StreamMarkMsg). A hint for the
  // relays' hashing ahead, never a condition of correctness.
  kStreamMark = 21,
};
inline constexpr uint8_t kMaxFrameType = 21;

// Returns true iff `type` names a FrameType this version knows.
bool IsKnownFrameType(uint8_t type);
// Returns the upper-case wire name of `type`, e.g. "CHUNK"; "UNKNOWN(n)"
// for an unknown value.
std::string FrameTypeName(FrameType type);

// The fields of a header a sender chooses. Length, checksum and the wire
// flag bits are filled in by EncodeFrame.
struct FrameHeader {
  FrameType type = FrameType::kHello;
  uint16_t flags = 0;  // on encode: message-layer bits only
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  RefitId refit_id;

  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// An immutable encoded frame (header, payload, optional tag), shared by
// every queue that sends it. Never copied per receiver.
using FrameBuffer = std::shared_ptr<const std::vector<std::byte>>;

// Computes and checks the optional trailing tag. dcr's implementation is
// HMAC-SHA256 with the topology's shared key (src/wire/hmac_authenticator.h);
// wire only fixes the layout and calls this interface. Implementations must be
// thread-safe.
class FrameAuthenticator {
 public:
  virtual ~FrameAuthenticator() = default;
  // Writes the tag for `covered`, the header (checksum included) and the
  // payload of one frame.
  virtual void Sign(std::span<const std::byte> covered,
                    std::span<std::byte, kAuthTagSize> tag) const = 0;
  // Returns true iff `tag` is the tag of `covered`.
  virtual bool Verify(std::span<const std::byte> covered,
                      std::span<const std::byte, kAuthTagSize> tag) const = 0;
};

// Bounds and authentication shared by the encoder and the decoder.
struct FrameOptions {
  // The largest payload accepted or produced. Checked against a header's
  // length field before any allocation.
  uint32_t max_payload = kDefaultMaxFramePayload;
  // The decoder's bound on the first frame of a link (0: max_payload).
  // Protocols that open with a small greeting set it so that a peer must
  // greet before it can make the receiver hold a large frame.
  uint32_t first_frame_max_payload = 0;
  // When set, EncodeFrame appends a tag and decoding requires and verifies
  // one. When null, a frame that carries a tag is accepted and the tag is
  // kept (and forwarded) unchecked.
  std::shared_ptr<const FrameAuthenticator> authenticator;
};

// A validated frame: views into the bytes it was parsed from. Valid as long
// as those bytes are (for a decoded frame: its FrameBuffer).
struct Frame {
  FrameHeader header;
  uint64_t checksum = 0;
  std::span<const std::byte> payload;
  std::span<const std::byte> auth_tag;  // empty unless kFrameFlagAuthTag
  std::span<const std::byte> bytes;     // the whole frame, as received

  FrameType type() const { return header.type; }
  bool has_auth_tag() const { return !auth_tag.empty(); }
};

// A decoded frame with the buffer that owns its bytes; forward `buffer` to
// pass the frame on without copying it.
struct DecodedFrame {
  Frame frame;
  FrameBuffer buffer;
};

// Encodes a frame with `payload` (the concatenation of `parts` for the
// gather form). Fails with InvalidArgument if header.flags has a wire bit
// set or with ResourceExhausted if the payload exceeds options.max_payload.
Result<FrameBuffer> EncodeFrame(const FrameHeader& header,
                                std::span<const std::byte> payload,
                                const FrameOptions& options = {});
Result<FrameBuffer> EncodeFrameGather(
    const FrameHeader& header,
    std::span<const std::span<const std::byte>> parts,
    const FrameOptions& options = {});

// Fields of a header that passed the checks that need no payload.
struct ParsedFrameHeader {
  FrameHeader header;
  uint32_t payload_length = 0;
  uint64_t checksum = 0;
  // Header + payload + tag: the bytes the whole frame occupies.
  size_t frame_size() const;
};

// Validates magic, version, type, flags, the reserved field and the length
// bound of the first kFrameHeaderSize bytes of `header`. Corruption on
// failure; the message names the bad field.
Result<ParsedFrameHeader> ParseFrameHeader(
    std::span<const std::byte, kFrameHeaderSize> header,
    const FrameOptions& options = {});

// Validates one whole frame that occupies exactly `bytes` (header, checksum,
// tag when an authenticator is set) and returns views into `bytes`.
Result<Frame> ParseFrame(std::span<const std::byte> bytes,
                         const FrameOptions& options = {});

// Incremental frame decoder; it never touches a socket. Feed() it bytes as
// they arrive, in any split, then call Next() until it reports "need more":
//
//   decoder.Feed(bytes_read);
//   for (;;) {
//     Result<std::optional<DecodedFrame>> r = decoder.Next();
//     if (!r.ok()) { close the link: r.status() says why; break; }
//     if (!r->has_value()) break;  // need more bytes
//     handle(**r);
//   }
//
// Each frame is assembled in its own FrameBuffer (one copy from the bytes
// fed), which is reserved to the frame's size only after its header passed
// ParseFrameHeader, so a hostile length costs no allocation. Frames
// completed before a corruption are returned first; after it the decoder
// stays failed and ignores further input (the link must be closed).
class FrameDecoder {
 public:
  explicit FrameDecoder(FrameOptions options = {});

  // Consumes all of `data`.
  void Feed(std::span<const std::byte> data);

  // A frame; std::nullopt when more bytes are needed; Corruption once the
  // input failed validation (repeated on every later call).
  Result<std::optional<DecodedFrame>> Next();

  bool failed() const { return !status_.ok(); }
  // True iff part of a frame was fed and the frame is not complete: a peer
  // that closes now truncated a frame.
  bool mid_frame() const { return header_have_ > 0 || current_ != nullptr; }
  // Bytes of the incomplete frame received so far.
  size_t partial_bytes() const;
  // Capacity held for the incomplete frame (what a header made the decoder
  // reserve); never above max_payload plus header and tag.
  size_t reserved_bytes() const;
  // Frames decoded and not yet returned by Next().
  size_t ready_frames() const { return ready_.size(); }
  // Frames whose header was accepted so far.
  uint64_t frames_started() const { return frames_started_; }

 private:
  void Fail(Status why);
  void FinishFrame();

  FrameOptions options_;
  std::array<std::byte, kFrameHeaderSize> header_buf_{};
  size_t header_have_ = 0;
  ParsedFrameHeader parsed_;
  std::shared_ptr<std::vector<std::byte>> current_;  // frame being filled
  size_t current_size_ = 0;                          // its final size
  uint64_t frames_started_ = 0;
  std::deque<DecodedFrame> ready_;
  Status status_;
};

}  // namespace dcr

#endif  // DCR_WIRE_H_
