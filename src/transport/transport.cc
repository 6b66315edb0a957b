// The members of Transport that every backend shares.
#include "dcr/transport.h"

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

}  // namespace dcr
