// UCX links on the UCP stream API: one context, one worker and one event
// thread per transport. UCX callbacks only record what completed (an Event
// on the loop's queue); the loop handles the queue after
// ucp_worker_progress returns, so LinkHandler callbacks never run inside
// UCX and may send, close or pause freely.
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
#include "transport/ucx/ucx_transport.h"

#include <netdb.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "transport/link_lifecycle.h"
#include "transport/ucx/ucx_context.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;
using transport_internal::LinkLifecycle;
using ucx_internal::ContextPtr;
using ucx_internal::UcsText;
using ucx_internal::WorkerPtr;

// What the server sends first on every accepted endpoint; a connect
// completes when it arrives (UCX creates a client endpoint before the
// server accepted it).
constexpr char kHelloMagic[8] = {'D', 'C', 'R', 'U', 'C', 'X', '0', '1'};
constexpr uint16_t kCtlAmId = 0x0dc1;
// Stream bytes a sender may have sent and not yet credited.
constexpr uint64_t kWindowBytes = 8u << 20;
// A receiver credits once this many bytes are unreported.
constexpr uint64_t kCreditQuantum = kWindowBytes / 4;
// How long a closed link's endpoint waits for the peer to read up to the
// bye and disconnect before it is cut.
constexpr std::chrono::seconds kLinger{10};
// How long Stop lets lingering endpoints and close requests finish.
constexpr std::chrono::milliseconds kStopGrace{1000};

enum class CtlKind : uint32_t { kCredit = 1, kBye = 2 };
struct CtlMsg {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t value = 0;
};

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

// host:port as a socket address; the error says why not.
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

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct ListenerDeleter {
  void operator()(ucp_listener_h l) const { ucp_listener_destroy(l); }
};
using ListenerPtr = std::unique_ptr<ucp_listener, ListenerDeleter>;

class UcxLink;
struct PendingConnect;
struct UcxShared;

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

class UcxLink final : public LinkLifecycle {
 public:
  UcxLink(std::shared_ptr<UcxShared> shared, ucp_ep_h ep, std::string peer,
          std::shared_ptr<LinkHandler> handler)
      : LinkLifecycle(std::move(handler), shared->options.high_watermark,
                      shared->options.low_watermark,
                      shared->options.max_queued_bytes),
        shared_(std::move(shared)),
        ep_(ep),
        peer_(std::move(peer)),
        id_(shared_->next_link_id++),
        decoder_(shared_->options.frames),
        read_buf_(std::max<size_t>(shared_->options.read_buffer_bytes, 4096)) {}

  // Event thread: registers the link, announces it and starts reading.
  void Start() {
    shared_->links[ep_] = Self();
    handler().OnOpen(*this);
    Deliver();
  }

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Event thread (DoClose). Lets the endpoint go: after a bye (local
  // close, OK) it lingers until the peer has read everything; otherwise it
  // is cut.
  void TearDown(const Status& why) override {
    // Sends still posted to this link (LinkLifecycle::Admit) subtract their own
    // bytes.
    size_t dropped = in_flight_bytes_;
    for (const FrameBuffer& f : queue_) dropped += f->size();
    queue_.clear();
    in_flight_bytes_ = 0;
    queued_ -= dropped;
    shared_->links.erase(ep_);
    if (ep_failed_) {
      shared_->CloseEp(ep_, /*force=*/true);  // UCX requires it
    } else if (peer_bye_ || !why.ok()) {
      // The peer closed first, or this side gives up on the link: a
      // graceful disconnect tells the peer (an IOError there).
      shared_->CloseEp(ep_, /*force=*/false);
    } else {
      shared_->SendCtl(ep_, CtlKind::kBye, sent_total_);
      shared_->lingering[ep_] = Lingering{Clock::now() + kLinger};
    }
    ep_ = nullptr;
    if (!why.ok()) {
      spdlog::debug("dcr: ucx link {} to {} closed: {}", id_, peer_,
                    why.ToString());
    }
  }

  void OnSendDone(const Op& op) {
    --in_flight_;
    if (closed()) {
      // Sent before the close finished it: the peer may have the frame.
      if (op.status == UCS_OK) {
        ++frames_sent_;
        bytes_sent_ += op.frame->size();
      }
      return;
    }
    if (op.status != UCS_OK) {
      ep_failed_ = true;
      DoClose(Status::IOError("send to " + peer_ +
                              " failed: " + UcsText(op.status)));
      return;
    }
    ++frames_sent_;
    bytes_sent_ += op.frame->size();
    in_flight_bytes_ -= op.frame->size();
    queued_ -= op.frame->size();
    if (NoteWritten(queued_.load())) return;
    Pump();
  }

  void OnRecvDone(const Op& op) {
    reading_ = false;
    if (closed()) return;
    if (op.status != UCS_OK) {
      if (!pending_close_) pending_close_ = PeerGone(op.status);
    } else if (op.length > 0) {
      bytes_received_ += op.length;
      unreported_ += op.length;
      if (unreported_ >= kCreditQuantum) {
        shared_->SendCtl(ep_, CtlKind::kCredit, unreported_);
        unreported_ = 0;
      }
      decoder_.Feed(std::span<const std::byte>(read_buf_.data(), op.length));
      CheckBye();
    }
    Deliver();
  }

  void OnCtl(const CtlMsg& m) {
    if (closed()) return;
    if (m.kind == static_cast<uint32_t>(CtlKind::kCredit)) {
      credited_total_ += m.value;
      Pump();
    } else if (m.kind == static_cast<uint32_t>(CtlKind::kBye)) {
      peer_bye_ = true;
      bye_total_ = m.value;
      CheckBye();
      if (pending_close_) Deliver();
    }
  }

  void OnEpError(ucs_status_t status) {
    ep_failed_ = true;
    if (closed()) return;
    if (!pending_close_) pending_close_ = PeerGone(status);
    // Frames already decoded are delivered first (once resumed if paused);
    // what UCX had not handed over is lost with the endpoint.
    Deliver();
  }

 private:
  bool OnEventThread() const override { return shared_->InThread(); }
  bool PostToEventThread(std::function<void()> fn) override {
    return shared_->Post(std::move(fn));
  }
  bool Flushed() const override { return queue_.empty() && in_flight_ == 0; }

  std::shared_ptr<UcxLink> Self() {
    return std::static_pointer_cast<UcxLink>(shared_from_this());
  }

  Status PeerGone(ucs_status_t status) const {
    std::string why = peer_bye_ ? "peer " + peer_ + " closed the connection"
                                : "connection to peer " + peer_ + " failed (" +
                                      UcsText(status) + ")";
    if (decoder_.mid_frame()) {
      why += " mid-frame (" + std::to_string(decoder_.partial_bytes()) +
             " bytes of a frame received)";
    }
    return Status::IOError(why);
  }

  // After the peer's bye, every byte it sent has been read: close.
  void CheckBye() {
    if (peer_bye_ && bytes_received_.load() >= bye_total_ && !pending_close_) {
      pending_close_ = PeerGone(UCS_OK);
    }
  }

  void Enqueue(FrameBuffer frame) override {
    queue_.push_back(std::move(frame));
    Pump();
  }

  // Posts queued frames while the window and max_write_gather allow; each
  // is sent from its own buffer, which the Op holds until completion.
  void Pump() {
    const size_t max_in_flight =
        std::max<size_t>(shared_->options.max_write_gather, 1);
    while (!closed() && !ep_failed_ && !queue_.empty() &&
           in_flight_ < max_in_flight &&
           sent_total_ - credited_total_ < kWindowBytes) {
      auto* op = new Op(Op::kSend);
      op->link = Self();
      op->frame = std::move(queue_.front());
      queue_.pop_front();
      sent_total_ += op->frame->size();
      in_flight_bytes_ += op->frame->size();
      ++in_flight_;
      ucp_request_param_t p = shared_->Params(op);
      shared_->Submit(op, ucp_stream_send_nbx(ep_, op->frame->data(),
                                              op->frame->size(), &p));
    }
    FinishFlushClose();
  }

  void DoRead() {
    if (closing() || read_paused() || reading_ || ep_failed_) return;
    reading_ = true;
    auto* op = new Op(Op::kRecv);
    op->link = Self();
    ucp_request_param_t p = shared_->Params(op);
    p.cb.recv_stream = &UcxShared::RecvCallback;
    shared_->Submit(op, ucp_stream_recv_nbx(ep_, read_buf_.data(),
                                            read_buf_.size(), &op->length, &p));
  }

  // Hands decoded frames to the handler until paused or out of frames,
  // then reads more (or closes if the peer is gone).
  void Deliver() override {
    while (!closing() && !read_paused()) {
      Result<std::optional<DecodedFrame>> next = decoder_.Next();
      if (!next.ok()) {
        DoClose(next.status().WithContext("frame from " + peer_));
        return;
      }
      if (!next->has_value()) break;
      ++frames_received_;
      const DecodedFrame& f = **next;
      handler().OnFrame(*this, f.frame, f.buffer);
    }
    if (closing() || read_paused()) return;
    if (pending_close_) {
      Status why = std::move(*pending_close_);
      pending_close_.reset();
      DoClose(std::move(why));
      return;
    }
    DoRead();
  }

  const std::shared_ptr<UcxShared> shared_;
  ucp_ep_h ep_;  // null once closed
  const std::string peer_;
  const uint64_t id_;
  FrameDecoder decoder_;
  std::vector<std::byte> read_buf_;  // the one receive in flight fills it
  std::deque<FrameBuffer> queue_;    // not yet handed to UCX
  size_t in_flight_ = 0;             // sends handed to UCX, not completed
  size_t in_flight_bytes_ = 0;       // their bytes
  uint64_t sent_total_ = 0;          // stream bytes handed to UCX
  uint64_t credited_total_ = 0;      // of which the peer has read
  uint64_t unreported_ = 0;          // read here, not yet credited
  uint64_t bye_total_ = 0;
  bool peer_bye_ = false;
  std::optional<Status> pending_close_;  // the peer is gone; deliver first
  bool reading_ = false;
  bool ep_failed_ = false;
};

// --- the loop ---------------------------------------------------------------

void FinishConnect(UcxShared& s, const std::shared_ptr<PendingConnect>& pc,
                   Result<std::shared_ptr<Link>> result) {
  if (pc->finished) return;
  pc->finished = true;
  s.connects.erase(pc->ep);
  if (!result.ok() && pc->ep != nullptr) s.CloseEp(pc->ep, /*force=*/true);
  ConnectCallback done = std::move(pc->done);
  done(std::move(result));
}

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
      RunLoop(shared);
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
    if (!shared_->Post([shared, pc] { StartConnect(shared, pc); })) {
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
  am.id = kCtlAmId;
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
