#include "transport/ucx/ucx_link.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace dcr::ucx_internal {

UcxLink::UcxLink(std::shared_ptr<UcxShared> shared, ucp_ep_h ep,
                 std::string peer, std::shared_ptr<LinkHandler> handler)
    : LinkLifecycle(std::move(handler), shared->options.high_watermark,
                    shared->options.low_watermark,
                    shared->options.max_queued_bytes),
      shared_(std::move(shared)),
      ep_(ep),
      peer_(std::move(peer)),
      id_(shared_->next_link_id++),
      decoder_(shared_->options.frames),
      read_buf_(std::max<size_t>(shared_->options.read_buffer_bytes, 4096)) {}

void UcxLink::Start() {
  shared_->links[ep_] = Self();
  handler().OnOpen(*this);
  Deliver();
}

void UcxLink::TearDown(const Status& why) {
  // Sends still posted to this link (LinkLifecycle::Admit) subtract their own
  // bytes.
  size_t dropped = in_flight_bytes_;
  for (const FrameBuffer& f : queue_) dropped += f->size();
  queue_.clear();
  in_flight_bytes_ = 0;
  queued_ -= dropped;
  shared_->links.erase(ep_);
  if (ep_failed_) {
    shared_->CloseEp(ep_, /*force=*/true);  // UCX requires it
  } else if (peer_bye_ || !why.ok()) {
    // The peer closed first, or this side gives up on the link: a
    // graceful disconnect tells the peer (an IOError there).
    shared_->CloseEp(ep_, /*force=*/false);
  } else {
    shared_->SendCtl(ep_, CtlKind::kBye, sent_total_);
    shared_->lingering[ep_] = Lingering{Clock::now() + kLinger};
  }
  ep_ = nullptr;
  if (!why.ok()) {
    spdlog::debug("dcr: ucx link {} to {} closed: {}", id_, peer_,
                  why.ToString());
  }
}

void UcxLink::OnSendDone(const Op& op) {
  --in_flight_;
  if (closed()) {
    // Sent before the close finished it: the peer may have the frame.
    if (op.status == UCS_OK) {
      ++frames_sent_;
      bytes_sent_ += op.frame->size();
    }
    return;
  }
  if (op.status != UCS_OK) {
    ep_failed_ = true;
    DoClose(
        Status::IOError("send to " + peer_ + " failed: " + UcsText(op.status)));
    return;
  }
  ++frames_sent_;
  bytes_sent_ += op.frame->size();
  in_flight_bytes_ -= op.frame->size();
  queued_ -= op.frame->size();
  if (NoteWritten(queued_.load())) return;
  Pump();
}

void UcxLink::OnRecvDone(const Op& op) {
  reading_ = false;
  if (closed()) return;
  if (op.status != UCS_OK) {
    if (!pending_close_) pending_close_ = PeerGone(op.status);
  } else if (op.length > 0) {
    bytes_received_ += op.length;
    unreported_ += op.length;
    if (unreported_ >= kCreditQuantum) {
      shared_->SendCtl(ep_, CtlKind::kCredit, unreported_);
      unreported_ = 0;
    }
    decoder_.Feed(std::span<const std::byte>(read_buf_.data(), op.length));
    CheckBye();
  }
  Deliver();
}

void UcxLink::OnCtl(const CtlMsg& m) {
  if (closed()) return;
  if (m.kind == static_cast<uint32_t>(CtlKind::kCredit)) {
    credited_total_ += m.value;
    Pump();
  } else if (m.kind == static_cast<uint32_t>(CtlKind::kBye)) {
    peer_bye_ = true;
    bye_total_ = m.value;
    CheckBye();
    if (pending_close_) Deliver();
  }
}

void UcxLink::OnEpError(ucs_status_t status) {
  ep_failed_ = true;
  if (closed()) return;
  if (!pending_close_) pending_close_ = PeerGone(status);
  // Frames already decoded are delivered first (once resumed if paused);
  // what UCX had not handed over is lost with the endpoint.
  Deliver();
}

bool UcxLink::PostToEventThread(std::function<void()> fn) {
  return shared_->Post(std::move(fn));
}

std::shared_ptr<UcxLink> UcxLink::Self() {
  return std::static_pointer_cast<UcxLink>(shared_from_this());
}

Status UcxLink::PeerGone(ucs_status_t status) const {
  std::string why = peer_bye_ ? "peer " + peer_ + " closed the connection"
                              : "connection to peer " + peer_ + " failed (" +
                                    UcsText(status) + ")";
  if (decoder_.mid_frame()) {
    why += " mid-frame (" + std::to_string(decoder_.partial_bytes()) +
           " bytes of a frame received)";
  }
  return Status::IOError(why);
}

void UcxLink::CheckBye() {
  if (peer_bye_ && bytes_received_.load() >= bye_total_ && !pending_close_) {
    pending_close_ = PeerGone(UCS_OK);
  }
}

void UcxLink::Enqueue(FrameBuffer frame) {
  queue_.push_back(std::move(frame));
  Pump();
}

void UcxLink::Pump() {
  const size_t max_in_flight =
      std::max<size_t>(shared_->options.max_write_gather, 1);
  while (!closed() && !ep_failed_ && !queue_.empty() &&
         in_flight_ < max_in_flight &&
         sent_total_ - credited_total_ < kWindowBytes) {
    auto* op = new Op(Op::kSend);
    op->link = Self();
    op->frame = std::move(queue_.front());
    queue_.pop_front();
    sent_total_ += op->frame->size();
    in_flight_bytes_ += op->frame->size();
    ++in_flight_;
    ucp_request_param_t p = shared_->Params(op);
    shared_->Submit(
        op, ucp_stream_send_nbx(ep_, op->frame->data(), op->frame->size(), &p));
  }
  FinishFlushClose();
}

void UcxLink::DoRead() {
  if (closing() || read_paused() || reading_ || ep_failed_) return;
  reading_ = true;
  auto* op = new Op(Op::kRecv);
  op->link = Self();
  ucp_request_param_t p = shared_->Params(op);
  p.cb.recv_stream = &UcxShared::RecvCallback;
  shared_->Submit(op, ucp_stream_recv_nbx(ep_, read_buf_.data(),
                                          read_buf_.size(), &op->length, &p));
}

void UcxLink::Deliver() {
  if (!DeliverDecoded(decoder_, peer_)) return;
  if (pending_close_) {
    Status why = std::move(*pending_close_);
    pending_close_.reset();
    DoClose(std::move(why));
    return;
  }
  DoRead();
}

}  // namespace dcr::ucx_internal
