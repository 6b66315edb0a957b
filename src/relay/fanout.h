// The downstream half of one node's part in a refit: a link to each child of
// the plan's receiver (plan.nodes[0]), the sub-plan sent to each, the frames
// forwarded to them, and their replies per phase. Used by the relay daemon
// and by the coordinator (the root), which differ only upstream.
//
// Failures are folded into results instead of errors: a child that cannot
// be reached, closes its link, or does not answer a phase before the
// deadline is out of the refit from then on, and every node of its subtree
// is reported with code kUnreachable or kTimeout. Its link is closed, so a
// child that is alive but late aborts by itself (its upstream went away).
//
// Thread safety: none. Every method runs on the owner's thread; link events
// reach the Fanout through the owner's Mailbox (they hold a weak reference,
// so events of a finished Fanout are dropped).
#ifndef DCR_RELAY_FANOUT_H_
#define DCR_RELAY_FANOUT_H_

#include <chrono>
#include <cstdint>
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
  // plan: nobody there would apply it. Control frames go to every child.
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

  // The current phase's results, for every node of every child's subtree
  // in plan order: a child's reply, or a generated result for each node
  // behind a child that failed.
  std::vector<NodeResult> Results() const;

  // Children still in the refit.
  size_t live_children() const;
  size_t child_count() const { return children_.size(); }

  // Writes what is queued and closes every link.
  void Close();

 private:
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
  };
  class ChildHandler;

  Fanout(Options options, PlanMsg plan);
  void OnConnected(size_t child, Result<std::shared_ptr<Link>> link);
  void OnFrame(size_t child, const Frame& frame);
  void OnClosed(size_t child, const Status& why);
  void Fail(size_t child, NodeCode code, std::string why);
  Status SendTo(Child& c, FrameType type, const std::vector<std::byte>& body);

  Options options_;
  PlanMsg plan_;
  std::vector<Child> children_;
  FrameType expected_ = FrameType::kPlanReply;
  Clock::time_point deadline_ = Clock::time_point::max();
  uint64_t bytes_sent_closed_ = 0;  // of links already gone
  bool closing_ = false;            // Close() ran: closed links are normal
};

}  // namespace dcr

#endif  // DCR_RELAY_FANOUT_H_
