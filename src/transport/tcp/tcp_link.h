// One TCP link of the Asio transport (tcp_transport.cc), and the state it
// shares with the transport: a socket (or a TLS stream over one), its
// gathered writes under the optional send pacer, its reads through a
// FrameDecoder, and its close. A link holds itself alive through the
// handlers in flight (as in the Asio chat and http server examples).
// Internal to the transport module.
#ifndef DCR_TRANSPORT_TCP_TCP_LINK_H_
#define DCR_TRANSPORT_TCP_TCP_LINK_H_

#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "transport/event_loop.h"
#include "transport/link_lifecycle.h"
#include "transport/tcp/send_pacer.h"

namespace dcr::tcp_internal {

using asio::ip::tcp;
using TlsStream = asio::ssl::stream<tcp::socket>;
using transport_internal::SendPacer;

// With TLS, frames smaller than this are copied into one buffer per write
// (Asio's ssl::stream encrypts one buffer per record); larger ones are
// written from their own buffer.
inline constexpr size_t kTlsCoalesceBytes = 64u << 10;

inline std::string HostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {  // IPv6 literal
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

inline std::string EndpointName(const tcp::endpoint& ep) {
  return HostPort(ep.address().to_string(), ep.port());
}

class TcpLink;
struct PendingConnect;    // tcp_transport.cc
struct PendingTlsAccept;  // tcp_transport.cc

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
  transport_internal::EventLoop loop;
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

// Sets the options every socket gets (no delay, keep-alive, buffers).
void ConfigureSocket(tcp::socket& s, const TransportOptions& o);

class TcpLink final : public transport_internal::LinkLifecycle {
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
          std::shared_ptr<LinkHandler> handler);

 public:
  // Event thread: registers the link, announces it and starts reading.
  void Start();

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Event thread (DoClose). Closes the socket and drops the queue.
  void TearDown(const Status& why) override;

 private:
  bool OnEventThread() const override { return shared_->loop.InThread(); }
  bool PostToEventThread(std::function<void()> fn) override;
  // The frames being written are still in queue_.
  bool Flushed() const override { return queue_.empty(); }

  std::shared_ptr<TcpLink> Self();

  void Enqueue(FrameBuffer frame) override;

  // Writes the front of the queue: up to max_write_gather frames and, with
  // a send limit, no more bytes than the pacer allows (possibly a prefix of
  // a frame, continued by the next write). Out of tokens it waits for them.
  void DoWrite();

  void WaitForTokens(std::chrono::microseconds delay);

  // Drops the frames a write finished; one it wrote a prefix of stays in
  // front, the prefix skipped by head_offset_. Counts them as sent.
  void CountWritten(size_t bytes);

  void OnWrite(const asio::error_code& ec, size_t bytes);

  void DoRead();

  void OnRead(const asio::error_code& ec, size_t n);

  // Hands decoded frames to the handler until paused or out of frames,
  // then reads more (or closes if the peer is gone).
  void Deliver() override;

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

}  // namespace dcr::tcp_internal

#endif  // DCR_TRANSPORT_TCP_TCP_LINK_H_
