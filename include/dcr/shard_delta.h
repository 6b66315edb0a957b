// A delta built by the trainer's ranks from their own shards, without
// gathering a canonical tensor (docs/PLACEMENT.md §"Deltas from shards"):
// each rank diffs its shards (DiffShards), encodes its changes as chunk
// parts in canonical span coordinates (docs/FORMAT.md §2 "Parts") and
// hashes the canonical regions it holds; the parts of all ranks make the
// delta, and the hashes compose into the tensor digests of its header.
//
// What a producer does at each step, and what `dcr diff --layout` runs
// offline for every rank in turn (each rank reads only its own files).
//
// Thread safety: the functions touch only their arguments; distinct calls
// may run concurrently.
#ifndef DCR_SHARD_DELTA_H_
#define DCR_SHARD_DELTA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/delta.h"
#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/shard_diff.h"
#include "dcr/shard_memory.h"
#include "dcr/status.h"

namespace dcr {

class ThreadPool;

// A rank's shard file in a directory of shards:
// DIR/rank-RRRRR.safetensors (rank zero-padded to 5 digits), as
// `dcr-traingen --layout` writes them.
std::string ShardFilePath(const std::string& dir, uint32_t rank);

// One rank's shards, mapped from its shard file: every shard the layout
// gives the rank, checked against the file's dtype and shape (errors name
// the file, the tensor and the layout). Tensors the layout does not name
// are ignored.
class RankShards {
 public:
  static Result<RankShards> Open(const Layout& layout, uint32_t rank,
                                 const std::string& dir);
  const ShardBytes& bytes() const { return bytes_; }
  uint64_t file_bytes() const;  // of the shards the layout names

 private:
  std::unique_ptr<Checkpoint> file_;
  ShardBytes bytes_;
};

// The part id of rank `rank`'s chunks: rank + 1.
inline uint16_t PartOf(uint32_t rank) {
  return static_cast<uint16_t>(rank + 1);
}

// Called with each chunk a rank encodes, in ascending id order.
using PartSink =
    std::function<Status(const ChunkId&, std::span<const std::byte>)>;

// Encodes rank `rank`'s `changes` (DiffShards' output) as chunk parts:
// per canonical tensor and span of `span_elems` elements with a change,
// one sparse chunk of `kind` with id (tensor, span, PartOf(rank)) holding
// the rank's changed positions in the span (XOR masks, or the target's
// bits for overwrites). Tensor ids are Layout::tensors indices, which are
// the canonical manifest's. `sizes`, if given, adds up the chunks' sizes.
Status EncodeParts(const Layout& layout, uint32_t rank,
                   std::span<const CanonicalChanges> changes, ChunkKind kind,
                   uint64_t span_elems, ChunkEncoder* encoder,
                   const PartSink& sink, ChunkSizes* sizes = nullptr);

// The tensor digests and version digest of the canonical checkpoint that
// the ranks' shards hold, from every rank's HashShardRegions parts
// (parts[rank][tensor]).
CheckpointDigests DigestsFromParts(
    const Layout& layout, std::span<const std::vector<LinearDigest>> parts);

// The canonical manifest the layout places (names, dtypes, shapes).
Result<Manifest> ManifestOf(const Layout& layout);

// A trainer rank's producer across steps (what the Python module's
// ShardProducer wraps): it keeps its baseline shards, a copy of the rank's
// shards at the last committed version, and diffs each step's shards
// against them.
//
// Where the shards live: in host memory (the default), or in a
// ShardMemory (dcr/shard_memory.h: a GPU's, dcr/cuda.h), which then holds
// the baseline and diffs there; the ShardBytes handed to this producer are
// spans of that memory, and only the changed elements cross to the host.
// The parts and digests are the same bytes either way.
//
// The step's change log (host memory): a Diff keeps the shard elements it
// found changed (ShardChangeLog, at most the step log's bytes: by default
// a quarter of the rank's shard bytes; 8 bytes per changed BF16 element,
// so up to about 6% of them changed, less the unused end of each shard's
// last block) and, once the diff is whole, moves
// the baseline to the bits it diffed, keeping their base bits: Advance
// then costs nothing (no pass over the shards after the decision) and
// Rewind puts the base back. A step whose changes do not fit keeps no log:
// its Advance copies the shards over the baseline after checking them.
//
// Memory: the baseline copy (the rank's shard bytes, where the shards
// live) plus, during Diff, the changes of one canonical tensor (of one
// shard, with a ShardMemory) and their chunks, and the step log's blocks,
// kept from step to step while the changes fit (the log of a step past
// the bound is freed). Thread safety: one thread at a time.
class ShardProducer {
 public:
  // set_step_log_bytes: a quarter of the baseline's bytes.
  static constexpr uint64_t kAutoStepLog = ~uint64_t{0};
  ShardProducer(Layout layout, uint32_t rank, uint64_t span_elems,
                EncodeOptions encode = {});
  ~ShardProducer();
  ShardProducer(const ShardProducer&) = delete;
  ShardProducer& operator=(const ShardProducer&) = delete;

  // The shards live in `memory` from now on (null: host memory). Only
  // while no baseline is held (InvalidArgument otherwise: drop it first).
  Status UseMemory(std::unique_ptr<ShardMemory> memory);
  // Null for host memory.
  const ShardMemory* memory() const { return memory_.get(); }

  // What one step produced.
  struct Step {
    // The rank's parts in ascending id order (chunk bytes by id).
    std::vector<std::pair<ChunkId, std::vector<std::byte>>> chunks;
    // Per canonical tensor, the linear digest parts of the rank's regions
    // at the baseline and at the target (HashShardRegions).
    std::vector<LinearDigest> base_digests, target_digests;
    uint64_t changed = 0;  // canonical elements whose bits changed
    ChunkSizes sizes;
    // What the step log's blocks allocate after the diff (at most its
    // bound; kept for the next step; 0 with a ShardMemory or a bound of
    // 0), and whether the baseline took the diffed bits by it (false: the
    // changes went past the bound, and the log was freed at the diff's
    // end).
    uint64_t log_bytes = 0;
    bool logged = false;
  };

  // The step log's bound (kAutoStepLog: a quarter of the baseline's bytes;
  // 0: none, every Advance checks and copies). From the next Diff on.
  void set_step_log_bytes(uint64_t bytes) { step_log_bytes_ = bytes; }

  // Copies `shards` (every shard the layout gives the rank; others are
  // ignored) as the baseline. Errors as DiffShards'. With a ShardMemory,
  // the copy stays there and each shard is read to the host once, one at
  // a time, to hash its regions; an error there leaves no baseline (the
  // shards cannot be hashed before they are copied).
  Status SetBaseline(const ShardBytes& shards);
  // As SetBaseline, taking the buffers instead of copying them (a rank
  // restarted without its baseline gets the tree's from the coordinator).
  // Host buffers always; with a ShardMemory they are copied there.
  Status AdoptBaseline(
      std::map<std::string, std::vector<std::byte>, std::less<>> shards);
  // Forgets the baseline (its memory too): has_baseline() turns false.
  void DropBaseline();
  // Diffs `target` against the baseline: the parts (XOR masks) and both
  // digest parts. InvalidArgument before a baseline was set. `span_elems`
  // (0: the constructor's) is the refit's span length. With `sink`, each
  // part goes there as soon as it is encoded (Step::chunks stays empty):
  // one canonical tensor's changes are held at a time, not the step's.
  // A step not advanced yet is rewound first (its diff is against the
  // base). With the step log (host memory), the baseline holds the diffed
  // bits once it returns OK, until Advance or Rewind; an error leaves it
  // at the base.
  Result<Step> Diff(const ShardBytes& target, uint64_t span_elems = 0,
                    const PartSink& sink = nullptr);
  // The refit of the last Diff committed: the bits it diffed become the
  // baseline. With the step log that is done already, and `target` is not
  // read: the baseline holds what the tree got, whatever the shards hold
  // now. Without it, `target` must hold the bits the last Diff was given
  // (its regions hash to that step's target digests): BaseMismatch naming
  // the first tensor otherwise (the trainer stepped again before the
  // commit); with a ShardMemory, each shard's fingerprint is compared with
  // the one taken at the Diff (BaseMismatch names the shard).
  // InvalidArgument when nothing was diffed.
  Status Advance(const ShardBytes& target);
  // The refit of the last Diff did not commit: with the step log, the base
  // bits go back into the baseline. Nothing otherwise (or twice).
  void Rewind();

  const Layout& layout() const { return layout_; }
  uint32_t rank() const { return rank_; }
  bool has_baseline() const { return has_baseline_; }
  // Per canonical tensor, the linear digest parts of the baseline's
  // regions (empty without a baseline).
  const std::vector<LinearDigest>& baseline_digests() const {
    return baseline_digests_;
  }
  uint64_t baseline_bytes() const;

 private:
  Status CheckRank() const;
  // Diff and Advance where the shards live in memory_.
  Status DiffInMemory(const ShardBytes& target, uint64_t span_elems,
                      const PartSink& sink, Step* step);
  Status AdvanceInMemory(const ShardBytes& target);
  // `shards` (checked, hashed to `digests`) become the host baseline; the
  // last step's digests and log are dropped.
  void KeepHostBaseline(
      std::map<std::string, std::vector<std::byte>, std::less<>> shards,
      std::vector<LinearDigest> digests);
  Layout layout_;
  uint32_t rank_;
  uint64_t span_elems_;
  std::unique_ptr<ChunkEncoder> encoder_;
  Status encoder_status_;
  bool has_baseline_ = false;
  std::map<std::string, std::vector<std::byte>, std::less<>> baseline_;
  std::vector<LinearDigest> baseline_digests_;
  std::optional<std::vector<LinearDigest>> last_target_digests_;
  // The last Diff's log; `moved_`: the baseline holds its target bits.
  uint64_t step_log_bytes_ = kAutoStepLog;
  ShardChangeLog step_log_;
  bool moved_ = false;
  std::unique_ptr<ShardMemory> memory_;
  // With memory_: each shard's fingerprint at the last Diff.
  std::map<std::string, Digest128, std::less<>> last_fingerprints_;
};

// `dcr diff --layout`: the delta from the checkpoint whose shards are in
// `base_dir` to the one in `target_dir`, written to `path` from chunk
// parts: each rank's shard files are read by that rank's task alone
// (ranks run on `pool`), never a canonical tensor. Applied to the gathered
// canonical base it gives the gathered canonical target, and its header
// names both versions by the digests a canonical checkpoint would have.
// Memory: the delta's chunks until they are written in id order.
// The same from shards that come from anywhere (the Python module's
// torch.save files): `source(rank, use)` opens rank `rank`'s base and
// target shards, calls `use` with them and closes them. Ranks run on
// `pool` (one worker: one rank at a time, as a source that takes a lock
// needs).
using RankShardsUse =
    std::function<Status(const ShardBytes& base, const ShardBytes& target)>;
using RankShardsSource =
    std::function<Status(uint32_t rank, const RankShardsUse& use)>;
Result<DeltaStats> WriteDeltaFromRanks(const Layout& layout,
                                       const RankShardsSource& source,
                                       const std::string& path,
                                       const DiffOptions& options,
                                       ThreadPool* pool);
Result<DeltaStats> WriteDeltaFromShards(const Layout& layout,
                                        const std::string& base_dir,
                                        const std::string& target_dir,
                                        const std::string& path,
                                        const DiffOptions& options,
                                        ThreadPool* pool);

}  // namespace dcr

#endif  // DCR_SHARD_DELTA_H_
