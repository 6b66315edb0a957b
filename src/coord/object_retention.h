// Which refits' objects an object store keeps (docs/PROTOCOL.md §"Chunks
// through an object store", Retention): the objects of the last
// root.keep_deltas committed refits of the whole tree, and those of a
// refit that is not over. Everything else a root uploaded is deleted: an
// aborted refit's objects when it ends, older committed ones and those of
// refits of named nodes (catch-ups, repairs, seeds: never read back) when
// a refit commits, and by `dcr gc` what a root that died left behind.
//
// The root's state directory is the index, not the bucket: before its
// first upload a refit writes state_dir/objects/<refit id>.json
// ("uploading", with its epoch and target step), durably, and rewrites it
// "committed" once the refit commits. So a root that crashes mid-upload
// leaves a record naming its objects, and pruning needs no LIST of the
// whole bucket (only one per refit removed, since a refit's object count
// is not recorded). `dcr gc` also LISTs refits/ and reports what no
// record names; it removes those only when asked (--unrecorded): a bucket
// prefix shared by two roots would otherwise lose the other root's.
//
// Objects are removed before their record, so a removal cut short is
// finished by the next prune. Deletes run on kDeleteThreads threads.
//
// Thread safety: not thread-safe; one owner (the coordinator run, or
// `dcr gc`, both under the state directory's lock).
#ifndef DCR_COORD_OBJECT_RETENTION_H_
#define DCR_COORD_OBJECT_RETENTION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coord/state_dir.h"
#include "dcr/objstore.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

struct ObjectRefitRecord {
  RefitId refit;
  uint64_t epoch = 0;
  uint64_t target_step = 0;
  bool whole_tree = true;  // false: a refit of named nodes (--only)
  bool committed = false;
};

// What a prune or `dcr gc` found and did, one entry per refit.
struct RetainedRefit {
  std::string refit;  // 32 hex digits
  // "committed", "uploading" (not committed: aborted, unfinished or
  // running), "unreadable" (a record that cannot be read: kept), or
  // "unrecorded" (objects no record names; `dcr gc` only).
  std::string state;
  std::optional<uint64_t> target_step;  // from the record
  // Objects found (a LIST of the refit's prefix; nullopt when not listed:
  // a kept refit, outside `dcr gc`).
  std::optional<uint64_t> objects;
  bool removed = false;  // its objects and record are gone (or, dry run,
                         // would be)
  std::string why;       // why kept or removed, or what failed
};

struct RetentionReport {
  // Newest epoch first, then unreadable records, then unrecorded refits.
  std::vector<RetainedRefit> refits;
  uint64_t objects_removed = 0;
  // Keys under refits/ that are not a refit's objects (left alone).
  std::vector<std::string> foreign_keys;
  size_t failures = 0;  // refits whose removal failed (named in `why`)
};

class ObjectRetention {
 public:
  static constexpr int kDeleteThreads = 8;

  // `store` outlives this object; `keep` is root.keep_deltas.
  ObjectRetention(StateDir state, ObjectStore* store, uint32_t keep)
      : state_(std::move(state)), store_(store), keep_(keep) {}

  // Records that `refit` is about to upload objects, durably; a refit
  // already recorded keeps its record.
  Status Begin(const RefitId& refit, uint64_t epoch, uint64_t target_step,
               bool whole_tree);
  // Marks `refit` committed (its objects are now among those kept).
  Status Committed(const RefitId& refit);
  // Removes `refit`'s objects and record (an aborted refit): those a LIST
  // of its prefix finds and, by name, ordinals 0 .. `pushed` - 1 (a LIST
  // may lag behind recent writes).
  Status Remove(const RefitId& refit, uint64_t pushed = 0);

  // Removes the objects of every recorded refit but the `keep` newest
  // committed (by epoch) and, if not committed, `running` (a refit of
  // this run still uploading) and the one current.json names (unfinished,
  // or this run's). With `scan_store` (dcr gc) it also
  // LISTs refits/ and reports refits no record names, removing them only
  // with `remove_unrecorded`. A dry run removes nothing. A failure to
  // remove one refit is reported in its entry and counted; the rest go on.
  // An error only when the records or the store cannot be listed.
  Result<RetentionReport> Prune(const std::optional<RefitId>& running,
                                bool scan_store = false,
                                bool remove_unrecorded = false,
                                bool dry_run = false);

  // The records in state_dir/objects/, newest epoch first. A file that is
  // not a record is logged and skipped (never removed); the refit ids of
  // those named "<refit id>.json" go to `unreadable` (their objects are
  // left alone too).
  Result<std::vector<ObjectRefitRecord>> Records(
      std::vector<RefitId>* unreadable = nullptr) const;

 private:
  std::string RecordPath(const RefitId& refit) const;
  Status WriteRecord(const ObjectRefitRecord& r) const;
  // Deletes every object under the refit's prefix (and ordinals 0 ..
  // pushed - 1 by name), then what unfinished uploads left; the count
  // removed.
  Result<uint64_t> DeleteObjects(const std::string& refit_hex,
                                 uint64_t pushed = 0) const;

  StateDir state_;
  ObjectStore* const store_;
  const uint32_t keep_;
};

}  // namespace dcr

#endif  // DCR_COORD_OBJECT_RETENTION_H_
