// The coordinator's end of the producers' links (dcr/producer.h): it
// accepts PRODUCER_HELLOs at any time, hands one refit the producers of
// every rank (Gather), tells them to go, queues their CHUNK frames for the
// refit's stream (Fetch, with backpressure on their links), collects their
// PRODUCER_DONEs and sends each its decision.
//
// A HELLO is refused at once (PRODUCER_DECISION "refused", link closed)
// when it does not decode, names another world size or layout, a rank
// already waiting, or carries digest parts of another tensor count. One
// without digest parts is a rank without a baseline: the refit sends it
// the tree's (SendBaseline).
// Producers that say hello while no refit gathers wait for the next one.
// Every producer that said hello gets a HEARTBEAT each second until its
// decision (it waits on the tree meanwhile); a producer's HEARTBEATs while
// it diffs count as frames against `idle` (Fetch).
//
// Thread safety: the transport's event thread runs the link callbacks;
// every public member is for the coordinator thread, one refit at a time.
#ifndef DCR_COORD_PRODUCER_HUB_H_
#define DCR_COORD_PRODUCER_HUB_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/transport.h"
#include "protocol/producer_messages.h"

namespace dcr {

// One chunk a producer sent: the payload views into `buffer`.
struct ProducerChunk {
  uint32_t rank = 0;
  FrameBuffer buffer;
  std::span<const std::byte> chunk;
};

class ProducerHub::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(Layout layout, std::unique_ptr<Transport> transport,
       FrameOptions frames);
  ~Impl();
  Status Listen(std::string_view host, uint16_t port);
  uint16_t port() const { return transport_->BoundPort(); }
  const Layout& layout() const { return layout_; }

  // A producer of every rank that said hello (rank order). Waits for the
  // first hello as long as it takes, then at most `wait` for the others:
  // Aborted naming the ranks missing. InvalidArgument when they are at
  // different steps. Aborted "stopped" once Stop was called.
  struct Joined {
    uint32_t rank = 0;
    uint64_t step = 0;
    std::string peer;
    std::vector<LinearDigest> base_parts;  // empty: no baseline
  };
  Result<std::vector<Joined>> Gather(std::chrono::milliseconds wait)
      DCR_EXCLUDES(mu_);
  // Any thread: a Gather waiting now or later returns Aborted.
  void Stop() DCR_EXCLUDES(mu_);
  bool stopped() const DCR_EXCLUDES(mu_);
  // The bytes of `rank`'s shard `shard` at the tree's version, to a
  // gathered producer (PRODUCER_BASELINE pieces of at most 16 MiB, before
  // its GO), about 64 MiB queued on its link at most. Aborted when it
  // left, the refit failed, or its link took no byte for `stall`.
  Status SendBaseline(uint32_t rank, const std::string& shard,
                      std::span<const std::byte> bytes,
                      std::chrono::milliseconds stall) DCR_EXCLUDES(mu_);
  // PRODUCER_GO to every gathered producer: from now on their chunks are
  // queued, at most `window` bytes before their links stop being read.
  void Go(const ProducerGoMsg& go, uint64_t window) DCR_EXCLUDES(mu_);
  // Moves up to `max` queued chunks (in arrival order) into `out`, waiting
  // for at least one while some producer has not sent PRODUCER_DONE. Empty
  // with OK: every producer is done. Aborted when a producer left, sent
  // something out of turn, or stayed silent for `idle` (the message names
  // its rank and peer). `ended`, if given, gets the ranks that sent
  // PRODUCER_DONE and whose every chunk this or an earlier Fetch returned,
  // each once per refit; with `ended`, a Fetch also returns (no chunk) as
  // soon as a rank ends, and "every producer is done" is an empty `out`
  // and an empty `ended`.
  Status Fetch(size_t max, std::chrono::milliseconds idle,
               std::vector<ProducerChunk>* out,
               std::vector<uint32_t>* ended = nullptr) DCR_EXCLUDES(mu_);
  // Makes a Fetch that waits (now or later in this refit) return Aborted
  // with `why`. Any thread.
  void Cancel(const std::string& why) DCR_EXCLUDES(mu_);
  // Why the refit failed (a producer left, even after its DONE, or sent
  // something out of turn), or OK: checked before a commit decision.
  Status Failure() const DCR_EXCLUDES(mu_);
  // Gathers begun so far (the CLI tells errors before one).
  uint64_t gathers() const DCR_EXCLUDES(mu_);
  // After Fetch returned empty: each rank's PRODUCER_DONE.
  std::vector<ProducerDoneMsg> Done() const DCR_EXCLUDES(mu_);
  // Sends `decision` to every producer of the refit (those gathered, or
  // waiting when Gather failed) and closes their links.
  void Decide(const ProducerDecisionMsg& decision) DCR_EXCLUDES(mu_);

 private:
  class Handler;
  // kWaiting: connected (said hello or not), not in a refit.
  enum class State { kWaiting, kGathered, kStreaming, kDone, kGone };
  struct Peer {
    std::shared_ptr<Link> link;
    std::string peer;
    bool hello_seen = false;
    ProducerHelloMsg hello;
    State state = State::kWaiting;
    bool paused = false;
    Clock::time_point last_frame;
    ProducerDoneMsg done;
  };

  // Event thread.
  void OnOpen(Link& link) DCR_EXCLUDES(mu_);
  void OnFrame(Link& link, const Frame& frame, const FrameBuffer& buffer)
      DCR_EXCLUDES(mu_);
  void OnClosed(Link& link, const Status& why) DCR_EXCLUDES(mu_);
  // Why `hello` cannot join, or "".
  std::string CheckHello(const ProducerHelloMsg& hello) const;
  void Send(Link& link, FrameType type, const std::vector<std::byte>& payload);
  // Refuses and closes `link` with `why` (not counted as a producer).
  void Refuse(Link& link, const std::string& why);
  // Whether the gathered producers' links may be read again.
  void ResumeIfRoom() DCR_REQUIRES(mu_);
  // Appends to `ended` the ranks done with nothing left in queue_ that
  // were not reported yet.
  void ReportEnded(std::vector<uint32_t>* ended) DCR_REQUIRES(mu_);
  // The refit failed: `why`, unless it failed already.
  void Fail(const std::string& why) DCR_REQUIRES(mu_);
  std::vector<uint32_t> MissingRanks() const DCR_REQUIRES(mu_);
  // Its own thread, from Listen to the destructor.
  void HeartbeatLoop() DCR_EXCLUDES(mu_);
  static constexpr std::chrono::seconds kHeartbeatInterval{1};

  const Layout layout_;
  const Digest128 fingerprint_;
  const FrameOptions frames_;
  std::unique_ptr<Transport> transport_;
  mutable Mutex mu_;
  CondVar changed_;
  // By link id.
  std::map<uint64_t, Peer> peers_ DCR_GUARDED_BY(mu_);
  // By rank, the link ids of this refit (Gather on).
  std::map<uint32_t, uint64_t> refit_ DCR_GUARDED_BY(mu_);
  uint64_t window_ DCR_GUARDED_BY(mu_) = 0;
  std::deque<ProducerChunk> queue_ DCR_GUARDED_BY(mu_);
  std::set<uint32_t> ended_ DCR_GUARDED_BY(mu_);  // reported by Fetch
  uint64_t queued_bytes_ DCR_GUARDED_BY(mu_) = 0;
  std::string failure_ DCR_GUARDED_BY(mu_);
  bool stopped_ DCR_GUARDED_BY(mu_) = false;
  uint64_t gathers_ DCR_GUARDED_BY(mu_) = 0;
  // Links closing after their last frame (a decision): the destructor
  // lets them flush.
  std::set<uint64_t> closing_ DCR_GUARDED_BY(mu_);
  // When the first producer of the next refit said hello.
  std::optional<Clock::time_point> first_hello_ DCR_GUARDED_BY(mu_);
  CondVar heartbeat_wake_;  // ending_ was set
  bool ending_ DCR_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
};

}  // namespace dcr

#endif  // DCR_COORD_PRODUCER_HUB_H_
