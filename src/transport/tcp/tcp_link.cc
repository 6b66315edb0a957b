#include "transport/tcp/tcp_link.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/write.hpp>
#include <cmath>
#include <system_error>
#include <utility>

#include "transport/tcp/tls_context.h"

namespace dcr::tcp_internal {

using transport_internal::TlsErrorText;

void ConfigureSocket(tcp::socket& s, const TransportOptions& o) {
  asio::error_code ignored;  // the kernel may clamp or refuse; not fatal
  s.set_option(tcp::no_delay(true), ignored);
  s.set_option(asio::socket_base::keep_alive(true), ignored);
  if (o.socket_buffer_bytes > 0) {
    s.set_option(asio::socket_base::send_buffer_size(o.socket_buffer_bytes),
                 ignored);
    s.set_option(asio::socket_base::receive_buffer_size(o.socket_buffer_bytes),
                 ignored);
  }
}

TcpLink::TcpLink(std::shared_ptr<TcpShared> shared, tcp::socket socket,
                 std::unique_ptr<TlsStream> tls, std::string peer,
                 std::shared_ptr<LinkHandler> handler)
    : LinkLifecycle(std::move(handler), shared->options.high_watermark,
                    shared->options.low_watermark,
                    shared->options.max_queued_bytes),
      shared_(std::move(shared)),
      socket_(std::move(socket)),
      tls_(std::move(tls)),
      peer_(std::move(peer)),
      id_(shared_->next_link_id++),
      decoder_(shared_->options.frames),
      read_buf_(std::max<size_t>(shared_->options.read_buffer_bytes, 4096)),
      pacer_(shared_->options.max_send_bps),
      pace_timer_(shared_->loop.io()) {}

void TcpLink::Start() {
  shared_->links.insert(Self());
  handler().OnOpen(*this);
  Deliver();
}

void TcpLink::TearDown(const Status& why) {
  asio::error_code ignored;
  // TLS: no close_notify; frames carry their own bounds, so a cut record
  // stream shows as a connection closed mid-frame.
  tcp::socket& socket = tls_ ? tls_->next_layer() : socket_;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
  pace_timer_.cancel();
  size_t dropped = 0;
  for (const FrameBuffer& f : queue_) dropped += f->size();
  queued_ -= dropped - head_offset_;  // the written prefix was counted
  // The buffers of the write in flight stay until its handler runs, and
  // head_offset_ with them: the handler counts what that write sent.
  if (in_flight_ == 0) head_offset_ = 0;
  queue_.resize(in_flight_);
  shared_->links.erase(Self());
  if (!why.ok()) {
    spdlog::debug("dcr: link {} to {} closed: {}", id_, peer_, why.ToString());
  }
}

bool TcpLink::PostToEventThread(std::function<void()> fn) {
  return shared_->loop.Post(std::move(fn));
}

std::shared_ptr<TcpLink> TcpLink::Self() {
  return std::static_pointer_cast<TcpLink>(shared_from_this());
}

void TcpLink::Enqueue(FrameBuffer frame) {
  queue_.push_back(std::move(frame));
  if (in_flight_ == 0 && !pace_waiting_) DoWrite();
}

void TcpLink::DoWrite() {
  size_t budget = SIZE_MAX;
  if (pacer_.enabled()) {
    const size_t want =
        std::min(pacer_.quantum(), queue_.front()->size() - head_offset_);
    budget = pacer_.Available();
    if (budget < want) {
      WaitForTokens(pacer_.TimeUntil(want));
      return;
    }
  }
  const size_t max_n = std::max<size_t>(shared_->options.max_write_gather, 1);
  gather_.clear();
  size_t total = 0;
  size_t n = 0;
  for (; n < queue_.size() && n < max_n && total < budget; ++n) {
    const size_t offset = n == 0 ? head_offset_ : 0;
    const size_t len = std::min(queue_[n]->size() - offset, budget - total);
    // TLS: only what fits the coalescing buffer joins a first frame.
    if (tls_ && n > 0 && total + len > kTlsCoalesceBytes) break;
    gather_.emplace_back(queue_[n]->data() + offset, len);
    total += len;
  }
  if (pacer_.enabled()) pacer_.Spend(total);
  in_flight_ = n;
  auto on_write = [self = Self()](const asio::error_code& ec, size_t bytes) {
    self->OnWrite(ec, bytes);
  };
  if (!tls_) {
    // One write_some, not async_write: it completes with what the kernel
    // took, so bytes_sent and QueuedBytes() move as bytes leave (a slow
    // link's progress shows within a socket buffer, not only once a
    // gather of many frames is out), and OnWrite keeps the rest.
    socket_.async_write_some(gather_, std::move(on_write));
    return;
  }
  // Asio's ssl::stream writes one buffer at a time, a record or more per
  // buffer: small frames go out as one buffer so they share records.
  if (gather_.size() > 1) {
    tls_stage_.resize(total);
    asio::buffer_copy(asio::buffer(tls_stage_), gather_);
    gather_.assign(1, asio::const_buffer(tls_stage_.data(), total));
  }
  asio::async_write(*tls_, gather_, std::move(on_write));
}

void TcpLink::WaitForTokens(std::chrono::microseconds delay) {
  pace_waiting_ = true;
  pace_timer_.expires_after(delay);
  pace_timer_.async_wait([self = Self()](const asio::error_code& ec) {
    self->pace_waiting_ = false;
    // Cancelled, or expired just before the close cancelled it.
    if (ec || self->closing()) return;
    if (!self->queue_.empty() && self->in_flight_ == 0) self->DoWrite();
  });
}

void TcpLink::CountWritten(size_t bytes) {
  for (size_t left = bytes; left > 0 && !queue_.empty();) {
    const size_t rest = queue_.front()->size() - head_offset_;
    if (left < rest) {
      head_offset_ += left;
      break;
    }
    left -= rest;
    queue_.pop_front();
    head_offset_ = 0;
    ++frames_sent_;
  }
  bytes_sent_ += bytes;
}

void TcpLink::OnWrite(const asio::error_code& ec, size_t bytes) {
  if (closed()) {
    // What reached the socket before the close was sent (the peer may
    // have it); TearDown already took the queue out of queued_.
    CountWritten(bytes);
    queue_.clear();
    head_offset_ = 0;
    in_flight_ = 0;
    return;
  }
  CountWritten(bytes);
  queued_ -= bytes;
  in_flight_ = 0;
  if (ec) {
    DoClose(Status::IOError("write to " + peer_ + ": " + ec.message()));
    return;
  }
  if (NoteWritten(queued_.load())) return;
  if (!queue_.empty() && !closing()) {
    DoWrite();
  } else {
    FinishFlushClose();
  }
}

void TcpLink::DoRead() {
  if (closing() || read_paused() || reading_) return;
  reading_ = true;
  auto on_read = [self = Self()](const asio::error_code& ec, size_t n) {
    self->OnRead(ec, n);
  };
  if (tls_) {
    tls_->async_read_some(asio::buffer(read_buf_), std::move(on_read));
  } else {
    socket_.async_read_some(asio::buffer(read_buf_), std::move(on_read));
  }
}

void TcpLink::OnRead(const asio::error_code& ec, size_t n) {
  reading_ = false;
  if (closed()) return;
  if (n > 0) {
    bytes_received_ += n;
    decoder_.Feed(std::span<const std::byte>(read_buf_.data(), n));
  }
  if (ec) {
    // Frames that arrived before the end are still delivered first.
    // TLS: a peer that closes the socket without close_notify (as this
    // transport does) reads as stream_truncated.
    if (ec == asio::error::eof ||
        (tls_ && ec == asio::ssl::error::stream_truncated)) {
      pending_close_ = Status::IOError(
          decoder_.mid_frame()
              ? "peer " + peer_ + " closed the connection mid-frame (" +
                    std::to_string(decoder_.partial_bytes()) +
                    " bytes of a frame received)"
              : "peer " + peer_ + " closed the connection");
    } else if (ec == asio::error::operation_aborted) {
      return;  // Close or Stop is under way
    } else if (tls_ && ec.category() == asio::error::get_ssl_category()) {
      // An alert before any data: under TLS 1.3 the peer checks this
      // end's certificate after this end's handshake has completed.
      pending_close_ =
          Status::IOError((bytes_received_.load() == 0
                               ? "TLS handshake with " + peer_ + " failed: "
                               : "TLS error from " + peer_ + ": ") +
                          TlsErrorText(ec, tls_->native_handle()));
    } else {
      pending_close_ =
          Status::IOError("read from " + peer_ + ": " + ec.message());
    }
  }
  Deliver();
}

void TcpLink::Deliver() {
  if (!DeliverDecoded(decoder_, peer_)) return;
  if (pending_close_) {
    Status why = std::move(*pending_close_);
    pending_close_.reset();
    DoClose(std::move(why));
    return;
  }
  DoRead();
}

}  // namespace dcr::tcp_internal
