#include "coord/producer_hub.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <thread>

namespace dcr {
namespace {

std::string Ranks(const std::vector<uint32_t>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

class ProducerHub::Impl::Handler : public LinkHandler {
 public:
  explicit Handler(Impl* hub) : hub_(hub) {}
  void OnOpen(Link& link) override { hub_->OnOpen(link); }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    hub_->OnFrame(link, frame, buffer);
  }
  void OnClosed(Link& link, const Status& why) override {
    hub_->OnClosed(link, why);
  }

 private:
  Impl* hub_;
};

ProducerHub::Impl::Impl(Layout layout, std::unique_ptr<Transport> transport,
                        FrameOptions frames)
    : layout_(std::move(layout)),
      fingerprint_(layout_.Fingerprint()),
      frames_(std::move(frames)),
      transport_(std::move(transport)) {}

ProducerHub::Impl::~Impl() {
  if (heartbeat_.joinable()) {
    {
      MutexLock lock(&mu_);
      ending_ = true;
    }
    heartbeat_wake_.SignalAll();
    heartbeat_.join();
  }
  {
    // The last decisions reach their producers (at most 2 s).
    MutexLock lock(&mu_);
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (!closing_.empty() && !changed_.WaitUntil(&mu_, deadline)) {
    }
  }
  transport_->Stop();
}

Status ProducerHub::Impl::Listen(std::string_view host, uint16_t port) {
  DCR_RETURN_IF_ERROR(
      transport_->Listen(host, port, std::make_shared<Handler>(this)));
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return Status::OK();
}

void ProducerHub::Impl::HeartbeatLoop() {
  MutexLock lock(&mu_);
  while (!ending_) {
    if (!heartbeat_wake_.WaitFor(&mu_, kHeartbeatInterval) || ending_) {
      continue;
    }
    // Whoever said hello waits for something from this side: GO while
    // the relays take the PLAN, or the decision while they vote, repair
    // and commit, which can take minutes on a large tree.
    for (auto& [id, p] : peers_) {
      if (p.hello_seen && p.state != State::kGone && !closing_.count(id)) {
        Send(*p.link, FrameType::kHeartbeat, {});
      }
    }
  }
}

void ProducerHub::Impl::Send(Link& link, FrameType type,
                             const std::vector<std::byte>& payload) {
  FrameHeader h;
  h.type = type;
  auto frame = EncodeFrame(h, payload, frames_);
  if (frame.ok()) link.Send(*std::move(frame));
}

void ProducerHub::Impl::Refuse(Link& link, const std::string& why) {
  spdlog::warn("producer at {} refused: {}", link.peer(), why);
  ProducerDecisionMsg d;
  d.outcome = static_cast<uint8_t>(ProducerOutcome::kRefused);
  d.reason = why;
  Send(link, FrameType::kProducerDecision, EncodeProducerDecision(d));
  {
    MutexLock lock(&mu_);
    closing_.insert(link.id());
  }
  link.CloseAfterFlush();
}

void ProducerHub::Impl::OnOpen(Link& link) {
  MutexLock lock(&mu_);
  Peer& p = peers_[link.id()];
  p.link = link.shared_from_this();
  p.peer = link.peer();
  p.last_frame = Clock::now();
}

// Why `hello` cannot join, or "".
std::string ProducerHub::Impl::CheckHello(const ProducerHelloMsg& hello) const {
  if (hello.world != layout_.ranks()) {
    return fmt::format(
        "rank {} says the world has {} ranks; the layout {} has {} (tp {}, "
        "pp {}, ep {})",
        hello.rank, hello.world, layout_.source, layout_.ranks(), layout_.tp,
        layout_.pp, layout_.ep);
  }
  if (hello.layout != fingerprint_) {
    return fmt::format(
        "rank {} runs another layout than the coordinator's {} (fingerprint "
        "{} here, {} there): start both from the same layout file",
        hello.rank, layout_.source, fingerprint_.ShortHex(),
        hello.layout.ShortHex());
  }
  if (!hello.base_parts.empty() &&
      hello.base_parts.size() != layout_.tensors.size()) {
    return fmt::format(
        "rank {} sent digest parts of {} tensors; the layout "
        "has {}",
        hello.rank, hello.base_parts.size(), layout_.tensors.size());
  }
  return "";
}

Status ProducerHub::Impl::SendBaseline(uint32_t rank, const std::string& shard,
                                       std::span<const std::byte> bytes,
                                       std::chrono::milliseconds stall) {
  std::shared_ptr<Link> link;
  {
    MutexLock lock(&mu_);
    auto it = refit_.find(rank);
    if (it != refit_.end() && peers_.count(it->second)) {
      link = peers_.at(it->second).link;
    }
  }
  if (!link) {
    return Status::Aborted(fmt::format("producer rank {} left", rank));
  }
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  // At most a few pieces queued on the link: a rank's shards can be tens
  // of GB.
  constexpr size_t kQueued = size_t{4} * kPiece;
  uint64_t at = 0;
  do {
    // A stall, not the whole transfer, is bounded: tens of GB take
    // minutes on a fast link.
    auto progress = Clock::now();
    size_t queued = link->QueuedBytes();
    while (queued > kQueued) {
      if (Status s = Failure(); !s.ok()) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const size_t now_queued = link->QueuedBytes();
      if (now_queued < queued) progress = Clock::now();
      queued = now_queued;
      if (Clock::now() - progress >= stall) {
        return Status::Aborted(fmt::format(
            "producer rank {} took none of its baseline's bytes for {:.3g} s",
            rank, std::chrono::duration<double>(stall).count()));
      }
    }
    ProducerBaselineMsg m;
    m.shard = shard;
    m.total = bytes.size();
    m.offset = at;
    m.bytes = bytes.subspan(at, std::min<uint64_t>(kPiece, bytes.size() - at));
    Send(*link, FrameType::kProducerBaseline, EncodeProducerBaseline(m));
    at += m.bytes.size();
  } while (at < bytes.size());
  return Failure();
}

void ProducerHub::Impl::OnFrame(Link& link, const Frame& frame,
                                const FrameBuffer& buffer) {
  std::string refuse;
  {
    MutexLock lock(&mu_);
    auto it = peers_.find(link.id());
    if (it == peers_.end()) return;
    Peer& p = it->second;
    p.last_frame = Clock::now();
    const bool in_refit = p.hello_seen && refit_.count(p.hello.rank) &&
                          refit_.at(p.hello.rank) == link.id();
    switch (frame.type()) {
      case FrameType::kProducerHello: {
        if (p.hello_seen) {
          // A producer of the refit stays in peers_ (refit_ names it):
          // the refit fails, as on any frame out of turn.
          if (in_refit) {
            Fail(fmt::format(
                "producer rank {} ({}) sent a second PRODUCER_HELLO during "
                "the refit",
                p.hello.rank, p.peer));
          } else {
            refuse = "a second PRODUCER_HELLO on one link";
          }
          break;
        }
        auto hello = DecodeProducerHello(frame.payload);
        if (!hello.ok()) {
          refuse = hello.status().ToString();
          break;
        }
        refuse = CheckHello(*hello);
        for (const auto& [id, q] : peers_) {
          if (refuse.empty() && id != link.id() && q.hello_seen &&
              q.state != State::kGone && q.hello.rank == hello->rank) {
            refuse = fmt::format("rank {} is already connected from {}",
                                 hello->rank, q.peer);
          }
        }
        if (!refuse.empty()) break;
        // The first of the next refit starts the clock, also when the ones
        // that said hello before it left.
        if (refit_.empty() &&
            (!first_hello_ || MissingRanks().size() == layout_.ranks())) {
          first_hello_ = Clock::now();
        }
        p.hello = *std::move(hello);
        p.hello_seen = true;
        spdlog::info("producer rank {} of {} connected from {} (step {})",
                     p.hello.rank, p.hello.world, p.peer, p.hello.step);
        break;
      }
      case FrameType::kHeartbeat:
        // (It counted as a frame above.) Only a producer that said who it
        // is keeps its link open by them.
        if (!p.hello_seen) refuse = "a HEARTBEAT before PRODUCER_HELLO";
        break;
      case FrameType::kChunk:
        if (!in_refit || p.state != State::kStreaming) {
          if (in_refit) {
            Fail(fmt::format("producer rank {} ({}) sent a CHUNK out of turn",
                             p.hello.rank, p.peer));
          } else {
            refuse = "a CHUNK before the refit began";
          }
          break;
        }
        queue_.push_back(ProducerChunk{p.hello.rank, buffer, frame.payload});
        queued_bytes_ += frame.payload.size();
        if (queued_bytes_ > window_) {
          for (auto& [id, q] : peers_) {
            if (q.state == State::kStreaming && !q.paused) {
              q.paused = true;
              q.link->PauseReading();
            }
          }
        }
        break;
      case FrameType::kProducerDone: {
        if (!in_refit || p.state != State::kStreaming) {
          if (in_refit) {
            Fail(fmt::format(
                "producer rank {} ({}) sent PRODUCER_DONE out of turn",
                p.hello.rank, p.peer));
          } else {
            refuse = "a PRODUCER_DONE before the refit began";
          }
          break;
        }
        auto done = DecodeProducerDone(frame.payload);
        if (!done.ok()) {
          Fail(fmt::format("producer rank {} ({}): {}", p.hello.rank, p.peer,
                           done.status().ToString()));
          break;
        }
        if (done->target_parts.size() != layout_.tensors.size()) {
          Fail(fmt::format(
              "producer rank {} ({}) sent target digest parts of {} tensors; "
              "the layout has {}",
              p.hello.rank, p.peer, done->target_parts.size(),
              layout_.tensors.size()));
          break;
        }
        p.done = *std::move(done);
        p.state = State::kDone;
        break;
      }
      case FrameType::kError:
        if (in_refit) {
          Fail(fmt::format(
              "producer rank {} ({}) gave up: {}", p.hello.rank, p.peer,
              std::string(reinterpret_cast<const char*>(frame.payload.data()),
                          std::min<size_t>(frame.payload.size(), 1024))));
        }
        refuse = in_refit ? "" : "gave up";
        break;
      default:
        if (in_refit) {
          Fail(
              fmt::format("producer rank {} ({}) sent {}, which a producer "
                          "never sends",
                          p.hello.rank, p.peer, FrameTypeName(frame.type())));
        } else {
          refuse = "unexpected " + FrameTypeName(frame.type());
        }
        break;
    }
    if (!refuse.empty()) peers_.erase(it);
  }
  changed_.SignalAll();
  if (!refuse.empty()) Refuse(link, refuse);
}

void ProducerHub::Impl::OnClosed(Link& link, const Status& why) {
  {
    MutexLock lock(&mu_);
    closing_.erase(link.id());
    // A refused or decided link is no peer any more; the destructor,
    // waiting for closing_ to empty, still needs the signal below.
    auto it = peers_.find(link.id());
    if (it != peers_.end()) {
      Peer& p = it->second;
      const bool in_refit = p.hello_seen && refit_.count(p.hello.rank) &&
                            refit_.at(p.hello.rank) == link.id();
      if (!in_refit) {
        // A link that failed before its HELLO counted (unauthenticated
        // frames, not dcr at all): whoever runs that rank needs to know.
        if (!p.hello_seen && !why.ok()) {
          spdlog::warn("producer link from {} dropped before its hello: {}",
                       p.peer, why.ToString());
        }
        peers_.erase(it);
      } else {
        // Before its decision: it will not hear it, and its baseline would
        // not follow the tree (the refit must not commit).
        Fail(fmt::format(
            "producer rank {} ({}) left before {}: {}", p.hello.rank, p.peer,
            p.state == State::kDone ? "the decision" : "it was done",
            why.ok() ? "closed" : why.ToString()));
        p.state = State::kGone;
      }
    }
  }
  changed_.SignalAll();
}

void ProducerHub::Impl::Fail(const std::string& why) {
  if (failure_.empty()) {
    spdlog::error("{}", why);
    failure_ = why;
  }
}

std::vector<uint32_t> ProducerHub::Impl::MissingRanks() const {
  std::set<uint32_t> present;
  for (const auto& [id, p] : peers_) {
    if (p.hello_seen && p.state == State::kWaiting)
      present.insert(p.hello.rank);
  }
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < layout_.ranks(); ++r) {
    if (!present.count(r)) missing.push_back(r);
  }
  return missing;
}

void ProducerHub::Impl::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  changed_.SignalAll();
}

uint64_t ProducerHub::Impl::gathers() const {
  MutexLock lock(&mu_);
  return gathers_;
}

bool ProducerHub::Impl::stopped() const {
  MutexLock lock(&mu_);
  return stopped_;
}

Result<std::vector<ProducerHub::Impl::Joined>> ProducerHub::Impl::Gather(
    std::chrono::milliseconds wait) {
  Result<std::vector<Joined>> out = std::vector<Joined>();
  {
    MutexLock lock(&mu_);
    ++gathers_;
    refit_.clear();
    queue_.clear();
    ended_.clear();
    queued_bytes_ = 0;
    failure_.clear();
    for (;;) {
      if (stopped_) return Status::Aborted("stopped");
      std::vector<uint32_t> missing = MissingRanks();
      if (missing.empty()) break;
      // Nobody waits (those that said hello left): the next hello starts
      // the clock.
      if (missing.size() == layout_.ranks()) first_hello_.reset();
      // (One that said hello while the last refit ran starts the clock now.)
      if (!first_hello_ && missing.size() < layout_.ranks()) {
        first_hello_ = Clock::now();
      }
      if (!first_hello_) {
        changed_.Wait(&mu_);
        continue;
      }
      const auto deadline = *first_hello_ + wait;
      if (changed_.WaitUntil(&mu_, deadline) && Clock::now() >= deadline) {
        missing = MissingRanks();
        if (missing.empty()) break;
        first_hello_.reset();
        return Status::Aborted(fmt::format(
            "waited {:.3g} s after the first producer for all {}: rank{} {} "
            "did not connect",
            std::chrono::duration<double>(wait).count(), layout_.ranks(),
            missing.size() == 1 ? "" : "s", Ranks(missing)));
      }
    }
    first_hello_.reset();
    std::map<uint64_t, std::vector<uint32_t>> by_step;
    for (auto& [id, p] : peers_) {
      if (p.hello_seen && p.state == State::kWaiting) refit_[p.hello.rank] = id;
    }
    std::vector<Joined> joined;
    for (const auto& [rank, id] : refit_) {
      Peer& p = peers_.at(id);
      by_step[p.hello.step].push_back(rank);
      p.state = State::kGathered;
      joined.push_back(Joined{rank, p.hello.step, p.peer, p.hello.base_parts});
    }
    if (by_step.size() > 1) {
      std::vector<std::string> steps;
      for (const auto& [step, ranks] : by_step) {
        steps.push_back(fmt::format("step {} (rank{} {})", step,
                                    ranks.size() == 1 ? "" : "s",
                                    Ranks(ranks)));
      }
      out = Status::InvalidArgument(
          fmt::format("the producers are at different trainer steps: {}",
                      fmt::join(steps, ", ")));
    } else {
      out = std::move(joined);
    }
  }
  return out;
}

ProducerHub::ProducerHub(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProducerHub::~ProducerHub() = default;

Result<std::unique_ptr<ProducerHub>> ProducerHub::Listen(
    Layout layout, std::string_view host, uint16_t port,
    const TransportOptions& transport) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                       CreateTransport("tcp", transport));
  auto impl =
      std::make_unique<Impl>(std::move(layout), std::move(t), transport.frames);
  if (Status s = impl->Listen(host, port); !s.ok()) {
    return s.WithContext(
        fmt::format("listening for producers on {}:{}", host, port));
  }
  return std::unique_ptr<ProducerHub>(new ProducerHub(std::move(impl)));
}

uint16_t ProducerHub::port() const { return impl_->port(); }
const Layout& ProducerHub::layout() const { return impl_->layout(); }
void ProducerHub::Stop() { impl_->Stop(); }
uint64_t ProducerHub::gathers() const { return impl_->gathers(); }
void ProducerHub::RefuseWaiting(const std::string& why) {
  ProducerDecisionMsg m;
  m.outcome = static_cast<uint8_t>(ProducerOutcome::kRefused);
  m.reason = why;
  impl_->Decide(m);
}
bool ProducerHub::stopped() const { return impl_->stopped(); }

}  // namespace dcr
