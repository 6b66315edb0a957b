// Producers' refits (docs/design/producer-stream.md, docs/PLACEMENT.md):
// every trainer rank diffs its own shards and streams its chunk parts to a
// coordinator, which merges the ranks' streams into one refit through the
// relay tree. No process gathers a canonical tensor or reads a checkpoint
// file.
//
//   trainer rank r ──Producer──▶ ProducerHub (in `dcr refit --producers N`)
//                                  │ merged CHUNK stream ─▶ relay tree
//                                  └─ applied to root.baseline (a session
//                                     of its own, like a relay's store)
//
// One refit, from a producer's side (docs/PROTOCOL.md §"Producers"):
//  1. It connects and says who it is: PRODUCER_HELLO with its rank, the
//     world size, the trainer step, the layout's fingerprint and the digest
//     parts of its baseline shards (none without a baseline: then
//     PRODUCER_BASELINE frames bring it the tree's, from root.baseline).
//     The coordinator waits for every rank (RefitOptions::producer_wait),
//     refuses a producer of another world size, layout or step, and checks
//     that the ranks' baselines compose into root.baseline's digest (the
//     version every relay holds).
//  2. After the relays took the PLAN, PRODUCER_GO names the refit, the
//     span length and the target step. The producer diffs its shards
//     against its baseline and sends its parts (XOR chunks with part
//     rank + 1), then PRODUCER_DONE with the digest parts of its target.
//  3. The coordinator forwards every part down the tree as it arrives and
//     applies it to root.baseline; the target's digests are the XOR of the
//     ranks' parts. Votes, repair rounds and the decision are those of any
//     refit (dcr/refit.h). PRODUCER_DECISION tells each producer the
//     outcome; on a commit its baseline shards become this step's.
// A producer that leaves (or stays silent for the phase timeout) before
// its PRODUCER_DONE aborts the refit: every relay and root.baseline
// restore their base bits, and the other producers are told "aborted".
//
// Thread safety: a Producer is used by one thread at a time. A ProducerHub
// is handed to one RunRefit at a time; its listener runs on its own event
// thread.
#ifndef DCR_PRODUCER_H_
#define DCR_PRODUCER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dcr/codec.h"
#include "dcr/layout.h"
#include "dcr/shard_diff.h"
#include "dcr/shard_memory.h"
#include "dcr/status.h"
#include "dcr/transport.h"
#include "dcr/version.h"

namespace dcr {

// How a producer's refit ended.
enum class ProducerOutcome {
  kCommitted,   // every receiver committed; the baseline shards advanced
  kPartial,     // committed, some receivers excluded; the shards advanced
  kAborted,     // nothing committed; the shards stay at the base
  kUnfinished,  // decided commit, confirmed by no relay yet (dcr refit
                // --resume finishes it); the shards advanced
  kRefused,     // the coordinator refused this producer or gave up before
                // the stream (the reason says why); nothing changed
};
std::string_view ProducerOutcomeName(ProducerOutcome o);
// Whether the tree moved to the target (committed, partial, unfinished).
inline bool Advanced(ProducerOutcome o) {
  return o == ProducerOutcome::kCommitted || o == ProducerOutcome::kPartial ||
         o == ProducerOutcome::kUnfinished;
}

struct ProducerDecision {
  ProducerOutcome outcome = ProducerOutcome::kRefused;
  RefitId refit;
  Version target;      // the tree's version after a commit
  std::string reason;  // why it aborted or was refused
  // The tree moved, but this rank's shards were not what it diffed any more
  // when the decision came (the trainer stepped again), and the step kept
  // no change log to advance by (ProducerOptions::step_log_bytes): its
  // baseline was dropped (`reason` says why) and the next refit fetches
  // the tree's.
  bool baseline_dropped = false;
  // This rank's share.
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;
  uint64_t changed_elements = 0;
  // What its step's change log allocates
  // (ProducerOptions::step_log_bytes; ShardProducer::Step::log_bytes).
  uint64_t log_bytes = 0;
  // Diff and encode of its shards, and sending its parts (which overlaps).
  double diff_seconds = 0;
  double total_seconds = 0;  // connect to decision
};

struct ProducerOptions {
  std::string coordinator;  // host:port of `dcr refit --producers`
  // Connecting; and how long the coordinator may stay silent while this
  // producer waits for GO or the decision (it sends a HEARTBEAT every
  // second while it works for the tree, so this bounds a dead coordinator,
  // not a long refit).
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds timeout{600000};
  // While it diffs, the producer sends a HEARTBEAT this often (0: never):
  // the coordinator takes a rank silent for its --timeout as gone, and a
  // rank diffing long runs of unchanged (e.g. frozen) weights sends no
  // chunk meanwhile.
  std::chrono::milliseconds heartbeat{1000};
  // tcp only; TLS and frame authentication as the relays'.
  TransportOptions transport;
  // Passed to the chunk encoder (threads, compression).
  EncodeOptions encode;
  // Shards in host memory: the bound on a step's change log
  // (ShardProducer::set_step_log_bytes, dcr/shard_delta.h), by which the
  // baseline takes the diffed bits before the decision, so that a commit
  // costs no pass over the shards. Default: a quarter of the rank's shard
  // bytes; 0: none (the shards are checked and copied after a commit).
  uint64_t step_log_bytes = ~uint64_t{0};
};

class ShardProducer;

// A trainer rank's producer across steps.
class Producer {
 public:
  Producer(Layout layout, uint32_t rank, ProducerOptions options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // The rank's shards at the version the tree holds now (every shard the
  // layout gives the rank; others ignored); copied. Errors as DiffShards'.
  // Optional: a producer without a baseline (a rank restarted without its
  // shards) gets the tree's from the coordinator, which builds it from
  // root.baseline, at its next Refit; that takes a rank whose layout
  // converts no tensor (an F32 master cannot be rebuilt from its BF16
  // canonical bits: such a rank is refused, naming the tensor).
  Status SetBaseline(const ShardBytes& shards);
  // The rank's shards live in `memory` from now on (a GPU's: dcr/cuda.h
  // CreateShardMemory; null: host memory): SetBaseline and Refit then take
  // spans of that memory, the baseline is kept there, and only the changed
  // elements cross to the host (dcr/shard_memory.h). Only while no
  // baseline is held (InvalidArgument otherwise).
  Status UseMemory(std::unique_ptr<ShardMemory> memory);
  const ShardMemory* memory() const;  // null: host memory
  // One refit of trainer step `step` with `shards` (the rank's tensors
  // after the optimizer step; read, not kept, and not to be changed until
  // it returns). Returns the decision once the coordinator made it; on a
  // commit the bits it diffed become the baseline (with the step's change
  // log, already done when the decision comes, whatever the shards hold
  // then; without it, checked and copied from `shards`: if they changed
  // meanwhile, ProducerDecision::baseline_dropped). Errors (not a decision)
  // when the coordinator cannot be reached or the link fails before the
  // decision (the baseline stays: the tree aborts a refit whose producer left),
  // or for shards that do not fit the layout (a changed shape names the
  // tensor).
  Result<ProducerDecision> Refit(uint64_t step, const ShardBytes& shards);

  uint32_t rank() const { return rank_; }
  const Layout& layout() const;
  bool has_baseline() const;

 private:
  uint32_t rank_;
  ProducerOptions options_;
  std::unique_ptr<ShardProducer> shards_;
};

// The coordinator's listener for producers: it accepts their links for
// the refits it is handed to (RefitOptions::producers), one at a time.
class ProducerHub {
 public:
  class Impl;  // src/coord/producer_hub.h

  // Listens on `host:port` (port 0: an ephemeral one) with a "tcp"
  // transport of `transport`'s options. Producers of other layouts are
  // refused.
  static Result<std::unique_ptr<ProducerHub>> Listen(
      Layout layout, std::string_view host, uint16_t port,
      const TransportOptions& transport);
  ~ProducerHub();
  ProducerHub(const ProducerHub&) = delete;
  ProducerHub& operator=(const ProducerHub&) = delete;

  uint16_t port() const;
  const Layout& layout() const;
  // Any thread: the refit waiting for its producers (now or next) returns
  // an error ("stopped"); a refit already streaming runs to its end.
  void Stop();
  bool stopped() const;
  // Refits that began waiting for their producers (RunRefit that failed
  // before: its producers heard nothing; see RefuseWaiting).
  uint64_t gathers() const;
  // Tells every producer that said hello and waits that it is refused, with
  // `why`, and closes their links.
  void RefuseWaiting(const std::string& why);
  Impl& impl() { return *impl_; }

 private:
  explicit ProducerHub(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcr

#endif  // DCR_PRODUCER_H_
