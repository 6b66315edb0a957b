// Where a relay keeps what it needs to restore its base bits until a refit
// commits: for each chunk applied, the chunk itself (an XOR chunk is undone
// by applying it again) and, for an overwrite, the values it replaced.
// Kept in an unlinked temporary file beside the store rather than on the
// heap, so a relay's memory stays bounded by its windows whatever the model
// size (a full refit's undo data is as large as the store).
//
// Thread safety: Append and Read may be called concurrently.
#ifndef DCR_RELAY_UNDO_LOG_H_
#define DCR_RELAY_UNDO_LOG_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/mutex.h"
#include "dcr/status.h"

namespace dcr {

class UndoLog {
 public:
  // A log in an unlinked file created in `dir` (gone when the log is
  // destroyed or the process dies), or on the heap when `dir` is empty
  // (memory stores in tests).
  static Result<std::unique_ptr<UndoLog>> Create(const std::string& dir);
  ~UndoLog() = default;
  UndoLog(const UndoLog&) = delete;
  UndoLog& operator=(const UndoLog&) = delete;

  struct Ref {
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // Appends one record, `a` followed by `b`.
  Result<Ref> Append(std::span<const std::byte> a, std::span<const std::byte> b)
      DCR_EXCLUDES(mu_);
  // Reads record `r` into `out` (resized).
  Status Read(const Ref& r, std::vector<std::byte>* out) const
      DCR_EXCLUDES(mu_);
  // Bytes appended so far.
  uint64_t bytes() const { return end_.load(); }

 private:
  UndoLog() = default;

  UniqueFd fd_;  // invalid: heap-backed
  std::string where_;
  std::atomic<uint64_t> end_{0};
  mutable Mutex mu_;  // heap backend only
  std::vector<std::byte> heap_ DCR_GUARDED_BY(mu_);
};

}  // namespace dcr

#endif  // DCR_RELAY_UNDO_LOG_H_
