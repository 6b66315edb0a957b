// The UCX backend of dcr/transport.h (ucx_transport.h): the transport,
// its event thread and its listener. One context, one worker and one
// event thread per transport; the parts are ucx_shared.h (shared state,
// control messages), ucx_link.cc (a link) and ucx_loop.cc (the loop).
#include "transport/ucx/ucx_transport.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <future>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "transport/ucx/ucx_shared.h"

namespace dcr {
namespace {

using ucx_internal::HostPort;
using ucx_internal::ListenerPtr;
using ucx_internal::PendingConnect;
using ucx_internal::Resolve;
using ucx_internal::UcsText;
using ucx_internal::UcxShared;

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxShared> shared)
      : shared_(std::move(shared)) {
    std::promise<void> started;
    auto ready = started.get_future();
    // The thread holds `shared` itself: it may outlive this object when
    // the last owner drops the transport on the event thread.
    thread_ = std::thread([shared = shared_, &started] {
      const std::string name = "dcr-ucx-" + shared->options.name;
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      shared->thread_id = std::this_thread::get_id();
      started.set_value();
      ucx_internal::RunLoop(shared);
      // Every endpoint is closed: the worker and context go with the loop.
      shared->listener.reset();
      shared->worker.reset();
      shared->context.reset();
      shared->events.clear();
    });
    ready.wait();
  }
  ~UcxTransport() override {
    Stop();
    // Destroyed on its own event thread: the loop ends after this handler.
    if (thread_.joinable()) thread_.detach();
  }

  std::string_view kind() const override { return "ucx"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.network = true;
    c.rdma = shared_->rdma;
    return c;
  }

  Status Listen(std::string_view host, uint16_t port,
                std::shared_ptr<LinkHandler> handler) override {
    if (!handler) return Status::InvalidArgument("listen: no LinkHandler");
    const std::string h(host);
    if (InEventThread()) return DoListen(h, port, std::move(handler));
    std::promise<Status> result;
    auto future = result.get_future();
    if (!Post(
            [&] { result.set_value(DoListen(h, port, std::move(handler))); })) {
      return Status::Aborted("listen: transport stopped");
    }
    return future.get();
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
    auto pc = std::make_shared<PendingConnect>();
    pc->host = std::string(host);
    pc->port = port;
    pc->handler = std::move(handler);
    pc->done = std::move(done);
    pc->timeout = timeout;
    auto shared = shared_;
    if (!shared_->Post(
            [shared, pc] { ucx_internal::StartConnect(shared, pc); })) {
      ConnectCallback cb = std::move(pc->done);
      cb(Status::Aborted("connect to " + pc->address() +
                         ": transport stopped"));
    }
  }

  bool Post(std::function<void()> fn) override {
    return shared_->Post(std::move(fn));
  }
  bool InEventThread() const override { return shared_->InThread(); }

  void Stop() override {
    {
      MutexLock lock(&shared_->mu);
      shared_->stop_requested = true;
    }
    shared_->Wake();
    if (InEventThread()) return;  // the thread ends after this handler
    MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  Status DoListen(const std::string& host, uint16_t port,
                  std::shared_ptr<LinkHandler> handler) {
    UcxShared& s = *shared_;
    const std::string where = HostPort(host, port);
    if (s.listener) {
      return Status::InvalidArgument(
          "listen on " + where + ": already listening on " + s.listen_address);
    }
    socklen_t len = 0;
    Result<sockaddr_storage> addr = Resolve(host, port, true, &len);
    if (!addr.ok()) return addr.status().WithContext("listen on " + where);
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                   UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    p.sockaddr.addrlen = len;
    p.conn_handler.cb = &UcxShared::ConnCallback;
    p.conn_handler.arg = &s;
    ucp_listener_h listener = nullptr;
    ucs_status_t st = ucp_listener_create(s.worker.get(), &p, &listener);
    if (st != UCS_OK) {
      return Status::IOError("listen on " + where + ": " + UcsText(st));
    }
    ListenerPtr owner(listener);
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(listener, &attr);
    if (st != UCS_OK) {
      return Status::IOError("listen on " + where + ": " + UcsText(st));
    }
    uint16_t bound = 0;
    if (attr.sockaddr.ss_family == AF_INET) {
      bound =
          ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
    } else if (attr.sockaddr.ss_family == AF_INET6) {
      bound = ntohs(
          reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
    }
    s.listener = std::move(owner);
    s.listen_handler = std::move(handler);
    s.listen_address = HostPort(host, bound);
    s.bound_port = bound;
    return Status::OK();
  }

  std::shared_ptr<UcxShared> shared_;
  Mutex join_mu_;  // serializes joins
  std::thread thread_ DCR_GUARDED_BY(join_mu_);
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateUcxTransport(
    const TransportOptions& options) {
  if (options.tls.enabled()) {
    return Status::Unsupported(
        "transport kind 'ucx' has no TLS (UCX links are not encrypted); use "
        "kind 'tcp' for TLS, or leave options.tls empty");
  }
  if (options.max_send_bps != 0) {
    return Status::Unsupported(
        "transport kind 'ucx' does not pace sends; max_send_bps is for kind "
        "'tcp' (set it to 0)");
  }
  if (options.low_watermark > options.high_watermark) {
    return Status::InvalidArgument(
        "transport low_watermark is above high_watermark");
  }
  auto shared = std::make_shared<UcxShared>(options);
  DCR_ASSIGN_OR_RETURN(shared->context, ucx_internal::CreateContext());
  DCR_ASSIGN_OR_RETURN(shared->worker,
                       ucx_internal::CreateWorker(shared->context.get()));
  for (const std::string& r :
       ucx_internal::ListResources(shared->context.get())) {
    shared->rdma = shared->rdma || ucx_internal::IsRdmaResource(r);
  }
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                  UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = ucx_internal::kCtlAmId;
  am.cb = &UcxShared::CtlCallback;
  am.arg = shared.get();
  ucs_status_t st = ucp_worker_set_am_recv_handler(shared->worker.get(), &am);
  if (st != UCS_OK) {
    return Status::IOError("ucp_worker_set_am_recv_handler failed (" +
                           UcsText(st) + ")");
  }
  int worker_fd = -1;
  st = ucp_worker_get_efd(shared->worker.get(), &worker_fd);
  if (st != UCS_OK) {
    return Status::IOError("ucp_worker_get_efd failed (" + UcsText(st) + ")");
  }
  shared->epoll_fd = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  shared->wake_fd = UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (shared->epoll_fd.get() < 0 || shared->wake_fd.get() < 0) {
    return Status::FromErrno("ucx transport: epoll/eventfd", errno);
  }
  for (int fd : {worker_fd, shared->wake_fd.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(shared->epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Status::FromErrno("ucx transport: epoll_ctl", errno);
    }
  }
  return std::unique_ptr<Transport>(
      std::make_unique<UcxTransport>(std::move(shared)));
}

}  // namespace dcr
