// The links other nodes open to a relay (its parent, adopters, `dcr
// status` clients): admission (at most max_links open; when all are taken,
// a new link takes the slot of the link silent longest if that one has
// been silent for kEvictAfterSilence, else it is closed as it opens), a
// read gate per link (ReadGate: a per-peer quota and the refit's
// backpressure), the allowlist of peer addresses, the HELLO every link must
// open with (within hello_timeout, naming a node the relay knows), and an
// idle timeout for greeted links that stop speaking. Frames of greeted
// links go on to the relay. Every link the relay cuts off is counted by
// reason and logged, one line per peer, rate-limited (CutoffLog). Also the
// two frames a relay answers on any link: a reply and an ERROR.
//
// Thread safety: the LinkHandler (Handler()) runs on the listening
// transport's event thread and only posts to the relay's Mailbox, except
// for the gate bookkeeping it keeps to itself and the deadlines it shares
// under a lock; everything else (GateOf, PeerNode, Sweep and the callbacks)
// runs on the relay's actor thread. TokenBucket and LinkDeadlines are not
// thread-safe; CutoffLog is.
#ifndef DCR_RELAY_INBOUND_LINKS_H_
#define DCR_RELAY_INBOUND_LINKS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "dcr/transport.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "relay/read_gate.h"
#include "relay/relay_stats.h"

namespace dcr {

using SteadyTime = std::chrono::steady_clock::time_point;

// A token bucket: up to `burst` events at once, then `per_second`.
class TokenBucket {
 public:
  TokenBucket(double per_second, double burst);
  // Takes a token at `now` if there is one.
  bool Take(SteadyTime now);
  // Whether a token is there at `now` (without taking it).
  bool Ready(SteadyTime now);

 private:
  void Refill(SteadyTime now);
  double per_second_;
  double burst_;
  double tokens_;
  std::optional<SteadyTime> last_;
};

// Logs the peers a relay cuts off, one line each ("<node>: cut off
// <peer>: <reason>: <detail>"), rate-limited by a token bucket (a burst of
// kCutLogBurst lines, then kCutLogPerSecond); lines over the rate are
// counted, and the next line logged (or Flush, once a token is back) says
// how many were not, by reason: "(N more peers cut off and not logged:
// links_full 40, hello_timeout 3)". Every cut is counted in `counters`
// (by CutReason) whether logged or not.
inline constexpr double kCutLogBurst = 10;
inline constexpr double kCutLogPerSecond = 1;
class CutoffLog {
 public:
  using Sink = std::function<void(const std::string& line)>;
  // `sink`: where lines go (default: spdlog warn); `counters`: kCutReasons
  // counters, or null.
  CutoffLog(std::string node, std::atomic<uint64_t>* counters,
            Sink sink = nullptr);
  void Cut(SteadyTime now, const std::string& peer, CutReason reason,
           const std::string& detail) DCR_EXCLUDES(mu_);
  // Logs the summary of suppressed lines if a token is back; true iff some
  // are still waiting to be summarized.
  bool Flush(SteadyTime now) DCR_EXCLUDES(mu_);

 private:
  std::string SummaryLocked() DCR_REQUIRES(mu_);
  const std::string node_;
  std::atomic<uint64_t>* const counters_;
  Sink sink_;
  Mutex mu_;
  TokenBucket bucket_ DCR_GUARDED_BY(mu_){kCutLogPerSecond, kCutLogBurst};
  std::array<uint64_t, kCutReasons> suppressed_ DCR_GUARDED_BY(mu_){};
};

// A link that holds a slot while every slot is taken loses it to a new
// link once it has sent no frame for this long.
inline constexpr std::chrono::milliseconds kEvictAfterSilence{2000};

// The deadlines of a relay's inbound links, by time (the caller passes the
// clock): a link must greet (Greeted) within hello_timeout of opening, and
// a greeted link that sends no whole frame for idle_timeout is cut, unless
// it is exempt (the relay's refit parent, or a link the relay stopped
// reading: its silence is the relay's doing). When max_links links are
// open, a new one takes the slot of the silent-longest non-exempt link
// (an ungreeted one first) if it has been silent for evict_after; else it
// is refused. A zero timeout or max_links turns that check off.
class LinkDeadlines {
 public:
  struct Options {
    size_t max_links = 0;
    std::chrono::milliseconds hello_timeout{0};
    std::chrono::milliseconds idle_timeout{0};
    std::chrono::milliseconds evict_after{kEvictAfterSilence};
  };
  struct Admission {
    bool accepted = false;
    std::optional<uint64_t> evicted;  // the link whose slot it took
    std::chrono::milliseconds evicted_silence{0};
  };
  struct Expiry {
    uint64_t id = 0;
    CutReason reason = CutReason::kIdle;
    std::chrono::milliseconds silence{0};  // since open or its last frame
  };

  explicit LinkDeadlines(Options options) : options_(options) {}

  // A new link `id` at `now`. An evicted link is forgotten at once (its
  // slot is the new link's); the caller closes it.
  Admission Open(uint64_t id, SteadyTime now);
  // A whole frame from `id`.
  void Heard(uint64_t id, SteadyTime now);
  void Greeted(uint64_t id);
  void SetExempt(uint64_t id, bool exempt, SteadyTime now);
  void Closed(uint64_t id);
  // The links past a deadline at `now`, each returned once (the caller
  // closes them; they keep their slot until Closed).
  std::vector<Expiry> Expired(SteadyTime now);
  size_t open() const { return links_.size(); }

 private:
  struct Entry {
    SteadyTime last;  // opened, or its last frame
    bool greeted = false;
    bool exempt = false;
    bool expired = false;
  };
  Options options_;
  std::map<uint64_t, Entry> links_;
};

// Sends `type` in reply to the frame whose header is `about`; logs (as
// `node`) a frame it cannot encode.
void SendReply(FrameSender& sender, Link& link, FrameType type,
               const FrameHeader& about, std::span<const std::byte> payload,
               const std::string& node);
// Sends an ERROR frame carrying `message`.
void SendError(FrameSender& sender, Link& link, const std::string& message);

class InboundLinks {
 public:
  struct Options {
    std::string node;
    // IP addresses (as Link::peer() prints them, without the port) links
    // may come from; empty: any.
    std::vector<std::string> peer_addresses;
    size_t max_links = 0;      // 0: no limit
    uint64_t quota_bytes = 0;  // per link; 0: none
    // The names a HELLO may give: role root or relay, one of these; role
    // client, one of these or "" (a CLI). Empty: any name (a relay started
    // without a topology knows none).
    std::vector<std::string> known_nodes;
    // 0: none (LinkDeadlines).
    std::chrono::milliseconds hello_timeout{0};
    std::chrono::milliseconds idle_timeout{0};
    // Actor thread: whether a link is in use by the relay although silent
    // (its refit parent); such a link is never cut for silence. Null: none.
    std::function<bool(uint64_t link_id)> in_use;
  };
  // Actor thread: a frame of a greeted link (not its HELLO), and a link
  // that closed.
  using FrameFn = std::function<void(const std::shared_ptr<Link>&, const Frame&,
                                     const FrameBuffer&)>;
  using ClosedFn = std::function<void(uint64_t link_id, const Status&)>;
  struct Counters {
    std::atomic<uint64_t>* refused = nullptr;  // links closed as they opened
    std::atomic<uint64_t>* pauses = nullptr;   // quota pauses
    std::atomic<uint64_t>* cut = nullptr;      // kCutReasons, by CutReason
  };

  InboundLinks(Options options, Mailbox* mailbox, FrameSender* sender,
               Counters counters, FrameFn on_frame, ClosedFn on_closed);

  // For Transport::Listen.
  std::shared_ptr<LinkHandler> Handler();

  // Actor thread. `epoch`: the highest coordinator epoch accepted, which
  // HELLO replies carry.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  // The read gate of an inbound link (one the listener did not open gets
  // one that only the windows close).
  std::shared_ptr<ReadGate> GateOf(Link& link);
  // The node a link's HELLO named ("" before it greeted).
  std::string PeerNode(uint64_t link_id) const;
  // Cuts the links past their HELLO or idle deadline, logs the summary of
  // suppressed cut-off lines, and gives freed frame memory back to the
  // system (malloc_trim, at most once a second, and each second for 4
  // more) after links that had received 16 MiB or more of frames closed. Cheap
  // when nothing is due; call it on every turn of the actor's loop.
  void Sweep(SteadyTime now);

 private:
  class Handler_;
  struct Inbound {
    std::shared_ptr<Link> link;
    std::shared_ptr<ReadGate> gate;
    bool greeted = false;
    HelloMsg hello;
  };
  void OnFrame(const std::shared_ptr<Link>& link, const Frame& frame,
               const FrameBuffer& buffer);
  void OnClosed(uint64_t link_id, const Status& why);
  bool Allowed(Link& link);
  bool Known(const HelloMsg& hello) const;
  // Counts and logs a cut-off; the caller closes the link.
  void Cut(Link& link, CutReason reason, const std::string& detail);

  Options options_;
  Mailbox* mailbox_;
  FrameSender* sender_;
  Counters counters_;
  FrameFn on_frame_;
  ClosedFn on_closed_;
  uint64_t epoch_ = 0;
  std::map<uint64_t, Inbound> inbound_;  // actor thread
  CutoffLog cutoffs_;
  mutable Mutex mu_;  // event and actor threads
  LinkDeadlines deadlines_ DCR_GUARDED_BY(mu_);
  // Actor thread: the next Sweep that does work; frame bytes received by
  // links closed since the last malloc_trim, and when the next one runs.
  SteadyTime next_sweep_{};
  SteadyTime last_trim_{};
  std::optional<SteadyTime> trim_at_;
  uint64_t closed_frame_bytes_ = 0;
  int trims_left_ = 0;  // trims still due after the last closes
};

}  // namespace dcr

#endif  // DCR_RELAY_INBOUND_LINKS_H_
