// EpochFile: the one reader and writer of a persisted coordinator epoch
// (docs/FORMAT.md, "Epoch files"). The file holds one unsigned decimal
// number and a newline, nothing else; it is replaced atomically (written
// beside, fsynced, renamed, the directory fsynced).
//
// Two files use it: a coordinator's state_dir/epoch (the last epoch a run
// took; the next run takes one more, durably, before any frame carries it)
// and a relay's "<store>.dcr-epoch" (the highest epoch it accepted; frames
// of a lower epoch are refused).
//
// Thread safety: none; one owner per path.
#ifndef DCR_PROTOCOL_EPOCH_FILE_H_
#define DCR_PROTOCOL_EPOCH_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

class EpochFile {
 public:
  // `path` empty: the epoch is kept in memory only (a memory store).
  // `meaning` completes the error for a corrupt file, e.g. "it holds the
  // highest coordinator epoch this relay accepted".
  explicit EpochFile(std::string path, std::string meaning = "");

  // The persisted epoch; 0 when the file does not exist (or the path is
  // empty). Corruption naming the path when it holds anything but one
  // decimal number and an optional newline.
  Result<uint64_t> Read() const;
  // Persists `epoch` durably (a no-op for an empty path).
  Status Write(uint64_t epoch) const;
  // Reads the last epoch, writes one more durably, returns it.
  Result<uint64_t> Next() const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string meaning_;
};

// Parses an epoch file's text: digits, then at most newlines. Exposed for
// the tests and the fuzz target.
Result<uint64_t> ParseEpoch(std::string_view text);

}  // namespace dcr

#endif  // DCR_PROTOCOL_EPOCH_FILE_H_
