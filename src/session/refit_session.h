// The local half of a relay's part in one refit: binds the plan to the
// store's committed version, applies chunks in place, votes, and commits
// or restores the base bits. Forwarding to children is the relay's job;
// this class never touches a link.
//
// Invariants it keeps (DESIGN.md §4): a chunk is applied only if the store
// holds the plan's base (2); an XOR chunk is applied at most once and
// duplicates are dropped (3); the vote is yes only if the store's digest is
// the target's (1); Abort returns the store to the base bits without a
// reload (5). What Abort needs is kept in the refit's journal
// (session/journal.h), a named file beside the store's version record, not on
// the heap: every apply is preceded by a record of the values it replaces,
// and a yes vote by a durable "voted yes" record. The journal outlives a
// crash of the process, so a relay restarted mid-refit recovers on its own
// (RecoverAfterCrash): without a yes vote it restores its base; with one it
// must not (the root may have decided to commit), and it only checks that
// its bits are the target's.
//
// Hashing ahead: the vote needs every tensor's digest, and hashing the
// whole store after the last chunk is the tail of every refit (a second or
// more per GB on a busy node). The root streams tensors in manifest order,
// so once an Apply reaches tensor t, the tensors below t are usually
// complete: that Apply hashes them (on the applying thread, which waits on
// the network most of the time) and keeps each digest with the count of
// applies the tensor had. The first vote re-hashes only the tensors an
// Apply touched since (or never hashed); later votes (repair rounds) hash
// everything again. So the first vote's digest of a tensor is taken after
// the session's last write to it, not necessarily at the vote: a change
// made by something other than this session between the two is seen by the
// next vote, not this one.
//
// A producers' stream is not in manifest order: the ranks' streams
// interleave (pipeline stages send at once), and a chunk of tensor t says
// nothing of the tensors below t. Its root marks it instead (STREAM_MARK,
// protocol/messages.h): once a session saw a mark (StreamPassed), an Apply
// hashes only below the last mark, where no chunk will write again.
//
// Serving stores (Options::serving; docs/PLACEMENT.md §"Serving relays"):
// the store holds one serving rank's shards (dcr/receiver_map.h), not the
// canonical tensors. Chunks still name canonical spans: they apply through
// the map to the elements the rank holds, the journal records the values
// they replace there (ReceiverMap::Gather, at canonical positions), and
// a restore writes those back through the map. The store's version record
// names canonical versions, as every node's does; the digests that name
// its bits are the rank's (ReceiverMap::BitsDigest of its canonical
// regions): the plan's base and target bits for the rank come from the
// root (Options::serving_base, LearnServingTarget), and they are what the
// journal's header, its yes votes and RecoverAfterCrash check. FP8 shards
// apply to their shadows; the blocks applies and restores touched are
// requantized before the vote hashes and after Abort restored. No hashing
// ahead: every vote hashes the rank's regions. Context-coded chunks are
// refused (a rank does not hold whole spans to decode them against).
//
// Thread safety: Apply may be called concurrently from worker threads
// (chunks of distinct spans, or duplicates of one); Vote, Commit and Abort
// require that no Apply is running.
#ifndef DCR_SESSION_REFIT_SESSION_H_
#define DCR_SESSION_REFIT_SESSION_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "dcr/codec.h"
#include "dcr/receiver_map.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "dcr/version.h"
#include "protocol/messages.h"
#include "session/journal.h"

namespace dcr {

class RefitSession {
 public:
  // Checks the plan against the store (manifest digest; for a delta plan
  // the committed version must be the plan's base, or, for a store without
  // a record, its digest must be the base digest) and records the refit as
  // in progress, durably, before any byte changes. On refusal returns the
  // NodeResult to report (code kNeedsCatchUp, also for a store left with a
  // refit unfinished, this one included, unless this plan is a full refit,
  // which repairs it; kManifestMismatch or kStoreError) through `refusal`
  // and a null session.
  struct Options {
    // Hashes a store without a record (to bind it by digest).
    ThreadPool* pool = nullptr;
    // The store was created for this (full) refit: there are no base bits
    // to restore, so nothing is kept for Abort.
    bool fresh_store = false;
    // The directory of the refit's journal (JournalPath); empty: on the
    // heap. Default: beside the store's version record (a memory store's
    // journal is on the heap).
    std::optional<std::string> undo_dir;
    // The relay restarted during this refit (the store's record names it
    // in progress) and could not restore its base at start (it had voted
    // yes, or its journal was lost): the bits are an unknown mix. No base
    // check; XOR chunks are dropped (they may have been applied already),
    // overwrites apply; Abort cannot restore the base and leaves the
    // record saying the refit is unfinished (repair: a full refit). Its
    // journal records only its yes votes.
    bool rejoin = false;
    // Hash tensors the stream has moved past (see "Hashing ahead").
    bool hash_ahead = true;
    // A serving store: the map of the rank it holds (outlives the
    // session), and the bits digest of the plan's base for that rank
    // (none: not known, as for a catch-up from a version the root no
    // longer holds; a restore after a crash then cannot be checked, and
    // RecoverAfterCrash leaves the store unfinished for a repair).
    const ReceiverMap* serving = nullptr;
    std::optional<Digest128> serving_base = std::nullopt;
  };
  static std::unique_ptr<RefitSession> Begin(
      WeightStore* store, const std::string& node, const RefitId& refit,
      const PlanMsg& plan, NodeResult* refusal, const Options& options);
  static std::unique_ptr<RefitSession> Begin(WeightStore* store,
                                             const std::string& node,
                                             const RefitId& refit,
                                             const PlanMsg& plan,
                                             NodeResult* refusal) {
    return Begin(store, node, refit, plan, refusal, Options());
  }

  enum class ApplyOutcome { kApplied, kDuplicate };
  // Validates `chunk` (checksum, and that it fits a tensor of the store
  // with the plan's span length) and applies it. Chunks of one span
  // conflict when they have the same part or either is the whole span
  // (part 0): an XOR chunk is dropped as a duplicate when a conflicting
  // chunk was applied or is being applied; an overwrite chunk is applied
  // again (idempotent), dropped only while a chunk that covers it (its own
  // id, or its span's part 0) is being applied, and waits for parts being
  // applied when it is the whole span. Two parts of a span whose
  // footprints overlap are applied one after the other when either
  // rewrites its footprint from a copy (FootprintOf). `decoder` belongs to
  // the calling thread.
  Result<ApplyOutcome> Apply(std::span<const std::byte> chunk,
                             ChunkDecoder* decoder) DCR_EXCLUDES(mu_);

  // Where an apply writes in its span: bytes [from, to), from the first
  // 4 KiB page it changes to the last (the whole span for a dense or a
  // context-coded chunk). by_copy: it changes at least half of those
  // pages (a context-coded chunk: at least as many elements as the span
  // has pages), so Apply changes them by WeightStore::ModifyTensor where
  // the store copies (a file store's pread and pwrite, which do not fault
  // on pages the write-back cleaned) rather than through the mapping.
  // Public for tests.
  struct Footprint {
    bool by_copy = false;
    uint64_t from = 0, to = 0;
  };
  // Chunk `h`'s, decoded into `c` unless context-coded.
  static Footprint FootprintOf(const ChunkHeader& h, const DecodedChunk& c);

  // After END: yes (kOk, version = target) iff the store's digest is the
  // target digest and "voted yes" is durable in the journal (else
  // kStoreError). Otherwise kIncomplete (chunks the root sent are missing)
  // or kDigestMismatch, with `repair` naming the tensors that differ from
  // the plan's target_tensor_digests. The first vote hashes what was not
  // hashed ahead; every later one hashes the whole store.
  NodeResult Vote(const EndMsg& end, ThreadPool* pool) DCR_EXCLUDES(mu_);

  // Tensors hashed by Apply ahead of the vote, and by votes.
  struct HashCounts {
    uint64_t ahead = 0;
    uint64_t at_vote = 0;
    // The last vote's time hashing, and making a yes vote durable (the
    // journal's sync).
    double vote_hash_seconds = 0;
    double vote_sync_seconds = 0;
  };
  HashCounts hash_counts() const;
  // The relay queued `chunk` for an Apply on another thread (Queued), and
  // that Apply returned (Unqueued): hashing ahead stops at a tensor with
  // a chunk queued, which would write it after the hash, and goes on from
  // there once it is not (Unqueued, in a marked stream, hashes up to the
  // mark). Any thread; a chunk whose header does not parse counts
  // nowhere.
  void Queued(std::span<const std::byte> chunk);
  void Unqueued(std::span<const std::byte> chunk);
  // A STREAM_MARK: no chunk of a tensor below `tensor` follows. From the
  // first mark on, Apply hashes ahead only below the last mark, not below
  // its chunk's tensor (see "Hashing ahead"). Any thread; marks that go
  // back are ignored.
  void StreamPassed(uint32_t tensor);

  // Persists the target version (data, then the version record), then
  // removes the journal, or with `spent` hands it over for the caller to
  // remove once it has answered (its unlink and the release of its blocks
  // can take a file system commit: off the COMMIT_REPLY's path). A journal
  // left behind names a refit the record no longer does; the next start
  // removes it.
  Status Commit(std::unique_ptr<Journal>* spent = nullptr) DCR_EXCLUDES(mu_);
  // Restores the base bits: every journal record of this session, last
  // written first, writes back the values it replaced. Then clears the
  // in-progress record, or, when this refit took over one left unfinished,
  // records that one again (the bits are its mix again), and removes the
  // journal. `decoder` is unused (kept for callers).
  Status Abort(ChunkDecoder* decoder) DCR_EXCLUDES(mu_);

  // At a relay's start, before anything else touches `store`: if its
  // record names a refit R unfinished and `journal_path` holds R's journal
  // written during this boot (`boot_id`):
  //   - no yes vote: writes back every record's old values, last first,
  //     checks that the store hashes to R's base digest, then ends the
  //     refit (the record says the base is committed, as before R) and
  //     removes the journal (kRestored); if the digest differs the record
  //     stays unfinished (kRestoreFailed);
  //   - a yes vote: never restores (the root may have committed R): hashes
  //     the store and reports kPrepared if it holds R's target, else
  //     kPreparedMix; the record stays unfinished, the journal stays.
  // Otherwise (no journal, a torn header, another refit's, another boot's)
  // nothing changes (kNoJournal). A record with nothing unfinished removes
  // a stale journal (kNothing).
  struct CrashRecovery {
    enum class Outcome {
      kNothing,
      kRestored,
      kRestoreFailed,
      kPrepared,
      kPreparedMix,
      kNoJournal,
    };
    Outcome outcome = Outcome::kNothing;
    std::optional<RefitInProgress> unfinished;  // as the record named it
    uint64_t spans = 0;  // kRestored: distinct spans written back
    uint64_t bytes = 0;  // kRestored: bytes written back
    std::string detail;  // why, for the log (every outcome but kNothing)
  };
  // A serving store passes its map: the journal's records are restored
  // through it, and the bits are checked by the rank's bits digest.
  static CrashRecovery RecoverAfterCrash(WeightStore* store,
                                         const std::string& journal_path,
                                         const std::string& boot_id,
                                         ThreadPool* pool,
                                         const ReceiverMap* serving = nullptr);

  uint64_t chunks_applied() const DCR_EXCLUDES(mu_);
  const PlanMsg& plan() const { return plan_; }
  // The target END named (PlanMsg::target_at_end): what Vote checks the
  // bits against and Commit records. No Vote or Commit may run meanwhile.
  void LearnTarget(const Version& target,
                   std::vector<Digest128> tensor_digests) {
    plan_.target = target;
    plan_.target_tensor_digests = std::move(tensor_digests);
  }
  // A serving store: what the rank's canonical regions hash to at the
  // target (ReceiverMap::ExpectedRegions, computed by the root), and their
  // BitsDigest. A vote before this is no (kDigestMismatch).
  struct ServingTarget {
    Digest128 bits;
    std::vector<LinearDigest> regions;
  };
  void LearnServingTarget(ServingTarget target) {
    serving_target_ = std::move(target);
  }
  // A serving store's map (Options::serving); null otherwise.
  const ReceiverMap* serving() const { return map_; }

  // A serving store's shards, by name, as a ReceiverMap reads and writes
  // them.
  static MutableShardBytes ShardsOf(WeightStore* store);

 private:
  RefitSession(WeightStore* store, std::string node, const RefitId& refit,
               PlanMsg plan)
      : store_(store),
        node_(std::move(node)),
        refit_(refit),
        plan_(std::move(plan)),
        hashes_(std::make_unique<TensorHash[]>(store->manifest().size())) {}
  Status Check(const ChunkHeader& h) const;
  // Writes a journal record's old values back through the map.
  static Status RestoreServing(const JournalApply& a, const ReceiverMap& map,
                               const MutableShardBytes& shards,
                               Fp8Dirty* dirty);
  // A serving store's vote: the rank's regions against serving_target_.
  NodeResult VoteServing(NodeResult r, bool complete, uint64_t applied,
                         const EndMsg& end);
  std::span<std::byte> SpanOf(const ChunkHeader& h);
  // Hashes the tensors from the hash frontier up to `tensor`, stopping at
  // the first with a chunk queued or being applied (a later call goes on
  // from there).
  void HashBehind(uint32_t tensor);
  // The tensor `chunk` names, if its header parses and it is one of ours.
  std::optional<uint32_t> TensorOfChunk(std::span<const std::byte> chunk) const;

  // A tensor's digest, taken while no Apply wrote to it. Applies hold `mu`
  // shared and count themselves in `writes` before writing; hashing holds
  // it exclusively, so `writes` then counts every write in the bits.
  struct TensorHash {
    SharedMutex mu;
    std::atomic<uint64_t> writes{0};
    std::atomic<uint32_t> queued{0};  // chunks queued for it, not applied
    // `writes` at `digest`; ~0: none.
    uint64_t hashed_writes DCR_GUARDED_BY(mu) = ~uint64_t{0};
    Digest128 digest DCR_GUARDED_BY(mu);
  };

  // One application of a chunk to a span, enough to reverse it: its
  // journal record (the values it replaced).
  struct Applied {
    Journal::Ref record;
  };
  // Apply's write for a serving store: the old values to the journal,
  // then the chunk through the map.
  Status ApplyServing(const DecodedChunk& c, Applied* a);
  // Per chunk id (a span, or one part of it). `unsure`: applies that
  // failed after their journal record was appended (a write-back that
  // failed part way may have changed some of the elements): Abort
  // restores them too, and no XOR applies over them.
  struct SpanState {
    bool in_flight = false;
    Footprint footprint;         // of the apply in flight
    std::vector<Applied> stack;  // in order of application
    std::vector<Applied> unsure;
  };
  // What a chunk `id` with footprint `fp` arriving now does (Apply's
  // rule): applies, is a duplicate, or waits: a whole-span overwrite while
  // parts of its span are being applied, and a part while another part
  // of its span whose footprint overlaps is being applied, when either
  // rewrites its footprint from a copy (its write-back would undo the
  // other's changes there).
  enum class Admission { kApply, kDuplicate, kWait };
  Admission Admit(const ChunkId& id, bool is_xor, const Footprint& fp) const
      DCR_REQUIRES(mu_);

  WeightStore* store_;
  bool keep_undo_ = true;
  bool rejoined_ = false;  // Options::rejoin
  // The refit the store had left unfinished when this one began (a full
  // refit repairing it); Abort records it again with the restored mix.
  std::optional<RefitInProgress> unfinished_;
  // Null only for a fresh store (nothing to restore, nothing to vote on
  // that a restart could undo).
  std::unique_ptr<Journal> journal_;
  std::string node_;
  RefitId refit_;
  PlanMsg plan_;
  mutable Mutex mu_;
  std::map<ChunkId, SpanState> spans_ DCR_GUARDED_BY(mu_);
  CondVar applied_;  // an apply finished: a waiting overwrite may go

  // A serving store (see "Serving stores"); null otherwise.
  const ReceiverMap* map_ = nullptr;
  MutableShardBytes shards_;  // the store's tensors, by name
  Manifest canonical_;        // the map's canonical tensors
  std::optional<ServingTarget> serving_target_;
  Mutex dirty_mu_;
  Fp8Dirty dirty_ DCR_GUARDED_BY(dirty_mu_);  // FP8 blocks to requantize

  bool hash_ahead_ = true;
  std::unique_ptr<TensorHash[]> hashes_;  // one per tensor of the manifest
  // Held by the one thread hashing ahead (HashBehind's TryLock).
  Mutex hash_mu_;
  // Tensors below it were hashed ahead, or had been since their last
  // write.
  uint32_t hash_frontier_ DCR_GUARDED_BY(hash_mu_) = 0;
  // The last STREAM_MARK's tensor; kNoMark before the first: the chunks'
  // ids bound the hashing ahead.
  static constexpr uint32_t kNoMark = ~uint32_t{0};
  std::atomic<uint32_t> marked_{kNoMark};
  std::atomic<uint64_t> hashed_ahead_{0};
  uint64_t hashed_at_vote_ = 0;   // Vote only
  double vote_hash_seconds_ = 0;  // Vote only
  double vote_sync_seconds_ = 0;  // Vote only
  uint64_t votes_ = 0;            // Vote only
};

}  // namespace dcr

#endif  // DCR_SESSION_REFIT_SESSION_H_
