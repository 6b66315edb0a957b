// CreateTransport: the one place that knows which backends this build has.
// Optional backends are chosen here with #if, nowhere else.
#include <string>

#include "dcr/transport.h"
#include "transport/fake_transport.h"
#include "transport/tcp/tcp_transport.h"

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
#error "the UCX transport is not written yet"
#else
    return Status::Unsupported(
        "transport kind 'ucx' is not available in this build (the UCX "
        "backend is not implemented yet); use 'tcp'");
#endif
  }
  return Status::InvalidArgument("unknown transport kind '" +
                                 std::string(kind) +
                                 "' (expected tcp, fake or ucx)");
}

}  // namespace dcr
