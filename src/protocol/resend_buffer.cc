#include "protocol/resend_buffer.h"

#include <algorithm>
#include <utility>

namespace dcr {

void ResendBuffer::Keep(const FrameBuffer& frame,
                        std::optional<FramePosition> position, bool keep,
                        FrameBuffer plain) {
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
  kept_.push_back(Kept{frame, *position, std::move(plain)});
  bytes_ += kept_.back().bytes();
  while (bytes_ > limit_ && !kept_.empty()) {
    const Kept& old = kept_.front();
    lost_through_ =
        std::max(lost_through_.value_or(old.position), old.position);
    bytes_ -= old.bytes();
    kept_.pop_front();
  }
}

ResendBuffer::Resend ResendBuffer::For(const FramePosition& after,
                                       std::vector<FramePosition> sent,
                                       bool context) const {
  Resend out;
  std::sort(sent.begin(), sent.end());
  for (const Kept& k : kept_) {
    // What it took before, and what went on its link since it connected.
    if (k.position <= after) continue;
    if (std::binary_search(sent.begin(), sent.end(), k.position)) continue;
    const FrameBuffer& f = !context && k.plain ? k.plain : k.frame;
    out.frames.push_back(f);
    out.bytes += f->size();
  }
  if (lost_through_ && *lost_through_ > after) {
    out.miss = true;
    out.lost_through = lost_through_;
  }
  return out;
}

}  // namespace dcr
