#include "relay/relay_stats.h"

#include <cstdlib>
#include <fstream>

#include "common/metrics.h"
#include "dcr/store.h"
#include "protocol/fanout.h"

namespace dcr {

const char* CutReasonName(CutReason reason) {
  static constexpr const char* kNames[kCutReasons] = {
      "links_full", "not_allowed", "bad_frame",    "truncated",
      "not_hello",  "bad_hello",   "unknown_node", "hello_timeout",
      "idle",       "evicted",     "send_overflow"};
  const auto i = static_cast<size_t>(reason);
  return i < kCutReasons ? kNames[i] : "unknown";
}

void RelayCounters::CloseRefit(const Fanout& f) {
  bytes_out_closed += f.BytesSent();
  adoptions_closed += f.adoptions();
  resent_chunks_closed += f.resent_chunks();
  resent_bytes_closed += f.resent_bytes();
  resend_misses_closed += f.resend_misses();
}

RelayStats RelayCounters::Snapshot(const WeightStore* store,
                                   const Fanout* f) const {
  RelayStats s;
  s.bytes_in = bytes_in;
  s.bytes_out = bytes_out_closed;
  s.chunks_received = chunks_received;
  s.chunks_applied = chunks_applied;
  s.chunks_forwarded = chunks_forwarded;
  s.chunks_dropped = chunks_dropped;
  s.refits_committed = refits_committed;
  s.refits_aborted = refits_aborted;
  s.repairs_restored = repairs_restored;
  s.repairs_by_root = repairs_by_root;
  s.links_refused = links_refused;
  s.inbound_pauses = inbound_pauses;
  s.tensors_hashed_ahead = tensors_hashed_ahead;
  s.tensors_hashed_at_vote = tensors_hashed_at_vote;
  for (size_t i = 0; i < kCutReasons; ++i) s.peers_cut[i] = peers_cut[i];
  s.adoptions = adoptions_closed;
  s.resent_chunks = resent_chunks_closed;
  s.resent_bytes = resent_bytes_closed;
  s.resend_misses = resend_misses_closed;
  if (store) {
    const VersionRecord rec = store->record();
    if (rec.committed) s.committed = rec.committed->version;
    s.store_unsynced = rec.unsynced.has_value();
  }
  if (f) {
    s.bytes_out += f->BytesSent();
    s.adoptions += f->adoptions();
    s.resent_chunks += f->resent_chunks();
    s.resent_bytes += f->resent_bytes();
    s.resend_misses += f->resend_misses();
    s.live_children = f->live_children();
    s.peak_children = f->peak_children();
    for (auto& [name, bytes] : f->QueueDepths()) {
      s.child_queue_bytes.emplace_back(name, bytes);
    }
  }
  return s;
}

void StatsBoard::Publish(RelayStats s, bool in_refit) {
  MutexLock lock(&mu_);
  s.last_refit_seconds = published_.last_refit_seconds;
  s.last_result = published_.last_result;
  if (!in_refit) s.peak_children = published_.peak_children;  // the last's
  published_ = std::move(s);
}

void StatsBoard::EndRefit(double seconds, std::string result) {
  MutexLock lock(&mu_);
  published_.last_refit_seconds = seconds;
  published_.last_result = std::move(result);
}

RelayStats StatsBoard::Get() const {
  MutexLock lock(&mu_);
  return published_;
}

uint64_t AnonResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) {
      return std::strtoull(line.c_str() + 8, nullptr, 10) * 1024;
    }
  }
  return 0;
}

std::string RenderRelayMetrics(const RelayStats& s, const std::string& node,
                               uint64_t resident_bytes, uint64_t memory_limit) {
  MetricsText m;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    m.Family(name, "counter", help);
    m.Sample(name, v, {{"node", node}});
  };
  counter("dcr_relay_bytes_in_total", "Bytes of refit frames from the parent",
          s.bytes_in);
  counter("dcr_relay_bytes_out_total", "Bytes written to children",
          s.bytes_out);
  counter("dcr_relay_chunks_received_total", "Chunks received",
          s.chunks_received);
  counter("dcr_relay_chunks_applied_total", "Chunks applied to the store",
          s.chunks_applied);
  counter("dcr_relay_chunks_forwarded_total",
          "Chunk sends to children (one per child)", s.chunks_forwarded);
  counter("dcr_relay_chunks_dropped_total",
          "Duplicate chunks and chunks outside a refit", s.chunks_dropped);
  counter("dcr_relay_adoptions_total",
          "Nodes this relay re-parented (adopted or placed) in refits",
          s.adoptions);
  counter("dcr_relay_resent_chunks_total",
          "Chunks resent from the resend buffer to adopted children",
          s.resent_chunks);
  counter("dcr_relay_resent_bytes_total", "Bytes of those chunks",
          s.resent_bytes);
  counter("dcr_relay_resend_misses_total",
          "Adoptions the resend buffer could not cover (repair rounds did)",
          s.resend_misses);
  counter("dcr_relay_links_refused_total",
          "Inbound connections closed as they opened: the memory limit's "
          "most links were open",
          s.links_refused);
  counter("dcr_relay_inbound_pauses_total",
          "Times a peer's link was paused because its frames waited for "
          "the relay",
          s.inbound_pauses);
  m.Family("dcr_relay_peers_cut_total", "counter",
           "Inbound links the relay cut off, by reason (each logged, "
           "rate-limited)");
  for (size_t i = 0; i < kCutReasons; ++i) {
    m.Sample(
        "dcr_relay_peers_cut_total", s.peers_cut[i],
        {{"node", node}, {"reason", CutReasonName(static_cast<CutReason>(i))}});
  }
  m.Family("dcr_relay_memory_bytes", "gauge",
           "Resident memory outside the store's mapping (RssAnon), and the "
           "--memory-limit (0: none)");
  m.Sample("dcr_relay_memory_bytes", resident_bytes,
           {{"node", node}, {"which", "resident"}});
  m.Sample("dcr_relay_memory_bytes", memory_limit,
           {{"node", node}, {"which", "limit"}});
  m.Family("dcr_relay_children", "gauge",
           "Children during a refit, now and the most at once");
  m.Sample("dcr_relay_children", s.live_children,
           {{"node", node}, {"which", "live"}});
  m.Sample("dcr_relay_children", s.peak_children,
           {{"node", node}, {"which", "peak"}});
  m.Family("dcr_relay_refits_total", "counter", "Refits by result");
  m.Sample("dcr_relay_refits_total", s.refits_committed,
           {{"node", node}, {"result", "committed"}});
  m.Sample("dcr_relay_refits_total", s.refits_aborted,
           {{"node", node}, {"result", "aborted"}});
  m.Family("dcr_relay_vote_tensors_hashed_total", "counter",
           "Tensors hashed for votes: ahead of END as the stream moved past "
           "them, or at the vote (a store's whole hash is the vote's tail)");
  m.Sample("dcr_relay_vote_tensors_hashed_total", s.tensors_hashed_ahead,
           {{"node", node}, {"when", "ahead"}});
  m.Sample("dcr_relay_vote_tensors_hashed_total", s.tensors_hashed_at_vote,
           {{"node", node}, {"when", "vote"}});
  m.Family("dcr_relay_repairs_total", "counter",
           "Stores a crash left with an unfinished refit's mix, made a "
           "version again: by the relay at start from its journal "
           "(restored), by the root's repair (root)");
  m.Sample("dcr_relay_repairs_total", s.repairs_restored,
           {{"node", node}, {"by", "restored"}});
  m.Sample("dcr_relay_repairs_total", s.repairs_by_root,
           {{"node", node}, {"by", "root"}});
  m.Family("dcr_relay_last_refit_duration_seconds", "gauge",
           "Duration of the last refit, PLAN to final reply");
  m.Sample("dcr_relay_last_refit_duration_seconds", s.last_refit_seconds,
           {{"node", node}});
  m.Family("dcr_relay_committed_step", "gauge",
           "Step of the committed version (-1: none)");
  m.Sample("dcr_relay_committed_step",
           s.committed ? static_cast<int64_t>(s.committed->step) : -1,
           {{"node", node}});
  m.Family("dcr_relay_store_unsynced", "gauge",
           "1 while the store's data is not yet written back to disk after "
           "a commit (--data-sync background)");
  m.Sample("dcr_relay_store_unsynced", uint64_t{s.store_unsynced ? 1u : 0u},
           {{"node", node}});
  m.Family("dcr_relay_committed_version_info", "gauge",
           "The committed version's digest as a label");
  std::string digest = s.committed ? s.committed->digest.ToHex() : "";
  m.Sample("dcr_relay_committed_version_info", uint64_t{1},
           {{"node", node}, {"digest", digest}});
  m.Family("dcr_relay_state", "gauge", "1 for the relay's current state");
  m.Sample("dcr_relay_state", uint64_t{1},
           {{"node", node}, {"state", s.state}});
  m.Family("dcr_relay_apply_backlog_bytes", "gauge",
           "Chunk bytes received and not yet applied");
  m.Sample("dcr_relay_apply_backlog_bytes", s.apply_backlog_bytes,
           {{"node", node}});
  m.Family("dcr_relay_child_queue_bytes", "gauge",
           "Bytes queued for each child during a refit");
  for (const auto& [child, bytes] : s.child_queue_bytes) {
    m.Sample("dcr_relay_child_queue_bytes", bytes,
             {{"node", node}, {"child", child}});
  }
  if (const auto& sv = s.serving) {  // docs/PLACEMENT.md §"Serving processes"
    m.Family("dcr_relay_serving_attached", "gauge",
             "1 while a serving process is attached to the relay's socket");
    m.Sample("dcr_relay_serving_attached", uint64_t{sv->attached ? 1u : 0u},
             {{"node", node}});
    m.Family("dcr_relay_serving_live_image", "gauge",
             "The image (0 or 1) the serving process computes on");
    m.Sample("dcr_relay_serving_live_image", uint64_t{sv->live_image},
             {{"node", node}});
    m.Family("dcr_relay_serving_pauses_total", "counter",
             "Commits the serving process moved to");
    m.Sample("dcr_relay_serving_pauses_total", sv->pauses, {{"node", node}});
    m.Family("dcr_relay_serving_pause_seconds", "gauge",
             "The last pause: COMMIT reaching the node to the serving "
             "process's answer that it moved");
    m.Sample("dcr_relay_serving_pause_seconds", sv->last_pause_seconds,
             {{"node", node}});
    m.Family("dcr_relay_serving_catch_up_seconds", "gauge",
             "The last copy of the live image over the old one");
    m.Sample("dcr_relay_serving_catch_up_seconds", sv->last_catch_up_seconds,
             {{"node", node}});
    m.Family("dcr_relay_serving_prepare_timeouts_total", "counter",
             "Yes votes turned to no: the serving process did not answer");
    m.Sample("dcr_relay_serving_prepare_timeouts_total", sv->prepare_timeouts,
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_attached", "gauge",
             "1 while the serving process's GPU buffers are attached and "
             "kept at the live image");
    m.Sample("dcr_relay_serving_gpu_attached", uint64_t{sv->gpu ? 1u : 0u},
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_attaching", "gauge",
             "1 while an attaching server's GPU buffers are brought to the "
             "live image, before its live line");
    m.Sample("dcr_relay_serving_gpu_attaching",
             uint64_t{sv->gpu_attaching ? 1u : 0u}, {{"node", node}});
    m.Family("dcr_relay_serving_gpu_syncs_total", "counter",
             "Attaches and commits that brought the GPU buffers to the live "
             "image");
    m.Sample("dcr_relay_serving_gpu_syncs_total", sv->gpu_syncs,
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_patched_tensors_total", "counter",
             "GPU tensors commits patched: only their changed elements "
             "written");
    m.Sample("dcr_relay_serving_gpu_patched_tensors_total", sv->gpu_patched,
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_patched_bytes_total", "counter",
             "Bytes of those patches (positions and values) copied to the "
             "GPU");
    m.Sample("dcr_relay_serving_gpu_patched_bytes_total", sv->gpu_patched_bytes,
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_rewritten_tensors_total", "counter",
             "GPU tensors those syncs rewrote whole from the live image");
    m.Sample("dcr_relay_serving_gpu_rewritten_tensors_total", sv->gpu_rewritten,
             {{"node", node}});
    m.Family("dcr_relay_serving_gpu_sync_seconds", "gauge",
             "The last sync of the GPU buffers: patching, hashing both "
             "sides and rewriting the tensors that differ");
    m.Sample("dcr_relay_serving_gpu_sync_seconds", sv->last_gpu_sync_seconds,
             {{"node", node}});
  }
  if (const auto& h = s.on_commit) {  // dcr-relay --on-commit
    m.Family("dcr_relay_on_commit_runs_total", "counter",
             "On-commit commands run (one per commit, newer commits "
             "replacing queued ones)");
    m.Sample("dcr_relay_on_commit_runs_total", h->runs, {{"node", node}});
    m.Family("dcr_relay_on_commit_failures_total", "counter",
             "On-commit commands that exited non-zero, were killed at "
             "their timeout or did not start");
    m.Sample("dcr_relay_on_commit_failures_total", h->failures,
             {{"node", node}});
    m.Family("dcr_relay_on_commit_seconds", "gauge",
             "How long the last on-commit command ran");
    m.Sample("dcr_relay_on_commit_seconds", h->last_seconds, {{"node", node}});
  }
  return m.str();
}

}  // namespace dcr
