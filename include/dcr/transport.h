// Transports: message links that carry frames (dcr/wire.h) between nodes.
//
// The relay and the coordinator reach the network only through this
// interface. Backends: "tcp" (Asio), "ucx" (UCP streams, when built with
// UCX: src/transport/ucx/ucx_transport.h), and "fake" (in-process,
// deterministic, with fault hooks: src/transport/fake_transport.h). Create
// one with CreateTransport().
//
// Threading. A Transport owns one event thread. Every LinkHandler callback
// and every function given to Post() runs on it, one at a time, so a
// handler needs no locking against other callbacks of the same transport.
// Callbacks must not block: hand long work to a worker pool and come back
// with Post().
//
// Thread safety: Link::Send, Link::Close, Link::CloseAfterFlush,
// Link::PauseReading, Link::ResumeReading, Link::QueuedBytes,
// Link::SetWatermarks, Link::stats and Link::peer may be called from any
// thread; the actions are posted to
// the event thread. Transport::Post, Connect, AsyncConnect and Stop may be
// called from any thread, except that Connect and Stop must not be called
// from the event thread (Connect would wait on itself; use AsyncConnect).
// Listen is called from one thread before links are expected.
//
// Ownership. Links are reference counted: a link lives while the
// application or an operation in flight holds it. Handlers are shared with
// every link they serve and released when the link is closed.
#ifndef DCR_TRANSPORT_H_
#define DCR_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcr/status.h"
#include "dcr/wire.h"

namespace dcr {

class FakeNetwork;  // src/transport/fake_transport.h

// Counters of one link, updated as bytes move. With TLS they count the
// frames' bytes, not the encrypted records.
struct LinkStats {
  uint64_t frames_sent = 0;  // frames fully handed to the OS / peer
  uint64_t bytes_sent = 0;
  uint64_t frames_received = 0;  // frames delivered to OnFrame
  uint64_t bytes_received = 0;   // raw bytes read, partial frames included
};

// One bidirectional frame link to one peer.
class Link : public std::enable_shared_from_this<Link> {
 public:
  virtual ~Link() = default;

  // Queues `frame` (an encoded frame, see EncodeFrame) behind the frames
  // sent before it and returns at once; it never blocks. Frames sent from
  // one thread are written in that order; the buffer is shared, not copied.
  // After the link closed, frames are discarded (OnClosed says why).
  virtual void Send(FrameBuffer frame) = 0;

  // Bytes accepted by Send and not yet written (the write in flight
  // included). Callers bound their forward windows with it; OnDrained
  // tells when it falls again.
  virtual size_t QueuedBytes() const = 0;

  // This link's drain watermarks (until now the transport's
  // TransportOptions::high_watermark and low_watermark; low <= high): from
  // the call on, OnDrained fires when QueuedBytes() falls to `low` or below
  // after it had reached `high` (a Send that brought it to `high` or above).
  // An owner that bounds its sends by a window sets (window, window / 2) to
  // hear when the link has room again.
  virtual void SetWatermarks(size_t high, size_t low) = 0;

  // Closes the link now; queued frames are discarded. OnClosed follows with
  // an OK status. Idempotent.
  virtual void Close() = 0;
  // Stops accepting Send, writes what is queued, then closes (OnClosed with
  // an OK status). Frames arriving meanwhile are still delivered.
  virtual void CloseAfterFlush() = 0;

  // Stops delivering frames (and reading from the peer, which then sees
  // backpressure) until ResumeReading. A frame already decoded waits. A
  // paused TCP link notices the peer closing only once it reads again.
  virtual void PauseReading() = 0;
  virtual void ResumeReading() = 0;

  // The peer for messages: "host:port" for a connected link, the remote
  // address (or the fake endpoint name) for an accepted one.
  virtual const std::string& peer() const = 0;
  // Unique among the links of one transport; for logs and maps.
  virtual uint64_t id() const = 0;
  virtual LinkStats stats() const = 0;
};

// Callbacks of one listener or one connection. All run on the transport's
// event thread.
class LinkHandler {
 public:
  virtual ~LinkHandler() = default;

  // Once per link, before its first OnFrame. Keep
  // link.shared_from_this() to send on it later.
  virtual void OnOpen(Link& link) { (void)link; }

  // A validated frame (checksum, bounds and, with a key, its tag). `frame`
  // views into `buffer`; keep `buffer` (not `frame`) beyond the call, and
  // pass it to other links' Send to forward the frame verbatim.
  virtual void OnFrame(Link& link, const Frame& frame,
                       const FrameBuffer& buffer) = 0;

  // Exactly once per link that was opened; no callback for the link
  // follows. `why`:
  //   OK          closed by this side (Close, CloseAfterFlush, Stop);
  //   IOError     the peer closed, the connection failed, the TLS handshake
  //               failed (the message says why), or (fake) the link was
  //               cut; the message names the peer;
  //   Corruption  the peer sent bytes that failed frame validation;
  //   ResourceExhausted  the send queue passed max_queued_bytes.
  virtual void OnClosed(Link& link, const Status& why) = 0;

  // QueuedBytes() fell to the link's low watermark or below after it had
  // reached its high watermark (TransportOptions, or Link::SetWatermarks).
  virtual void OnDrained(Link& link) { (void)link; }
};

// TLS on the links of the "tcp" backend: every link, accepted or connected,
// runs TLS 1.2 or later (1.3 preferred) with mutual authentication. Each
// end presents its certificate and accepts the other's only if it chains
// to `ca_file`; host names and IP addresses are not checked, so every
// holder of a certificate from that CA is trusted (use a CA of its own for
// the cluster). Frame authentication (FrameOptions) still runs on top.
struct TlsOptions {
  std::string ca_file;    // PEM: the CA (or CAs) that signs every node's
  std::string cert_file;  // PEM: this node's certificate, then its chain
  std::string key_file;   // PEM: this node's private key, unencrypted

  // True iff any file is set; CreateTransport then requires all three.
  bool enabled() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty();
  }
};

struct TransportOptions {
  // Names this endpoint in logs and, for the fake backend, in its network.
  std::string name = "dcr";
  // Frame bounds and authentication for every link of the transport.
  FrameOptions frames;
  // Backpressure hysteresis for LinkHandler::OnDrained.
  size_t high_watermark = 16u << 20;
  size_t low_watermark = 4u << 20;
  // 0: unbounded. Otherwise a Send that would queue more closes the link
  // with ResourceExhausted: a last guard; callers bound their windows.
  size_t max_queued_bytes = 0;
  // TCP: the reused read buffer, and SO_SNDBUF/SO_RCVBUF (the kernel may
  // clamp them).
  size_t read_buffer_bytes = 256u << 10;
  int socket_buffer_bytes = 4 << 20;
  // Most buffers gathered into one write.
  size_t max_write_gather = 64;
  // TCP: bits per second per link; 0: unlimited. A token bucket paces
  // writes (bench: bandwidth-bound trees without tc), with a burst of
  // max(64 KiB, 20 ms at this rate).
  uint64_t max_send_bps = 0;
  // TCP: TLS on every link when tls.enabled(); plain TCP otherwise. The
  // fake backend refuses it (Unsupported).
  TlsOptions tls;
  // The network the "fake" backend joins; required for that kind.
  std::shared_ptr<FakeNetwork> fake_network;
};

struct TransportCapabilities {
  bool network = false;          // reaches other processes and hosts
  bool fault_injection = false;  // has test hooks (the fake backend)
  bool rdma = false;             // zero-copy remote memory (UCX)
};

using ConnectCallback = std::function<void(Result<std::shared_ptr<Link>>)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // "tcp", "fake", ...
  virtual std::string_view kind() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  // Accepts links on host:port (port 0: an ephemeral port, see BoundPort);
  // each accepted link is served by `handler`. One listener per transport.
  [[nodiscard]] virtual Status Listen(std::string_view host, uint16_t port,
                                      std::shared_ptr<LinkHandler> handler) = 0;
  // The port Listen bound; 0 before Listen.
  virtual uint16_t BoundPort() const = 0;

  // Opens a link to host:port served by `handler`, waiting up to `timeout`.
  // The error names host:port. Not from the event thread (InvalidArgument
  // there). The default runs AsyncConnect and waits for its callback.
  virtual Result<std::shared_ptr<Link>> Connect(
      std::string_view host, uint16_t port,
      std::shared_ptr<LinkHandler> handler, std::chrono::milliseconds timeout);
  // As Connect, but returns at once; `done` runs exactly once, on the event
  // thread (with Aborted if the transport stops first), or at once on the
  // calling thread if the transport has already stopped.
  virtual void AsyncConnect(std::string_view host, uint16_t port,
                            std::shared_ptr<LinkHandler> handler,
                            std::chrono::milliseconds timeout,
                            ConnectCallback done) = 0;

  // Runs `fn` on the event thread. Returns false (and drops `fn`) once
  // Stop has begun.
  virtual bool Post(std::function<void()> fn) = 0;
  // True iff called from this transport's event thread.
  virtual bool InEventThread() const = 0;

  // Closes the listener and every link (OnClosed with OK), cancels pending
  // connects, and waits for the event thread to finish. Idempotent; the
  // destructor calls it.
  virtual void Stop() = 0;
};

// Creates a transport of `kind`: "tcp", "ucx" (a build without UCX answers
// Unsupported, saying how to rebuild; it refuses TLS and max_send_bps), or
// "fake" (needs options.fake_network). InvalidArgument for an unknown kind.
// With options.tls, the certificate, key and CA files are loaded here: an error
// names the file and what is wrong with it (NotFound, or InvalidArgument: not
// PEM, the key does not match the certificate, a file missing from the three).
Result<std::unique_ptr<Transport>> CreateTransport(
    std::string_view kind, const TransportOptions& options);

// What this build and machine offer for relay links (`dcr doctor`,
// `dcr-relay --doctor`). One entry per backend kind a topology can name
// ("tcp", "ucx"), in that order.
struct TransportSupport {
  std::string kind;     // "tcp", "ucx"
  bool built = false;   // compiled into this build
  bool usable = false;  // can carry relay links on this machine now
  std::string version;  // the library's version ("UCX 1.13.1"); may be empty
  std::string detail;   // what was found (UCX transports and devices), or
                        // why it is not usable and what to do about it
};
// Probes each backend (for UCX: creates and destroys a context and worker
// and lists the transport resources it found). Takes well under a second;
// never throws, never aborts the process.
std::vector<TransportSupport> ProbeTransports();

// "host:port" (a bracketed IPv6 host too) split for Listen and Connect;
// InvalidArgument naming `what` (a flag or option) and an example.
// `allow_zero`: port 0 (an ephemeral port, for listening) is accepted.
Result<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view what,
                                                       std::string_view s,
                                                       bool allow_zero);

// Loads `tls`'s three files as CreateTransport("tcp", ...) would and returns
// the same error: for commands that check their configuration up front.
// OK when TLS is not enabled.
[[nodiscard]] Status CheckTlsOptions(const TlsOptions& tls);

}  // namespace dcr

#endif  // DCR_TRANSPORT_H_
