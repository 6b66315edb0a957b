// The in-process fake transport (contract in transport/fake_transport.h).
//
// Each link end keeps the frames its side sent in a queue; a "pump" step on
// the network's event thread takes one frame, applies the direction's
// faults and feeds the bytes to the other end's FrameDecoder, which calls
// that end's handler. Everything below runs on the event thread unless a
// comment says otherwise.
#include "transport/fake_transport.h"

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "transport/event_loop.h"
#include "transport/link_lifecycle.h"

namespace dcr {
namespace fake_internal {

using Clock = std::chrono::steady_clock;
using transport_internal::EventLoop;
using transport_internal::LinkLifecycle;

class FakeLink;

struct Direction {
  FakeFaults faults;
  bool paused = false;
  // Counts since SetFaults, for the Nth-frame and N-byte faults.
  uint64_t frames_taken = 0;
  uint64_t frames_delivered = 0;
  uint64_t bytes_delivered = 0;
  FakeDirectionStats stats;
};

// One transport's endpoint.
struct Endpoint {
  Endpoint(std::string n, const TransportOptions& o)
      : name(std::move(n)), options(o) {}

  const std::string name;
  const TransportOptions options;
  std::atomic<bool> stopped{false};
  std::atomic<uint16_t> bound_port{0};
  uint64_t next_link_id = 1;
  std::string listen_address;
  std::shared_ptr<LinkHandler> listen_handler;
  std::set<std::shared_ptr<FakeLink>> links;
};

// The network: the loop is declared first so it outlives the rest.
struct Core {
  Core() : loop("dcr-fake") {}

  Direction& Dir(const std::string& from, const std::string& to) {
    return directions[{from, to}];
  }

  EventLoop loop;
  std::map<std::pair<std::string, std::string>, Direction> directions;
  std::map<std::string, std::weak_ptr<Endpoint>> endpoints;  // by name
  std::map<std::string, std::weak_ptr<Endpoint>> listeners;  // by address
  std::vector<std::weak_ptr<FakeLink>> links;
  uint16_t next_port = 40000;
};

class FakeLink final : public LinkLifecycle {
 public:
  FakeLink(std::shared_ptr<Core> core, std::shared_ptr<Endpoint> endpoint,
           std::string remote_name, std::string peer,
           std::shared_ptr<LinkHandler> handler)
      : LinkLifecycle(std::move(handler), endpoint->options.high_watermark,
                      endpoint->options.low_watermark,
                      endpoint->options.max_queued_bytes),
        core_(std::move(core)),
        endpoint_(std::move(endpoint)),
        remote_name_(std::move(remote_name)),
        peer_(std::move(peer)),
        id_(endpoint_->next_link_id++),
        decoder_(endpoint_->options.frames),
        timer_(core_->loop.io()) {}

  void Pair(const std::shared_ptr<FakeLink>& remote) { remote_ = remote; }

  void Open() {
    auto self = Self();
    endpoint_->links.insert(self);
    std::erase_if(core_->links, [](const auto& w) { return w.expired(); });
    core_->links.push_back(self);
    handler().OnOpen(*this);
  }

  const std::string& local_name() const { return endpoint_->name; }
  const std::string& remote_name() const { return remote_name_; }

  // Any thread.

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Event thread (DoClose). Drops the frames not delivered yet.
  void TearDown(const Status& /*why*/) override {
    timer_.cancel();
    size_t dropped = 0;
    for (const Pending& p : out_) dropped += p.frame->size();
    queued_ -= dropped;
    out_.clear();
    endpoint_->links.erase(Self());
  }

  // Event thread (DoClose, after the handler heard of it).
  void AfterClosed() override {
    std::shared_ptr<FakeLink> remote = remote_.lock();
    remote_.reset();
    if (remote && !remote->closed()) {
      // The peer learns of it a turn later, as over a network.
      std::string msg = "peer " + local_name() + " closed the link";
      asio::post(core_->loop.io(),
                 [remote, msg] { remote->DoClose(Status::IOError(msg)); });
    }
  }

  void SchedulePump() {
    if (pump_posted_ || closed()) return;
    pump_posted_ = true;
    asio::post(core_->loop.io(), [self = Self()] {
      self->pump_posted_ = false;
      self->PumpOne();
    });
  }

 private:
  bool OnEventThread() const override { return core_->loop.InThread(); }
  bool PostToEventThread(std::function<void()> fn) override {
    return core_->loop.Post(std::move(fn));
  }
  bool Flushed() const override { return out_.empty(); }
  // The peer end may pump the frames it held back for this end again.
  void AfterResume() override {
    if (auto remote = remote_.lock()) remote->SchedulePump();
  }

  struct Pending {
    FrameBuffer frame;
    Clock::time_point due;
  };

  std::shared_ptr<FakeLink> Self() {
    return std::static_pointer_cast<FakeLink>(shared_from_this());
  }

  void Enqueue(FrameBuffer frame) override {
    const Direction& dir = core_->Dir(local_name(), remote_name_);
    out_.push_back(Pending{std::move(frame), Clock::now() + dir.faults.delay});
    SchedulePump();
  }

  // Delivers bytes that arrived from the peer.
  void Receive(std::span<const std::byte> bytes) {
    if (closing()) return;
    bytes_received_ += bytes.size();
    decoder_.Feed(bytes);
    Deliver();
  }

  void Deliver() override { (void)DeliverDecoded(decoder_, peer_); }

  // Cuts the link: both ends close with `why`.
  void Cut(Direction& dir, const Status& why) {
    ++dir.stats.cuts;
    if (std::shared_ptr<FakeLink> remote = remote_.lock()) {
      remote->DoClose(why);
    }
    DoClose(why);
  }

  bool CutByFrames(Direction& dir) {
    FakeFaults& f = dir.faults;
    if (!f.cut_after_frames || dir.frames_delivered < *f.cut_after_frames) {
      return false;
    }
    Status why = Status::IOError(
        "fake link " + local_name() + " -> " + remote_name_ + " cut after " +
        std::to_string(*f.cut_after_frames) + " frames");
    f.cut_after_frames.reset();
    Cut(dir, why);
    return true;
  }

  // One delivery step: takes the next frame the peer can take, applies the
  // faults, and hands the bytes over.
  void PumpOne() {
    if (closed() || out_.empty()) return;
    std::shared_ptr<FakeLink> remote = remote_.lock();
    if (!remote || remote->closing()) return;
    Direction& dir = core_->Dir(local_name(), remote_name_);
    if (dir.paused || remote->read_paused()) return;  // Resume pumps again
    if (out_.front().due > Clock::now()) {
      ArmTimer(out_.front().due);
      return;
    }
    if (CutByFrames(dir)) return;
    FrameBuffer frame = std::move(out_.front().frame);
    out_.pop_front();
    const size_t size = frame->size();
    queued_ -= size;
    ++frames_sent_;
    bytes_sent_ += size;
    ++dir.stats.frames_sent;
    const uint64_t n = ++dir.frames_taken;
    FakeFaults& f = dir.faults;
    if (f.drop_frame && *f.drop_frame == n) {
      f.drop_frame.reset();
      ++dir.stats.frames_dropped;
      AfterSend();
      return;
    }
    std::span<const std::byte> bytes(*frame);
    std::vector<std::byte> corrupted;
    if (f.corrupt_frame && *f.corrupt_frame == n) {
      f.corrupt_frame.reset();
      corrupted.assign(frame->begin(), frame->end());
      corrupted[f.corrupt_offset % size] ^= std::byte{f.corrupt_mask};
      bytes = corrupted;
      ++dir.stats.frames_corrupted;
    }
    std::optional<Status> cut;
    if (f.cut_after_bytes) {
      const uint64_t left = *f.cut_after_bytes -
                            std::min(dir.bytes_delivered, *f.cut_after_bytes);
      if (bytes.size() >= left) {
        bytes = bytes.first(left);
        cut = Status::IOError("fake link " + local_name() + " -> " +
                              remote_name_ + " cut after " +
                              std::to_string(*f.cut_after_bytes) + " bytes");
        f.cut_after_bytes.reset();
      }
    }
    dir.bytes_delivered += bytes.size();
    dir.stats.bytes_delivered += bytes.size();
    if (bytes.size() == size) {
      ++dir.frames_delivered;
      ++dir.stats.frames_delivered;
    }
    if (!bytes.empty()) remote->Receive(bytes);  // runs the peer's handler
    if (cut) {
      Cut(dir, *cut);
      return;
    }
    if (closed() || CutByFrames(dir)) return;
    AfterSend();
  }

  void AfterSend() {
    if (closed()) return;
    if (NoteWritten(queued_.load())) return;
    if (FinishFlushClose()) return;
    SchedulePump();
  }

  void ArmTimer(Clock::time_point due) {
    if (timer_armed_) return;
    timer_armed_ = true;
    timer_.expires_at(due);
    timer_.async_wait([self = Self()](const asio::error_code& ec) {
      self->timer_armed_ = false;
      if (!ec) self->SchedulePump();
    });
  }

  const std::shared_ptr<Core> core_;
  const std::shared_ptr<Endpoint> endpoint_;
  const std::string remote_name_;
  const std::string peer_;
  const uint64_t id_;
  std::weak_ptr<FakeLink> remote_;
  FrameDecoder decoder_;
  asio::steady_timer timer_;
  std::deque<Pending> out_;
  bool pump_posted_ = false;
  bool timer_armed_ = false;
};

// Closes `endpoint`'s listener and links.
void CloseEndpoint(Core& core, Endpoint& endpoint) {
  if (!endpoint.listen_address.empty()) {
    core.listeners.erase(endpoint.listen_address);
  }
  endpoint.listen_handler.reset();
  auto links = endpoint.links;
  for (const auto& link : links) link->DoClose(Status::OK());
}

class FakeTransport final : public Transport {
 public:
  FakeTransport(std::shared_ptr<Core> core, std::shared_ptr<Endpoint> ep)
      : core_(std::move(core)), ep_(std::move(ep)) {}
  ~FakeTransport() override { Stop(); }

  std::string_view kind() const override { return "fake"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.fault_injection = true;
    return c;
  }

  Status Listen(std::string_view host, uint16_t port,
                std::shared_ptr<LinkHandler> handler) override {
    if (!handler) return Status::InvalidArgument("listen: no LinkHandler");
    Status result = Status::Aborted("listen: transport stopped");
    std::string h(host);
    core_->loop.RunSync([&] {
      if (ep_->stopped) return;
      if (ep_->listen_handler) {
        result = Status::InvalidArgument("listen on " + h +
                                         ": already "
                                         "listening on " +
                                         ep_->listen_address);
        return;
      }
      uint16_t p = port;
      if (p == 0) {
        do {
          p = core_->next_port++;
        } while (!core_->listeners[h + ":" + std::to_string(p)].expired());
      }
      const std::string address = h + ":" + std::to_string(p);
      if (!core_->listeners[address].expired()) {
        result = Status::IOError("listen on " + address +
                                 ": address already in use");
        return;
      }
      core_->listeners[address] = ep_;
      ep_->listen_address = address;
      ep_->listen_handler = std::move(handler);
      ep_->bound_port = p;
      result = Status::OK();
    });
    return result;
  }

  uint16_t BoundPort() const override { return ep_->bound_port.load(); }

  // The fake connects at once or is refused; `timeout` is not needed.
  void AsyncConnect(std::string_view host, uint16_t port,
                    std::shared_ptr<LinkHandler> handler,
                    std::chrono::milliseconds /*timeout*/,
                    ConnectCallback done) override {
    if (!handler) {
      done(Status::InvalidArgument("connect: no LinkHandler"));
      return;
    }
    const std::string address = std::string(host) + ":" + std::to_string(port);
    auto core = core_;
    auto ep = ep_;
    auto shared_done = std::make_shared<ConnectCallback>(std::move(done));
    bool posted = core_->loop.Post([core, ep, address, handler, shared_done] {
      ConnectCallback cb = std::move(*shared_done);
      if (ep->stopped) {
        cb(Status::Aborted("connect to " + address + ": transport stopped"));
        return;
      }
      auto it = core->listeners.find(address);
      std::shared_ptr<Endpoint> server =
          it == core->listeners.end() ? nullptr : it->second.lock();
      if (!server || server->stopped || !server->listen_handler) {
        cb(Status::IOError("connect to " + address +
                           ": connection refused (no fake listener)"));
        return;
      }
      auto client_link =
          std::make_shared<FakeLink>(core, ep, server->name, address, handler);
      auto server_link = std::make_shared<FakeLink>(
          core, server, ep->name, ep->name, server->listen_handler);
      client_link->Pair(server_link);
      server_link->Pair(client_link);
      server_link->Open();
      client_link->Open();
      cb(std::shared_ptr<Link>(std::move(client_link)));
    });
    if (!posted) {
      ConnectCallback cb = std::move(*shared_done);
      cb(Status::Aborted("connect to " + address + ": transport stopped"));
    }
  }

  bool Post(std::function<void()> fn) override {
    if (ep_->stopped) return false;
    auto ep = ep_;
    return core_->loop.Post([ep, f = std::move(fn)] {
      if (!ep->stopped) f();
    });
  }

  bool InEventThread() const override { return core_->loop.InThread(); }

  void Stop() override {
    if (ep_->stopped.exchange(true)) return;
    auto core = core_;
    auto ep = ep_;
    // Refused once the network is shutting down; its closer does this.
    core_->loop.RunSync([core, ep] {
      CloseEndpoint(*core, *ep);
      auto it = core->endpoints.find(ep->name);
      if (it != core->endpoints.end() && it->second.lock() == ep) {
        core->endpoints.erase(it);
      }
    });
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Endpoint> ep_;
};

}  // namespace fake_internal

using fake_internal::Core;
using fake_internal::Endpoint;

FakeNetwork::FakeNetwork() : core_(std::make_shared<Core>()) {}

std::shared_ptr<FakeNetwork> FakeNetwork::Create() {
  return std::shared_ptr<FakeNetwork>(new FakeNetwork());
}

FakeNetwork::~FakeNetwork() {
  auto core = core_;
  core_->loop.Shutdown([core] {
    for (auto& [name, weak] : core->endpoints) {
      if (auto ep = weak.lock()) {
        ep->stopped = true;
        fake_internal::CloseEndpoint(*core, *ep);
      }
    }
    core->endpoints.clear();
    core->listeners.clear();
  });
}

Result<std::unique_ptr<Transport>> FakeNetwork::CreateTransport(
    const TransportOptions& options) {
  if (options.name.empty()) {
    return Status::InvalidArgument("a fake transport needs options.name");
  }
  if (options.low_watermark > options.high_watermark) {
    return Status::InvalidArgument(
        "transport low_watermark is above high_watermark");
  }
  // The endpoint must not keep the network alive (it is destroyed from the
  // network's own thread otherwise).
  TransportOptions own = options;
  own.fake_network.reset();
  auto ep = std::make_shared<Endpoint>(options.name, own);
  Status result = Status::Aborted("fake network is shut down");
  core_->loop.RunSync([&] {
    std::weak_ptr<Endpoint>& slot = core_->endpoints[options.name];
    if (!slot.expired()) {
      result = Status::InvalidArgument("fake endpoint name '" + options.name +
                                       "' is in use");
      return;
    }
    slot = ep;
    result = Status::OK();
  });
  DCR_RETURN_IF_ERROR(result);
  return std::unique_ptr<Transport>(
      std::make_unique<fake_internal::FakeTransport>(core_, ep));
}

void FakeNetwork::SetFaults(std::string_view from, std::string_view to,
                            const FakeFaults& faults) {
  core_->loop.RunSync([&] {
    fake_internal::Direction& dir =
        core_->Dir(std::string(from), std::string(to));
    dir.faults = faults;
    dir.frames_taken = dir.frames_delivered = dir.bytes_delivered = 0;
  });
}

void FakeNetwork::Pause(std::string_view from, std::string_view to) {
  core_->loop.RunSync(
      [&] { core_->Dir(std::string(from), std::string(to)).paused = true; });
}

void FakeNetwork::Resume(std::string_view from, std::string_view to) {
  core_->loop.RunSync([&] {
    core_->Dir(std::string(from), std::string(to)).paused = false;
    for (const auto& weak : core_->links) {
      auto link = weak.lock();
      if (link && link->local_name() == from && link->remote_name() == to) {
        link->SchedulePump();
      }
    }
  });
}

FakeDirectionStats FakeNetwork::Stats(std::string_view from,
                                      std::string_view to) const {
  FakeDirectionStats stats;
  core_->loop.RunSync(
      [&] { stats = core_->Dir(std::string(from), std::string(to)).stats; });
  return stats;
}

void FakeNetwork::Sync() const {
  core_->loop.RunSync([] {});
}

}  // namespace dcr
