// A relay's journal of one refit session: what it needs to put its store's
// base bits back, in a named file beside the store's version record, so
// that it outlives the process (a relay killed mid-refit restores its base
// by itself at restart, or knows that it voted yes and must not).
//
// Write-ahead: before a chunk touches its span, AppendApply writes a record
// of the span's OLD values at the chunk's positions (every element of the
// span for a dense chunk), XOR and overwrite chunks alike. Writing the old
// values back restores the span whether the apply finished, stopped half
// way or never started, so restoring every record in reverse order of
// append gives the base bits. Appends are serialized: the file is a
// sequence of complete records followed by at most one torn record (the
// one being written when the process died), whose apply never started
// (the apply runs only once AppendApply returned). A torn record fails
// its checksum and is ignored.
//
// "Voted yes at digest D" (AppendVotedYes) is appended before the session's
// yes vote is returned, so before it is sent: a journal that holds one
// belongs to a relay that may be in the root's commit set, which must
// never restore its base on its own (two-phase commit).
//
// Durability (fsync points):
//   - AppendApply: none. The write reaches the page cache, which survives
//     a crash of the process (what restart recovery relies on), not of the
//     host. A record per chunk with an fsync each would cost more than the
//     apply.
//   - AppendVotedYes: fdatasync of the journal (every record before it is
//     then on disk) and, the first time, an fsync of its directory (so the
//     file itself is found after a reboot), both before it returns.
//   - Create, Remove: none (a journal whose refit is not the one the
//     store's record names unfinished is stale and ignored).
// After a host crash (the header's boot id is not this boot's) the journal
// is not trusted for a restore: records after the last vote may be lost,
// and the store's own data may be older than its record says (see
// include/dcr/store.h, "Durability").
//
// Layout: docs/FORMAT.md §6 "The relay journal".
//
// Thread safety: Append* and Read may be called concurrently; Remove
// requires that no other call is running.
#ifndef DCR_SESSION_JOURNAL_H_
#define DCR_SESSION_JOURNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/mutex.h"
#include "dcr/codec.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// What the journal is about; its fixed-size header.
struct JournalHeader {
  RefitId refit;
  Version base;
  Version target;
  std::string boot_id;  // 36 characters, or empty where the kernel says none
  friend bool operator==(const JournalHeader&, const JournalHeader&) = default;
};

// One apply, as written ahead of it: where the span is and its old values.
struct JournalApply {
  ChunkId id;
  uint64_t offset = 0;  // byte offset of the span in its tensor
  uint8_t elem_size = 0;
  bool dense = false;                 // every element of the span
  std::vector<uint32_t> positions;    // sparse: element indices in the span
  std::vector<std::byte> old_values;  // positions (or span) * elem_size
  // Bytes written back by a restore.
  uint64_t bytes() const { return old_values.size(); }
};

// Writes `a`'s old values back into `tensor` (the whole tensor's bytes).
// Corruption if the record does not fit the tensor.
Status RestoreApply(const JournalApply& a, std::span<std::byte> tensor);

// Where the journal of a store whose version record is `record_path` lives:
// "<record without .dcr-version>.dcr-journal" beside it, or, when `dir` is
// not empty, "<that file name without .dcr-journal>.<16 hex digits of the
// XXH3-64 of record_path>.dcr-journal" in `dir`. Empty when `record_path` is (a
// memory store: the journal lives on the heap).
std::string JournalPath(const std::string& record_path, const std::string& dir);

class Journal {
 public:
  // Creates the journal at `path` (replacing any file there) and writes its
  // header; on the heap when `path` is empty (memory stores in tests).
  static Result<std::unique_ptr<Journal>> Create(const std::string& path,
                                                 const JournalHeader& header);
  // Fails (naming `dir`) unless a journal can be created in `dir`.
  static Status ProbeDir(const std::string& dir);
  ~Journal() = default;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Where a record is, for Read.
  struct Ref {
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // Writes the record of applying `chunk` at byte `offset` of a tensor
  // whose span bytes are `span` (read here: the values the chunk is about
  // to replace). Call before writing to the span.
  Result<Ref> AppendApply(const DecodedChunk& chunk, uint64_t offset,
                          std::span<const std::byte> span) DCR_EXCLUDES(mu_);
  // The same record, with the old values already read: `old` holds one
  // element per position of `chunk` (dense: per element of its span), in
  // order. For a store that does not hold the span whole (a serving rank,
  // ReceiverMap::Gather): `offset` is then the span's byte offset in its
  // canonical tensor.
  Result<Ref> AppendApplyValues(const DecodedChunk& chunk, uint64_t offset,
                                std::span<const std::byte> old)
      DCR_EXCLUDES(mu_);
  // Writes "voted yes at `digest`" and makes the journal durable.
  Status AppendVotedYes(const Digest128& digest) DCR_EXCLUDES(mu_);
  // Reads the apply record at `ref`.
  Status Read(const Ref& ref, JournalApply* out) const DCR_EXCLUDES(mu_);
  // Deletes the file (nothing for a heap journal). Idempotent.
  Status Remove();

  const std::string& path() const { return path_; }
  // Bytes appended so far, header included.
  uint64_t bytes() const { return end_.load(); }

 private:
  Journal() = default;
  Result<Ref> AppendRecord(std::span<const std::byte> record) DCR_EXCLUDES(mu_);
  // AppendApply's record: the old values read from `span` at the chunk's
  // positions, or (`gathered`) taken from `span` as they lie.
  Result<Ref> AppendApplyRecord(const DecodedChunk& chunk, uint64_t offset,
                                std::span<const std::byte> span, bool gathered)
      DCR_EXCLUDES(mu_);

  std::string path_;  // empty: heap-backed
  UniqueFd fd_;       // invalid: heap-backed
  std::atomic<uint64_t> end_{0};
  mutable Mutex mu_;  // serializes appends (and guards the heap backend)
  std::vector<std::byte> heap_ DCR_GUARDED_BY(mu_);
  bool dir_synced_ DCR_GUARDED_BY(mu_) = false;
  bool removed_ = false;
};

// A journal found on disk (at a relay's start), read back.
class JournalReader {
 public:
  // NotFound when there is no file; Corruption when its header is torn or
  // malformed. Records are scanned up to the first that is torn or fails
  // its checksum; everything from there on is ignored.
  static Result<std::unique_ptr<JournalReader>> Open(const std::string& path);

  const JournalHeader& header() const { return header_; }
  // The apply records, in order of append.
  const std::vector<Journal::Ref>& applies() const { return applies_; }
  // The digest of the last "voted yes" record, if any.
  const std::optional<Digest128>& voted_yes() const { return voted_yes_; }
  // Bytes ignored after the last valid record (a torn tail).
  uint64_t torn_bytes() const { return torn_bytes_; }
  Status Read(const Journal::Ref& ref, JournalApply* out) const;

 private:
  JournalReader() = default;
  std::string path_;
  UniqueFd fd_;
  JournalHeader header_;
  std::vector<Journal::Ref> applies_;
  std::optional<Digest128> voted_yes_;
  uint64_t torn_bytes_ = 0;
};

}  // namespace dcr

#endif  // DCR_SESSION_JOURNAL_H_
