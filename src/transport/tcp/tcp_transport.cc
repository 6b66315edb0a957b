// TCP links on Asio: one io_context thread, one gathered write in flight
// per socket. This file holds the transport, its connects and its accepts;
// a link (a session object per socket that holds itself alive through the
// handlers in flight, as in the Asio chat and http server examples) is
// tcp_link.cc. With TransportOptions::tls every socket is wrapped in an
// asio::ssl::stream whose handshake completes before the link exists.
#include "transport/tcp/tcp_transport.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "transport/event_loop.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tls_context.h"

namespace dcr {
namespace tcp_internal {

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

}  // namespace tcp_internal

namespace {

using asio::ip::tcp;
using tcp_internal::ConfigureSocket;
using tcp_internal::EndpointName;
using tcp_internal::HostPort;
using tcp_internal::PendingConnect;
using tcp_internal::PendingTlsAccept;
using tcp_internal::TcpLink;
using tcp_internal::TcpShared;
using tcp_internal::TlsStream;
using transport_internal::MakeTlsContext;
using transport_internal::TlsErrorText;

// An accepted socket that has not finished its TLS handshake within this
// long is closed.
constexpr std::chrono::seconds kTlsAcceptHandshakeTimeout{10};

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
