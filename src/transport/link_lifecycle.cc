#include "transport/link_lifecycle.h"

#include <optional>
#include <string>
#include <utility>

namespace dcr::transport_internal {

void LinkLifecycle::Close() {
  if (OnEventThread()) closing_ = true;  // no OnFrame after this
  PostToEventThread([self = std::static_pointer_cast<LinkLifecycle>(
                         shared_from_this())] { self->DoClose(Status::OK()); });
}

void LinkLifecycle::CloseAfterFlush() {
  PostToEventThread(
      [self = std::static_pointer_cast<LinkLifecycle>(shared_from_this())] {
        if (self->closed_) return;
        self->flush_close_ = true;
        if (self->Flushed()) self->DoClose(Status::OK());
      });
}

void LinkLifecycle::PauseReading() {
  if (OnEventThread()) {
    read_paused_ = true;
    return;
  }
  PostToEventThread([self = std::static_pointer_cast<LinkLifecycle>(
                         shared_from_this())] { self->read_paused_ = true; });
}

bool LinkLifecycle::DeliverDecoded(FrameDecoder& decoder,
                                   const std::string& peer) {
  while (!closing_ && !read_paused_) {
    Result<std::optional<DecodedFrame>> next = decoder.Next();
    if (!next.ok()) {
      DoClose(next.status().WithContext("frame from " + peer));
      return false;
    }
    if (!next->has_value()) break;
    ++frames_received_;
    const DecodedFrame& f = **next;
    handler().OnFrame(*this, f.frame, f.buffer);
  }
  return !closing_ && !read_paused_;
}

void LinkLifecycle::ResumeReading() {
  PostToEventThread(
      [self = std::static_pointer_cast<LinkLifecycle>(shared_from_this())] {
        if (!self->read_paused_) return;
        self->read_paused_ = false;
        self->Deliver();
        self->AfterResume();
      });
}

void LinkLifecycle::DoClose(Status why) {
  if (closed_) return;
  closed_ = closing_ = true;
  // The handler may drop the last other reference to this link.
  auto self = shared_from_this();
  TearDown(why);
  std::shared_ptr<LinkHandler> handler = std::move(handler_);
  handler->OnClosed(*this, why);
  AfterClosed();
}

void LinkLifecycle::Send(FrameBuffer frame) {
  if (!frame || frame->empty()) return;
  const size_t size = frame->size();
  NoteQueued(queued_ += size);
  if (OnEventThread()) {
    Admit(std::move(frame));
    return;
  }
  if (!PostToEventThread(
          [self = std::static_pointer_cast<LinkLifecycle>(shared_from_this()),
           f = std::move(frame)]() mutable { self->Admit(std::move(f)); })) {
    queued_ -= size;
  }
}

void LinkLifecycle::Admit(FrameBuffer frame) {
  const size_t size = frame->size();
  if (closing_ || flush_close_) {
    queued_ -= size;
    return;
  }
  if (max_queued_ != 0 && queued_.load() > max_queued_) {
    queued_ -= size;
    DoClose(Status::ResourceExhausted("send queue to " + peer() + " exceeded " +
                                      std::to_string(max_queued_) + " bytes"));
    return;
  }
  Enqueue(std::move(frame));
}

void LinkLifecycle::SetWatermarks(size_t high, size_t low) {
  low_.store(low, std::memory_order_relaxed);
  high_.store(high, std::memory_order_relaxed);
}

void LinkLifecycle::NoteQueued(size_t queued) {
  if (queued >= high_.load(std::memory_order_relaxed)) {
    above_high_.store(true, std::memory_order_release);
  }
}

bool LinkLifecycle::NoteWritten(size_t queued) {
  if (closed_) return true;
  if (queued > low_.load(std::memory_order_relaxed) ||
      !above_high_.load(std::memory_order_acquire) ||
      !above_high_.exchange(false, std::memory_order_acq_rel)) {
    return false;
  }
  handler_->OnDrained(*this);
  return closed_;
}

bool LinkLifecycle::FinishFlushClose() {
  if (!flush_close_ || closed_ || !Flushed()) return false;
  DoClose(Status::OK());
  return true;
}

}  // namespace dcr::transport_internal
