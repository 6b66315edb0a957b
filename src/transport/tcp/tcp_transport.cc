// TCP links on Asio: one io_context thread, a session object per socket
// that holds itself alive through the handlers in flight (as in the Asio
// chat and http server examples), one gathered write in flight per socket.
// With TransportOptions::tls every socket is wrapped in an asio::ssl::stream
// whose handshake completes before the link exists.
#include "transport/tcp/tcp_transport.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/buffer.hpp>
#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>
#include <system_error>
#include <unordered_set>
#include <vector>

#include "transport/event_loop.h"
#include "transport/link_lifecycle.h"
#include "transport/tcp/send_pacer.h"
#include "transport/tcp/tls_context.h"

namespace dcr {
namespace {

using asio::ip::tcp;
using transport_internal::EventLoop;
using transport_internal::LinkLifecycle;
using transport_internal::MakeTlsContext;
using transport_internal::SendPacer;
using transport_internal::TlsErrorText;
using TlsStream = asio::ssl::stream<tcp::socket>;

// An accepted socket that has not finished its TLS handshake within this
// long is closed.
constexpr std::chrono::seconds kTlsAcceptHandshakeTimeout{10};
// With TLS, frames smaller than this are copied into one buffer per write
// (Asio's ssl::stream encrypts one buffer per record); larger ones are
// written from their own buffer.
constexpr size_t kTlsCoalesceBytes = 64u << 10;

std::string HostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {  // IPv6 literal
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string EndpointName(const tcp::endpoint& ep) {
  return HostPort(ep.address().to_string(), ep.port());
}

class TcpLink;
struct PendingConnect;
struct PendingTlsAccept;

// State shared by the transport and its links. The TLS context and then
// the loop are declared first so that they outlive every socket and stream
// below them. Fields after `loop` are touched only on the event thread.
struct TcpShared {
  TcpShared(const TransportOptions& o,
            std::unique_ptr<asio::ssl::context> tls_context)
      : options(WithoutFakeNetwork(o)),
        tls(std::move(tls_context)),
        loop("dcr-tcp-" + o.name) {}

  static TransportOptions WithoutFakeNetwork(TransportOptions o) {
    o.fake_network.reset();
    return o;
  }

  const TransportOptions options;
  const std::unique_ptr<asio::ssl::context> tls;  // null: plain TCP
  EventLoop loop;
  std::atomic<uint64_t> next_link_id{1};
  std::atomic<uint16_t> bound_port{0};

  bool stopping = false;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> accept_retry;
  std::string listen_address;
  std::shared_ptr<LinkHandler> listen_handler;
  std::unordered_set<std::shared_ptr<TcpLink>> links;
  std::unordered_set<std::shared_ptr<PendingConnect>> connects;
  std::unordered_set<std::shared_ptr<PendingTlsAccept>> tls_accepts;
};

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

class TcpLink final : public LinkLifecycle {
 public:
  // A plain link on `socket`.
  TcpLink(std::shared_ptr<TcpShared> shared, tcp::socket socket,
          std::string peer, std::shared_ptr<LinkHandler> handler)
      : TcpLink(std::move(shared), std::move(socket), nullptr, std::move(peer),
                std::move(handler)) {}
  // A TLS link on `tls`, whose handshake has completed.
  TcpLink(std::shared_ptr<TcpShared> shared, std::unique_ptr<TlsStream> tls,
          std::string peer, std::shared_ptr<LinkHandler> handler)
      : TcpLink(shared, tcp::socket(shared->loop.io()), std::move(tls),
                std::move(peer), std::move(handler)) {}

 private:
  TcpLink(std::shared_ptr<TcpShared> shared, tcp::socket socket,
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

 public:
  // Event thread: registers the link, announces it and starts reading.
  void Start() {
    shared_->links.insert(Self());
    handler().OnOpen(*this);
    Deliver();
  }

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Event thread (DoClose). Closes the socket and drops the queue.
  void TearDown(const Status& why) override {
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
      spdlog::debug("dcr: link {} to {} closed: {}", id_, peer_,
                    why.ToString());
    }
  }

 private:
  bool OnEventThread() const override { return shared_->loop.InThread(); }
  bool PostToEventThread(std::function<void()> fn) override {
    return shared_->loop.Post(std::move(fn));
  }
  // The frames being written are still in queue_.
  bool Flushed() const override { return queue_.empty(); }

  std::shared_ptr<TcpLink> Self() {
    return std::static_pointer_cast<TcpLink>(shared_from_this());
  }

  void Enqueue(FrameBuffer frame) override {
    queue_.push_back(std::move(frame));
    if (in_flight_ == 0 && !pace_waiting_) DoWrite();
  }

  // Writes the front of the queue: up to max_write_gather frames and, with
  // a send limit, no more bytes than the pacer allows (possibly a prefix of
  // a frame, continued by the next write). Out of tokens it waits for them.
  void DoWrite() {
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

  void WaitForTokens(std::chrono::microseconds delay) {
    pace_waiting_ = true;
    pace_timer_.expires_after(delay);
    pace_timer_.async_wait([self = Self()](const asio::error_code& ec) {
      self->pace_waiting_ = false;
      // Cancelled, or expired just before the close cancelled it.
      if (ec || self->closing()) return;
      if (!self->queue_.empty() && self->in_flight_ == 0) self->DoWrite();
    });
  }

  // Drops the frames a write finished; one it wrote a prefix of stays in
  // front, the prefix skipped by head_offset_. Counts them as sent.
  void CountWritten(size_t bytes) {
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

  void OnWrite(const asio::error_code& ec, size_t bytes) {
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

  void DoRead() {
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

  void OnRead(const asio::error_code& ec, size_t n) {
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

  // Hands decoded frames to the handler until paused or out of frames,
  // then reads more (or closes if the peer is gone).
  void Deliver() override {
    while (!closing() && !read_paused()) {
      Result<std::optional<DecodedFrame>> next = decoder_.Next();
      if (!next.ok()) {
        DoClose(next.status().WithContext("frame from " + peer_));
        return;
      }
      if (!next->has_value()) break;
      ++frames_received_;
      const DecodedFrame& f = **next;
      handler().OnFrame(*this, f.frame, f.buffer);
    }
    if (closing() || read_paused()) return;
    if (pending_close_) {
      Status why = std::move(*pending_close_);
      pending_close_.reset();
      DoClose(std::move(why));
      return;
    }
    DoRead();
  }

  const std::shared_ptr<TcpShared> shared_;
  tcp::socket socket_;                // plain TCP; unopened with TLS
  std::unique_ptr<TlsStream> tls_;    // TLS: owns the socket
  std::vector<std::byte> tls_stage_;  // TLS: small frames written together
  const std::string peer_;
  const uint64_t id_;
  FrameDecoder decoder_;
  std::vector<std::byte> read_buf_;
  // Frames to write; the first in_flight_ are being written. The first
  // head_offset_ bytes of the front frame are already written (a paced
  // write may end mid-frame).
  std::deque<FrameBuffer> queue_;
  size_t in_flight_ = 0;
  size_t head_offset_ = 0;
  std::vector<asio::const_buffer> gather_;
  SendPacer pacer_;
  asio::steady_timer pace_timer_;  // armed while pace_waiting_
  bool pace_waiting_ = false;
  std::optional<Status> pending_close_;  // the peer is gone; deliver first
  bool reading_ = false;
};

// One connect attempt, alive while its handlers are in flight.
struct PendingConnect {
  explicit PendingConnect(asio::io_context& io)
      : resolver(io), socket(io), timer(io) {}

  std::string host;
  uint16_t port = 0;
  std::shared_ptr<LinkHandler> handler;
  ConnectCallback done;
  tcp::resolver resolver;
  tcp::socket socket;
  std::unique_ptr<TlsStream> tls;  // owns the socket once connected, TLS
  asio::steady_timer timer;        // the timeout covers the TLS handshake
  bool finished = false;

  std::string address() const { return HostPort(host, port); }
};

// An accepted socket in its TLS handshake, alive while its handlers are in
// flight; it becomes a link once the client's certificate checked out.
struct PendingTlsAccept {
  PendingTlsAccept(tcp::socket socket, asio::ssl::context& ctx,
                   asio::io_context& io, std::string peer_name)
      : tls(std::make_unique<TlsStream>(std::move(socket), ctx)),
        timer(io),
        peer(std::move(peer_name)) {}

  std::unique_ptr<TlsStream> tls;
  asio::steady_timer timer;
  std::string peer;
  bool finished = false;
};

// Ends an accepted socket's handshake: a link on success, otherwise the
// socket is closed and `why` logged (no handler hears of it).
void FinishTlsAccept(const std::shared_ptr<TcpShared>& shared,
                     const std::shared_ptr<PendingTlsAccept>& pa,
                     const std::string& why) {
  if (pa->finished) return;
  pa->finished = true;
  pa->timer.cancel();
  shared->tls_accepts.erase(pa);
  if (!why.empty()) {
    if (!shared->stopping) {
      spdlog::warn("dcr: TLS handshake with {} failed: {}", pa->peer, why);
    }
    asio::error_code ignored;
    pa->tls->next_layer().close(ignored);
    return;
  }
  auto link = std::make_shared<TcpLink>(shared, std::move(pa->tls), pa->peer,
                                        shared->listen_handler);
  link->Start();
}

void StartTlsAccept(const std::shared_ptr<TcpShared>& shared,
                    tcp::socket socket, std::string peer) {
  auto pa = std::make_shared<PendingTlsAccept>(
      std::move(socket), *shared->tls, shared->loop.io(), std::move(peer));
  shared->tls_accepts.insert(pa);
  pa->timer.expires_after(kTlsAcceptHandshakeTimeout);
  pa->timer.async_wait([shared, pa](const asio::error_code& ec) {
    if (ec || pa->finished) return;
    FinishTlsAccept(shared, pa,
                    "timed out after " +
                        std::to_string(kTlsAcceptHandshakeTimeout.count()) +
                        " s");
  });
  pa->tls->async_handshake(
      asio::ssl::stream_base::server, [shared, pa](const asio::error_code& ec) {
        if (pa->finished) return;
        FinishTlsAccept(shared, pa,
                        ec ? TlsErrorText(ec, pa->tls->native_handle()) : "");
      });
}

void FinishConnect(const std::shared_ptr<TcpShared>& shared,
                   const std::shared_ptr<PendingConnect>& pc,
                   Result<std::shared_ptr<Link>> result) {
  if (pc->finished) return;
  pc->finished = true;
  pc->timer.cancel();
  pc->resolver.cancel();
  if (!result.ok()) {
    asio::error_code ignored;
    pc->socket.close(ignored);
    if (pc->tls) pc->tls->next_layer().close(ignored);
  }
  shared->connects.erase(pc);
  ConnectCallback done = std::move(pc->done);
  done(std::move(result));
}

void OnConnected(const std::shared_ptr<TcpShared>& shared,
                 const std::shared_ptr<PendingConnect>& pc,
                 const asio::error_code& ec) {
  if (pc->finished) return;
  if (ec) {
    FinishConnect(
        shared, pc,
        Status::IOError("connect to " + pc->address() + ": " + ec.message()));
    return;
  }
  ConfigureSocket(pc->socket, shared->options);
  if (!shared->tls) {
    auto link = std::make_shared<TcpLink>(shared, std::move(pc->socket),
                                          pc->address(), pc->handler);
    link->Start();
    FinishConnect(shared, pc, std::shared_ptr<Link>(std::move(link)));
    return;
  }
  pc->tls = std::make_unique<TlsStream>(std::move(pc->socket), *shared->tls);
  pc->tls->async_handshake(
      asio::ssl::stream_base::client, [shared, pc](const asio::error_code& e) {
        if (pc->finished) return;
        if (e) {
          FinishConnect(
              shared, pc,
              Status::IOError(
                  "TLS handshake with " + pc->address() +
                  " failed: " + TlsErrorText(e, pc->tls->native_handle())));
          return;
        }
        auto link = std::make_shared<TcpLink>(shared, std::move(pc->tls),
                                              pc->address(), pc->handler);
        link->Start();
        FinishConnect(shared, pc, std::shared_ptr<Link>(std::move(link)));
      });
}

void StartConnect(const std::shared_ptr<TcpShared>& shared,
                  std::shared_ptr<PendingConnect> pc,
                  std::chrono::milliseconds timeout) {
  if (shared->stopping) {
    ConnectCallback done = std::move(pc->done);
    done(
        Status::Aborted("connect to " + pc->address() + ": transport stopped"));
    return;
  }
  shared->connects.insert(pc);
  pc->timer.expires_after(timeout);
  pc->timer.async_wait([shared, pc, timeout](const asio::error_code& ec) {
    if (ec || pc->finished) return;
    FinishConnect(
        shared, pc,
        Status::IOError("connect to " + pc->address() + " timed out after " +
                        std::to_string(timeout.count()) + " ms"));
  });
  asio::error_code ec;
  asio::ip::address addr = asio::ip::make_address(pc->host, ec);
  if (!ec) {
    pc->socket.async_connect(tcp::endpoint(addr, pc->port),
                             [shared, pc](const asio::error_code& e) {
                               OnConnected(shared, pc, e);
                             });
    return;
  }
  pc->resolver.async_resolve(
      pc->host, std::to_string(pc->port),
      [shared, pc](const asio::error_code& e,
                   const tcp::resolver::results_type& results) {
        if (pc->finished) return;
        if (e) {
          FinishConnect(
              shared, pc,
              Status::IOError("connect to " + pc->address() +
                              ": cannot resolve host: " + e.message()));
          return;
        }
        asio::async_connect(
            pc->socket, results,
            [shared, pc](const asio::error_code& e2, const tcp::endpoint&) {
              OnConnected(shared, pc, e2);
            });
      });
}

void DoAccept(const std::shared_ptr<TcpShared>& shared) {
  shared->acceptor->async_accept([shared](const asio::error_code& ec,
                                          tcp::socket socket) {
    if (shared->stopping || !shared->acceptor) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors and the like: back off instead of spinning.
      spdlog::warn("dcr: accept on {}: {}", shared->listen_address,
                   ec.message());
      shared->accept_retry->expires_after(std::chrono::milliseconds(100));
      shared->accept_retry->async_wait([shared](const asio::error_code& e) {
        if (!e && !shared->stopping) DoAccept(shared);
      });
      return;
    }
    asio::error_code remote_ec;
    tcp::endpoint remote = socket.remote_endpoint(remote_ec);
    std::string peer = remote_ec ? "unknown peer" : EndpointName(remote);
    ConfigureSocket(socket, shared->options);
    if (shared->tls) {
      StartTlsAccept(shared, std::move(socket), std::move(peer));
    } else {
      auto link = std::make_shared<TcpLink>(
          shared, std::move(socket), std::move(peer), shared->listen_handler);
      link->Start();
    }
    DoAccept(shared);
  });
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TransportOptions& options,
               std::unique_ptr<asio::ssl::context> tls)
      : shared_(std::make_shared<TcpShared>(options, std::move(tls))) {}
  ~TcpTransport() override { Stop(); }

  std::string_view kind() const override { return "tcp"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.network = true;
    return c;
  }

  Status Listen(std::string_view host, uint16_t port,
                std::shared_ptr<LinkHandler> handler) override {
    if (!handler) return Status::InvalidArgument("listen: no LinkHandler");
    Status result;
    std::string h(host);
    bool ran = shared_->loop.RunSync(
        [&] { result = DoListen(h, port, std::move(handler)); });
    if (!ran) return Status::Aborted("listen: transport stopped");
    return result;
  }

  uint16_t BoundPort() const override { return shared_->bound_port.load(); }

  void AsyncConnect(std::string_view host, uint16_t port,
                    std::shared_ptr<LinkHandler> handler,
                    std::chrono::milliseconds timeout,
                    ConnectCallback done) override {
    if (!handler) {
      done(Status::InvalidArgument("connect: no LinkHandler"));
      return;
    }
    auto pc = std::make_shared<PendingConnect>(shared_->loop.io());
    pc->host = std::string(host);
    pc->port = port;
    pc->handler = std::move(handler);
    pc->done = std::move(done);
    auto shared = shared_;
    if (!shared_->loop.Post(
            [shared, pc, timeout] { StartConnect(shared, pc, timeout); })) {
      ConnectCallback cb = std::move(pc->done);
      cb(Status::Aborted("connect to " + pc->address() +
                         ": transport stopped"));
    }
  }

  bool Post(std::function<void()> fn) override {
    return shared_->loop.Post(std::move(fn));
  }
  bool InEventThread() const override { return shared_->loop.InThread(); }

  void Stop() override {
    auto shared = shared_;
    shared_->loop.Shutdown([shared] {
      shared->stopping = true;
      asio::error_code ignored;
      if (shared->acceptor) shared->acceptor->close(ignored);
      if (shared->accept_retry) shared->accept_retry->cancel();
      auto accepts = shared->tls_accepts;
      for (const auto& pa : accepts) FinishTlsAccept(shared, pa, "stopped");
      auto connects = shared->connects;
      for (const auto& pc : connects) {
        FinishConnect(shared, pc,
                      Status::Aborted("connect to " + pc->address() +
                                      ": transport stopped"));
      }
      auto links = shared->links;
      for (const auto& link : links) link->DoClose(Status::OK());
      shared->listen_handler.reset();
    });
  }

 private:
  Status DoListen(const std::string& host, uint16_t port,
                  std::shared_ptr<LinkHandler> handler) {
    const std::string where = HostPort(host, port);
    if (shared_->acceptor) {
      return Status::InvalidArgument("listen on " + where +
                                     ": already listening on " +
                                     shared_->listen_address);
    }
    asio::error_code ec;
    tcp::endpoint endpoint;
    asio::ip::address addr = asio::ip::make_address(host, ec);
    if (!ec) {
      endpoint = tcp::endpoint(addr, port);
    } else {
      tcp::resolver resolver(shared_->loop.io());
      auto results = resolver.resolve(host, std::to_string(port),
                                      tcp::resolver::passive, ec);
      if (ec || results.empty()) {
        return Status::IOError("listen on " + where + ": cannot resolve host" +
                               (ec ? ": " + ec.message() : ""));
      }
      endpoint = results.begin()->endpoint();
    }
    auto acceptor = std::make_unique<tcp::acceptor>(shared_->loop.io());
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IOError("listen on " + where + ": " + ec.message());
    tcp::endpoint local = acceptor->local_endpoint(ec);
    if (ec) return Status::IOError("listen on " + where + ": " + ec.message());
    shared_->acceptor = std::move(acceptor);
    shared_->accept_retry =
        std::make_unique<asio::steady_timer>(shared_->loop.io());
    shared_->listen_address = HostPort(host, local.port());
    shared_->listen_handler = std::move(handler);
    shared_->bound_port = local.port();
    DoAccept(shared_);
    return Status::OK();
  }

  std::shared_ptr<TcpShared> shared_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateTcpTransport(
    const TransportOptions& options) {
  if (options.low_watermark > options.high_watermark) {
    return Status::InvalidArgument(
        "transport low_watermark is above high_watermark");
  }
  std::unique_ptr<asio::ssl::context> tls;
  if (options.tls.enabled()) {
    DCR_ASSIGN_OR_RETURN(tls, MakeTlsContext(options.tls));
  }
  return std::unique_ptr<Transport>(
      std::make_unique<TcpTransport>(options, std::move(tls)));
}

}  // namespace dcr
