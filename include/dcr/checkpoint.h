// Canonical checkpoints: named tensors in Hugging Face safetensors
// coordinates, read from one .safetensors file or from a directory (or an
// index file) with model.safetensors.index.json naming several files.
//
// A Checkpoint maps its files with mmap; tensor views are zero-copy and
// remain valid for the Checkpoint's lifetime. A Checkpoint opened
// read-write maps its files shared, so writes through MutableTensorData()
// change the files in place (Flush() makes them durable).
//
// Thread safety: const methods may be called concurrently. Writes to
// distinct byte ranges of MutableTensorData() may proceed concurrently
// (ModifyTensorData writes its whole window: see MappedFile::Modify);
// Flush() requires that no write is in progress.
#ifndef DCR_CHECKPOINT_H_
#define DCR_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/digest.h"
#include "dcr/dtype.h"
#include "dcr/status.h"

namespace dcr {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;  // empty for a scalar

  uint64_t NumElements() const;  // product of shape; 1 for a scalar
  uint64_t NumBytes() const { return NumElements() * DTypeSize(dtype); }
  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

// The ordered list of tensors of a canonical checkpoint. Canonical order is
// by name, bytewise ascending; a tensor's index in this order is how
// chunks name it.
class Manifest {
 public:
  Manifest() = default;
  // Sorts `tensors` into canonical order. Duplicate names are
  // InvalidArgument.
  static Result<Manifest> Create(std::vector<TensorInfo> tensors);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  const TensorInfo& operator[](size_t i) const { return tensors_[i]; }
  // Index of the tensor called `name`, or -1.
  int64_t Find(std::string_view name) const;
  uint64_t TotalBytes() const;
  uint64_t TotalElements() const;

  // XXH3-128 over the canonical serialization of (name, dtype, shape) of
  // every tensor in order; see docs/FORMAT.md.
  Digest128 digest() const { return digest_; }

  // Empty when equal; otherwise one line naming the first difference
  // ("tensor 'x' has shape [2, 3] in A but [3, 2] in B").
  static std::string Difference(const Manifest& a, const Manifest& b);

 private:
  std::vector<TensorInfo> tensors_;
  Digest128 digest_;
};

// Per-tensor digests of the bits (TensorDigest, dcr/digest.h: linear, so
// they compose from parts) plus the version digest, which is
// XXH3-128 over the manifest digest followed by every tensor digest in
// canonical order. Two checkpoints have equal version digests iff (up to
// hash collisions) their canonical bits are identical.
struct CheckpointDigests {
  std::vector<Digest128> tensors;
  Digest128 manifest;
  Digest128 version;
};
// Combines already computed tensor digests into the version digest.
Digest128 VersionDigest(const Digest128& manifest_digest,
                        std::span<const Digest128> tensor_digests);

class ThreadPool;

class Checkpoint {
 public:
  enum class Mode { kReadOnly, kReadWrite };

  // `path` is a .safetensors file, a *.safetensors.index.json file, or a
  // directory holding either model.safetensors.index.json or exactly one
  // *.safetensors file. Every header is validated fully before Open
  // returns (see docs/FORMAT.md §safetensors); errors name the file and
  // the tensor. kReadWrite opens every file for writing up front, so an
  // unwritable file fails here, before anything is mutated.
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& path,
                                                  Mode mode);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& path() const { return path_; }
  Mode mode() const { return mode_; }
  const Manifest& manifest() const { return manifest_; }
  // The "__metadata__" string map of the first file (by name).
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // The file that holds tensor `index` (for error messages).
  const std::string& FileOf(size_t index) const;

  std::span<const std::byte> TensorData(size_t index) const;
  // Requires mode() == kReadWrite.
  std::span<std::byte> MutableTensorData(size_t index);
  // Writes `bytes` into tensor `index` at byte `offset` (kReadWrite; the
  // range must lie inside the tensor): the bits of a copy into
  // MutableTensorData(), by write(2) where that is cheaper (a disk
  // filesystem; see MappedFile::Write).
  Status WriteTensorData(size_t index, uint64_t offset,
                         std::span<const std::byte> bytes);
  // Changes tensor `index` in place where it lies in bytes [offset, offset
  // + size), window [from, to) of that range (kReadWrite; the range must
  // lie inside the tensor), by pread and pwrite where that is cheaper: see
  // MappedFile::Modify, whose rules for `fn` and for concurrent writes
  // hold here.
  Status ModifyTensorData(
      size_t index, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
      const std::function<Status(std::span<std::byte>)>& fn);
  // Whether ModifyTensorData of `size` bytes of tensor `index` goes by a
  // copy (MappedFile::ModifiesByCopy).
  bool ModifiesByCopy(size_t index, uint64_t size) const;

  // Digests of every tensor; parallel over tensors when `pool` is given.
  CheckpointDigests ComputeDigests(ThreadPool* pool = nullptr) const;

  // msync()s every mapping (kReadWrite only; a no-op otherwise). With
  // `slice_bytes` > 0, each file's write-back is paced in slices of that
  // size first (MappedFile::Sync): slower alone, kinder to other fsyncs.
  Status Flush(size_t slice_bytes = 0);

 private:
  struct File;
  Checkpoint() = default;

  std::string path_;
  Mode mode_ = Mode::kReadOnly;
  Manifest manifest_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::unique_ptr<File>> files_;
  // Per tensor in manifest order: owning file and byte range in it.
  struct Location {
    size_t file;
    uint64_t offset;  // from the start of the file
    uint64_t size;
  };
  std::vector<Location> locations_;
};

// One tensor to write: `data` must hold exactly info.NumBytes() bytes.
struct TensorToWrite {
  TensorInfo info;
  std::span<const std::byte> data;
};

// Writes a single .safetensors file: header in canonical (name) order,
// padded with spaces to a multiple of 8 bytes, then data in the same order.
// Writes to "<path>.tmp" then renames, so readers never see a partial file.
Status WriteSafetensors(const std::string& path,
                        std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata);

// Writes a multi-file checkpoint into directory `dir`: tensors are packed
// in canonical order into files of at most `max_file_bytes` (a tensor
// larger than that gets a file of its own), named
// model-0000i-of-0000n.safetensors, plus model.safetensors.index.json.
Status WriteShardedSafetensors(
    const std::string& dir, std::span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata,
    uint64_t max_file_bytes);

// Limits enforced while parsing a safetensors header.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
inline constexpr uint64_t kMaxTensorsPerCheckpoint = 1u << 20;
inline constexpr size_t kMaxTensorRank = 16;

}  // namespace dcr

#endif  // DCR_CHECKPOINT_H_
