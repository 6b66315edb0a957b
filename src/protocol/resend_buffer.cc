#include "protocol/resend_buffer.h"

#include <algorithm>
#include <utility>

namespace dcr {

void ResendBuffer::Keep(const FrameBuffer& frame,
                        std::optional<FramePosition> position, bool keep) {
  if (limit_ == 0) return;
  if (!position) {  // not whole: say it is the one after the last seen
    position = last_seen_.value_or(FramePosition{});
    position->sequence += 1;
    keep = false;
  }
  last_seen_ = position;
  if (!keep) {
    lost_through_ = std::max(lost_through_.value_or(*position), *position);
    return;
  }
  kept_.push_back(Kept{frame, *position});
  bytes_ += frame->size();
  while (bytes_ > limit_ && !kept_.empty()) {
    const Kept& old = kept_.front();
    lost_through_ =
        std::max(lost_through_.value_or(old.position), old.position);
    bytes_ -= old.frame->size();
    kept_.pop_front();
  }
}

ResendBuffer::Resend ResendBuffer::For(const FramePosition& after,
                                       std::vector<FramePosition> sent) const {
  Resend out;
  std::sort(sent.begin(), sent.end());
  for (const Kept& k : kept_) {
    // What it took before, and what went on its link since it connected.
    if (k.position <= after) continue;
    if (std::binary_search(sent.begin(), sent.end(), k.position)) continue;
    out.frames.push_back(k.frame);
    out.bytes += k.frame->size();
  }
  if (lost_through_ && *lost_through_ > after) {
    out.miss = true;
    out.lost_through = lost_through_;
  }
  return out;
}

}  // namespace dcr
