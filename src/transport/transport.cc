// The members of Transport that every backend shares, and the address
// parsing of its callers.
#include "dcr/transport.h"

#include <fmt/format.h>

#include <future>
#include <memory>
#include <utility>

namespace dcr {

Result<std::shared_ptr<Link>> Transport::Connect(
    std::string_view host, uint16_t port, std::shared_ptr<LinkHandler> handler,
    std::chrono::milliseconds timeout) {
  if (InEventThread()) {
    return Status::InvalidArgument(
        "Transport::Connect called on the event thread; use AsyncConnect");
  }
  // Held by a shared_ptr: a ConnectCallback (std::function) must be
  // copyable, and a promise is move-only.
  auto promise =
      std::make_shared<std::promise<Result<std::shared_ptr<Link>>>>();
  std::future<Result<std::shared_ptr<Link>>> future = promise->get_future();
  AsyncConnect(host, port, std::move(handler), timeout,
               [promise](Result<std::shared_ptr<Link>> r) {
                 promise->set_value(std::move(r));
               });
  return future.get();
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view what,
                                                       std::string_view s,
                                                       bool allow_zero) {
  auto bad = [&] {
    return Status::InvalidArgument(
        fmt::format("{} '{}': give host:port, e.g. {}:7480", what, s,
                    allow_zero ? "0.0.0.0" : "10.0.0.5"));
  };
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) {
    return bad();
  }
  uint32_t port = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9') return bad();
    port = port * 10 + uint32_t(c - '0');
    if (port > 65535) return bad();
  }
  if (port == 0 && !allow_zero) return bad();
  std::string_view host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(port));
}

}  // namespace dcr
