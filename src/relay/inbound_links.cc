#include "relay/inbound_links.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace dcr {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string Seconds(milliseconds ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms.count()) / 1000.0);
}

// Frame bytes a closed link must have received before its closing makes
// the relay give freed memory back (malloc_trim).
constexpr uint64_t kTrimAfterBytes = 16ull << 20;
constexpr auto kTrimInterval = std::chrono::seconds(1);
constexpr int kTrimsAfterClose = 4;
// Sweep's resolution: deadlines are checked this often at most.
constexpr auto kSweepInterval = milliseconds(100);

// A peer's name for a log line: printable ASCII, at most 64 bytes.
std::string SanitizedName(const std::string& name) {
  std::string out;
  for (char c : name.substr(0, 64)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (name.size() > 64) out += "...";
  return out;
}

}  // namespace

TokenBucket::TokenBucket(double per_second, double burst)
    : per_second_(per_second), burst_(burst), tokens_(burst) {}

void TokenBucket::Refill(SteadyTime now) {
  if (last_ && now > *last_) {
    const double seconds = std::chrono::duration<double>(now - *last_).count();
    tokens_ = std::min(burst_, tokens_ + seconds * per_second_);
  }
  if (!last_ || now > *last_) last_ = now;
}

bool TokenBucket::Take(SteadyTime now) {
  Refill(now);
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

bool TokenBucket::Ready(SteadyTime now) {
  Refill(now);
  return tokens_ >= 1;
}

CutoffLog::CutoffLog(std::string node, std::atomic<uint64_t>* counters,
                     Sink sink)
    : node_(std::move(node)), counters_(counters), sink_(std::move(sink)) {
  if (!sink_) {
    sink_ = [](const std::string& line) { spdlog::warn("{}", line); };
  }
}

std::string CutoffLog::SummaryLocked() {
  uint64_t total = 0;
  std::string by;
  for (size_t i = 0; i < kCutReasons; ++i) {
    if (suppressed_[i] == 0) continue;
    total += suppressed_[i];
    by += fmt::format("{}{} {}", by.empty() ? "" : ", ",
                      CutReasonName(static_cast<CutReason>(i)), suppressed_[i]);
  }
  suppressed_ = {};
  if (total == 0) return "";
  return fmt::format("{} more peer{} cut off and not logged: {}", total,
                     total == 1 ? "" : "s", by);
}

void CutoffLog::Cut(SteadyTime now, const std::string& peer, CutReason reason,
                    const std::string& detail) {
  const auto i = static_cast<size_t>(reason);
  if (counters_ != nullptr && i < kCutReasons) ++counters_[i];
  std::string line;
  {
    MutexLock lock(&mu_);
    if (!bucket_.Take(now)) {
      if (i < kCutReasons) ++suppressed_[i];
      return;
    }
    line = fmt::format("{}: cut off {}: {}: {}", node_, peer,
                       CutReasonName(reason), detail);
    if (std::string more = SummaryLocked(); !more.empty()) {
      line += " (" + more + ")";
    }
  }
  sink_(line);
}

bool CutoffLog::Flush(SteadyTime now) {
  std::string line;
  {
    MutexLock lock(&mu_);
    uint64_t waiting = 0;
    for (uint64_t n : suppressed_) waiting += n;
    if (waiting == 0) return false;
    if (!bucket_.Take(now)) return true;
    line = node_ + ": " + SummaryLocked();
  }
  sink_(line);
  return false;
}

LinkDeadlines::Admission LinkDeadlines::Open(uint64_t id, SteadyTime now) {
  Admission a;
  if (options_.max_links != 0 && links_.size() >= options_.max_links) {
    // The silent-longest link that may lose its slot: an ungreeted one
    // first, then the one whose last frame is oldest.
    auto victim = links_.end();
    for (auto it = links_.begin(); it != links_.end(); ++it) {
      const Entry& e = it->second;
      if (e.exempt || e.expired || now - e.last < options_.evict_after) {
        continue;
      }
      if (victim == links_.end() || (!e.greeted && victim->second.greeted) ||
          (e.greeted == victim->second.greeted &&
           e.last < victim->second.last)) {
        victim = it;
      }
    }
    if (victim == links_.end()) return a;  // refused
    a.evicted = victim->first;
    a.evicted_silence = duration_cast<milliseconds>(now - victim->second.last);
    links_.erase(victim);
  }
  a.accepted = true;
  links_[id] = Entry{now};
  return a;
}

void LinkDeadlines::Heard(uint64_t id, SteadyTime now) {
  if (auto it = links_.find(id); it != links_.end()) it->second.last = now;
}

void LinkDeadlines::Greeted(uint64_t id) {
  if (auto it = links_.find(id); it != links_.end()) it->second.greeted = true;
}

void LinkDeadlines::SetExempt(uint64_t id, bool exempt, SteadyTime now) {
  auto it = links_.find(id);
  if (it == links_.end()) return;
  // Its silence counts from the moment the relay stops using it.
  if (it->second.exempt && !exempt) it->second.last = now;
  it->second.exempt = exempt;
}

void LinkDeadlines::Closed(uint64_t id) { links_.erase(id); }

std::vector<LinkDeadlines::Expiry> LinkDeadlines::Expired(SteadyTime now) {
  std::vector<Expiry> out;
  for (auto& [id, e] : links_) {
    if (e.expired || e.exempt) continue;
    const auto silence = duration_cast<milliseconds>(now - e.last);
    if (!e.greeted && options_.hello_timeout.count() > 0 &&
        silence >= options_.hello_timeout) {
      e.expired = true;
      out.push_back(Expiry{id, CutReason::kHelloTimeout, silence});
    } else if (e.greeted && options_.idle_timeout.count() > 0 &&
               silence >= options_.idle_timeout) {
      e.expired = true;
      out.push_back(Expiry{id, CutReason::kIdle, silence});
    }
  }
  return out;
}

void SendReply(FrameSender& sender, Link& link, FrameType type,
               const FrameHeader& about, std::span<const std::byte> payload,
               const std::string& node) {
  auto frame = sender.Reply(type, about, payload);
  if (!frame.ok()) {
    spdlog::error("{}: cannot encode {}: {}", node, FrameTypeName(type),
                  frame.status().ToString());
    return;
  }
  link.Send(*frame);
}

void SendError(FrameSender& sender, Link& link, const std::string& message) {
  auto frame = sender.Next(
      FrameType::kError,
      std::as_bytes(std::span<const char>(message.data(), message.size())));
  if (frame.ok()) link.Send(*frame);
}

// Every callback runs on the listening transport's event thread; gates_
// needs no lock.
class InboundLinks::Handler_ : public LinkHandler {
 public:
  explicit Handler_(InboundLinks* links) : links_(links) {}
  void OnOpen(Link& link) override {
    const auto now = std::chrono::steady_clock::now();
    LinkDeadlines::Admission a;
    {
      MutexLock lock(&links_->mu_);
      a = links_->deadlines_.Open(link.id(), now);
    }
    const size_t most = links_->options_.max_links;
    if (!a.accepted) {
      uint64_t n = ++*links_->counters_.refused;
      links_->Cut(link, CutReason::kLinksFull,
                  fmt::format("{} links are open, the most its memory limit "
                              "allows, and none has been silent for {} ({} "
                              "refused so far)",
                              most, Seconds(kEvictAfterSilence), n));
      link.Close();
      return;
    }
    if (a.evicted) {
      if (auto it = gates_.find(*a.evicted); it != gates_.end()) {
        if (auto victim = it->second.link.lock()) {
          links_->Cut(
              *victim, CutReason::kEvicted,
              fmt::format("silent for {} while all {} links were "
                          "taken; its slot went to {}",
                          Seconds(a.evicted_silence), most, link.peer()));
          victim->Close();
        }
      }
    }
    auto gate = std::make_shared<ReadGate>(link.weak_from_this(),
                                           links_->options_.quota_bytes);
    gates_.emplace(link.id(), Slot{gate, link.weak_from_this()});
    links_->mailbox_->Post(
        [links = links_, l = link.shared_from_this(), gate = std::move(gate)] {
          Inbound& in = links->inbound_[l->id()];
          in.link = l;
          in.gate = gate;
        });
  }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    auto it = gates_.find(link.id());
    if (it == gates_.end()) return;  // refused in OnOpen
    {
      MutexLock lock(&links_->mu_);
      links_->deadlines_.Heard(link.id(), std::chrono::steady_clock::now());
    }
    const uint64_t bytes = frame.bytes.size();
    if (it->second.gate->Queued(bytes)) ++*links_->counters_.pauses;
    links_->mailbox_->Post([links = links_, l = link.shared_from_this(), frame,
                            buffer, gate = it->second.gate, bytes] {
      links->OnFrame(l, frame, buffer);
      gate->Handled(bytes);
    });
  }
  void OnClosed(Link& link, const Status& why) override {
    if (gates_.erase(link.id()) == 0) return;  // refused in OnOpen
    {
      MutexLock lock(&links_->mu_);
      links_->deadlines_.Closed(link.id());
    }
    // What the transport cut off (the peer's fault); a peer that closed
    // between frames, or this side closing, is not a cut.
    if (why.code() == StatusCode::kCorruption) {
      links_->Cut(link, CutReason::kBadFrame, std::string(why.message()));
    } else if (why.code() == StatusCode::kResourceExhausted) {
      links_->Cut(link, CutReason::kSendOverflow, std::string(why.message()));
    } else if (why.code() == StatusCode::kIOError &&
               why.message().find("mid-frame") != std::string_view::npos) {
      // The transports say "closed the connection mid-frame (N bytes of a
      // frame received)".
      links_->Cut(link, CutReason::kTruncated, std::string(why.message()));
    }
    links_->mailbox_->Post(
        [links = links_, id = link.id(), why] { links->OnClosed(id, why); });
  }

 private:
  struct Slot {
    std::shared_ptr<ReadGate> gate;
    std::weak_ptr<Link> link;
  };
  InboundLinks* links_;
  std::map<uint64_t, Slot> gates_;
};

InboundLinks::InboundLinks(Options options, Mailbox* mailbox,
                           FrameSender* sender, Counters counters,
                           FrameFn on_frame, ClosedFn on_closed)
    : options_(std::move(options)),
      mailbox_(mailbox),
      sender_(sender),
      counters_(counters),
      on_frame_(std::move(on_frame)),
      on_closed_(std::move(on_closed)),
      cutoffs_(options_.node, counters.cut),
      deadlines_(
          LinkDeadlines::Options{options_.max_links, options_.hello_timeout,
                                 options_.idle_timeout, kEvictAfterSilence}) {}

void InboundLinks::Cut(Link& link, CutReason reason,
                       const std::string& detail) {
  cutoffs_.Cut(std::chrono::steady_clock::now(), link.peer(), reason, detail);
}

bool InboundLinks::Known(const HelloMsg& hello) const {
  if (options_.known_nodes.empty()) return true;
  if (hello.role == kRoleClient && hello.node.empty()) return true;
  return std::find(options_.known_nodes.begin(), options_.known_nodes.end(),
                   hello.node) != options_.known_nodes.end();
}

void InboundLinks::Sweep(SteadyTime now) {
  if (now < next_sweep_) return;
  next_sweep_ = now + kSweepInterval;
  std::vector<LinkDeadlines::Expiry> expired;
  {
    MutexLock lock(&mu_);
    // The relay's own use of a link, and its read gate, exempt it.
    for (auto& [id, in] : inbound_) {
      bool exempt = options_.in_use && options_.in_use(id);
      if (!exempt && in.gate) {
        exempt = in.gate->paused(ReadGate::kWindows) ||
                 in.gate->paused(ReadGate::kQueued);
      }
      deadlines_.SetExempt(id, exempt, now);
    }
    expired = deadlines_.Expired(now);
  }
  for (const LinkDeadlines::Expiry& e : expired) {
    auto it = inbound_.find(e.id);
    if (it == inbound_.end() || !it->second.link) continue;
    Link& link = *it->second.link;
    Cut(link, e.reason,
        e.reason == CutReason::kHelloTimeout
            ? fmt::format("no HELLO within {}", Seconds(e.silence))
            : fmt::format("greeted as '{}', then no frame for {}",
                          it->second.hello.node, Seconds(e.silence)));
    link.Close();
  }
  cutoffs_.Flush(now);
  // Again each second for kTrimsAfterClose seconds after the last trim
  // that followed closes: a closed link's last buffers may be freed on the
  // transport's thread after a trim ran, later still on a loaded machine
  // (one trim a second later was not always enough under ctest -j2).
  if (trim_at_ && now >= *trim_at_ && now - last_trim_ >= kTrimInterval) {
    last_trim_ = now;
    trim_at_.reset();
    if (closed_frame_bytes_ > 0) trims_left_ = kTrimsAfterClose;
    closed_frame_bytes_ = 0;
    if (trims_left_ > 0) {
      --trims_left_;
      trim_at_ = now + kTrimInterval;
    }
#if !defined(__SANITIZE_ADDRESS__) && !defined(DCR_SANITIZED)
    ::malloc_trim(0);  // glibc's; under ASan malloc is not glibc's
#endif
  }
}

std::shared_ptr<LinkHandler> InboundLinks::Handler() {
  return std::make_shared<Handler_>(this);
}

std::shared_ptr<ReadGate> InboundLinks::GateOf(Link& link) {
  Inbound& in = inbound_[link.id()];
  if (!in.gate) in.gate = std::make_shared<ReadGate>(link.weak_from_this(), 0);
  return in.gate;
}

std::string InboundLinks::PeerNode(uint64_t link_id) const {
  auto it = inbound_.find(link_id);
  return it == inbound_.end() ? std::string() : it->second.hello.node;
}

bool InboundLinks::Allowed(Link& link) {
  if (options_.peer_addresses.empty()) return true;
  std::string host = link.peer();
  if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (std::find(options_.peer_addresses.begin(), options_.peer_addresses.end(),
                host) != options_.peer_addresses.end()) {
    return true;
  }
  Cut(link, CutReason::kNotAllowed, "not a host of the topology");
  SendError(*sender_, link,
            fmt::format("{} takes connections only from the topology's "
                        "hosts; {} is not one",
                        options_.node, host));
  link.CloseAfterFlush();
  return false;
}

void InboundLinks::OnFrame(const std::shared_ptr<Link>& link,
                           const Frame& frame, const FrameBuffer& buffer) {
  Inbound& in = inbound_[link->id()];
  in.link = link;
  if (in.greeted) {
    on_frame_(link, frame, buffer);
    // A PLAN may have made it the relay's refit parent: silent, it keeps
    // its slot from now on.
    if (options_.in_use) {
      const bool used = options_.in_use(link->id());
      MutexLock lock(&mu_);
      deadlines_.SetExempt(link->id(), used, std::chrono::steady_clock::now());
    }
    return;
  }
  if (!Allowed(*link)) return;
  if (frame.type() != FrameType::kHello) {
    Cut(*link, CutReason::kNotHello,
        fmt::format("its first frame was {}, not HELLO",
                    FrameTypeName(frame.type())));
    SendError(*sender_, *link, "the first frame must be HELLO");
    link->CloseAfterFlush();
    return;
  }
  auto hello = DecodeHello(frame.payload);
  if (!hello.ok()) {
    Cut(*link, CutReason::kBadHello, hello.status().ToString());
    SendError(*sender_, *link, hello.status().ToString());
    link->CloseAfterFlush();
    return;
  }
  if (!Known(*hello)) {
    const std::string name = SanitizedName(hello->node);
    Cut(*link, CutReason::kUnknownNode,
        fmt::format("its HELLO names '{}', not a node of the topology", name));
    SendError(*sender_, *link,
              fmt::format("{} takes links only from the topology's nodes; "
                          "'{}' is not one",
                          options_.node, name));
    link->CloseAfterFlush();
    return;
  }
  in.greeted = true;
  in.hello = *hello;
  {
    MutexLock lock(&mu_);
    deadlines_.Greeted(link->id());
  }
  HelloMsg mine{options_.node, kRoleRelay, epoch_};
  SendReply(*sender_, *link, FrameType::kHello, frame.header, EncodeHello(mine),
            options_.node);
}

void InboundLinks::OnClosed(uint64_t link_id, const Status& why) {
  if (auto it = inbound_.find(link_id);
      it != inbound_.end() && it->second.link) {
    closed_frame_bytes_ += it->second.link->stats().bytes_received;
    if (closed_frame_bytes_ >= kTrimAfterBytes && !trim_at_) {
      trim_at_ = std::chrono::steady_clock::now();
    }
  }
  inbound_.erase(link_id);
  on_closed_(link_id, why);
}

}  // namespace dcr
