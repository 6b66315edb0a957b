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
// Durability. Commit() first makes the data durable (msync for file
// stores; nothing for memory; shm data lives in RAM, so it survives a crash
// of the relay but not a reboot of the host, like its default record
// location), then replaces the record atomically (write a temporary file,
// fsync, rename, fsync the directory). A crash at any point leaves either
// the old record or the new one, never a mix. BeginRefit() persists "refit
// in progress" before the caller modifies anything, and EndRefit() / Commit()
// clear it only after the data was made durable, so a record without a
// refit in progress always describes durable bits.
//
// The record states what dcr last committed; it is not re-verified on open
// (that would hash the whole store). Callers that must be sure, such as a
// relay before voting, compute Digests().
//
// One process at a time: opening or creating a file or shm store takes an
// exclusive advisory lock (flock) on its data, released when the store is
// destroyed; a second open fails with IOError. Serving processes that only
// map the data are not affected.
//
// Thread safety: manifest(), describe(), Tensor(), Digests(), committed(),
// InProgress() and record() may be called concurrently with anything.
// MutableTensor() may be called concurrently, and writes to disjoint byte
// ranges may proceed concurrently. Commit() and EndRefit() require that no
// write to the data is in progress (they sync it); Commit(), BeginRefit() and
// EndRefit() are serialized against each other internally.
#ifndef DCR_STORE_H_
#define DCR_STORE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
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

// What a version record file holds; see docs/FORMAT.md §version record.
//
//   {"format": 1,
//    "manifest": "<32 hex>",            manifest digest of the store
//    "committed": null | {"step": N, "digest": "<32 hex>",
//                         "refit": "<32 hex>", "committed_at": "<ISO>"},
//    "in_progress": null | {"refit": "<32 hex>",
//                           "base": {"step": N, "digest": "<32 hex>"},
//                           "target": {"step": N, "digest": "<32 hex>"},
//                           "started_at": "<ISO>"}}
//
// Strict JSON, at most kMaxVersionRecordBytes; every key required, no
// others allowed. A "format" other than 1 is Unsupported; anything else
// malformed is Corruption.
struct VersionRecord {
  Digest128 manifest;
  std::optional<CommitInfo> committed;
  std::optional<RefitInProgress> in_progress;
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

  // Makes the data durable, then records `version` as committed by
  // `refit` and clears any refit in progress. Does not check the bits
  // against version.digest: the caller has (Digests()). When a refit is in
  // progress, `refit` and `version` must be its id and target
  // (InvalidArgument otherwise, nothing written). On failure the previous
  // record stays in force.
  Status Commit(const Version& version, const RefitId& refit);
  // Records durably that refit `refit` from `base` to `target` is about to
  // modify the data. Call before the first write; replaces a refit already
  // in progress.
  Status BeginRefit(const RefitId& refit, const Version& base,
                    const Version& target);
  // Makes the data durable (the caller restored the base bits) and clears
  // the refit in progress; OK if none is.
  Status EndRefit();

 protected:
  // `record` is the state found at open; `record_path` empty keeps it in
  // memory only.
  WeightStore(std::string describe, std::string record_path,
              VersionRecord record);

  // Makes every write so far durable (no-op where there is nothing to do).
  virtual Status SyncData() = 0;

 private:
  Status Persist(const VersionRecord& record);

  const std::string describe_;
  const std::string record_path_;
  // Serializes Commit, BeginRefit and EndRefit (held across I/O).
  std::mutex persist_mu_;
  // Guards record_ (never held across I/O).
  mutable std::mutex mu_;
  VersionRecord record_;
};

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
