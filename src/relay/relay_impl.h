// Relay::Impl, the wiring behind the Relay facade (relay.h): it owns the
// store, the transports, the apply workers and the actor thread, and drives
// the refit in progress (relay_refit.h) with the events that reach its
// Mailbox (frames, link closes, apply completions) and the deadlines that
// the refit's parts name (phase deadline, heartbeats, orphan wait). Private
// to src/relay: relay.cc holds the event loop and the routing of frames,
// relay_plan.cc carries out PLAN decisions (plan_decision.h).
//
// Thread safety: Init, Stop and Stats may be called from any thread (Stop
// once at a time); every other member runs on the actor thread (`actor_`),
// which alone touches the refit state; transport callbacks and apply
// workers reach it through `mailbox_`.
#ifndef DCR_RELAY_RELAY_IMPL_H_
#define DCR_RELAY_RELAY_IMPL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dcr/codec.h"
#include "dcr/thread_pool.h"
#include "protocol/epoch_file.h"
#include "protocol/fanout.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "relay/apply_workers.h"
#include "relay/commit_hook.h"
#include "relay/inbound_links.h"
#include "relay/object_puller.h"
#include "relay/parent_link.h"
#include "relay/plan_decision.h"
#include "relay/relay.h"
#include "relay/relay_refit.h"
#include "relay/relay_stats.h"
#include "relay/serving_images.h"

namespace dcr {

class Relay::Impl {
 public:
  explicit Impl(RelayOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Init();
  uint16_t port() const { return listener_->BoundPort(); }
  RelayStats Stats() const { return board_.Get(); }
  std::chrono::steady_clock::duration SinceLoopTurn() const {
    return std::chrono::steady_clock::now() -
           std::chrono::steady_clock::time_point(
               std::chrono::steady_clock::duration(
                   loop_turn_.load(std::memory_order_relaxed)));
  }
  void Stop();

 private:
  using Clock = std::chrono::steady_clock;

  // The refit in progress: its state machine and its two directions.
  struct Current {
    std::unique_ptr<RelayRefit> refit;
    std::unique_ptr<ParentLink> parent;
    std::shared_ptr<Fanout> fanout;
    Clock::time_point started;
    bool first_chunk = false;  // one came (logged with its delay)
    ProgressMeter progress;    // reported in HEARTBEATs up
    // A full refit over a store its record says another refit left
    // unfinished: the root's repair (coord/repair.h).
    bool repair = false;
    // When COMMIT reached the node: a serving process's pause starts.
    std::optional<Clock::time_point> commit_at;
    bool flipped = false;  // the committed standby was made live
    // A head of a source: objstore cluster: reads the CHUNK and END frames
    // from the object store (its parent link carries the rest). Last: it
    // is stopped first.
    std::unique_ptr<ObjectPuller> puller;
    // The END that came on the link while the puller reads the store's:
    // it ends the stream if the pull fails for good.
    FrameBuffer link_end;
    // Why the puller gave up (the store refused it); the vote says so.
    std::string pull_failed;
  };
  // The refit that ended last and what we answered in it: a parent that
  // lost our final reply reconnects (an adoption PLAN) and gets it again.
  struct Finished {
    RefitId id;
    uint64_t epoch = 0;
    std::vector<std::byte> plan_reply;
    std::optional<ParentLink::CachedReply> last_reply;
  };

  // relay.cc: the event loop, frame routing, the refit's progress.
  void Run();
  Clock::time_point NextDeadline(Clock::time_point now) const;
  void OnTimers(Clock::time_point now);
  void Advance();
  void OnFrame(const std::shared_ptr<Link>& link, const Frame& frame,
               const FrameBuffer& buffer);
  void OnClosed(uint64_t link_id, const Status& why);
  void AnswerStatus(Link& link, const Frame& frame);
  bool AnswerEnded(Link& link, const Frame& frame);
  void OnRefitFrame(const Frame& frame, const FrameBuffer& buffer);
  void OnChunk(const Frame& frame, const FrameBuffer& buffer);
  void OnStreamMark(const Frame& frame, const FrameBuffer& buffer);
  // relay_objects.cc: the object store path of a pulling head.
  // Starts reading refit `id`'s frame objects (current_->puller), paused
  // until its PLAN phase is over.
  void StartPuller(const RefitId& id);
  // A frame object the puller read for refit `refit`: checked as a frame
  // from the parent link is (checksum, tag, refit, epoch), then routed.
  void OnPulledFrame(const RefitId& refit, const FrameBuffer& buffer);
  // The puller of refit `refit` gave up (ObjectPuller's `fail`): the END
  // from the link, if it came, ends the stream, and the vote is no.
  void OnPullFailed(const RefitId& refit, const Status& why);
  void Orphan(const std::string& why);
  void AnswerUp(FrameType type, const NodeResult& own);
  void Conclude();
  void EndRefit(const std::string& result, bool committed);
  void MaybePause();
  void MaybeResume();
  // A serving relay's yes vote waits for its server (ServingImages): true
  // once it may go up (possibly turned into a no).
  bool ServingVoteGate(RelayRefit& r);
  // Brings the standby image to the live version when its server left it.
  void CatchUpStandby();
  // Makes the committed standby live: at once, not after the children's
  // replies (they are not part of the pause).
  void FlipServing();
  // Feeds the refit's ProgressMeter what holds its parent link now.
  void SampleProgress();
  // This refit's progress for the HEARTBEATs up: the meter's figures and
  // the subtree's delivered bytes (its own applied bytes, or a child's
  // report where less).
  ProgressMsg ProgressReport();
  void PublishStats();
  FrameHeader About() const;
  void Reply(Link& link, FrameType type, const FrameHeader& about,
             std::span<const std::byte> payload);
  // relay_setup.cc (with Init): the relay's start.
  // Sizes the bounds from options_.memory_limit_bytes (RelayOptions).
  Status ApplyMemoryLimit();
  // Reads the serving layout and maps the rank (RelayOptions::serving_*).
  // ServingImages::Options::attach_device: a server's CUDA IPC exports.
  Result<std::unique_ptr<DeviceWeights>> AttachServerGpu(
      const std::string& socket, const Manifest* live);
  Status LoadServing();
  // The bits of the plan's base a serving relay's rank has, if it names
  // them.
  std::optional<Digest128> ServingBase(const PlanMsg& plan) const;
  Status PersistEpoch(uint64_t epoch);
  // At Init, once the store is open: recovers from a refit a crash left
  // unfinished, from its journal (RefitSession::RecoverAfterCrash).
  void RecoverStore();

  // After a restart mid-refit whose journal holds this relay's yes vote:
  // the refit it is prepared in (its record stays unfinished; only the
  // root's decision ends it) and whether the bits hashed to its target at
  // start (else an unknown mix). For the PLAN reply; cleared once a refit
  // session takes the store over.
  struct PreparedAfterCrash {
    RefitId refit;
    Version target;
    bool verified = false;
  };
  const std::optional<PreparedAfterCrash>& prepared_after_crash() const {
    return prepared_;
  }

  // relay_plan.cc: carrying out what DecidePlan decided.
  void OnPlan(const std::shared_ptr<Link>& link, const Frame& frame);
  PlanFacts Facts(const Link& link, const FrameHeader& header,
                  const PlanMsg& plan) const;
  void Refuse(Link& link, const FrameHeader& header, const PlanMsg& plan,
              NodeCode code, const std::string& detail);
  void AnswerAgain(Link& link, const FrameHeader& header, bool raise_epoch);
  void ReplaceOrphan(uint64_t epoch);
  void StartRefit(const std::shared_ptr<Link>& link, const FrameHeader& header,
                  PlanMsg plan, bool rejoin);
  // This node's part of a new refit: the session on its store (created for
  // a full refit if missing), or null with the refusal in `own`.
  std::unique_ptr<RefitSession> BeginSession(const RefitId& id,
                                             const PlanMsg& plan, bool rejoin,
                                             NodeResult* own);
  void OnAdoption(const std::shared_ptr<Link>& link, const Frame& frame,
                  const PlanMsg& plan);

  RelayOptions options_;
  EpochFile epoch_file_{""};
  std::unique_ptr<WeightStore> store_;  // null until a full refit creates it
  // The node's transports: the one it listens on (listener_, of
  // options_.transport) and those its children's links need.
  std::unique_ptr<TransportSet> transports_;
  Transport* listener_ = nullptr;
  Mailbox mailbox_;
  std::unique_ptr<ApplyWorkers> workers_;
  std::unique_ptr<ThreadPool> hash_pool_;
  // A serving relay's map (RelayOptions::serving_layout); null otherwise.
  std::unique_ptr<ReceiverMap> serving_;
  Manifest serving_store_;  // the shards a serving store holds
  // With a serving socket: the live image and the server; store_ is then
  // the standby image. Null otherwise.
  std::unique_ptr<ServingImages> images_;
  // What a GPU server's pause may hold in patches (ApplyMemoryLimit; a
  // relay without a memory limit, in tests, takes 256 MiB).
  uint64_t device_patch_budget_ = 256ull << 20;
  std::unique_ptr<CommitHook> hook_;       // RelayOptions::on_commit; or null
  std::unique_ptr<ChunkDecoder> decoder_;  // for restores on the actor thread
  RelayRefit::Env env_;
  std::unique_ptr<InboundLinks> inbound_;
  std::thread actor_;
  std::atomic<bool> stopping_{false};
  // When the actor's loop last turned (steady_clock ticks): it turns at
  // least every kStatsInterval while healthy (SinceLoopTurn).
  std::atomic<int64_t> loop_turn_{
      std::chrono::steady_clock::now().time_since_epoch().count()};
  std::once_flag stop_once_;

  // Actor state.
  std::optional<Current> current_;
  std::optional<Finished> finished_;
  uint64_t max_epoch_ = 0;
  // The refit whose base this relay restored by itself at start (its
  // journal held no yes vote): an adoption PLAN of it is a rejoin with a
  // normal session (PlanFacts::restored). Cleared by the next refit.
  std::optional<RefitId> restored_from_;
  std::optional<PreparedAfterCrash> prepared_;
  // Frames this relay originates; made once Init fixed the frame options.
  std::optional<FrameSender> sender_;
  uint64_t last_chunks_applied_ = 0;
  Clock::time_point timers_ran_;  // the last OnTimers

  RelayCounters counters_;
  StatsBoard board_;
};

}  // namespace dcr

#endif  // DCR_RELAY_RELAY_IMPL_H_
