// The root's baseline updated while a delta refit streams (DESIGN.md
// invariant 8, docs/FORMAT.md §"State directory"), so the commit phase
// costs a durable record instead of a pass over the model.
//
// Write-ahead: a span the refit changed takes the target's bits only once
// the chunk that changed it is synced in the delta history's temporary
// file. That file (XOR chunks, base-independent) and the target checkpoint
// are then an undo log: RestoreBase takes every span it names back to the
// base whatever the baseline holds there (the base, the target, or a torn
// write of either), so an abort, a crash before the decision and a crash
// during the restore itself all end at the base. After the decision the
// baseline already holds the target; a crash then is finished forward by
// --resume (the target's bits of every span, checked by digest).
//
// The baseline's record names the refit in progress (WeightStore::
// BeginRefit) before the first write: a plain refit is refused until
// --resume settles it.
//
// The last settle (the spans of the stream's last history bytes, up to
// sync_bytes of history: at a 1% change rate that can be most of the
// model) runs beside the vote instead (SettleLastInBackground): END goes
// out when the encoder is done, and the decision waits for the writes
// (Join). The write-ahead is the same, so an abort or a crash meanwhile
// ends as one during the stream does.
//
// Thread safety: BaselineInStream runs on the producer thread (Changed,
// AfterBatch) and uses the pool from there; SettleLastInBackground, after
// the producer stopped, hands it to a thread of its own until Join; the
// rest after that.
#ifndef DCR_COORD_BASELINE_STREAM_H_
#define DCR_COORD_BASELINE_STREAM_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "coord/history.h"
#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "dcr/version.h"
#include "protocol/messages.h"

namespace dcr {

class BaselineInStream {
 public:
  struct Options {
    WeightStore* baseline = nullptr;
    const Checkpoint* target = nullptr;
    ThreadPool* pool = nullptr;
    HistoryRecording* record = nullptr;  // must be active()
    RefitId refit;
    Version base;
    Version to;  // the target version
    uint64_t span_elems = 0;
    // History bytes recorded between syncs (and span writes): each sync
    // costs an fdatasync of the history file.
    uint64_t sync_bytes = uint64_t{64} << 20;
  };
  explicit BaselineInStream(Options options);
  ~BaselineInStream();  // joins SettleLastInBackground's thread
  BaselineInStream(const BaselineInStream&) = delete;
  BaselineInStream& operator=(const BaselineInStream&) = delete;

  // Span `id` changed: its chunk (first pass, not empty) was appended to
  // the record.
  void Changed(const ChunkId& id);
  // After each batch of the stream: once sync_bytes were recorded since
  // the last sync (always when `last`), syncs the record and writes the
  // target's bits of every span changed up to there. An error is a failed
  // baseline write: the refit must abort (and restore). A record that
  // fails stops the overlap instead (active() false): what was written
  // stays covered by the part of the file already synced.
  Status AfterBatch(bool last);

  // The stream's last AfterBatch(true), on a thread of its own with a pool
  // of `threads` of its own (Options::pool may serve the vote's repair
  // rounds meanwhile); `done` is called on that thread when it ends
  // (finished() is true by then). No other call until Join but finished().
  void SettleLastInBackground(size_t threads, std::function<void()> done);
  // SettleLastInBackground's settle has ended (or none was started): Join
  // returns at once.
  bool finished() const { return !last_.joinable() || last_done_.load(); }
  // Waits for SettleLastInBackground's settle; its status, as
  // AfterBatch's (OK where none ran).
  Status Join();

  // Still writing spans as they stream.
  bool active() const { return active_; }
  // The baseline was flagged for the refit and a span may have been
  // written (also where a batch's writes failed part way): an abort must
  // restore the base.
  bool touched() const { return begun_; }
  // Every span the refit changed holds the target's bits (active through
  // the last batch): no baseline pass after the decision.
  bool complete() const { return active_ && done_; }
  uint64_t written_bytes() const { return written_bytes_; }
  // Span writes ended so far, on any thread (callable while
  // SettleLastInBackground runs): a wait that sees it move is waiting on
  // a disk that writes, not on one that hangs.
  uint64_t writes_ended() const {
    return writes_ended_.load(std::memory_order_relaxed);
  }
  // Wall time of the writes and syncs (on the producer thread, overlapped
  // with the transfer).
  double seconds() const { return seconds_; }

 private:
  Status AfterBatchOn(bool last, ThreadPool* pool);
  Status Settle(ThreadPool* pool);

  Options o_;
  bool active_ = true;
  bool begun_ = false;
  bool done_ = false;
  uint64_t synced_at_ = 0;  // record bytes at the last sync
  std::vector<ChunkId> pending_;
  uint64_t written_spans_ = 0;
  uint64_t written_bytes_ = 0;
  double seconds_ = 0;
  std::thread last_;  // SettleLastInBackground
  std::atomic<bool> last_done_{false};
  std::atomic<uint64_t> writes_ended_{0};
  Status last_status_;
};

// Takes every span named in the undo log `log` (a delta file of the refit
// base -> target: finished, or the temporary file of an unfinished record,
// read up to its last whole chunk) back to the base: the target's bits of
// the span with the chunk's XOR undone, written to `baseline`. The result
// depends only on the log and the target, so running it again (a crash
// during the restore) is harmless. Refuses a log of another manifest or
// span length, and overwrite chunks (not invertible).
struct RestoreStats {
  uint64_t spans = 0;
  uint64_t bytes = 0;
  // An unfinished log ended inside a chunk, or held chunks that do not
  // decode (a crash cut them; their spans were never written).
  bool torn_tail = false;
};
Result<RestoreStats> RestoreBase(const std::string& log,
                                 const Checkpoint& target,
                                 WeightStore* baseline, uint64_t span_elems,
                                 ThreadPool* pool);

// The identity of the files a checkpoint maps (device, inode, size,
// modification time): a target rewritten in place while the refit runs
// (the baseline would take other bits than the relays verified) is told
// by Changed().
class FileStamps {
 public:
  FileStamps() = default;
  explicit FileStamps(const Checkpoint& c);
  // The first file whose identity changed (or that is gone), "" if none.
  std::string Changed() const;

 private:
  struct Stamp {
    std::string path;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool ok = false;
  };
  static Stamp Take(const std::string& path);
  std::vector<Stamp> stamps_;
};

}  // namespace dcr

#endif  // DCR_COORD_BASELINE_STREAM_H_
