// The UCX backend of dcr/transport.h, on the UCP stream API. Reached
// through CreateTransport("ucx", ...); built with -DDCR_UCX=AUTO|ON when
// libucx-dev is installed.
#ifndef DCR_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define DCR_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>

#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr {

// One UCP context and one worker per transport, driven by one event thread
// that sleeps in epoll on the worker's event fd (ucp_worker_get_efd, armed
// with ucp_worker_arm) and on an eventfd that Post() writes: an idle
// transport uses no CPU. UCX callbacks only queue what completed; the loop
// runs LinkHandler callbacks after ucp_worker_progress returns.
//
// Links. The listener is a UCP sockaddr listener on host:port (port 0: an
// ephemeral port, read back with ucp_listener_query); connects create
// client-server endpoints to host:port. Every endpoint uses peer error
// handling: a peer that dies or drops the connection closes the link with
// IOError naming the peer, as a TCP reset would. Frames travel on the UCP
// stream API (ucp_stream_send_nbx, ucp_stream_recv_nbx into a reused
// buffer of options.read_buffer_bytes) through the same FrameDecoder as
// TCP, so frame bounds, checksums, authentication tags, LinkStats,
// QueuedBytes, the watermarks, max_queued_bytes and CloseAfterFlush behave
// as on TCP.
//
// Flow control. UCX buffers stream data that no receive asked for, so it
// gives no backpressure of its own. Each side credits the bytes it has
// taken out of UCX back to the sender (a small active message); a sender
// keeps at most 8 MiB (plus one frame) sent and not yet credited. A paused
// link posts no receive and credits nothing: its peer's QueuedBytes grows
// as it would on TCP.
//
// Connection handshake. A UCX client endpoint exists before the server has
// accepted it, so a connect completes only when the server's 8-byte hello
// ("DCRUCX01") arrives on the stream; the server sends it as soon as it
// accepts the connection request. A connect fails with IOError naming
// host:port when the endpoint errors (nobody listening, refused) or the
// timeout passes first.
//
// Closing. A link closed by this side (Close, CloseAfterFlush, Stop)
// sends a "bye" active message carrying the total stream bytes it sent,
// and keeps its endpoint (lingering, at most 10 s; Stop waits at most 1 s
// for them) until the peer has read that many bytes and disconnects. The
// peer reports IOError "peer HOST:PORT closed the connection" only after
// delivering every frame, so a graceful close never cuts data in flight
// even though UCX signals disconnects on a separate connection.
//
// Sends. A frame is sent from its own FrameBuffer (dcr copies nothing;
// UCX may still stage small sends in its own buffers); the request holds
// the buffer until UCX completes it. Up to max_write_gather sends are
// in flight per link; QueuedBytes counts every byte not yet completed.
//
// Not supported: options.tls (CreateTransport answers Unsupported: UCX
// links are not encrypted; use "tcp" with TLS) and options.max_send_bps
// (Unsupported: pacing is a TCP bench feature). socket_buffer_bytes is
// ignored (tune UCX with UCX_* variables).
//
// Environment: UCX reads UCX_TLS, UCX_NET_DEVICES, ... as usual. On a
// machine without RDMA set UCX_TLS=tcp.
Result<std::unique_ptr<Transport>> CreateUcxTransport(
    const TransportOptions& options);

// The "ucx" entry of ProbeTransports(): creates and destroys a context and
// a worker; usable iff both succeeded; version from ucp_get_version_string;
// detail lists the transport resources found ("tcp/lo, tcp/eth0, ...") and
// whether any is RDMA-capable.
TransportSupport ProbeUcxTransport();

}  // namespace dcr

#endif  // DCR_TRANSPORT_UCX_UCX_TRANSPORT_H_
