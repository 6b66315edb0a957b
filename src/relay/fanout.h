// The downstream half of one node's part in a refit: a link to each child of
// the plan's receiver (plan.nodes[0]), the sub-plan sent to each, the frames
// forwarded to them, and their replies per phase. Used by the relay daemon
// and by the coordinator (the root), which differ only upstream.
//
// Failures are folded into results instead of errors: a child that refuses
// or does not answer a phase before the deadline is out of the refit from
// then on, and every node of its subtree is reported (kRejected,
// kTimeout). A child whose link fails is re-parented: connected to again,
// or its own children adopted (see set_adopting), and the failed node is
// reported alone (kUnreachable, kTimeout).
//
// Thread safety: none. Every method runs on the owner's thread; link events
// reach the Fanout through the owner's Mailbox (they hold a weak reference,
// so events of a finished Fanout are dropped).
#ifndef DCR_RELAY_FANOUT_H_
#define DCR_RELAY_FANOUT_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "relay/mailbox.h"
#include "relay/messages.h"

namespace dcr {

class Fanout : public std::enable_shared_from_this<Fanout> {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    Transport* transport = nullptr;
    Mailbox* mailbox = nullptr;  // where link events are delivered
    std::chrono::milliseconds connect_timeout{5000};
    HelloMsg hello;       // sent first on every child link
    FrameOptions frames;  // for the frames the Fanout encodes itself
    FrameHeader header;   // epoch, refit id, sequence for HELLO and PLAN
    // Each level of the tree waits less than its parent, so that a parent
    // hears its child's report of a late grandchild before its own
    // deadline: a child's timeout is this fraction of its parent's.
    double child_timeout_fraction = 0.8;
    // This node's depth in the tree (root 0): adoption PLANs carry it.
    uint32_t depth = 0;
    // Re-parent the subtree of a child whose link fails (see below).
    bool adopt = true;
    // `dcr refit --resume`: every PLAN is a resume adoption (PlanMsg).
    bool resume = false;
  };

  // `plan` is the receiver's plan (nodes[0] = the node that owns this
  // Fanout). Call Start() to connect.
  static std::shared_ptr<Fanout> Create(Options options, PlanMsg plan);
  ~Fanout();
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  // Connects to every child (asynchronously) and sends each HELLO and its
  // sub-plan; expects PLAN_REPLY from each before `deadline`.
  void Start(Clock::time_point deadline);

  // Sends `frame` to every child still in the refit; returns how many.
  // A CHUNK (`chunk` true) skips children whose whole subtree refused the
  // plan: nobody there would apply it. Control frames (END, COMMIT, ABORT)
  // go to every child and are kept: a child adopted later in the phase
  // gets the phase's control frame once it accepted the adoption.
  size_t Forward(const FrameBuffer& frame, bool chunk = false);

  // The largest send queue among live children (backpressure).
  size_t MaxQueuedBytes() const;
  // Per child (name, queued bytes); 0 for children out of the refit.
  std::vector<std::pair<std::string, size_t>> QueueDepths() const;
  // Bytes written to children so far.
  uint64_t BytesSent() const;

  // Starts a phase: every live child must answer with `reply` before
  // `deadline`.
  void Expect(FrameType reply, Clock::time_point deadline);
  // True when every child of the current phase answered or failed.
  bool Complete() const;
  // Marks late children timed out (closing their links) once `now` is past
  // the phase deadline.
  void ExpireIfDue(Clock::time_point now);
  Clock::time_point deadline() const { return deadline_; }

  // Link liveness, every plan.heartbeat_ms (0: off): sends a HEARTBEAT to
  // every child, fails a child silent for 4 intervals (a hung or stopped
  // process), a child whose adoption is not accepted within the connect
  // timeout, and a slow child: one whose send queue stayed above the
  // plan's window (the tree waits for it) for 8 intervals while it took
  // bytes at under a tenth of its link's bandwidth (PlanNode::link_bps;
  // 0: never slow). Call at least every interval / 2.
  void Tick(Clock::time_point now);
  // When Tick wants to run next.
  Clock::time_point next_tick() const { return next_tick_; }

  // Re-parenting. When a child's link fails (closed, cut, silent) the
  // Fanout first connects to it again and sends it an adoption PLAN (it may
  // have lost only the link); if that fails, or the child was dropped as
  // slow, it adopts the child's own children the same way, recursively, so
  // every live node below a failed one keeps receiving. An adopted node
  // answers PLAN_REPLY (its subtree's plan results), then takes part in the
  // current phase. Chunks it missed meanwhile show in its vote (tensors to
  // repair); the root resends them. Only a node that has a parent adopts:
  // an orphan turns this off until it is adopted itself.
  void set_adopting(bool on) { options_.adopt = on; }
  void set_depth(uint32_t depth) { options_.depth = depth; }
  // Adoptions started (each node once per attempt).
  uint64_t adoptions() const { return adoptions_; }

  // The current phase's results, for every node of every child's subtree:
  // a child's reply, or a generated result for each node behind a child
  // that failed. A node whose children were adopted is reported alone
  // (failed), and its adopted children report for themselves.
  std::vector<NodeResult> Results() const;

  // Children still in the refit.
  size_t live_children() const;
  size_t child_count() const { return children_.size(); }

  // Writes what is queued and closes every link.
  void Close();
  // Writes what is queued and closes every link as a network failure
  // would (failpoints): the children are failed and recovered as usual.
  void CutLinks();

 private:
  // How a child failed decides what happens to its subtree.
  enum class FailKind {
    kLink,      // its link closed or fell silent: try it again, then adopt
    kAdoption,  // it did not accept an adoption: adopt its children
    kSlow,      // dropped for holding the tree back: adopt its children
    kFinal,     // refused, deadline, bad frame: no adoption
  };
  struct Child {
    size_t plan_index = 0;  // in plan_.nodes
    PlanMsg sub;            // its sub-plan (nodes[0] = the child)
    std::shared_ptr<Link> link;
    bool greeted = false;  // its HELLO arrived
    bool failed = false;
    NodeCode failure = NodeCode::kOk;
    std::string why;
    std::optional<ResultsMsg> reply;  // of the current phase
    bool takes_chunks = true;         // some node of its subtree took the plan
    std::optional<ResultsMsg> refused;  // its PLAN_REPLY, if nobody took it
    bool adoption = false;      // this entry adopts the node (PLAN adopt)
    bool accepted = false;      // its PLAN_REPLY arrived
    bool retried = false;       // this entry re-adopts a node whose link failed
    bool split = false;         // its children were adopted: reports itself
    bool superseded = false;    // a newer entry stands for it: reports nothing
    Clock::time_point started;  // connect began
    Clock::time_point last_rx;  // last frame from it
    Clock::time_point last_heartbeat;  // last HEARTBEAT to it
    std::optional<Clock::time_point> blocked_since;
    // A split node is tried again now and then (it may restart and rejoin
    // its refit): when, how often so far, and for a rejoin entry, which
    // entry it would replace.
    Clock::time_point rejoin_at = Clock::time_point::max();
    int rejoin_tries = 0;
    std::optional<size_t> rejoin_of;
    uint64_t blocked_sent = 0;  // bytes sent to it when it got blocked
  };
  class ChildHandler;

  Fanout(Options options, PlanMsg plan);
  size_t AddChild(size_t plan_index, bool adoption, bool retried);
  void Connect(size_t child);
  void OnConnected(size_t child, Result<std::shared_ptr<Link>> link);
  void OnFrame(size_t child, const Frame& frame);
  void OnClosed(size_t child, const Status& why);
  void Fail(size_t child, NodeCode code, std::string why,
            FailKind kind = FailKind::kFinal);
  void AdoptChildrenOf(size_t child);
  Status SendTo(Child& c, FrameType type, const std::vector<std::byte>& body);
  std::chrono::milliseconds heartbeat() const {
    return std::chrono::milliseconds(plan_.heartbeat_ms);
  }

  Options options_;
  PlanMsg plan_;
  // A deque: adoption appends while references to other entries are held.
  std::deque<Child> children_;
  FrameType expected_ = FrameType::kPlanReply;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point next_tick_ = Clock::time_point::max();
  FrameBuffer control_;             // the current phase's control frame, if any
  uint64_t bytes_sent_closed_ = 0;  // of links already gone
  uint64_t adoptions_ = 0;
  bool closing_ = false;  // Close() ran: closed links are normal
};

}  // namespace dcr

#endif  // DCR_RELAY_FANOUT_H_
