// ucx_shared.h StartConnect and RunLoop: the transport's event thread.
// It progresses the worker, handles what UCX reported (completed requests,
// endpoint errors, connection requests, control messages), runs what other
// threads posted, and enforces the connect and linger deadlines; it sleeps
// in epoll on the worker's event fd and the wake eventfd.
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "transport/ucx/ucx_link.h"
#include "transport/ucx/ucx_shared.h"

namespace dcr::ucx_internal {

std::string HostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string SockaddrName(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown peer";
  }
  return HostPort(host, static_cast<uint16_t>(std::stoi(serv)));
}

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port,
                                 bool passive, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::IOError(std::string("cannot resolve host: ") +
                           gai_strerror(rc));
  }
  // IPv4 first: "localhost" may list ::1 first while listeners bind
  // 127.0.0.1.
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  sockaddr_storage out{};
  std::memcpy(&out, pick->ai_addr, pick->ai_addrlen);
  *len = pick->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

namespace {

void FinishConnect(UcxShared& s, const std::shared_ptr<PendingConnect>& pc,
                   Result<std::shared_ptr<Link>> result) {
  if (pc->finished) return;
  pc->finished = true;
  s.connects.erase(pc->ep);
  if (!result.ok() && pc->ep != nullptr) s.CloseEp(pc->ep, /*force=*/true);
  ConnectCallback done = std::move(pc->done);
  done(std::move(result));
}

void OnHello(const std::shared_ptr<UcxShared>& shared, const Op& op) {
  const std::shared_ptr<PendingConnect>& pc = op.pc;
  if (pc->finished) return;
  if (op.status != UCS_OK) {
    FinishConnect(*shared, pc,
                  Status::IOError("connect to " + pc->address() + ": " +
                                  UcsText(op.status)));
    return;
  }
  if (op.length != sizeof(kHelloMagic) ||
      std::memcmp(pc->hello, kHelloMagic, sizeof(kHelloMagic)) != 0) {
    FinishConnect(*shared, pc,
                  Status::IOError("connect to " + pc->address() +
                                  ": the peer is not a dcr ucx transport"));
    return;
  }
  pc->finished = true;
  shared->connects.erase(pc->ep);
  auto link =
      std::make_shared<UcxLink>(shared, pc->ep, pc->address(), pc->handler);
  link->Start();
  ConnectCallback done = std::move(pc->done);
  done(std::shared_ptr<Link>(std::move(link)));
}

void OnConnRequest(const std::shared_ptr<UcxShared>& shared,
                   ucp_conn_request_h conn) {
  UcxShared& s = *shared;
  if (s.closing_all || !s.listener) {
    if (s.listener) ucp_listener_reject(s.listener.get(), conn);
    return;
  }
  std::string peer = "unknown peer";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(conn, &attr) == UCS_OK) {
    peer = SockaddrName(reinterpret_cast<const sockaddr*>(&attr.client_address),
                        sizeof(attr.client_address));
  }
  ucp_ep_params_t p = s.EpParams();
  p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = conn;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(s.worker.get(), &p, &ep);
  if (st != UCS_OK) {
    spdlog::warn("dcr: ucx accept from {} on {}: {}", peer, s.listen_address,
                 UcsText(st));
    return;
  }
  auto* op = new Op(Op::kHello);
  ucp_request_param_t sp = s.Params(op);
  s.Submit(op, ucp_stream_send_nbx(ep, kHelloMagic, sizeof(kHelloMagic), &sp));
  auto link = std::make_shared<UcxLink>(shared, ep, peer, s.listen_handler);
  link->Start();
}

void HandleEvent(const std::shared_ptr<UcxShared>& shared, Event& e) {
  UcxShared& s = *shared;
  switch (e.kind) {
    case Event::kOpDone: {
      Op& op = *e.op;
      switch (op.kind) {
        case Op::kSend:
          op.link->OnSendDone(op);
          break;
        case Op::kRecv:
          op.link->OnRecvDone(op);
          break;
        case Op::kHello:
          if (op.pc) OnHello(shared, op);
          break;
        case Op::kCtl:
        case Op::kClose:
          break;
      }
      return;
    }
    case Event::kEpError: {
      if (auto it = s.links.find(e.ep); it != s.links.end()) {
        std::shared_ptr<UcxLink> link = it->second;
        link->OnEpError(e.status);
      } else if (auto c = s.connects.find(e.ep); c != s.connects.end()) {
        std::shared_ptr<PendingConnect> pc = c->second;
        FinishConnect(s, pc,
                      Status::IOError("connect to " + pc->address() + ": " +
                                      UcsText(e.status)));
      } else if (s.lingering.count(e.ep) != 0) {
        s.CloseEp(e.ep, /*force=*/true);  // the peer read up to the bye
      }
      return;
    }
    case Event::kConnRequest:
      OnConnRequest(shared, e.conn);
      return;
    case Event::kCtlRecv: {
      if (auto it = s.links.find(e.ep); it != s.links.end()) {
        std::shared_ptr<UcxLink> link = it->second;
        link->OnCtl(e.ctl);
      } else if (s.lingering.count(e.ep) != 0 &&
                 e.ctl.kind == static_cast<uint32_t>(CtlKind::kBye)) {
        s.CloseEp(e.ep, /*force=*/false);  // both sides closed
      }
      return;
    }
  }
}

// Progresses the worker and handles what it reported until both are quiet.
void ProgressAll(const std::shared_ptr<UcxShared>& shared) {
  UcxShared& s = *shared;
  for (;;) {
    unsigned n = 0;
    while (ucp_worker_progress(s.worker.get()) != 0) ++n;
    if (s.events.empty() && n == 0) return;
    while (!s.events.empty()) {
      Event e = std::move(s.events.front());
      s.events.pop_front();
      HandleEvent(shared, e);
    }
  }
}

void CloseAll(const std::shared_ptr<UcxShared>& shared) {
  UcxShared& s = *shared;
  s.closing_all = true;
  s.stop_deadline = Clock::now() + kStopGrace;
  s.listener.reset();
  s.bound_port = 0;
  auto connects = s.connects;
  for (const auto& [ep, pc] : connects) {
    FinishConnect(
        s, pc,
        Status::Aborted("connect to " + pc->address() + ": transport stopped"));
  }
  auto links = s.links;
  for (const auto& [ep, link] : links) link->DoClose(Status::OK());
  s.listen_handler.reset();
}

// Handles connect timeouts and lingering endpoints; returns how long epoll
// may sleep (-1: no deadline).
int CheckDeadlines(const std::shared_ptr<UcxShared>& shared) {
  UcxShared& s = *shared;
  const Clock::time_point now = Clock::now();
  std::optional<Clock::time_point> next;
  auto consider = [&](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  std::vector<std::shared_ptr<PendingConnect>> expired;
  for (const auto& [ep, pc] : s.connects) {
    if (pc->deadline <= now) {
      expired.push_back(pc);
    } else {
      consider(pc->deadline);
    }
  }
  for (const auto& pc : expired) {
    FinishConnect(
        s, pc,
        Status::IOError("connect to " + pc->address() + " timed out after " +
                        std::to_string(pc->timeout.count()) + " ms"));
  }
  std::vector<ucp_ep_h> cut;
  for (const auto& [ep, l] : s.lingering) {
    if (l.deadline <= now || (s.closing_all && s.stop_deadline <= now)) {
      cut.push_back(ep);
    } else {
      consider(
          std::min(l.deadline, s.closing_all ? s.stop_deadline : l.deadline));
    }
  }
  for (ucp_ep_h ep : cut) s.CloseEp(ep, /*force=*/true);
  if (s.closing_all) consider(s.stop_deadline + kStopGrace);
  if (!next) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now);
  return static_cast<int>(std::clamp<int64_t>(ms.count(), 0, 60'000));
}

}  // namespace

void StartConnect(const std::shared_ptr<UcxShared>& shared,
                  const std::shared_ptr<PendingConnect>& pc) {
  UcxShared& s = *shared;
  if (s.closing_all) {
    FinishConnect(
        s, pc,
        Status::Aborted("connect to " + pc->address() + ": transport stopped"));
    return;
  }
  socklen_t len = 0;
  Result<sockaddr_storage> addr = Resolve(pc->host, pc->port, false, &len);
  if (!addr.ok()) {
    FinishConnect(s, pc,
                  addr.status().WithContext("connect to " + pc->address()));
    return;
  }
  ucp_ep_params_t p = s.EpParams();
  p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  p.sockaddr.addrlen = len;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(s.worker.get(), &p, &ep);
  if (st != UCS_OK) {
    FinishConnect(
        s, pc,
        Status::IOError("connect to " + pc->address() + ": " + UcsText(st)));
    return;
  }
  pc->ep = ep;
  pc->deadline = Clock::now() + pc->timeout;
  s.connects[ep] = pc;
  auto* op = new Op(Op::kHello);
  op->pc = pc;
  ucp_request_param_t rp = s.Params(op);
  rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  rp.cb.recv_stream = &UcxShared::RecvCallback;
  s.Submit(op, ucp_stream_recv_nbx(ep, pc->hello, sizeof(pc->hello),
                                   &op->length, &rp));
}

void RunLoop(const std::shared_ptr<UcxShared>& shared) {
  UcxShared& s = *shared;
  for (;;) {
    std::deque<std::function<void()>> work;
    bool stop = false;
    {
      MutexLock lock(&s.mu);
      work.swap(s.posted);
      stop = s.stop_requested;
    }
    for (auto& fn : work) {
      fn();
      ProgressAll(shared);
    }
    if (stop && !s.closing_all) CloseAll(shared);
    ProgressAll(shared);
    const int timeout_ms = CheckDeadlines(shared);
    if (!s.events.empty()) continue;
    if (s.closing_all) {
      const bool quiet =
          s.links.empty() && s.connects.empty() && s.lingering.empty();
      if ((quiet && s.outstanding == 0) ||
          Clock::now() >= s.stop_deadline + kStopGrace) {
        if (s.outstanding != 0) {
          spdlog::warn(
              "dcr: ucx transport stopped with {} UCX requests "
              "unfinished",
              s.outstanding);
        }
        return;
      }
    }
    {
      MutexLock lock(&s.mu);
      if (!s.posted.empty() || (s.stop_requested && !s.closing_all)) continue;
    }
    const ucs_status_t armed = ucp_worker_arm(s.worker.get());
    if (armed == UCS_ERR_BUSY) continue;
    epoll_event ev[2];
    const int n = epoll_wait(s.epoll_fd.get(), ev, 2, timeout_ms);
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.fd == s.wake_fd.get()) {
        uint64_t count;
        ssize_t r = ::read(s.wake_fd.get(), &count, sizeof(count));
        (void)r;
      }
    }
  }
}

}  // namespace dcr::ucx_internal
