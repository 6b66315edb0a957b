// Delta files (.dcr) and the offline operations on checkpoints: diff two
// checkpoints into a delta, apply a delta in place, compare checkpoints.
//
// A delta file is a fixed header naming the base and target versions
// (step and version digest) and the manifest digest, followed by chunks in
// ascending (tensor, span) order; docs/FORMAT.md §delta. It can be read as
// a stream: DeltaReader hands out one chunk at a time.
//
// Thread safety: DeltaReader and DeltaWriter are not thread-safe. The
// operations use the ThreadPool they are given.
#ifndef DCR_DELTA_H_
#define DCR_DELTA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

class ThreadPool;

struct DeltaHeader {
  Version base;
  Version target;
  Digest128 manifest;
  uint64_t span_elems = kDefaultSpanElems;
  uint64_t chunk_count = 0;
  uint64_t tensor_count = 0;
  uint64_t total_elements = 0;  // canonical elements of the checkpoint
  uint64_t total_bytes = 0;     // canonical bytes of the checkpoint
  uint64_t changed_elements = 0;
  bool all_overwrite = false;  // every chunk is an overwrite chunk
};
inline constexpr size_t kDeltaHeaderBytes = 136;

// Reads a delta file (mapped) chunk by chunk.
class DeltaReader {
 public:
  // Validates the header (magic, version, checksum, ranges).
  static Result<std::unique_ptr<DeltaReader>> Open(const std::string& path);
  ~DeltaReader();

  const DeltaHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const;

  // Sets *chunk to the next chunk's bytes (framing checked, payload not
  // decoded) and returns true; returns false at the end. After the last
  // chunk, checks that the count matches the header and no bytes trail.
  Result<bool> Next(std::span<const std::byte>* chunk);
  // Restarts from the first chunk.
  void Rewind();

 private:
  DeltaReader() = default;
  struct Mapping;
  std::string path_;
  std::unique_ptr<Mapping> map_;
  DeltaHeader header_;
  uint64_t offset_ = kDeltaHeaderBytes;
  uint64_t index_ = 0;
};

// Writes a delta file: to "<path>.tmp", renamed over `path` by Finish().
// Destroying an unfinished writer removes the temporary file, unless Keep()
// was called. Until Finish() the temporary file's header is zeros and its
// chunks follow it whole, in order, up to the last Sync() at least.
class DeltaWriter {
 public:
  static Result<std::unique_ptr<DeltaWriter>> Create(const std::string& path);
  ~DeltaWriter();
  Status Append(std::span<const std::byte> chunk);
  // Writes the chunks appended so far to the temporary file and syncs its
  // data: they survive a crash of this process or of the host.
  Status Sync();
  // Closes the temporary file and leaves it in place: it outlives the
  // writer (an undo log that recovery reads). Finish() is then refused.
  void Keep();
  const std::string& tmp_path() const { return tmp_path_; }
  // Finish renames to `path` instead (a path on the same filesystem).
  void set_path(std::string path) { path_ = std::move(path); }
  // Writes `header` (chunk_count is taken from the appended chunks), syncs
  // and renames.
  Status Finish(DeltaHeader header);
  uint64_t bytes_written() const { return bytes_; }

 private:
  DeltaWriter() = default;
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t bytes_ = kDeltaHeaderBytes;
  uint64_t chunks_ = 0;
  std::vector<std::byte> buffer_;
  Status error_;  // sticky: the first write error
  Status FlushBuffer();
};

// Serializes and parses the fixed header (exposed for tests and fuzzing).
std::vector<std::byte> EncodeDeltaHeader(const DeltaHeader& header);
Result<DeltaHeader> DecodeDeltaHeader(std::span<const std::byte> bytes);

// ------------------------------------------------------------ operations

struct DiffOptions {
  ChunkKind kind = ChunkKind::kXor;
  uint64_t span_elems = kDefaultSpanElems;
  EncodeOptions encode;
  uint64_t base_step = 0;
  uint64_t target_step = 1;
  // Called with canonical bytes processed, from worker threads.
  std::function<void(uint64_t)> progress;
};

struct DeltaStats {
  DeltaHeader header;
  uint64_t checkpoint_bytes = 0;  // canonical bytes of one version
  uint64_t chunks = 0;
  uint64_t sparse_chunks = 0;
  uint64_t dense_chunks = 0;
  ChunkSizes sizes;  // payload bytes by section
  uint64_t file_bytes = 0;
  double seconds = 0;
};

// Diffs `base` against `target` (their manifests must be equal) and
// writes the delta to `path`. Base and target digests are computed here.
Result<DeltaStats> WriteDelta(const Checkpoint& base, const Checkpoint& target,
                              const std::string& path,
                              const DiffOptions& options, ThreadPool* pool);

// Applies the delta at `delta_path` to `target` (opened read-write) in
// place. Checks, before writing anything: the manifest digest, that the
// target holds exactly the delta's base version (a target already at the
// delta's target version is refused, so applying twice is harmless), and
// that every chunk decodes and fits its tensor. After writing it verifies
// the target version digest; on any failure it restores the bits the
// target had.
//
// An overwrite-only delta is also accepted by a target that is neither at
// its base nor at its target, as a repair: overwrites are idempotent, so
// re-applying one after an apply that crashed midway finishes the job, and
// the digest check refuses (and undoes) anything else.
//
// Not crash-safe on its own: a process killed mid-apply leaves a mix of
// base and target bits (an overwrite delta repairs it, see above; for an
// XOR delta restore the file). Memory: the overwritten values of overwrite
// chunks are kept until verification (for a dense overwrite delta, a
// second copy of what it covers).
Result<DeltaStats> ApplyDelta(const std::string& delta_path, Checkpoint* target,
                              ThreadPool* pool,
                              std::function<void(uint64_t)> progress = {});

// Reads every chunk of a delta and decodes it, without a target: section
// sizes and chunk counts for `dcr inspect`.
Result<DeltaStats> InspectDelta(const std::string& delta_path,
                                ThreadPool* pool);

// The first difference between two checkpoints, if any.
struct Mismatch {
  std::string tensor;  // empty when the manifests differ
  std::string manifest_difference;
  uint64_t element = 0;             // first differing element of `tensor`
  std::string a_hex, b_hex;         // that element's bits, as hex
  uint64_t differing_elements = 0;  // in `tensor`
};
// Compares the canonical bits of `a` and `b`: an empty vector when
// identical, else one entry per differing tensor (or one entry for a
// manifest difference).
std::vector<Mismatch> CompareCheckpoints(const Checkpoint& a,
                                         const Checkpoint& b, ThreadPool* pool);

}  // namespace dcr

#endif  // DCR_DELTA_H_
