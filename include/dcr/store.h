// Weight stores: where a receiver's canonical weights live, and the record
// of which version they hold.
//
// A WeightStore exposes the tensors of one canonical manifest as host
// memory that chunks are applied to in place, and keeps a version record:
// the version committed last and whether a refit is in progress (so that a
// relay restarting mid-refit knows its bits may be a mix of base and
// target). Backends:
//
//   memory:        heap memory, for tests; the record lives in memory only.
//   file:PATH      a .safetensors file (or a sharded directory / index) mapped
//                  shared and read-write; the record is "<PATH>.dcr-version"
//                  ("<PATH>/store.dcr-version" for a directory).
//   shm:NAME       a POSIX shared-memory object "/NAME" holding a complete
//                  safetensors image (u64 header length, JSON header, data)
//                  that a serving process can shm_open + mmap and parse; the
//                  record is "/dev/shm/NAME.dcr-version" unless the spec
//                  names another path (e.g. under the relay's state_dir).
//
// Durability. Records are replaced atomically (write a temporary file,
// fsync, rename, fsync the directory): a crash at any point leaves either
// the old record or the new one, never a mix. BeginRefit() persists "refit
// in progress" before the caller modifies anything. Memory stores have
// nothing to make durable; shm data lives in RAM, so it survives a crash of
// the relay but not a reboot of the host, like its default record location.
// For file stores, Commit() and EndRefit() make the data durable (msync) in
// one of two ways, chosen by StoreSpec::data_sync:
//
//   kAtCommit    before the record is replaced: a record without a refit in
//                progress always describes bits that are on disk. A commit
//                costs a write-back of every page the refit touched (about
//                1 s per GB changed, per node sharing the disk).
//   kBackground  (the default) the record is replaced at once, marked
//                "unsynced" with this boot's id, and a background thread
//                writes the data back (paced, 256 KiB at a time, so that
//                the next refit's record and journal fsyncs do not queue
//                behind the whole store; after StoreSpec::write_back_delay,
//                which lets commits close together share one write-back),
//                then rewrites the record without the mark, if the record
//                on disk is still the one this store wrote (someone else's
//                is left as it is). A crash of the process alone loses
//                nothing (the page cache holds the bits); a crash of the
//                host before the write-back finished may. So OpenStore,
//                finding the mark from an earlier boot, hashes the data:
//                bits that match the committed digest keep the version,
//                others lose it (the record then says "never committed",
//                so no delta is bound to them; a full refit repairs the
//                store). The mark from this boot means only the process
//                died: the open syncs the data and clears it.
//
// The record states what dcr last committed; it is not re-verified on open
// (that would hash the whole store), except as above. Callers that must be
// sure, such as a relay before voting, compute Digests().
//
// One process at a time: opening or creating a file or shm store takes an
// exclusive advisory lock (flock) on its data, released when the store is
// destroyed; a second open fails with IOError. Serving processes that only
// map the data are not affected.
//
// Thread safety: manifest(), describe(), Tensor(), Digests(), committed(),
// InProgress() and record() may be called concurrently with anything.
// MutableTensor() may be called concurrently, and writes to disjoint byte
// ranges may proceed concurrently (ModifyTensor writes its whole window:
// see there). Commit() and EndRefit() require that no
// write to the data is in progress (they sync it); Commit(), BeginRefit(),
// EndRefit() and the background write-back's record update are serialized
// against each other internally. WaitDataSync() may be called from any
// thread.
#ifndef DCR_STORE_H_
#define DCR_STORE_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "dcr/checkpoint.h"
#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

class ThreadPool;

// ---------------------------------------------------------- version record

// A refit that started and has neither committed nor ended: the store's bits
// may be any mix of `base` and `target`.
struct RefitInProgress {
  RefitId refit;
  Version base;
  Version target;
  std::string started_at;  // ISO 8601 UTC, e.g. "2025-01-31T12:00:00Z"
  friend bool operator==(const RefitInProgress&,
                         const RefitInProgress&) = default;
};

// The last commit.
struct CommitInfo {
  Version version;
  RefitId refit;             // zero when committed without a refit
  std::string committed_at;  // ISO 8601 UTC
  friend bool operator==(const CommitInfo&, const CommitInfo&) = default;
};

// The data changed after `since`, during the boot `boot_id` (Linux's
// /proc/sys/kernel/random/boot_id), and its write-back to disk had not
// finished when the record was written.
struct DataUnsynced {
  std::string boot_id;  // 36 characters: a lowercase UUID
  std::string since;    // ISO 8601 UTC
  // The version the data on disk held when the write-back began to lag
  // (the committed version of the record the mark was first put on):
  // after a crash of the host, every element holds it or a later version
  // up to the one committed. Unknown (nullopt) in records written before
  // it existed.
  std::optional<Version> synced;
  friend bool operator==(const DataUnsynced&, const DataUnsynced&) = default;
};

// What a version record file holds; see docs/FORMAT.md §version record.
//
//   {"format": 3 | 4,
//    "manifest": "<32 hex>",            manifest digest of the store
//    "committed": null | {"step": N, "digest": "<32 hex>",
//                         "refit": "<32 hex>", "committed_at": "<ISO>"},
//    "in_progress": null | {"refit": "<32 hex>",
//                           "base": {"step": N, "digest": "<32 hex>"},
//                           "target": {"step": N, "digest": "<32 hex>"},
//                           "started_at": "<ISO>"},
//    "unsynced": {"boot_id": "<uuid>", "since": "<ISO>",
//                 "synced": {"step": N, "digest": "<32 hex>"}}  format 4 only
//                                      ("synced" may be absent)
//
// Format 4 is format 3 plus "unsynced", which it must carry (not null);
// EncodeVersionRecord writes format 3 whenever `unsynced` is empty. Formats
// 3 and 4 name versions by linear tensor digests (docs/FORMAT.md
// §"Digests"); formats 1 and 2, the same keys, by the XXH3 digests of
// earlier builds: they decode with legacy_digests set, and builds that know
// only them refuse 3 and 4, so no build misreads a digest.
// Strict JSON, at most kMaxVersionRecordBytes; every key required, no
// others allowed. A "format" above 4 is Unsupported; anything else
// malformed is Corruption.
//
// Digests. A store opened with a record of format 1 or 2 upgrades it once,
// before anything else reads it: it hashes its bits both ways; if the old
// version digest is the committed one, the record is rewritten at format 3
// or 4 with the new digest (an "unsynced" mark loses its synced version).
// Bits that do not hold it under an "unsynced" mark (a write-back lost),
// and a record that names a refit in progress (a mix no build can finish
// now), leave the store never committed, to be seeded, as RecoverUnsynced
// does without a synced version. Bits that do not hold the committed
// version otherwise are refused (Corruption, the record left as it was)
// with a message that says to remove the record and seed the store again
// (`dcr refit --full --node NAME`).
struct VersionRecord {
  Digest128 manifest;
  std::optional<CommitInfo> committed;
  std::optional<RefitInProgress> in_progress;
  std::optional<DataUnsynced> unsynced;
  // Read from a record of format 1 or 2, whose digests are of the earlier
  // XXH3 kind: a store upgrades it at open (see "Digests").
  bool legacy_digests = false;
  friend bool operator==(const VersionRecord&, const VersionRecord&) = default;
};
inline constexpr uint64_t kMaxVersionRecordBytes = 64 * 1024;

// One line of JSON, newline-terminated.
std::string EncodeVersionRecord(const VersionRecord& record);
// `what` names the source in messages (usually the path).
Result<VersionRecord> DecodeVersionRecord(std::string_view text,
                                          std::string_view what);
// nullopt when no file exists at `path`; Corruption naming `path` when one
// exists but is not a valid record.
Result<std::optional<VersionRecord>> ReadVersionRecord(const std::string& path);
// Replaces the record at `path` atomically and durably.
Status WriteVersionRecord(const std::string& path, const VersionRecord& record);

// ------------------------------------------------------------------- specs

struct StoreSpec {
  enum class Kind { kMemory, kFile, kShm };
  Kind kind = Kind::kMemory;
  // kFile: the file, directory or index path. kShm: the object name,
  // "/name" (one leading slash, no other). kMemory: empty.
  std::string path;
  // Where the version record lives; empty means the default
  // (DefaultRecordPath). Ignored for kMemory.
  std::string record_path;
  // When a file store's data is written back at Commit() and EndRefit();
  // see "Durability" above. Ignored for memory and shm stores.
  enum class DataSync { kBackground, kAtCommit };
  DataSync data_sync = DataSync::kBackground;
  // kBackground: how long the write-back waits after a commit before it
  // starts. Commits within the wait are written back together, and pages
  // not yet written back stay writable: a refit that comes sooner neither
  // competes with the write-back nor faults on every page it changes
  // through the mapping (a write-protect fault per 4 KiB page once a page
  // was written back: 0.35 s of CPU per GB changed; a chunk's apply that
  // changes most of its pages takes pread and pwrite instead on a disk
  // filesystem, ModifyTensor). The data is as durable as the page cache
  // keeps it meanwhile (see "Durability"). WaitDataSync() and closing the
  // store do not wait it out, nor does the write-back after one that a
  // refit overlapped (it could not drop the mark). 0: at once.
  std::chrono::milliseconds write_back_delay{0};

  // "memory:", "file:/models/p.safetensors", "shm:/policy".
  std::string ToString() const;
};

// Parses "memory:", "file:PATH" or "shm:NAME" (NAME with or without its
// leading slash; stored as "/NAME"). record_path is left empty (the
// default).
Result<StoreSpec> ParseStoreSpec(std::string_view text);

// The record path used when spec.record_path is empty; empty for kMemory.
std::string DefaultRecordPath(const StoreSpec& spec);

// ------------------------------------------------------------------ stores

class WeightStore {
 public:
  virtual ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // For logs: "memory:", "file:/models/p.safetensors", "shm:/policy".
  const std::string& describe() const { return describe_; }
  virtual const Manifest& manifest() const = 0;
  // The canonical bits of tensor `i` (empty for a tensor with no elements).
  // Views stay valid for the store's lifetime.
  virtual std::span<const std::byte> Tensor(size_t i) const = 0;
  virtual std::span<std::byte> MutableTensor(size_t i) = 0;
  // Copies `bytes` into tensor `i` at byte `offset` (the range must lie
  // inside the tensor): the bits of a copy into MutableTensor(i), by the
  // backend's cheaper path (a file store on a disk filesystem uses write(2):
  // rewriting a mapped page faults). Like a write through MutableTensor()
  // for thread safety.
  virtual Status WriteTensor(size_t i, uint64_t offset,
                             std::span<const std::byte> bytes);
  // Changes tensor `i` in place where it lies in bytes [offset, offset +
  // size) (the range must lie inside the tensor): `fn` gets a span of
  // `size` bytes standing for the range, of which the window [from, to)
  // (from <= to <= size) holds the tensor's current bits, and the bits it
  // leaves in the window become the tensor's; it reads and changes
  // nothing outside the window. For a change that touches most pages of
  // the window (a chunk's apply), by the backend's cheaper path: where
  // ModifiesByCopy (a file store on a disk filesystem), the window is read
  // into a buffer of the calling thread's and written back with write(2)
  // once `fn` returned OK (MappedFile::Modify: changing mapped pages the
  // kernel wrote back faults on each); elsewhere `fn` gets the tensor's
  // memory itself. So `fn` should fail only before it changed the span,
  // and must not call ModifyTensor itself. After an error the window holds
  // its old bits, what `fn` left there, or (a write-back that failed part
  // way) a mix of its old bits and `fn`'s. While a call runs, nothing else
  // may change its window's bytes (an overlapping ModifyTensor, a write
  // through MutableTensor() or WriteTensor): its write-back would undo
  // them.
  virtual Status ModifyTensor(
      size_t i, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
      const std::function<Status(std::span<std::byte>)>& fn);
  // Whether ModifyTensor(i, ..., size, ...) changes the window from a copy
  // (false: through the tensor's memory).
  virtual bool ModifiesByCopy(size_t i, uint64_t size) const;

  // Digests of the current bits, parallel over tensors when `pool` is
  // given; equal to Checkpoint::ComputeDigests() of a checkpoint with the
  // same bits.
  CheckpointDigests Digests(ThreadPool* pool = nullptr) const;

  // The version recorded by the last Commit(), or nullopt when the store
  // has no record ("never committed": freshly created, or a file that dcr
  // has not committed to). While InProgress() is set the bits may differ
  // from it.
  std::optional<Version> committed() const;
  std::optional<RefitInProgress> InProgress() const;
  // The whole record as last persisted (or as found at open).
  VersionRecord record() const;
  // Where the record is persisted; empty for a memory store.
  const std::string& record_path() const { return record_path_; }

  // Records `version` as committed by `refit` and clears any refit in
  // progress, making the data durable first (kAtCommit) or in the
  // background (kBackground; see "Durability"). Does not check the bits
  // against version.digest: the caller has (Digests()). When a refit is in
  // progress, `refit` and `version` must be its id and target
  // (InvalidArgument otherwise, nothing written); a target recorded with a
  // zero digest (begun before the digest was known, docs/PROTOCOL.md
  // §"Target digests at END") matches any version of its step. On failure
  // the previous record stays in force.
  Status Commit(const Version& version, const RefitId& refit);
  // Records durably that refit `refit` from `base` to `target` is about to
  // modify the data. Call before the first write; replaces a refit already
  // in progress.
  Status BeginRefit(const RefitId& refit, const Version& base,
                    const Version& target);
  // Clears the refit in progress (the caller restored the base bits),
  // making the data durable like Commit(); OK if none is in progress.
  Status EndRefit();

  // Blocks until no background write-back is queued or running (or
  // DetachDataSync was called); a queued one starts at once, without
  // waiting out StoreSpec::write_back_delay. Returns the error of the last one
  // that failed since the previous call, else OK. After a failure the record
  // keeps its "unsynced" mark for the rest of the process: the kernel
  // reports a write-back error once, so a later write-back that succeeds
  // does not prove the failed pages reached the disk. Destroying a store
  // waits for its write-back too, unless detached.
  Status WaitDataSync();
  // For a short-lived process (dcr refit and its root.baseline): the
  // destructor does not wait for queued write-backs. The record keeps its
  // mark and the next open settles it (this boot: a write-back; another
  // boot: a digest check).
  void DetachDataSync();

 protected:
  // `record` is the state found at open; `record_path` empty keeps it in
  // memory only.
  WeightStore(std::string describe, std::string record_path,
              VersionRecord record);

  // Makes every write so far durable (no-op where there is nothing to do);
  // 0 writes it back at once.
  // `slice_bytes` > 0 paces the write-back (Checkpoint::Flush): the
  // background write-back does, so that the fsyncs of records and
  // journals, on the critical path of the next refit phase, wait behind a
  // slice of it and not behind the whole store.
  virtual Status SyncData(size_t slice_bytes) = 0;

  // For backends whose SyncData() does work (file stores): the constructor
  // of the most derived class calls EnableBackgroundSync(), its destructor
  // StopDataSync() (which waits for a write-back in flight, since that calls
  // SyncData()). Without it, Commit() and EndRefit() call SyncData() before
  // the record is replaced. Fails where CurrentBootId() does: a mark could
  // not be told from this boot's, so the caller keeps syncing at commit.
  Status EnableBackgroundSync(std::chrono::milliseconds delay);
  void StopDataSync();

  // At open, before the store is used: settles a record left "unsynced"
  // (see "Durability"). `boot_id` is this boot's id.
  Status RecoverUnsynced(const std::string& boot_id);
  // At open, first: rewrites a record of the XXH3 digests of earlier builds
  // with linear digests (see "Digests" above VersionRecord).
  Status UpgradeLegacyDigests();

 private:
  // The record, the locks that serialize its updates and the functions
  // that write it; defined in store.cc, so this public header holds no
  // lock type.
  struct Records;

  void SyncLoop();
  // Whether the record file holds `ours` (what this store wrote last): a
  // write-back clears the mark only on its own record.
  bool RecordIsOurs(const VersionRecord& ours) const;

  const std::string describe_;
  const std::string record_path_;
  const std::unique_ptr<Records> records_;

  // Background write-back (kBackground on a store that syncs data).
  struct Syncer;
  // Null: SyncData() runs inside Commit() and EndRefit().
  std::unique_ptr<Syncer> syncer_;
};

// This boot's id (/proc/sys/kernel/random/boot_id, 36 characters), or an
// error where the kernel does not say.
Result<std::string> CurrentBootId();

// Opens an existing file or shm store read-write and reads its record.
// Errors: NotFound (no such file or object), IOError (unwritable data or
// record directory, or locked by another process), Corruption (bad header
// or record, or a record whose manifest digest differs from the store's),
// InvalidArgument for memory specs (nothing to reopen).
Result<std::unique_ptr<WeightStore>> OpenStore(const StoreSpec& spec);

// Creates a zero-filled store with `manifest` and no record (committed() is
// nullopt); removes a stale record at the record path first. A file store is
// a complete single .safetensors file (blocks allocated, so later writes
// cannot hit ENOSPC); a shm store is a complete safetensors image with its
// memory reserved (fallocate). InvalidArgument if the file or object
// already exists (RemoveStore first).
Result<std::unique_ptr<WeightStore>> CreateStore(
    const StoreSpec& spec, const Manifest& manifest,
    const std::map<std::string, std::string>& metadata = {});

// A memory store holding a copy of `checkpoint`'s bits, with no record.
Result<std::unique_ptr<WeightStore>> CreateMemoryStoreFrom(
    const Checkpoint& checkpoint);

// Removes a store's data (a single file, or the shm object) and its record.
// OK when neither exists. Refuses (InvalidArgument) a directory path.
Status RemoveStore(const StoreSpec& spec);

}  // namespace dcr

#endif  // DCR_STORE_H_
