// The root's end of the relay tree for one coordinator run: its links to
// the cluster heads (a Fanout over a TransportSet, events delivered to the
// coordinator thread's Mailbox) and the frames it originates (one
// FrameSender at the run's epoch and refit: PLAN is frame 0, the fan-out's;
// everything after it is numbered from 1).
//
// A phase is: Expect the reply type with a deadline, send the frame down,
// WaitPhase until every child's subtree answered or the deadline passed,
// then Results. StreamFrom sends a producer's chunks down with
// backpressure: no more while a child's send queue is over the window.
//
// Thread safety: everything on the coordinator thread, but for sender()
// (FrameSender::Next), which the producer thread uses while the
// coordinator thread sends nothing else, and Wake, callable from any.
#ifndef DCR_COORD_ROOT_TREE_H_
#define DCR_COORD_ROOT_TREE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coord/chunk_producer.h"
#include "coord/object_uploader.h"
#include "dcr/refit.h"
#include "dcr/topology.h"
#include "protocol/fanout.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "transport/transport_set.h"

namespace dcr {

// The tree as PLAN nodes (each after its parent, as BuildTree orders them).
std::vector<PlanNode> PlanNodes(const Tree& tree);

// What a vote round asks for: the tensors (manifest indices, ascending)
// some receiver named as differing, and who named them. Empty tensors: no
// repair wanted.
struct RepairRequest {
  std::vector<uint32_t> tensors;
  std::vector<std::string> nodes;
};
// Receivers whose bits differ (incomplete or digest mismatch) and that
// named tensors; overwrites of those tensors repair every one of them.
RepairRequest RepairsWanted(const std::vector<NodeResult>& votes);

// The nodes that voted yes with the target's version.
std::set<std::string> YesVotes(const std::vector<NodeResult>& votes,
                               const Version& target);

class RootTree {
 public:
  using Clock = std::chrono::steady_clock;

  // Links of the root (options' transport, frames, timeouts, heartbeat)
  // for this run; `resume`: every PLAN is a resume adoption (PlanMsg).
  // `objects`: the topology's object store, when the plan has nodes that
  // pull from it (PlanNode::pulls_objects); their CHUNK and END frames go
  // there (ObjectUploader) instead of down their links.
  // `plain_nodes`: a mixed tree's nodes that take no context-coded chunks
  // (Fanout::Options::plain_nodes).
  RootTree(const RefitOptions& options, PlanMsg plan, uint64_t epoch,
           const RefitId& refit, bool resume, ObjectStore* objects = nullptr,
           std::set<std::string> plain_nodes = {});
  ~RootTree();
  RootTree(const RootTree&) = delete;
  RootTree& operator=(const RootTree&) = delete;

  // PLAN to the cluster heads; waits for every PLAN_REPLY (or the phase
  // deadline) and returns them.
  std::vector<NodeResult> Plan();
  // After Plan, before the first chunk (Fanout::Stream).
  void BeginStream() { fanout_->Stream(); }

  // Expects `reply` from every node within the phase timeout.
  void Expect(FrameType reply);
  // Sends a frame down to every child.
  Status SendDown(FrameType type, const std::vector<std::byte>& payload);
  // Runs link events until every child's subtree answered the expected
  // reply, or the deadline.
  void WaitPhase();
  // Runs link events, timers (heartbeats, adoptions) and progress reports
  // until `done()` holds or `deadline` passes: the coordinator waiting on
  // something else keeps the tree alive. Whatever makes `done()` true must
  // call Wake().
  void RunUntil(const std::function<bool()>& done,
                Clock::time_point deadline = Clock::time_point::max());
  // Between phases (the votes are in, the decision waits): no phase
  // deadline applies until the next Expect, so a node re-parented
  // meanwhile is not failed against the vote's deadline.
  void Hold() { fanout_->Stream(); }

  // While StreamFrom and WaitPhase run, about every kProgressInterval:
  // `fill` gets the tree's figures (payload and chunks of the current
  // stream, delivered bytes of it, answers, the slowest child) and adds
  // the refit's own (phase, scan), then reports them. Null: none.
  void SetProgress(std::function<void(RefitOptions::Progress*)> fill) {
    progress_ = std::move(fill);
  }
  // Reports progress now (at a phase's end), if SetProgress set one.
  void ReportProgress();
  // When every receiver had applied every chunk of the last stream, as the
  // relays report it; nullopt before that, or when they do not report.
  std::optional<Clock::time_point> applied_at() const { return applied_at_; }
  std::vector<NodeResult> Results() const { return fanout_->Results(); }

  struct Streamed {
    uint64_t chunks = 0;
    uint64_t payload_bytes = 0;
    // What subtrees without context-coded chunks got (Outgoing::
    // plain_payload): payload_bytes unless the tree is mixed.
    uint64_t plain_payload_bytes = 0;
  };
  // Sends what `producer` queues until it is done and drained, or until
  // no child is left (then it cancels the producer). A new stream for
  // progress: its payload and delivered bytes count from here.
  Streamed StreamFrom(ChunkProducer* producer, uint64_t window);

  FrameSender& sender() { return sender_; }
  void Wake() { mailbox_.Wake(); }
  size_t live_children() const { return fanout_->live_children(); }
  // Bytes of every frame the root sent down one edge (of a mixed tree, an
  // edge that takes context-coded chunks).
  uint64_t stream_bytes() const { return stream_bytes_; }
  // The nodes that took no context-coded chunks (Fanout::plain_nodes).
  const std::set<std::string>& plain_nodes() const {
    return fanout_->plain_nodes();
  }
  // Re-parenting counters (RefitReport's adoptions, resent_*).
  void CountAdoptions(RefitReport* report) const;

  // Closes the fan-out: links that close from now on are normal.
  void Close();
  // Closes the fan-out, lets the last frames leave (at most 2 s), then
  // stops the links.
  void FlushAndStop();
  // Stops the links at once (a coordinator that "dies", for tests).
  void Stop();
  // The object store path's uploader; null without one.
  const ObjectUploader* uploader() const { return uploader_.get(); }

 private:
  // Object uploads in flight at once (small objects: the request rate, not
  // one stream's bandwidth, bounds them).
  static constexpr int kParallelUploads = 8;
  // How often StreamFrom reports progress.
  static constexpr std::chrono::milliseconds kProgressInterval{100};

  // The next timer of the Fanout not yet acted on (phase deadline,
  // heartbeat tick, adoption timeout); max() when none.
  Clock::time_point NextTimer() const;
  // Acts on the Fanout's timers that are due.
  void RunTimers();
  // When the next progress report is due (max() without one).
  Clock::time_point NextProgress() const;
  // Reports if one is due.
  void MaybeReportProgress();
  // Sets applied_at_ once the stream is over and delivered everywhere.
  void NoteApplied();

  const RefitOptions& options_;
  Mailbox mailbox_;
  std::unique_ptr<TransportSet> transports_;
  // Before fanout_, which points to it; after mailbox_, which it wakes.
  std::unique_ptr<ObjectUploader> uploader_;
  std::shared_ptr<Fanout> fanout_;
  FrameSender sender_;
  uint64_t stream_bytes_ = 0;
  bool stopped_ = false;
  std::function<void(RefitOptions::Progress*)> progress_;
  Clock::time_point last_progress_{};
  // The current stream (StreamFrom) for progress: its payload and chunks
  // so far, whether it ended, and the tree's delivered bytes as it began
  // (relays count every stream of the refit).
  // A mixed tree's two kinds of subtree count different bytes: each
  // variant's payload and delivered bytes are kept apart ([0]: context-
  // coded, [1]: base-independent) and progress takes the least fraction.
  uint64_t stream_payload_ = 0;
  uint64_t stream_plain_payload_ = 0;
  uint64_t stream_chunks_ = 0;
  bool stream_final_ = false;
  uint64_t delivered_before_[2] = {0, 0};
  // This stream's bytes every receiver applied, scaled to stream_payload_;
  // nullopt when no child reports.
  std::optional<uint64_t> StreamDelivered() const;
  std::optional<Clock::time_point> applied_at_;
  Clock::time_point timers_ran_;  // RunTimers last ran
};

}  // namespace dcr

#endif  // DCR_COORD_ROOT_TREE_H_
