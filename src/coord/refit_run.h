// One coordinator run of a refit, as a phase driver (root_phase.h): it
// sets up (refit_setup.h), plans, streams, votes with repair rounds,
// decides durably (state_dir.h) and concludes over the parts that do each
// job: the root's links (root_tree.h), the encoder pipeline
// (chunk_producer.h, span_encoder.h), what was sent (sent_chunks.h), the
// signed END (end_signer.h), the history record (history.h), the baseline
// pass (baseline_update.h), the producers' stream (producer_feed.h) and
// the report (refit_report.h). The stream phase is in refit_stream.cc,
// the baseline's end in refit_baseline.cc.
//
// Thread safety: a RefitRun is used once (Run or Resume) by one thread.
// Its helpers' threads (the encoder pipeline, root.baseline's last writes
// beside the vote) end before the phase that reads what they wrote.
#ifndef DCR_COORD_REFIT_RUN_H_
#define DCR_COORD_REFIT_RUN_H_

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coord/baseline_stream.h"
#include "coord/chunk_producer.h"
#include "coord/history.h"
#include "coord/object_retention.h"
#include "coord/producer_feed.h"
#include "coord/refit_report.h"
#include "coord/refit_setup.h"
#include "coord/root_phase.h"
#include "coord/root_tree.h"
#include "coord/sent_chunks.h"
#include "coord/span_encoder.h"
#include "coord/target_digests.h"
#include "dcr/refit.h"
#include "protocol/messages.h"

namespace dcr {

class RefitRun {
 public:
  // With `feed` (history delta files, options.only_nodes set): feeds the
  // named relays from the history, a chain's composition from its base to
  // the baseline's version (catch-up) or the overwrites of the union of
  // the files' change sets (repair). `options` must outlive the run.
  explicit RefitRun(const RefitOptions& options, HistoryFeed feed = {});
  ~RefitRun();

  Result<RefitReport> Run();
  // dcr refit --resume: finishes the refit state_dir/current.json names.
  Result<RefitReport> Resume();

  // After Run: the PLAN_REPLY of every receiver that needs catch-up.
  const std::vector<NodeResult>& behind() const { return behind_; }
  // After Run: the root's baseline version now (the target if the refit
  // committed and the baseline advanced, else the base).
  const Version& baseline_version() const { return baseline_version_; }

 private:
  using Clock = std::chrono::steady_clock;

  // Opens objects_ and retention_ when the plan has nodes that pull from
  // the object store; `for_upload` (not --resume, which only decides):
  // checks that the store takes a write and records the refit
  // (ObjectRetention::Begin).
  Status OpenObjects(bool for_upload);
  // Once the refit is over: removes an aborted refit's objects (the
  // pullers have given it up; its delta stays in state_dir/history for
  // crash repair), or marks a committed one kept and removes those no
  // longer kept (coord/object_retention.h). Failures are logged: the
  // refit's outcome stands, and `dcr gc` removes what is left.
  void FinishObjects();

  // Run's phases; Run tells the producers (if any) how they ended.
  Result<RefitReport> RunPhases();
  Status WriteCurrent();
  // A producers' refit's stream: their parts, merged (ProducerFeed).
  Status StreamProducers();
  // Runs `job` on the encoder pipeline and sends what it queues down the
  // tree (RootTree::StreamFrom, with progress); the pipeline's failure.
  Status SendJob(ChunkJob job, RootTree::Streamed* streamed);
  // Frames encoded chunk `id` for the tree, numbered in the order queued
  // (the producer thread's emit): in a mixed tree a context-coded chunk
  // and its base-independent copy at one sequence number. Counts it as
  // sent, and (not for a `repair` round) appends its base-independent
  // bytes to the history record.
  Result<Outgoing> Emit(const ChunkId& id, const EncodedChunk& chunk,
                        bool repair);
  // RootTree's progress with the refit's phase and scan added, to
  // RefitOptions::on_progress.
  void FillProgress(RefitOptions::Progress* p);
  // Streams chunks down the tree: the delta (or every span for --full, or
  // the composed history chain), or with `repair` dense overwrites of every
  // span of `tensors`. The producer's failure, if any. The refit's first
  // stream is the pass StartPass began before the PLAN (ahead_), if any.
  Status Stream(bool repair, std::vector<uint32_t> tensors = {});
  // One pass of the encoder pipeline: what its producer's job refers to.
  struct StreamPass {
    bool repair = false;
    SpanEncoder::Kind kind = SpanEncoder::Kind::kDiff;
    std::unique_ptr<TargetDigests> digests;  // the first pass hashes
    std::unique_ptr<SpanEncoder> encoder;
    std::unique_ptr<ChunkProducer> producer;  // last: it uses the others
  };
  // Builds a pass and starts its producer, held (ChunkProducer::Hold): it
  // encodes its first batch, then waits for RunPass. Run starts the
  // refit's pass before the PLAN, so that the PLAN's round trip hides
  // that encode.
  Result<std::unique_ptr<StreamPass>> StartPass(bool repair,
                                                std::vector<uint32_t> tensors);
  // Releases the pass (root.baseline's writes set up first: its producer
  // emits from then on) and sends what it queues down the tree.
  Status RunPass(StreamPass& pass);
  // END, then the votes of every receiver (into replies_.votes); repair
  // rounds while some receivers name tensors that differ and the budget
  // lasts. Whether END went out.
  Result<bool> Vote();
  Status SignEnd(EndMsg* end) const;
  // The serving ranks' bits at the target, for END when the PLAN left the
  // target to it (computed once, from the target checkpoint); empty, with
  // a warning, if they cannot be (those nodes then vote no).
  const std::vector<ServingBits>& ServingTargets();
  // Sends COMMIT (to commit_set) or ABORT down, collects the replies,
  // advances the baseline on commit, and writes the report.
  Result<RefitReport> Conclude(bool commit, std::set<std::string> commit_set,
                               Clock::time_point t0,
                               Clock::time_point t_decide);
  // The commit phase's baseline pass, history record and pruning; the
  // baseline's error, if any. The baseline records the target unless the
  // COMMIT reached no one (CommitReachedNoOne: fenced off, or lost).
  Status AdvanceBaselineAndHistory(bool commit_sent,
                                   const std::set<std::string>& commit_set,
                                   Clock::time_point t_decide);
  // Before the decision: waits for root.baseline's last writes (beside
  // the vote) as long as they make progress; writes that failed, or made
  // none for a phase, turn *commit false with the reason.
  void AwaitBaselineWrites(Clock::time_point t_decide, bool* commit);
  // Abort: waits for those writes to end (they may still run after a
  // stall), before the baseline is restored.
  void JoinBaselineWrites();
  // The history record's header for this refit's delta.
  DeltaHeader RecordHeader() const;
  // Abort: root.baseline back to the base from the undo log (the history's
  // temporary file, or `log`) and its record cleared; false (logged, the
  // baseline stays flagged for --resume) if that fails.
  bool RestoreBaseline(const std::string& log, bool verify);

  const RefitOptions& options_;
  HistoryFeed feed_;
  RootPhases phases_;
  RefitSetup setup_;
  RefitReport report_;
  // The topology's object store, when some cluster pulls from it; before
  // root_, whose uploader writes to it.
  std::unique_ptr<ObjectStore> objects_;
  std::optional<ObjectRetention> retention_;  // with objects_
  std::unique_ptr<RootTree> root_;
  SentChunks sent_;
  // A delta refit of the whole tree records its chunks for the history;
  // kept if it commits.
  HistoryRecording record_;
  PhaseReplies replies_;
  std::vector<NodeResult> behind_;
  Version baseline_version_;
  bool copy_all_ = false;  // resume: the baseline takes every span
  // root.baseline updated as the delta streams (coord/baseline_stream.h);
  // null when it is updated after the decision.
  std::unique_ptr<BaselineInStream> in_stream_;
  // A producers' refit (options.producers): root.baseline's session.
  std::unique_ptr<ProducerFeed> producers_;
  // END names the target (hashed in the first pass; the PLAN left it).
  bool target_at_end_ = false;
  std::optional<std::vector<ServingBits>> serving_targets_;
  FileStamps target_stamps_;    // the target's files when the refit began
  bool keep_current_ = false;   // the baseline still needs --resume
  bool repair_stream_ = false;  // the last Stream was a repair round's
  // When the stream's chunks were applied everywhere (RootTree::applied_at).
  std::optional<std::chrono::steady_clock::time_point> stream_applied_at_;
  // The refit's stream, started before the PLAN; taken by Stream. Last, so
  // that it is destroyed first: its producer's job uses the members above.
  std::unique_ptr<StreamPass> ahead_;
};

}  // namespace dcr

#endif  // DCR_COORD_REFIT_RUN_H_
