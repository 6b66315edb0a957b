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
// reported alone (kUnreachable, kTimeout); so is a child that cannot be
// reached at PLAN (its live children are adopted). Orphans are re-parented
// within capacity (see AdoptChildrenOf below), and an adopted node gets the
// chunks it missed again from a bounded buffer of recent CHUNK frames.
//
// Thread safety: none. Every method runs on the owner's thread; link events
// reach the Fanout through the owner's Mailbox (they hold a weak reference,
// so events of a finished Fanout are dropped).
#ifndef DCR_PROTOCOL_FANOUT_H_
#define DCR_PROTOCOL_FANOUT_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "protocol/frame_sender.h"
#include "protocol/liveness.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "protocol/object_sink.h"
#include "protocol/plan_tree.h"
#include "protocol/resend_buffer.h"
#include "transport/transport_set.h"

namespace dcr {

class Fanout : public std::enable_shared_from_this<Fanout> {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    // Each child is reached with the transport of its PlanNode's kind
    // (topology `transport` of the link into it), created on first use.
    TransportSet* transports = nullptr;
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
    // The resend buffer: bytes of the most recent CHUNK frames forwarded,
    // kept (shared, not copied) to resend to an adopted node what it
    // missed; the oldest are evicted first. Unset: kResendWindows times the
    // plan's chunk_window_bytes (kResendDefaultBytes if the plan has no
    // window). 0: no buffer (adopted nodes get missed chunks from the
    // root's repair round only).
    std::optional<uint64_t> resend_buffer_bytes;
    // The root's object store path: CHUNK and END frames for children that
    // pull from the store (PlanNode::pulls_objects) go here, once per
    // frame, and never as CHUNKs on their links (END still goes on the
    // link too, where the puller ignores it). Null: no child pulls.
    ObjectSink* objects = nullptr;
    // The root of a tree where some subtrees take context-coded chunks
    // (PlanMsg::context_coded) and others must not (they hold serving
    // ranks: docs/PROTOCOL.md §"Context-coded chunks"): the nodes that
    // must never get one. A child whose subtree holds one gets its PLAN
    // without the flag and the base-independent frame of every chunk sent
    // in two encodings (Forward's `plain`). Every subtree keeps one
    // encoding: an orphan is placed only under a subtree of its own kind
    // (or adopted by the root). The subtree of a pulling child that reads
    // base-independent objects (see Forward) joins the set. Empty: every
    // child gets the plan's flag (relays).
    std::set<std::string> plain_nodes;
  };
  static constexpr uint64_t kResendWindows = 4;
  static constexpr uint64_t kResendDefaultBytes = 64ull << 20;

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
  // go to every child and are kept: a child being adopted gets the
  // phase's control frame once it accepted the adoption (after the chunks
  // it missed), not before.
  // Every whole CHUNK frame goes into the resend buffer, even with no child
  // to send it to. A chunk not to be kept (`keep` false: a relay.forward
  // failpoint's damaged or cut copy, a fault in this node's forward path)
  // or not whole counts as evicted: an adopted node that missed it gets it
  // from the root's repair round.
  // `plain` (the root of a mixed tree): the same CHUNK in a
  // base-independent encoding at the same sequence number, for children
  // planned without PlanMsg::context_coded; null: `frame` is for everyone.
  size_t Forward(const FrameBuffer& frame, bool chunk = false, bool keep = true,
                 const FrameBuffer& plain = nullptr);
  // Sends a STREAM_MARK (or another hint about the stream) to every live
  // child that takes chunks over its link, in order with the CHUNKs: not
  // kept (a child adopted later, or one that pulls from the object store,
  // goes without: it hashes at its vote what it did not hash ahead), not
  // a control frame. Returns how many children it went to.
  size_t Hint(const FrameBuffer& frame);

  // The largest send queue among live children (backpressure), and the
  // object sink's queue when children pull from it. When a
  // child's queue falls to half the plan's window (from above half), the
  // owner's mailbox is woken (Mailbox::Wake): an owner paused on this can
  // wait for events instead of polling.
  size_t MaxQueuedBytes() const;
  // Per child (name, queued bytes); 0 for children out of the refit.
  std::vector<std::pair<std::string, size_t>> QueueDepths() const;
  // Bytes written to children so far.
  uint64_t BytesSent() const;
  // The least chunk bytes any node below has applied in this refit, from
  // the children's HEARTBEATs (ProgressMsg::delivered_bytes: each child's
  // subtree minimum; a child that has not reported yet counts 0). Failed
  // and superseded children, children whose PLAN_REPLY has not come (an
  // adoption in progress), subtrees that took no chunks and children of an
  // older release (no figure) are left out. nullopt with heartbeats off or
  // when no child counts (docs/PROTOCOL.md §"Progress").
  // `context`: only the children planned with (true) or without (false)
  // PlanMsg::context_coded, whose chunk bytes differ in a mixed tree.
  std::optional<uint64_t> Delivered(
      std::optional<bool> context = std::nullopt) const;
  // The current phase's answers so far: nodes below that answered (or whose
  // link failed: their parent answers for them), of all nodes below.
  std::pair<size_t, size_t> Answered() const;

  // Starts a phase: every live child must answer with `reply` before
  // `deadline`.
  void Expect(FrameType reply, Clock::time_point deadline);
  // The plan phase is answered and chunks flow until the next Expect: no
  // phase deadline applies. A node adopted now answers its PLAN_REPLY
  // whenever the plan's deadline was (heartbeats bound a live child, the
  // connect timeout an adoption), not against a deadline long past.
  void Stream();
  // True when every child of the current phase answered or failed.
  bool Complete() const;
  // Marks late children timed out (closing their links) once `now` is past
  // the phase deadline, and, in any phase, a node that has not accepted its
  // adoption within the connect timeout (with or without heartbeats).
  void ExpireIfDue(Clock::time_point now);
  Clock::time_point deadline() const { return deadline_; }
  // When the oldest adoption not yet accepted runs out of its connect
  // timeout (ExpireIfDue fails it then); max() when none is pending.
  Clock::time_point adoption_deadline() const;

  // Link liveness, every plan.heartbeat_ms (0: off): sends a HEARTBEAT to
  // every child, fails a child silent for 4 intervals (a hung or stopped
  // process; not while it owes its PLAN_REPLY or decision reply, when it
  // may be creating, hashing or syncing a large store: the phase deadline
  // bounds that), and a slow node: one that held the tree back (its send
  // queue, or the backlog it reports in its HEARTBEATs, above the plan's
  // window) for 8 intervals because it did not consume what arrived, at
  // under a tenth of what its link carries (the topology's bandwidth,
  // PlanNode::link_bps, or less where the link was measured slower). A
  // child that reports it kept up is behind a slow link: it is never
  // failed (re-parenting its children would only add crossings of that
  // link); the link's measured rate becomes its expectation (logged once
  // per hold). protocol/liveness.h has the rules. Call at least every
  // interval / 2.
  void Tick(Clock::time_point now);
  // When Tick wants to run next.
  Clock::time_point next_tick() const { return next_tick_; }

  // Re-parenting. When a child's link fails (closed, cut, silent) the
  // Fanout first connects to it again and sends it an adoption PLAN (it may
  // have lost only the link); if that fails, or the child was dropped as
  // slow, its own children (the orphans) are re-parented, so every live
  // node below a failed one keeps receiving:
  //  - While chunks stream (a CHUNK went out, END did not), within
  //    capacity: this node adopts orphans into its free slots (the
  //    failed child's), and places each other one, with its subtree, under
  //    the first node with a free slot, breadth-first, of the subtrees of
  //    the orphans it adopts now, then of its other live children. A
  //    node's capacity is the larger of its child count in the plan and
  //    the largest child count of any node of this node's plan (the
  //    cluster fanout as the tree builder applied it); the root's is its
  //    planned child count. A placed orphan travels down in the PLAN of
  //    the subtree that takes it (an adoption PLAN, or one on a live link:
  //    Amend), and the node it goes under adopts it, sending this node's
  //    depth (PlanMsg::sender_depth).
  //  - Otherwise (planning, or END went by: control frames and repair
  //    chunks are left) this node adopts every orphan itself.
  // An adopted node answers PLAN_REPLY (its subtree's plan results, and
  // the last chunk it took while it still receives), then takes part in
  // the current phase. With a resend buffer, the chunks it missed are sent
  // again from it first; what the buffer no longer holds (evicted) shows
  // in the node's vote (tensors to repair) and the root's repair round
  // resends it. Only a node that has a parent adopts: an orphan turns this
  // off until it is adopted itself. A child that fails meanwhile is not
  // given up: its recovery (connecting to it again, or adopting its
  // children) waits until adopting is turned on again (this node was
  // adopted), and runs at the adopter's PLAN (Amend): for the children
  // that PLAN still lists under this node; the others the adopter took
  // itself (a rejoin PLAN lists this node alone), so they stay failed here,
  // and their own replies reach the root. Without an Amend, the next
  // ExpireIfDue recovers them all. Until then the phase is not Complete
  // (this node does not answer for a subtree it may still reach). A node
  // never adopted gives the refit up at its orphan deadline instead.
  void set_adopting(bool on) { options_.adopt = on; }
  // The owner did not run for `gap` (its process was stopped, or its
  // thread blocked): silence measured across the gap says nothing about a
  // child, whose frames may still wait in the socket. Credits the gap to
  // every child's silence clock. Call before Tick when the owner's timers
  // ran late by more than a heartbeat interval.
  void Stalled(Clock::duration gap);
  void set_depth(uint32_t depth) { options_.depth = depth; }
  // A PLAN for this node from its parent (an adoption PLAN, or one on the
  // live parent link) may carry subtrees its parent placed under nodes of
  // this node's subtree: takes the nodes this Fanout's plan lacks, adopts
  // those placed under this node (or under a failed child of it whose
  // children it adopted), and passes the others down in a PLAN to the
  // child whose subtree takes them.
  // Runs the recoveries deferred while this node was an orphan (see
  // set_adopting) first.
  void Amend(const PlanMsg& plan);
  // Adoptions started, each node once per attempt; an orphan placed under
  // another node counts here, where it was placed.
  uint64_t adoptions() const { return adoptions_; }
  // The most children this node had in the refit at once (live, including
  // adoptions in progress; a rejoin try once accepted). A failed node that
  // rejoins (see Tick) comes back alone, in addition to the nodes that
  // took its slot: one leaf over the capacity, for the rest of the refit.
  size_t peak_children() const { return peak_children_; }
  // Resends to adopted nodes: CHUNK frames and their bytes, and adoptions
  // the buffer could not cover (the repair round is the fallback).
  uint64_t resent_chunks() const { return resent_chunks_; }
  uint64_t resent_bytes() const { return resent_bytes_; }
  uint64_t resend_misses() const { return resend_misses_; }

  // The current phase's results, for every node of every child's subtree:
  // a child's reply, or a generated result for each node behind a child
  // that failed. A node whose children were adopted is reported alone
  // (failed), and its adopted children report for themselves. A node
  // placed in a child's subtree after the child answered the phase is
  // reported as timed out until the child answers again.
  std::vector<NodeResult> Results() const;

  // The nodes that get no context-coded chunks (Options::plain_nodes, and
  // pullers that read base-independent objects).
  const std::set<std::string>& plain_nodes() const { return plain_; }

  // Children still in the refit.
  size_t live_children() const;
  size_t child_count() const { return children_.size(); }

  // Writes what is queued and closes every link.
  void Close();
  // Writes what is queued and closes every link as a network failure
  // would (failpoints): the children are failed and recovered as usual.
  void CutLinks();

 private:
  // A failed node is tried again this many times (every half interval): a
  // relay that restarts within a few heartbeats rejoins its refit. The vote
  // phase waits for these tries.
  static constexpr int kRejoinTries = 6;
  // How a child failed decides what happens to its subtree.
  enum class FailKind {
    kLink,      // its link closed or fell silent: try it again, then adopt
    kAdoption,  // it did not accept an adoption: adopt its children
    kSlow,      // dropped for holding the tree back: adopt its children
    // It could not be reached at PLAN (connection refused, connect
    // timeout): adopt its live children as for a node that fails
    // mid-refit; it took nothing, so no rejoin tries.
    kUnreached,
    kFinal,  // refused, deadline, bad frame: no adoption
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
    Clock::time_point last_heartbeat;     // last HEARTBEAT to it
    LivenessState liveness;               // protocol/liveness.h
    std::optional<ProgressMsg> progress;  // its last HEARTBEAT's report
    bool sent_empty_heartbeat = false;    // an older release: no progress
    // A split node is tried again now and then (it may restart and rejoin
    // its refit): when, how often so far, and for a rejoin entry, which
    // entry it would replace.
    Clock::time_point rejoin_at = Clock::time_point::max();
    int rejoin_tries = 0;
    std::optional<size_t> rejoin_of;
    // The CHUNKs forwarded on its link before it accepted its plan, in
    // sending order: the resend at acceptance skips them. (Not a single
    // "first chunk" bound: a node that was adopted itself takes its own
    // resends after live chunks, so what it forwards is not in order.)
    std::vector<FramePosition> sent_unaccepted;
    // Its PLAN carries PlanMsg::context_coded: it gets context-coded
    // chunks (the first frame of a pair).
    bool context = false;
    // Adopting on behalf of an ancestor (Amend): the depth it sends.
    std::optional<uint32_t> delegated_depth;
    // Adopted because its parent could not be reached at PLAN: it never
    // took this refit's plan (if it cannot be reached either, it is routed
    // around the same way, with no rejoin tries).
    bool unplanned = false;
    // It failed while this node was an orphan (adopting off): the recovery
    // Fail would have started, run once adopted (RecoverDeferred).
    std::optional<FailKind> deferred;
  };
  class ChildHandler;

  Fanout(Options options, PlanMsg plan);
  size_t AddChild(size_t plan_index, bool adoption, bool retried,
                  std::optional<uint32_t> delegated_depth = std::nullopt);
  // Its sub-plan from the current tree (placements included).
  void RefreshSub(Child& c);
  // Some node of the current subtree of plan node `index` is in plain_.
  bool HoldsPlain(size_t index) const;
  // It receives context-coded chunks (the first frame of a pair).
  bool GetsContext(const Child& c) const {
    return c.context && !plain_.contains(c.sub.nodes[0].name);
  }
  void NotePeak();
  // Fails adoptions not accepted within the connect timeout.
  void ExpireAdoptions(Clock::time_point now);
  // The entry standing for plan node `index` (not superseded; not a rejoin
  // attempt), if any.
  std::optional<size_t> EntryOf(size_t index) const;
  // A PLAN on its live link naming its current subtree (placements).
  void SendAmendment(Child& c, uint32_t depth);
  // Sends `c` what the resend buffer holds after `after`, except the
  // positions in `sent` (forwarded on its link before it was accepted).
  void Resend(Child& c, const FramePosition& after,
              std::vector<FramePosition> sent);
  void Connect(size_t child);
  void OnConnected(size_t child, Result<std::shared_ptr<Link>> link);
  void OnFrame(size_t child, const Frame& frame);
  void OnClosed(size_t child, const Status& why);
  void Fail(size_t child, NodeCode code, std::string why,
            FailKind kind = FailKind::kFinal);
  // What follows a failure of `kind` when this node adopts: connect to
  // the child again, or re-parent its children.
  void Recover(size_t child, FailKind kind);
  // Once adopting again: recovers the deferred children that `adopter`
  // (the adopter's PLAN) lists, every one if null; gives up the others.
  void RecoverDeferred(const PlanMsg* adopter);
  // `unplanned`: `child` never took the plan (kUnreached), nor did they.
  void AdoptChildrenOf(size_t child, bool unplanned = false);
  Status SendTo(Child& c, FrameType type, const std::vector<std::byte>& body);
  std::chrono::milliseconds heartbeat() const {
    return std::chrono::milliseconds(tree_.plan.heartbeat_ms);
  }

  Options options_;
  PlanTree tree_;  // the plan, re-parenting included (protocol/plan_tree.h)
  FrameSender sender_;  // HELLO and PLAN at options_.header's position
  // A deque: adoption appends while references to other entries are held.
  std::deque<Child> children_;
  FrameType expected_ = FrameType::kPlanReply;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point next_tick_ = Clock::time_point::max();
  FrameBuffer control_;             // the current phase's control frame, if any
  uint64_t bytes_sent_closed_ = 0;  // of links already gone
  uint64_t adoptions_ = 0;
  size_t peak_children_ = 0;
  bool closing_ = false;      // Close() ran: closed links are normal
  bool chunks_seen_ = false;  // Forward had a CHUNK
  ResendBuffer resend_;
  std::set<std::string> plain_;  // Options::plain_nodes, grown by placement
  // The object sink got a base-independent frame: it gets them from then
  // on (a puller planned without the flag reads every object).
  bool objects_plain_ = false;
  uint64_t resent_chunks_ = 0;
  uint64_t resent_bytes_ = 0;
  uint64_t resend_misses_ = 0;
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_FANOUT_H_
