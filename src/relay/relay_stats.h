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
  std::atomic<uint64_t> links_refused{0};   // transport thread
  std::atomic<uint64_t> inbound_pauses{0};  // transport thread
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
