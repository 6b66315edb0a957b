// The TCP backend of dcr/transport.h, on Asio. Reached through
// CreateTransport("tcp", ...).
#ifndef DCR_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define DCR_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>

#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr {

// Starts the event thread; one listener and any number of links.
//
// Links set TCP_NODELAY, SO_KEEPALIVE and options.socket_buffer_bytes for
// both socket buffers; each reads into a reused buffer of
// options.read_buffer_bytes that feeds a FrameDecoder, and writes its queue
// with one gathered async_write at a time (up to options.max_write_gather
// frames). With options.max_send_bps, a token bucket per link caps each
// write to the bytes it allows (a write may end mid-frame; the next one
// continues it) and a steady_timer waits for more; Close and Stop cancel
// it. The listener sets SO_REUSEADDR.
//
// With options.tls each socket is wrapped in an asio::ssl::stream (TLS 1.2
// or later, mutual certificates checked against the CA, host names not
// checked). A link exists once its handshake succeeded: a failed connect
// handshake fails the connect ("TLS handshake with HOST:PORT failed: ..."),
// a failed accepted one (or one not done in 10 s) is closed and logged.
// Writes of several small frames are copied into one buffer (so they share
// TLS records); a write of one frame is encrypted from its own buffer.
Result<std::unique_ptr<Transport>> CreateTcpTransport(
    const TransportOptions& options);

}  // namespace dcr

#endif  // DCR_TRANSPORT_TCP_TCP_TRANSPORT_H_
