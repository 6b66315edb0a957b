// The root's delta history: the last K committed deltas, kept in
// state_dir/history/ as delta files (dcr/delta.h, docs/FORMAT.md §delta),
// so that a relay a few versions behind catches up with one composed delta
// instead of a dense copy (docs/PROTOCOL.md §"Catch-up").
//
// A refit records its XOR chunks while it streams them (DeltaWriter to a
// temporary file) and keeps the file only if it commits; then the oldest
// files beyond K are removed. A relay that answers a PLAN with "needs
// catch-up" and a committed version found in the history gets the
// composition of the chain from its version to the tree's: XOR chunks
// compose (old ^ new over several steps is the XOR of the steps' masks),
// and an overwrite anywhere in the chain makes that span a dense overwrite
// from the current bits (the last overwrite wins, and the root holds the
// result).
//
// The file names are the history's index: <target step, 12 digits>-<short
// digest>.dcr. A delta file that cannot be read (a torn write, a header
// that fails its checks, chunks cut short) or whose name is not its
// header's target is moved to history/quarantine/ with a logged reason and
// treated as absent: one bad file costs a dense catch-up, never a refit.
//
// Thread safety: DeltaHistory and HistoryRecording are not thread-safe.
// ComposedDelta::Encode may run on several threads at once for distinct
// indices, each with its own encoder, decoder and scratch.
#ifndef DCR_COORD_HISTORY_H_
#define DCR_COORD_HISTORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec.h"
#include "dcr/delta.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

class DeltaHistory {
 public:
  // `dir` is created on first Record; `keep` = 0 keeps nothing.
  DeltaHistory(std::string dir, uint32_t keep)
      : dir_(std::move(dir)), keep_(keep) {}

  const std::string& dir() const { return dir_; }
  uint32_t keep() const { return keep_; }

  // The file that holds the delta to `target`.
  std::string PathFor(const Version& target) const;

  // A writer for the delta base -> target of the refit in progress (the
  // chunks in stream order; Finish with the header once committed). Null
  // when keep() is 0.
  Result<std::unique_ptr<DeltaWriter>> Record(const Version& target) const;

  // The temporary file of refit `refit`'s record while it runs (named by
  // the refit: the target's digest is known only after the stream). It is
  // root.baseline's undo log until the refit ends (coord/baseline_stream.h).
  std::string TmpPathFor(const RefitId& refit) const;

  // Removes every delta file but the `keep` with the highest target steps
  // (and temporary files of refits that never finished), and quarantined
  // files but the kQuarantineKept newest.
  Status Prune();

  // The recorded deltas that lead from `from` to `to`, in order: NotFound
  // (naming the first missing step) when the history does not hold the
  // whole chain. `from` == `to` is InvalidArgument. Every file of the
  // chain returned reads to its end.
  Result<std::vector<std::string>> Chain(const Version& from,
                                         const Version& to) const;

  // Where the delta of an aborted refit is kept (docs/FORMAT.md §"State
  // directory"), apart from the chain: a relay that died while applying it
  // is repaired with its change set (coord/repair.h).
  std::string AbortedDir() const;
  std::string AbortedPathFor(const RefitId& refit) const;
  // The kept delta of the aborted refit `refit` to `target` (its base in
  // *base): NotFound when none is kept (or it is not that refit's),
  // Corruption naming it when it does not read to its end. A zero target
  // digest matches any target of its step (the refit's id names the file).
  Result<std::string> Aborted(const RefitId& refit, const Version& target,
                              Version* base) const;

  // Where unreadable delta files go (docs/FORMAT.md §"State directory").
  std::string QuarantineDir() const;
  static constexpr size_t kQuarantineKept = 8;

 private:
  struct Entry {
    std::string path;
    DeltaHeader header;
  };
  // Every delta file of the history by its header. A delta file that does
  // not open, or whose name is not the one PathFor gives its target, is
  // quarantined (moved to QuarantineDir with a logged reason) and left
  // out; any other entry is logged and left out.
  std::vector<Entry> Entries() const;
  Result<std::vector<std::string>> ChainOf(const std::vector<Entry>& entries,
                                           const Version& from,
                                           const Version& to) const;
  void Quarantine(const std::string& path, const std::string& why) const;

  std::string dir_;
  uint32_t keep_;
};

// The history record of one refit in progress: its chunks as they are
// streamed, kept only if the refit commits. Recording is best effort: a
// failure logs a warning and the refit goes on without a record (relays
// behind it then catch up with a dense copy).
class HistoryRecording {
 public:
  // Records nothing.
  HistoryRecording() = default;
  // A pinned record's temporary file outlives it.
  ~HistoryRecording() { Drop(); }
  HistoryRecording(HistoryRecording&&) = default;
  HistoryRecording& operator=(HistoryRecording&& other) {
    Drop();
    writer_ = std::move(other.writer_);
    history_ = std::move(other.history_);
    tmp_path_ = std::move(other.tmp_path_);
    aborted_path_ = std::move(other.aborted_path_);
    pinned_ = other.pinned_;
    return *this;
  }
  // Records refit `refit`'s delta in `history` (nothing when it keeps
  // none), in DeltaHistory::TmpPathFor(refit) until Finish names it by its
  // target.
  HistoryRecording(const DeltaHistory& history, const RefitId& refit);

  bool active() const { return writer_ != nullptr; }
  // Appends one chunk, in stream order.
  void Append(std::span<const std::byte> chunk);
  // Bytes recorded so far (the file's, with its header).
  uint64_t bytes() const { return writer_ ? writer_->bytes_written() : 0; }
  // Makes every chunk appended so far durable in the temporary file; false
  // (and no longer active) if it cannot.
  bool Sync();
  // From now on the temporary file is an undo log (coord/baseline_stream.h):
  // it stays in place whatever happens to the recording (a failed write,
  // Discard, destruction) until Finish or FinishAborted renames it, or the
  // caller removes it after restoring.
  void Pin() { pinned_ = true; }
  // The temporary file ("" when nothing was recorded).
  const std::string& undo_path() const { return tmp_path_; }
  // Makes the record durable under `header`, as DeltaHistory::PathFor(
  // header.target); that path, or nullopt when nothing was recorded or it
  // failed.
  std::optional<std::string> Finish(const DeltaHeader& header);
  // The refit `refit` aborted: keeps the record apart from the chain
  // (DeltaHistory::AbortedPathFor), for the repair of relays that died
  // applying it.
  void FinishAborted(const DeltaHeader& header, const RefitId& refit);
  // Drops the record (removes its temporary file unless pinned).
  void Discard() { Drop(); }

 private:
  void Drop();

  std::unique_ptr<DeltaWriter> writer_;
  DeltaHistory history_{"", 0};
  std::string tmp_path_;
  std::string aborted_path_;
  bool pinned_ = false;
};

// The composition of a chain of deltas (DeltaHistory::Chain): one chunk per
// span that any delta of the chain touches, in ascending (tensor, span)
// order, taking a store at the chain's first base to its last target.
//
// Opened as a union (kUnion), the files need not form a chain: the delta
// then stands for the union of their change sets, and EncodeUnion sends
// every element any of them changes (the repair of a store left with a mix
// of versions, coord/repair.h).
class ComposedDelta {
 public:
  enum class Kind { kChain, kUnion };
  // Maps every file and indexes its chunks by id. Checks that the files
  // are of one manifest (`manifest`) and span length (`span_elems`) and,
  // for kChain, that they are contiguous (each base is the previous
  // target).
  static Result<std::unique_ptr<ComposedDelta>> Open(
      const std::vector<std::string>& chain, const Digest128& manifest,
      uint64_t span_elems, Kind kind = Kind::kChain);
  ~ComposedDelta();

  const Version& base() const { return base_; }
  const Version& target() const { return target_; }
  size_t deltas() const { return readers_.size(); }
  // Every chunk id some delta of the chain has, ascending.
  const std::vector<ChunkId>& ids() const { return ids_; }
  // Bytes of the chain's delta files.
  uint64_t file_bytes() const { return file_bytes_; }

  // Appends to `out` the composed chunk of ids()[i]: the XOR of the
  // chain's XOR masks for that span, or, if a chunk of the chain
  // overwrites it, a dense overwrite carrying `target` (the span's bits at
  // the chain's end, span_elems * elem_size bytes). Returns false and
  // appends nothing when the masks cancel out. Corruption when a chunk
  // does not decode or does not fit `elem_size` and `target`.
  Result<bool> Encode(size_t i, size_t elem_size,
                      std::span<const std::byte> target, ChunkEncoder* encoder,
                      ChunkDecoder* decoder, std::vector<std::byte>* scratch,
                      std::vector<std::byte>* out, ChunkSizes* sizes) const;

  // Appends to `out` an overwrite chunk that sets every element of span
  // ids()[i] that some delta changes (a nonzero XOR value, or any element
  // an overwrite chunk carries) to its bits in `target`. Returns false and
  // appends nothing when no element is changed.
  Result<bool> EncodeUnion(size_t i, size_t elem_size,
                           std::span<const std::byte> target,
                           ChunkEncoder* encoder, ChunkDecoder* decoder,
                           std::vector<std::byte>* scratch,
                           std::vector<std::byte>* out,
                           ChunkSizes* sizes) const;

 private:
  ComposedDelta() = default;
  // Decodes parts_[k], a chunk of span `id`, checking that it fits the
  // span (`elem_size`, `span_bytes`).
  Status DecodePart(size_t k, const ChunkId& id, size_t elem_size,
                    size_t span_bytes, ChunkDecoder* decoder,
                    DecodedChunk* chunk) const;
  Version base_;
  Version target_;
  std::vector<std::unique_ptr<DeltaReader>> readers_;
  std::vector<ChunkId> ids_;
  // For ids_[i]: the chunks of that id, oldest first, viewing the mapped
  // files. parts_[offsets_[i] .. offsets_[i + 1]).
  std::vector<std::span<const std::byte>> parts_;
  std::vector<size_t> offsets_;
  uint64_t file_bytes_ = 0;
};

}  // namespace dcr

#endif  // DCR_COORD_HISTORY_H_
