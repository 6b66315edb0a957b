// ResendBuffer: the most recent CHUNK frames a node forwarded, kept (shared,
// not copied) so that a node it adopts mid-stream gets again what it
// missed. Bounded in bytes: the oldest frames are evicted first, and the
// buffer remembers the newest position it no longer holds, so that a
// resend can tell when it cannot cover an adopted node (the root's repair
// round then resends what is missing).
//
// Thread safety: none; the owner's thread only.
#ifndef DCR_PROTOCOL_RESEND_BUFFER_H_
#define DCR_PROTOCOL_RESEND_BUFFER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "dcr/wire.h"
#include "protocol/messages.h"

namespace dcr {

class ResendBuffer {
 public:
  // `limit_bytes` 0: keeps nothing (adopted nodes rely on repair rounds).
  explicit ResendBuffer(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Records a forwarded CHUNK frame at `position` (std::nullopt: not one
  // whole frame; it counts as the position after the last one seen). A
  // frame not to be kept (`keep` false: a damaged copy a failpoint made) or
  // without a position is lost: an adopted node that needs it is a miss.
  // `plain`: the same chunk in a base-independent encoding at the same
  // position, when `frame` is context-coded and some child takes the
  // other (the root of a mixed tree); kept and evicted with it, its bytes
  // counted too. Null: one encoding for everyone.
  void Keep(const FrameBuffer& frame, std::optional<FramePosition> position,
            bool keep, FrameBuffer plain = nullptr);

  // What to resend to a node that took everything through `after`, less
  // the positions in `sent` (already on its link): the kept frames after
  // `after`, oldest first. `miss` is true when frames after `after` were
  // evicted or lost, so the resend cannot cover the node. `context` false:
  // a node that must not get context-coded chunks (the base-independent
  // frame where one was kept beside the first).
  struct Resend {
    std::vector<FrameBuffer> frames;
    uint64_t bytes = 0;
    bool miss = false;
    std::optional<FramePosition> lost_through;  // set when miss
  };
  Resend For(const FramePosition& after, std::vector<FramePosition> sent,
             bool context = true) const;

  bool enabled() const { return limit_ != 0; }
  uint64_t bytes() const { return bytes_; }
  size_t frames() const { return kept_.size(); }

 private:
  struct Kept {
    FrameBuffer frame;
    FramePosition position;
    FrameBuffer plain;  // null: `frame` is for everyone
    uint64_t bytes() const {
      return frame->size() + (plain ? plain->size() : 0);
    }
  };
  uint64_t limit_;
  std::deque<Kept> kept_;
  uint64_t bytes_ = 0;
  std::optional<FramePosition> lost_through_;
  std::optional<FramePosition> last_seen_;
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_RESEND_BUFFER_H_
