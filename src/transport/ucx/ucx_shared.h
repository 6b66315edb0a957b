// What a UCX transport's parts share (ucx_transport.cc the transport,
// ucx_link.cc a link, ucx_loop.cc the event loop): the control messages,
// the requests in flight and the events UCX reported, and UcxShared, the
// state of one transport. Internal to the transport module.
//
// UCX callbacks only record what completed (an Event on the loop's
// queue); the loop handles the queue after ucp_worker_progress returns,
// so LinkHandler callbacks never run inside UCX and may send, close or
// pause freely.
//
// Beside the byte stream each endpoint carries small control messages as
// UCP active messages (id kCtlAmId, a CtlMsg as payload):
//   credit(n)  the receiver took n more bytes out of UCX. A sender keeps
//              at most kWindowBytes (plus one frame) sent and not yet
//              credited: UCX itself has no flow control for stream data
//              (it buffers whatever arrives), so a paused reader stops
//              crediting and its peer's QueuedBytes grows, as on TCP.
//   bye(n)     the sender closed its link after n stream bytes in total.
//              The receiver closes once it has read n bytes (IOError "peer
//              closed the connection"), which closes its endpoint; the
//              closer keeps its endpoint (lingering) until then, so a
//              graceful close never cuts data still in flight.
#ifndef DCR_TRANSPORT_UCX_UCX_SHARED_H_
#define DCR_TRANSPORT_UCX_UCX_SHARED_H_

#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/file.h"
#include "common/mutex.h"
#include "dcr/transport.h"
#include "transport/ucx/ucx_context.h"

namespace dcr::ucx_internal {

using Clock = std::chrono::steady_clock;

// What the server sends first on every accepted endpoint; a connect
// completes when it arrives (UCX creates a client endpoint before the
// server accepted it).
inline constexpr char kHelloMagic[8] = {'D', 'C', 'R', 'U', 'C', 'X', '0', '1'};
inline constexpr uint16_t kCtlAmId = 0x0dc1;
// Stream bytes a sender may have sent and not yet credited.
inline constexpr uint64_t kWindowBytes = 8u << 20;
// A receiver credits once this many bytes are unreported.
inline constexpr uint64_t kCreditQuantum = kWindowBytes / 4;
// How long a closed link's endpoint waits for the peer to read up to the
// bye and disconnect before it is cut.
inline constexpr std::chrono::seconds kLinger{10};
// How long Stop lets lingering endpoints and close requests finish.
inline constexpr std::chrono::milliseconds kStopGrace{1000};

enum class CtlKind : uint32_t { kCredit = 1, kBye = 2 };
struct CtlMsg {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t value = 0;
};

// "host:port", bracketing an IPv6 host.
std::string HostPort(std::string_view host, uint16_t port);
// A socket address as "host:port" (numeric), or "unknown peer".
std::string SockaddrName(const sockaddr* sa, socklen_t len);
// host:port as a socket address; the error says why not.
Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port,
                                 bool passive, socklen_t* len);

class UcxLink;  // ucx_link.h
struct PendingConnect;
struct UcxShared;

struct ListenerDeleter {
  void operator()(ucp_listener_h l) const { ucp_listener_destroy(l); }
};
using ListenerPtr = std::unique_ptr<ucp_listener, ListenerDeleter>;

// The user data of one UCX request. Owned by UCX from Submit until its
// callback (or by the Event at once when the request completed inline),
// then by the Event that hands it back to the loop.
struct Op {
  enum Kind { kSend, kRecv, kHello, kCtl, kClose };
  explicit Op(Kind k) : kind(k) {}

  const Kind kind;
  std::shared_ptr<UcxLink> link;
  std::shared_ptr<PendingConnect> pc;
  FrameBuffer frame;  // kSend: held until UCX is done with it
  CtlMsg ctl;         // kCtl: the payload, held until sent
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  UcxShared* shared = nullptr;
};

// Something UCX reported, handled by the loop outside UCX callbacks.
struct Event {
  enum Kind { kOpDone, kEpError, kConnRequest, kCtlRecv };
  Event(Kind k, std::unique_ptr<Op> o) : kind(k), op(std::move(o)) {}

  Kind kind;
  std::unique_ptr<Op> op;
  ucp_ep_h ep = nullptr;
  ucs_status_t status = UCS_OK;
  ucp_conn_request_h conn = nullptr;
  CtlMsg ctl;
};

// One connect attempt: an endpoint waiting for the server's hello.
struct PendingConnect {
  std::string host;
  uint16_t port = 0;
  std::shared_ptr<LinkHandler> handler;
  ConnectCallback done;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;
  ucp_ep_h ep = nullptr;
  char hello[sizeof(kHelloMagic)] = {};
  bool finished = false;

  std::string address() const { return HostPort(host, port); }
};

// A closed link's endpoint after its bye, until the peer disconnects.
struct Lingering {
  Clock::time_point deadline;
};

// State shared by the transport, its links and its loop. Fields below
// `mu`'s group are touched only on the event thread.
struct UcxShared {
  explicit UcxShared(const TransportOptions& o) : options(o) {
    options.fake_network.reset();
  }

  TransportOptions options;
  ContextPtr context;
  WorkerPtr worker;  // declared after the context: destroyed first
  bool rdma = false;
  UniqueFd epoll_fd, wake_fd;
  std::thread::id thread_id;
  std::atomic<uint64_t> next_link_id{1};
  std::atomic<uint16_t> bound_port{0};

  Mutex mu;
  std::deque<std::function<void()>> posted DCR_GUARDED_BY(mu);
  bool stop_requested DCR_GUARDED_BY(mu) = false;

  // Event thread only.
  std::deque<Event> events;
  ListenerPtr listener;
  std::shared_ptr<LinkHandler> listen_handler;
  std::string listen_address;
  std::unordered_map<ucp_ep_h, std::shared_ptr<UcxLink>> links;
  std::unordered_map<ucp_ep_h, std::shared_ptr<PendingConnect>> connects;
  std::unordered_map<ucp_ep_h, Lingering> lingering;
  size_t outstanding = 0;  // requests whose callbacks are still due
  bool closing_all = false;
  Clock::time_point stop_deadline;

  bool InThread() const { return std::this_thread::get_id() == thread_id; }

  bool Post(std::function<void()> fn) {
    {
      MutexLock lock(&mu);
      if (stop_requested) return false;
      posted.push_back(std::move(fn));
    }
    Wake();
    return true;
  }

  void Wake() {
    const uint64_t one = 1;
    ssize_t n = ::write(wake_fd.get(), &one, sizeof(one));
    (void)n;  // EAGAIN: the counter is already non-zero
  }

  // Takes a request's outcome: done now (NULL), failed now, or later
  // through the callback.
  void Submit(Op* op, ucs_status_ptr_t request) {
    if (request == nullptr) {
      events.push_back(Event{Event::kOpDone, std::unique_ptr<Op>(op)});
    } else if (UCS_PTR_IS_ERR(request)) {
      op->status = UCS_PTR_STATUS(request);
      events.push_back(Event{Event::kOpDone, std::unique_ptr<Op>(op)});
    } else {
      // The callback frees the request: freeing it before completion
      // would cancel the callback (UCX 1.13 clears it on release).
      ++outstanding;
    }
  }

  static void Complete(void* request, ucs_status_t status, Op* op) {
    ucp_request_free(request);
    op->status = status;
    --op->shared->outstanding;
    op->shared->events.push_back(
        Event{Event::kOpDone, std::unique_ptr<Op>(op)});
  }

  static void SendCallback(void* request, ucs_status_t status,
                           void* user_data) {
    Complete(request, status, static_cast<Op*>(user_data));
  }

  static void RecvCallback(void* request, ucs_status_t status, size_t length,
                           void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->length = length;
    Complete(request, status, op);
  }

  static void ErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* shared = static_cast<UcxShared*>(arg);
    Event e{Event::kEpError, nullptr};
    e.ep = ep;
    e.status = status;
    shared->events.push_back(std::move(e));
  }

  static void ConnCallback(ucp_conn_request_h conn, void* arg) {
    auto* shared = static_cast<UcxShared*>(arg);
    Event e{Event::kConnRequest, nullptr};
    e.conn = conn;
    shared->events.push_back(std::move(e));
  }

  static ucs_status_t CtlCallback(void* arg, const void*, size_t, void* data,
                                  size_t length,
                                  const ucp_am_recv_param_t* param) {
    auto* shared = static_cast<UcxShared*>(arg);
    if (length != sizeof(CtlMsg) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      return UCS_OK;  // not ours
    }
    Event e{Event::kCtlRecv, nullptr};
    e.ep = param->reply_ep;
    std::memcpy(&e.ctl, data, sizeof(CtlMsg));
    shared->events.push_back(std::move(e));
    return UCS_OK;
  }

  ucp_request_param_t Params(Op* op) {
    op->shared = this;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &SendCallback;
    p.user_data = op;
    return p;
  }

  void SendCtl(ucp_ep_h ep, CtlKind kind, uint64_t value) {
    auto* op = new Op(Op::kCtl);
    op->ctl.kind = static_cast<uint32_t>(kind);
    op->ctl.value = value;
    ucp_request_param_t p = Params(op);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    Submit(op, ucp_am_send_nbx(ep, kCtlAmId, nullptr, 0, &op->ctl,
                               sizeof(CtlMsg), &p));
  }

  // Releases `ep`: `force` for a failed endpoint or a cut; otherwise UCX
  // flushes what was sent first.
  void CloseEp(ucp_ep_h ep, bool force) {
    lingering.erase(ep);
    auto* op = new Op(Op::kClose);
    ucp_request_param_t p = Params(op);
    if (force) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    Submit(op, ucp_ep_close_nbx(ep, &p));
  }

  ucp_ep_params_t EpParams() {
    ucp_ep_params_t p{};
    p.field_mask =
        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &ErrorCallback;
    p.err_handler.arg = this;
    return p;
  }
};

// The event loop (ucx_loop.cc), on the transport's thread.
// Starts connect attempt `pc`: resolves, creates the endpoint and waits
// for the server's hello (or the timeout).
void StartConnect(const std::shared_ptr<UcxShared>& shared,
                  const std::shared_ptr<PendingConnect>& pc);
// Runs until Stop was asked and every link, connect and lingering
// endpoint is gone (or the stop grace passed).
void RunLoop(const std::shared_ptr<UcxShared>& shared);

}  // namespace dcr::ucx_internal

#endif  // DCR_TRANSPORT_UCX_UCX_SHARED_H_
