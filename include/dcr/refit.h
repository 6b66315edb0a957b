// A refit, as a trainer library or `dcr refit` calls it: the root of the
// relay tree, beside the trainer, runs one refit from its baseline to a
// target checkpoint through the tree of a topology. This header is the
// whole API of it and names no src/ type (no relay, protocol or wire type).
//
// One refit (docs/PROTOCOL.md):
//  1. Plan. Loads the baseline (root.baseline, a file store whose version
//     record names its step) and the target; the target version is
//     (base step + 1, target digest). Persists a new epoch in state_dir,
//     connects to the heads of the clusters and sends each its sub-plan;
//     waits for the PLAN_REPLY of every node (or the phase deadline).
//  2. Stream. Encoder threads diff base and target span by span (XOR
//     chunks; dense overwrites for --full) while the coordinator thread
//     sends the chunks down: construction overlaps transfer, and both the
//     encoded-but-unsent queue and each child's send queue are bounded by
//     the window. END carries the chunk count and the digest of the ids.
//  3. Vote. Every node reports whether its store now has the target digest;
//     a node whose bits differ names the tensors, which the root resends
//     as overwrite chunks before asking again (repair rounds). A link that
//     fails is reconnected, or the failed node's children are adopted
//     (docs/PROTOCOL.md §"Re-parenting").
//  4. Decide. If at least min_commit receivers (topology defaults; 0 =
//     all) voted yes, the decision and its commit set are written durably to
//     state_dir/decisions/<refit>.json before COMMIT is sent; otherwise
//     ABORT, and every relay restores its base bits.
//     The refit in progress is recorded in state_dir/current.json (see
//     ResumeRefit).
//  5. Commit. COMMIT_REPLY from every node; the baseline store takes the
//     target bits meanwhile and records the target version unless the
//     COMMIT reached no relay of the commit set (kUnfinished): the
//     base of the next refit, and the delta joins state_dir/history.
//     state_dir/last-refit.json keeps the report.
//  6. Catch up (RefitOptions::catch_up): relays that were versions behind
//     are brought to the target (src/coord/history.h).
//
// Thread safety: RunRefit and ResumeRefit are blocking calls that own their
// threads; each holds state_dir's lock for its whole run (a second call on
// the same state_dir meanwhile, from any process, is refused naming the
// first one's pid); concurrent calls need distinct state_dirs and
// baselines.
// RefitOptions::on_progress runs on the calling thread.
#ifndef DCR_REFIT_H_
#define DCR_REFIT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/refit_codes.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "dcr/transport.h"
#include "dcr/version.h"

namespace dcr {

class ProducerHub;  // dcr/producer.h

// root.baseline kept open between the refits of one process
// (RefitOptions::kept_baseline). Filled and checked by the refits; the
// caller only makes one and passes it to each.
struct KeptBaseline {
  std::shared_ptr<WeightStore> store;
  uint64_t device = 0, inode = 0;  // the file it was opened from
};

struct RefitOptions {
  Topology topology;
  std::string target;  // safetensors file, sharded directory or index
  // A producers' refit (dcr/producer.h): the target is what the trainer's
  // ranks stream through this hub, not a file (`target` unused). A delta
  // of the whole tree; needs root.baseline, which takes the merged stream.
  ProducerHub* producers = nullptr;
  // A producers' refit waits for the first rank's PRODUCER_HELLO as long
  // as it takes, then this long for the other ranks'.
  std::chrono::milliseconds producer_wait{60000};
  RefitMode mode = RefitMode::kDelta;
  // A full refit of these relays only (each fed directly by the root),
  // to seed or repair them at the tree's current version: the target must
  // hold the baseline's bits, the target version is the baseline's, and
  // the baseline does not move. Empty: the whole tree.
  std::vector<std::string> only_nodes;
  std::chrono::milliseconds phase_timeout{60000};
  std::chrono::milliseconds connect_timeout{5000};
  // Every tree link carries a HEARTBEAT this often; a link silent for 4
  // intervals is dropped and its subtree re-parented (0: no heartbeats).
  std::chrono::milliseconds heartbeat{1000};
  // After the vote, receivers whose bits differ from the target name the
  // tensors; the root resends them as overwrites and asks for a new vote,
  // at most this many times, then excludes whoever still differs.
  int repair_rounds = 2;
  // After a refit that committed, relays that refused its plan because they
  // hold an older version ("needs catch-up") are brought to the new one,
  // each fed directly by the root: with the composition of the deltas
  // recorded in state_dir/history (root.keep_deltas) when it holds the
  // whole chain from their version, else with a dense copy. A store
  // without a record, left unfinished, or missing is left alone (seed or
  // repair it with a full refit of that node).
  // Relays behind at an older step of this tree count towards min_commit
  // (they are expected at the target once caught up; if a catch-up fails
  // the refit ends committed-partial).
  bool catch_up = true;
  // A full refit's dense overwrites with raw value planes: the checkpoint's
  // bytes as they are (the transport-only reference; no compression work
  // at the root). Deltas are always compressed.
  bool compress_full = true;
  // Delta refits: code chunks in the context of the base bits every node
  // of the plan holds (codec.h kContext): about 0.77x the payload on Adam
  // steps, at 2-3x the encode and decode CPU. History files stay
  // base-independent. Decided per child of the root: a subtree that holds
  // a serving rank gets base-independent chunks (the same changes, at the
  // same sequence numbers) whatever this says. kAuto predicts both
  // through the tree with the cost model (coord/cost_model.h
  // ChooseContextPerSubtree: the topology's bandwidths, the root's
  // encoder threads, the relays' apply threads (topology
  // defaults.apply_threads, 2 by default), the last refit's change rate
  // or 3%) and takes the faster per subtree; kOn and kOff force it.
  enum class ContextCoding { kAuto, kOn, kOff };
  ContextCoding context_coding = ContextCoding::kAuto;
  // When root.baseline's data is written back (dcr/store.h "Durability").
  StoreSpec::DataSync baseline_data_sync = StoreSpec::DataSync::kBackground;
  // A process that runs refits one after another (dcr refit --producers
  // with --refits) keeps root.baseline open in it between them, instead of
  // opening it for each. The store then writes its data back 30 s after a
  // commit (StoreSpec::write_back_delay, as a relay's), not when the next
  // refit opens it, and its pages stay mapped and writable meanwhile: a
  // refit that follows within that time neither waits for the last one's
  // write-back nor takes a write-protect fault on every page it changes
  // (both together cost about as much CPU as applying the changes). While
  // kept, no other process can open root.baseline (a store is open in one
  // process at a time): another coordinator on this tree is refused until
  // this one exits. Each refit checks it first: a file replaced since
  // (another inode: a copy put back by rename) or whose version record on
  // disk is no longer the kept store's is opened afresh, and the kept
  // store's write-back leaves a record it did not write as it is. Only a
  // single-file baseline is kept (not a directory or an index).
  std::shared_ptr<KeptBaseline> kept_baseline;
  // Tests only: return right after the commit decision is durable, without
  // sending COMMIT, as if the coordinator had died there.
  bool TEST_crash_after_decision = false;
  // Tests only: nodes taken as if they held a serving rank for the choice
  // of context coding (their root child's subtree gets base-independent
  // chunks), without a serving layout.
  std::set<std::string> TEST_plain_nodes;
  // Tests only: the most bytes of producers' parts the coordinator holds
  // to compose (0: the plan's chunk window, at least 1 MiB), so that a small
  // model reaches the bound past which parts go down the tree one by one.
  uint64_t TEST_held_parts_bytes = 0;
  size_t threads = 0;  // encoder threads; 0: hardware count
  // Every link's kind; empty: each link the kind the topology gives it
  // (`transport` on defaults, a cluster, a node or a link). Tests set
  // "fake" (with transport_options.fake_network).
  std::string transport;
  // Transport options for the root's links (frames, send rate limit).
  TransportOptions transport_options;
  // The root's Ed25519 private key (root.signing_key_file; empty: none).
  // With it the encoder hashes every chunk and END carries the refit
  // manifest signed with it (docs/PROTOCOL.md §"Signed refits").
  std::string signing_key_file;
  // Called on the coordinator thread about every 100 ms from the stream to
  // the last reply (docs/PROTOCOL.md §"Progress").
  struct Progress {
    // The phase as a user sees it:
    //   "stream"  chunks going down, until every receiver has applied
    //             every chunk sent (delivered_bytes reaches payload_bytes
    //             once payload_final), whatever the root's own phase;
    //   "vote"    receivers verifying the target (answered of receivers);
    //   "repair"  a repair round's overwrites going down and applied;
    //   "commit", "abort"  the decision going down (answered of receivers).
    std::string phase = "stream";
    // Target bytes diffed so far; the first batch's during "plan" too (it
    // encodes while the PLAN's replies come back).
    uint64_t scanned_bytes = 0;
    uint64_t total_bytes = 0;  // checkpoint bytes
    // Chunk bytes sent so far in this stream (the refit's, or the repair
    // round's), and whether it sent its last chunk (then the total).
    uint64_t payload_bytes = 0;
    bool payload_final = false;
    uint64_t chunks = 0;
    // Of payload_bytes, those every receiver has applied: the least over
    // the tree, as the relays report it (at most 250 ms old per hop).
    // nullopt where the relays do not report it (heartbeats off, a relay
    // of an older release).
    std::optional<uint64_t> delivered_bytes;
    // This phase's replies: receivers that answered (or whose link
    // failed) of all.
    size_t answered = 0;
    size_t receivers = 0;
    std::string slowest;  // the child with the longest send queue
    uint64_t slowest_queue_bytes = 0;
  };
  std::function<void(const Progress&)> on_progress;
};

enum class RefitOutcome {
  kCommitted,  // every receiver committed
  kPartial,    // committed; some receivers were excluded (stale)
  kAborted,    // nothing committed; every reachable relay restored its base
  // Decided commit, but no relay of the commit set answered the COMMIT
  // (they refuse or drop it when another coordinator run took the refit
  // over; or the links failed).
  // The baseline did not advance and current.json stays: ResumeRefit, or
  // the next RunRefit, finishes it.
  kUnfinished,
};
std::string_view RefitOutcomeName(RefitOutcome o);

struct NodeOutcome {
  std::string node;
  std::string cluster;
  bool committed = false;
  NodeCode code = NodeCode::kOk;  // the first phase that failed, else kOk
  std::string phase;              // "plan", "vote", "commit" or ""
  std::string detail;
  uint64_t chunks_applied = 0;
};

// One catch-up after the refit (RefitOptions::catch_up).
struct CatchUpReport {
  RefitId refit;  // its own refit id and epoch
  uint64_t epoch = 0;
  std::vector<std::string> nodes;  // the relays it fed
  Version from;  // their version (history catch-up; repair: the
                 // unfinished refit's target)
  // "history" (composed deltas), "dense" (a dense copy), "repair" (the
  // overwrites that repair a store left with a mix, coord/repair.h) or
  // "seed" (a dense copy into a store that was missing).
  std::string method;
  RefitId repaired;     // "repair", or "dense" for one: the unfinished refit
  uint64_t deltas = 0;  // history deltas composed (repair: whose union)
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;
  double seconds = 0;
  RefitOutcome outcome = RefitOutcome::kAborted;
  std::string reason;  // why some of them did not catch up
};

struct RefitReport {
  RefitId refit;
  uint64_t epoch = 0;
  RefitMode mode = RefitMode::kDelta;
  RefitOutcome outcome = RefitOutcome::kAborted;
  std::string reason;  // why it aborted, or who was excluded
  Version base;
  Version target;
  uint64_t checkpoint_bytes = 0;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;  // encoded chunk bytes
  // Of `chunks`, those coded in the context of the base (codec.h kContext).
  uint64_t context_chunks = 0;
  // A mixed tree (serving ranks beside canonical stores, with context
  // coding on): the nodes planned with context-coded chunks, and the
  // payload the others got (each context-coded chunk base-independent).
  // `payload_bytes` and `stream_bytes` are then what a context_nodes edge
  // carried. Empty and 0 otherwise.
  std::vector<std::string> context_nodes;
  uint64_t plain_payload_bytes = 0;
  uint64_t stream_bytes = 0;   // all frames the root sent down one edge
  int repair_rounds = 0;       // repair rounds run (see RefitOptions)
  uint64_t repair_chunks = 0;  // overwrite chunks they sent
  uint64_t repair_bytes = 0;   // their encoded bytes
  uint64_t adoptions = 0;      // nodes the root re-parented
  // Chunks the root resent from its resend buffer to nodes it adopted, and
  // adoptions whose missed chunks the buffer no longer held (those come
  // back in a repair round).
  uint64_t resent_chunks = 0;
  uint64_t resent_bytes = 0;
  uint64_t resend_misses = 0;
  // Bytes carried per link class ("wan", "lan") by the tree's edges that
  // reached a node in the refit: each edge carries the stream once.
  std::map<std::string, uint64_t> link_class_bytes;
  double prepare_seconds = 0;  // open target and baseline, epoch, state
  double plan_seconds = 0;     // PLAN sent to the last PLAN_REPLY
  double stream_seconds = 0;   // first chunk to END sent
  double vote_seconds = 0;     // END sent to the last vote
  // Of vote_seconds: END sent to every receiver having applied every chunk
  // of the stream, as the relays report it (docs/PROTOCOL.md §"Progress"):
  // a paced link's drain, not the verification. 0: not reported, or all
  // applied by the time the stream ended.
  double applied_seconds = 0;
  double commit_seconds = 0;  // decision to the last COMMIT_REPLY (and the
                              // baseline committed, in parallel)
  double total_seconds = 0;
  // Time root.baseline took the target's bits while the refit streamed
  // and voted (writes and history syncs on the producer thread, hidden
  // behind the transfer, then the last batch's beside the vote; part of
  // stream_seconds only where the transfer did not hide it). 0 when the
  // baseline was updated after the decision instead.
  double baseline_in_stream_seconds = 0;
  // Of baseline_in_stream_seconds: how long the decision waited for the
  // last batch's writes after the votes were in (part of commit_seconds);
  // 0 when the vote hid them.
  double baseline_waited_seconds = 0;
  // Time the encoder's workers spent hashing the target for its digests
  // (which END carries), summed over workers: part of stream_seconds, and
  // no longer a pass before PLAN. 0 when the target was hashed before PLAN
  // (named nodes) or not at all.
  double hashed_in_stream_seconds = 0;
  // A producers' refit: how many ranks streamed it, at which trainer step
  // (0 and 0 otherwise).
  uint32_t producers = 0;
  uint64_t trainer_step = 0;
  std::vector<NodeOutcome> nodes;  // every receiver in tree order
  std::vector<CatchUpReport> catch_up;
  // When the coordinator wrote the report to its state directory (ISO 8601
  // UTC, to the second); empty before that.
  std::string ended_at;

  std::string ToJson() const;  // one object, keys documented in README
};

// Runs one refit. Errors (not a report) for what stops it before any relay
// is asked: a bad topology, a missing state_dir or baseline, a target whose
// tensors differ from the baseline, another coordinator running on the
// state_dir (InvalidArgument, NotFound). Everything after that ends in a
// report, aborted or not. A refit that a stopped coordinator left in its
// commit phase (state_dir/current.json with a commit decision, root.baseline
// flagged mid-update for it) is finished first, as ResumeRefit would
// (Aborted if it cannot be).
Result<RefitReport> RunRefit(const RefitOptions& options);

// `dcr refit --resume`: finishes the refit a coordinator left unfinished
// (state_dir/current.json, written before its PLAN, removed with its
// report). With a durable commit decision (decisions/<refit>.json) it
// sends COMMIT to the same commit set, else ABORT. It runs at a new epoch:
// every relay that holds the refit accepts it as its new parent (an
// adoption PLAN with `resume`) and from then on refuses the old run's
// frames; a relay that finished the refit reports how it ended. The
// baseline is advanced from the recorded target path if the interrupted
// run had not done it (unless this COMMIT reaches no relay either:
// kUnfinished, current.json stays).
// Uses options' topology, timeouts, transport and heartbeat; target and
// mode come from current.json. NotFound when there is nothing to resume;
// InvalidArgument naming its pid while another coordinator runs on the
// state_dir.
Result<RefitReport> ResumeRefit(const RefitOptions& options);

}  // namespace dcr

#endif  // DCR_REFIT_H_
