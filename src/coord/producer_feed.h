// The root's half of a producers' refit (dcr/producer.h): the trainer's
// ranks, gathered by the ProducerHub, stream chunk parts that the root
// merges into the refit's stream (a ChunkJob that fetches instead of
// encoding), and root.baseline takes them as a relay's store would: a
// session of its own (session/refit_session.h) applies every part behind
// the undo journal beside root.baseline's version record, and commits or
// restores with the tree. Its bits are not hashed (Finish). root.baseline stays
// the canonical copy that repairs, catch-up and seeding read.
//
// Thread safety: Gather, Begin, Go, Finish, Commit, Abort and Decide on
// the coordinator thread; Fetch on the chunk producer's thread; Apply on
// the pool's workers (distinct items), id() from the producer thread.
#ifndef DCR_COORD_PRODUCER_FEED_H_
#define DCR_COORD_PRODUCER_FEED_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coord/chunk_producer.h"
#include "coord/part_groups.h"
#include "coord/producer_hub.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/refit.h"
#include "dcr/shard_diff.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "protocol/messages.h"
#include "session/refit_session.h"

namespace dcr {

// A producers' refit that a stopped coordinator left (dcr refit --resume):
// root.baseline, whose record names `refit` in progress, is settled from
// its session's journal. With a commit decision its bits are the target
// already (the stream ended before the vote): checked against `target`'s
// digest (a pass over it), then committed; without one the journal's
// records restore the base. The journal is removed either way.
Status SettleRootSession(WeightStore* baseline, bool commit,
                         const Version& target, const RefitId& refit,
                         ThreadPool* pool);

class ProducerFeed {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ProducerFeed(ProducerHub* hub);
  ~ProducerFeed();

  // Waits for a producer of every rank (ProducerHub::Impl::Gather).
  Status Gather(std::chrono::milliseconds wait);
  // Checks that the layout places root.baseline's tensors and that the
  // producers' baseline shards compose into its version `base`, giving
  // root.baseline's bits of their shards (ProducerHub's SendBaseline) to
  // the ranks that need them, once the check passes with them:
  //  - ranks that said hello without a baseline (restarted without their
  //    shards): their base parts are those of the shards they will get;
  //  - when the parts do not compose, ranks whose shards differ from
  //    root.baseline's (they missed the last decision), found by one pass
  //    over it, if taking the tree's makes the parts compose.
  // Nothing is sent for a refit that is refused. InvalidArgument, naming
  // the rank and the tensor, for a rank without a baseline whose layout
  // converts a tensor (its shard bits are not a copy of the canonical
  // ones: the trainer must give it its baseline); BaseMismatch naming the
  // tensors that still differ, or saying that root.baseline's bits are
  // not its recorded version; Aborted when a rank leaves or its link takes
  // nothing for `stall` while it is sent its shards.
  Status CheckBaseline(const WeightStore& baseline, const Version& base,
                       ThreadPool* pool, std::chrono::milliseconds stall);
  // The trainer step the producers named.
  uint64_t step() const { return step_; }
  uint32_t ranks() const { return static_cast<uint32_t>(joined_.size()); }

  // Opens root.baseline's session for `plan` (its base must be the
  // baseline's committed version), journal beside its record. At most
  // `held_bytes` of parts are held to compose (PartGroups).
  Status Begin(WeightStore* baseline, const RefitId& refit, const PlanMsg& plan,
               uint64_t held_bytes, ThreadPool* pool);
  // PRODUCER_GO to every producer.
  void Go(const ProducerGoMsg& go, uint64_t window);

  // The stream's job: fetches the producers' chunks in batches, groups the
  // parts of a span that several ranks change (PartGroups: held until no
  // rank holding elements of the span can send another, at most the
  // plan's chunk window of them), applies each item to root.baseline on
  // the pool (Apply) and hands it on (`out->bytes`, hashed when `sign`):
  // a rank's part unchanged, a group as one whole-span XOR chunk
  // (ComposeParts). In a plan with the context flag, every span that goes
  // whole (all its parts together) is one whole-span chunk coded in the
  // context of root.baseline's bits of the span, read before the item
  // applies there (ChunkEncoder::EncodeChangesInContext: the bytes a
  // canonical root would send), with its base-independent copy in
  // `out->base_independent` (what root.baseline applies and the history
  // keeps; hashed too when `sign_plain`: a mixed tree sends it). A part
  // of another rank, a chunk that is not an XOR part, one sent twice or
  // out of its rank's ascending order, or one of a span outside the
  // rank's pieces fails the stream. `idle`: a producer silent for this
  // long fails it too.
  ChunkJob Job(std::chrono::milliseconds idle, bool sign, bool sign_plain,
               size_t workers);
  const ChunkId& id(size_t i) const;
  // On the job's thread, between batches: no item of a tensor below this
  // one is still to be fetched (PartGroups::LowestOpen, and what was
  // released but not yet fetched): what a STREAM_MARK after the items
  // fetched so far names.
  uint32_t CompleteBelow() const;

  // After the stream: the target's digests, from the producers' parts
  // (what root.baseline records on a commit). root.baseline's bits are not
  // hashed here (a pass over the model): they are the relays', applied by
  // the same code, and every relay checks its own against these digests.
  CheckpointDigests Finish();
  // OK while every producer of the refit is still there (checked before a
  // commit decision: one that left would not follow the tree).
  Status StillThere() const { return hub_->Failure(); }
  // Elements the producers changed (their PRODUCER_DONEs).
  uint64_t changed_elements() const { return changed_; }
  // Of the last stream: spans sent as one chunk composed of two or more
  // ranks' parts, and those parts.
  uint64_t grouped_spans() const {
    return groups_ ? groups_->grouped_spans() : 0;
  }
  uint64_t grouped_parts() const {
    return groups_ ? groups_->grouped_parts() : 0;
  }

  // root.baseline records the target (after the decision, once the COMMIT
  // reached someone) or restores its base.
  Status Commit();
  Status Abort();
  // Whether root.baseline took any part (an abort must restore it).
  bool touched() const { return session_ != nullptr; }

  // Tells every producer how the refit ended and closes their links.
  void Decide(ProducerOutcome outcome, const RefitId& refit,
              const Version& target, const std::string& reason);

 private:
  // One chunk of the stream: a rank's part, or the parts of a span that
  // go as one chunk (id: the span's part 0).
  using Item = PartGroups::Group;
  Result<size_t> Fetch(size_t max, std::chrono::milliseconds idle);
  // A rank to be sent root.baseline's bits of its shards.
  struct Pending {
    size_t joined = 0;      // index into joined_
    bool had_none = false;  // it had no baseline (else another version)
  };
  // The digest parts rank `j` would hold with root.baseline's bits of its
  // shards (hashed in place: nothing is built); an error when its shards
  // cannot be built from canonical bits (a converted tensor).
  Result<std::vector<LinearDigest>> TreeParts(
      const ProducerHub::Impl::Joined& j,
      const CanonicalBytes& canonical) const;
  // Builds the rank's shards from root.baseline through the layout's maps
  // and sends them, one shard in memory at a time.
  Status Serve(const Pending& p, const CanonicalBytes& canonical,
               std::chrono::milliseconds stall);
  Status Apply(size_t i, size_t worker, bool sign, bool sign_plain,
               EncodedChunk* out);
  // Item `item`, a whole span, coded in the context of root.baseline's
  // bits of it, into `out`.
  Status EncodeInContext(const Item& item, size_t worker, EncodedChunk* out);

  ProducerHub::Impl* hub_;
  std::vector<ProducerHub::Impl::Joined> joined_;
  uint64_t step_ = 0;
  uint64_t changed_ = 0;
  std::unique_ptr<RefitSession> session_;
  WeightStore* baseline_ = nullptr;  // Begin on
  bool context_ = false;             // the plan's context flag
  uint64_t span_elems_ = 0;
  std::unique_ptr<PartGroups> groups_;  // Begin on
  std::vector<Item> ready_;  // released by groups_, not yet in a batch
  std::vector<std::unique_ptr<ChunkDecoder>> decoders_;
  std::vector<std::unique_ptr<ChunkEncoder>> encoders_;
  std::vector<DecodedChunk> merged_;  // per worker
  // The batch being encoded: items [batch_begin_, batch_begin_ + size).
  std::vector<Item> batch_;
  size_t batch_begin_ = 0;
  size_t fetched_ = 0;
  std::vector<ProducerChunk> scratch_;
};

}  // namespace dcr

#endif  // DCR_COORD_PRODUCER_FEED_H_
