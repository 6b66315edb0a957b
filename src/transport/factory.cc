// CreateTransport and ProbeTransports: the one place that knows which
// backends this build has. Optional backends are chosen here with #if,
// nowhere else.
#include <openssl/crypto.h>

#include <asio/version.hpp>
#include <string>

#include "dcr/transport.h"
#include "transport/fake_transport.h"
#include "transport/tcp/tcp_transport.h"
#if DCR_HAVE_UCX_TRANSPORT
#include "transport/ucx/ucx_transport.h"
#endif

namespace dcr {

Result<std::unique_ptr<Transport>> CreateTransport(
    std::string_view kind, const TransportOptions& options) {
  if (kind == "tcp") return CreateTcpTransport(options);
  if (kind == "fake") {
    if (!options.fake_network) {
      return Status::InvalidArgument(
          "transport kind 'fake' needs options.fake_network (a FakeNetwork "
          "from transport/fake_transport.h)");
    }
    if (options.tls.enabled()) {
      return Status::Unsupported(
          "transport kind 'fake' has no TLS; leave options.tls empty");
    }
    return options.fake_network->CreateTransport(options);
  }
  if (kind == "ucx") {
#if DCR_HAVE_UCX_TRANSPORT
    return CreateUcxTransport(options);
#else
    return Status::Unsupported(
        "transport kind 'ucx': this build has no UCX transport: rebuild with "
        "-DDCR_UCX=ON after installing libucx-dev");
#endif
  }
  return Status::InvalidArgument("unknown transport kind '" +
                                 std::string(kind) +
                                 "' (expected tcp, fake or ucx)");
}

std::vector<TransportSupport> ProbeTransports() {
  std::vector<TransportSupport> out;
  TransportSupport tcp;
  tcp.kind = "tcp";
  tcp.built = true;
  tcp.usable = true;
  tcp.version = "Asio " + std::to_string(ASIO_VERSION / 100000) + "." +
                std::to_string(ASIO_VERSION / 100 % 1000) + "." +
                std::to_string(ASIO_VERSION % 100);
  tcp.detail =
      std::string("TLS available (") + OpenSSL_version(OPENSSL_VERSION) + ")";
  out.push_back(std::move(tcp));
#if DCR_HAVE_UCX_TRANSPORT
  out.push_back(ProbeUcxTransport());
#else
  TransportSupport ucx;
  ucx.kind = "ucx";
  ucx.detail =
      "this build has no UCX transport: rebuild with -DDCR_UCX=ON after "
      "installing libucx-dev";
  out.push_back(std::move(ucx));
#endif
  return out;
}

}  // namespace dcr
