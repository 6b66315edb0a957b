// What a relay counts and shows: RelayStats (the snapshot Relay::Stats()
// returns), RelayCounters (the running totals the actor thread keeps),
// StatsBoard (the last published snapshot, shared with other threads) and
// RenderRelayMetrics (the Prometheus text `dcr-relay --metrics-port`
// serves).
//
// Thread safety: RelayCounters' atomic counters may be written from the
// actor thread and the transport's event thread and read from any thread;
// its plain fields and Snapshot/CloseRefit belong to the actor thread.
// StatsBoard may be used from any thread. RenderRelayMetrics is a pure
// function of its arguments.
#ifndef DCR_RELAY_RELAY_STATS_H_
#define DCR_RELAY_RELAY_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "dcr/version.h"

namespace dcr {

class Fanout;
class WeightStore;

// Why a relay cut a peer's inbound link off (logged, rate-limited, and
// counted in dcr_relay_peers_cut_total{reason}). kPeerClosed is not a cut
// and is not counted: the peer closed between frames.
enum class CutReason : unsigned {
  kLinksFull,     // every slot was taken (also dcr_relay_links_refused_total)
  kNotAllowed,    // its address is not a host of the topology
  kBadFrame,      // a frame failed validation (header, bound, checksum, tag)
  kTruncated,     // it closed mid-frame
  kNotHello,      // its first frame was not a HELLO
  kBadHello,      // its HELLO did not decode
  kUnknownNode,   // its HELLO named a node the relay does not know
  kHelloTimeout,  // no HELLO within the HELLO deadline
  kIdle,          // greeted, then silent for the idle timeout
  kEvicted,       // silent while every slot was taken and another peer came
  kSendOverflow,  // its send queue passed the last guard (it does not read)
};
inline constexpr size_t kCutReasons = 11;
// "links_full", "not_allowed", ...: the metric's label.
const char* CutReasonName(CutReason reason);

// A serving relay's images and server (relay/serving_images.h).
struct ServingStats {
  bool attached = false;  // a server is attached now
  uint32_t live_image = 0;
  bool caught_up = false;         // the standby may take a refit
  uint64_t pauses = 0;            // flips the server answered
  double last_pause_seconds = 0;  // COMMIT reaching the node to its answer
  double last_catch_up_seconds = 0;
  uint64_t prepare_timeouts = 0;  // yes votes turned to no
  // A server computing on GPU buffers it exported (cuda_ipc in its hello):
  bool gpu = false;                // attached, and kept at the live image
  bool gpu_attaching = false;      // attached, being brought to the live
                                   // image (no live line yet)
  uint64_t gpu_syncs = 0;          // attaches and commits that synced them
  uint64_t gpu_patched = 0;        // tensors patched at commits
  uint64_t gpu_patched_bytes = 0;  // positions and values of the patches
  uint64_t gpu_rewritten = 0;      // tensors those syncs rewrote whole
  double last_gpu_sync_seconds = 0;
};

// The command run after each commit (relay/commit_hook.h).
struct CommitHookStats {
  uint64_t runs = 0;      // commands started (or that failed to start)
  uint64_t failures = 0;  // of them: non-zero exit, killed, not started
  uint64_t replaced = 0;  // queued commits a newer one replaced
  int last_exit = -1;     // exit status; 128 + signal if killed; -1 none
  double last_seconds = 0;
  bool running = false;
};

// A snapshot for metrics and tests.
struct RelayStats {
  uint64_t bytes_in = 0;   // from the parent, all frames
  uint64_t bytes_out = 0;  // to children, all frames
  uint64_t chunks_received = 0;
  uint64_t chunks_applied = 0;
  uint64_t chunks_forwarded = 0;  // chunk sends, one per child
  uint64_t chunks_dropped = 0;    // duplicates and refused chunks
  uint64_t refits_committed = 0;
  uint64_t refits_aborted = 0;
  // Stores left with an unfinished refit's mix by a crash and made a
  // version again: by the relay itself at start (from its journal), and
  // by the root's repairs that committed here.
  uint64_t repairs_restored = 0;
  uint64_t repairs_by_root = 0;
  double last_refit_seconds = 0;  // PLAN to the final reply
  std::optional<Version> committed;
  // The store's record is marked "unsynced": its data's background
  // write-back has not finished (dcr/store.h "Durability").
  bool store_unsynced = false;
  std::string state;  // "idle", "planned", "receiving", "voted", "no store"
  std::string last_result;  // e.g. "committed step 3 (refit 1a2b...)"
  uint64_t apply_backlog_bytes = 0;
  std::vector<std::pair<std::string, uint64_t>> child_queue_bytes;
  // Re-parenting (protocol/fanout.h): children now (during a refit), the
  // most at once in the current or last refit, adoptions started or
  // placed, and chunks resent to adopted children from the resend buffer
  // (frames, bytes; misses: adoptions it could not cover).
  uint64_t live_children = 0;
  uint64_t peak_children = 0;
  uint64_t adoptions = 0;
  uint64_t resent_chunks = 0;
  uint64_t resent_bytes = 0;
  uint64_t resend_misses = 0;
  // Inbound links closed as they opened (max_inbound_links), and times a
  // link was paused because its frames waited (inbound_quota_bytes).
  uint64_t links_refused = 0;
  uint64_t inbound_pauses = 0;
  // Tensors hashed for votes: ahead of END, as the stream moved past them
  // (RefitSession "Hashing ahead"), and at the votes themselves.
  uint64_t tensors_hashed_ahead = 0;
  uint64_t tensors_hashed_at_vote = 0;
  // Inbound links cut off, by CutReason.
  std::array<uint64_t, kCutReasons> peers_cut{};
  // A relay with a serving process (RelayOptions::serving_socket).
  std::optional<ServingStats> serving;
  // A relay with an on-commit command (RelayOptions::on_commit).
  std::optional<CommitHookStats> on_commit;
};

// The running totals of a relay.
struct RelayCounters {
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> chunks_received{0};
  std::atomic<uint64_t> chunks_applied{0};
  std::atomic<uint64_t> chunks_forwarded{0};
  std::atomic<uint64_t> chunks_dropped{0};
  std::atomic<uint64_t> refits_committed{0};
  std::atomic<uint64_t> refits_aborted{0};
  std::atomic<uint64_t> repairs_restored{0};
  std::atomic<uint64_t> repairs_by_root{0};
  std::atomic<uint64_t> links_refused{0};   // transport thread
  std::atomic<uint64_t> inbound_pauses{0};  // transport thread
  std::atomic<uint64_t> tensors_hashed_ahead{0};
  std::atomic<uint64_t> tensors_hashed_at_vote{0};
  // By CutReason; transport and actor threads.
  std::array<std::atomic<uint64_t>, kCutReasons> peers_cut{};
  // Of refits that ended (the current one's are its Fanout's).
  uint64_t bytes_out_closed = 0;
  uint64_t adoptions_closed = 0;
  uint64_t resent_chunks_closed = 0;
  uint64_t resent_bytes_closed = 0;
  uint64_t resend_misses_closed = 0;

  // Adds the totals of a refit's Fanout that is being closed.
  void CloseRefit(const Fanout& fanout);
  // The counters, the store's committed version and, during a refit, its
  // Fanout's live figures (`fanout` null between refits).
  RelayStats Snapshot(const WeightStore* store, const Fanout* fanout) const;
};

// The snapshot other threads read. The actor publishes; the last refit's
// duration, result and peak children carry over between publications.
class StatsBoard {
 public:
  // `in_refit`: s describes a refit in progress (its peak_children is
  // live); else the last refit's peak is kept.
  void Publish(RelayStats s, bool in_refit) DCR_EXCLUDES(mu_);
  void EndRefit(double seconds, std::string result) DCR_EXCLUDES(mu_);
  RelayStats Get() const DCR_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  RelayStats published_ DCR_GUARDED_BY(mu_);
};

// The process's resident anonymous memory (RssAnon of /proc/self/status):
// what --memory-limit bounds; a mapped store is RssFile or RssShmem. 0 when
// unknown.
uint64_t AnonResidentBytes();

// The Prometheus text exposition of `s` for node `node`, with the memory
// gauge's resident bytes and limit (0: none).
std::string RenderRelayMetrics(const RelayStats& s, const std::string& node,
                               uint64_t resident_bytes, uint64_t memory_limit);

}  // namespace dcr

#endif  // DCR_RELAY_RELAY_STATS_H_
