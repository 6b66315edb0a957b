// What the UCX backend's tests share: the environment UCX must see
// (loopback over TCP, no RDMA), transports made by kind, a listening
// server with a recorder, and a connect that must succeed.
#ifndef DCR_TESTS_UNIT_TRANSPORT_UCX_TEST_UTIL_H_
#define DCR_TESTS_UNIT_TRANSPORT_UCX_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <string_view>

#include "dcr/transport.h"
#include "unit/transport/transport_test_util.h"

namespace dcr::testing {

// Loopback without RDMA, before any UCX context reads the environment (the
// CMake test environment sets UCX_WARN_UNUSED_ENV_VARS=n, which UCX reads
// when it loads; a caller's own UCX_TLS wins).
inline const bool kUcxEnv = [] {
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  return true;
}();

inline std::unique_ptr<Transport> Make(std::string_view kind,
                                       TransportOptions options = {}) {
  Result<std::unique_ptr<Transport>> t = CreateTransport(kind, options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

inline std::unique_ptr<Transport> MakeUcx(TransportOptions options = {}) {
  return Make("ucx", std::move(options));
}

struct Server {
  explicit Server(TransportOptions options = {}, bool pause_on_open = false,
                  std::string_view kind = "ucx")
      : transport(Make(kind, options)), recorder(std::make_shared<Recorder>()) {
    recorder->set_pause_on_open(pause_on_open);
    if (!transport) return;
    Status s = transport->Listen("127.0.0.1", 0, recorder);
    EXPECT_TRUE(s.ok()) << s.ToString();
    port = transport->BoundPort();
    EXPECT_NE(port, 0);
  }
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Recorder> recorder;
  uint16_t port = 0;
};

inline std::shared_ptr<Link> MustConnect(Transport& t, uint16_t port,
                                         std::shared_ptr<LinkHandler> handler,
                                         std::string_view host = "127.0.0.1") {
  Result<std::shared_ptr<Link>> link =
      t.Connect(host, port, std::move(handler), kConnectTimeout);
  EXPECT_TRUE(link.ok()) << link.status().ToString();
  return link.ok() ? *link : nullptr;
}

}  // namespace dcr::testing

#endif  // DCR_TESTS_UNIT_TRANSPORT_UCX_TEST_UTIL_H_
