// RAII owners for file descriptors and memory mappings, and whole-file
// helpers. Every error names the path and the failing call.
#ifndef DCR_COMMON_FILE_H_
#define DCR_COMMON_FILE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "dcr/status.h"

namespace dcr {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// What a file type is, for a message: "a regular file", "a directory",
// "a FIFO", "a socket", "a character device", "a block device", "a
// symbolic link", or "a file of unknown type"; `mode` is a stat st_mode.
const char* FileTypeName(mode_t mode);

// Opens `path` with `flags` (O_RDONLY or O_RDWR, plus others; O_CLOEXEC is
// added) and refuses anything that is not a regular file with
// InvalidArgument "'<path>' is a FIFO, not a regular file" (or the type
// it is), at once: the open is non-blocking, so a FIFO without a writer
// does not hang it, and the type is that of the file opened (fstat). The
// descriptor returned is blocking. `st`, when given, receives the fstat.
Result<UniqueFd> OpenRegularFile(const std::string& path, int flags,
                                 struct stat* st = nullptr);

// The largest range MappedFile::Modify changes from a buffer; larger ones
// are changed through the mapping. Each thread that calls Modify keeps a
// buffer of the largest range it took, up to this (a span of 2 Mi
// elements of 2 bytes; dcr's default spans hold 1 Mi elements).
inline constexpr size_t kModifyBufferBytes = size_t{4} << 20;

// A whole file mapped into memory. Read-only mappings are private;
// writable mappings are shared, so stores reach the file.
class MappedFile {
 public:
  enum class Mode { kReadOnly, kReadWrite };
  // Refuses a path that is not a regular file (OpenRegularFile).
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path,
                                                  Mode mode);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  std::span<const std::byte> data() const { return {data_, size_}; }
  // Requires kReadWrite.
  std::span<std::byte> mutable_data() { return {data_, size_}; }
  // Writes `bytes` at `offset` (kReadWrite only; the range must lie inside
  // the file). The bits are those of a copy into mutable_data() (one page
  // cache backs both), by the cheaper path: on a disk filesystem each page
  // of a shared mapping faults the first time it is dirtied, and write(2)
  // does not (1 GB rewritten on ext4 by 2 threads: 0.34 s through the
  // mapping, 0.13 s by pwrite), so ext4, XFS and btrfs take pwrite; on
  // tmpfs the copy through the mapping is the cheaper one (0.07 s against
  // 0.14 s), and on other filesystems (network, FUSE) only it is sure to
  // be seen through the mapping. Safe to call concurrently for disjoint
  // ranges.
  Status Write(uint64_t offset, std::span<const std::byte> bytes);
  // Changes the file in place where it lies in bytes [offset, offset +
  // size) (kReadWrite only; the range must lie inside the file): `fn`
  // gets a span of `size` bytes standing for the range, of which the
  // window [from, to) (from <= to <= size) holds the file's current bits,
  // and the bits it leaves in the window become the file's. `fn` reads and
  // changes nothing outside the window (its bytes there are unspecified
  // and are not written back), and does not call Modify (the buffer below
  // is the thread's). Meant for a change that touches most pages of the
  // window (a chunk's apply). Where ModifiesByCopy(size), the window is
  // read into a buffer the calling thread keeps (pread) and written back
  // (pwrite) once `fn` returned OK: changing pages through the shared
  // mapping faults on each one the kernel wrote back since it was last
  // dirtied (a 1 GiB file changed in 2.7% of its 2-byte elements on this
  // project's VMs: 5-7 s through a mapping the write-back had cleaned,
  // 0.09 s through one already dirty, 0.13 s by pread and pwrite).
  // Elsewhere `fn` gets the mapping itself. So `fn` should fail only
  // before it changed the span. After an error the window holds its old
  // bits, what `fn` left (the mapping), or, when the pwrite failed part
  // way, a mix of its old bits and `fn`'s.
  //
  // While a call runs, nothing else may change its window's bytes (a
  // concurrent Modify whose window overlaps, a write through
  // mutable_data() or Write): its write-back would undo them.
  Status Modify(uint64_t offset, size_t size, size_t from, size_t to,
                const std::function<Status(std::span<std::byte>)>& fn);
  // Whether Modify of `size` bytes goes by pread and pwrite: a local disk
  // filesystem (ext4, XFS, btrfs; see Write) and at most
  // kModifyBufferBytes.
  bool ModifiesByCopy(size_t size) const {
    return !write_through_map_ && size <= kModifyBufferBytes;
  }
  // msync(MS_SYNC) of the whole mapping (kReadWrite only). With
  // `slice_bytes` > 0 on a local disk filesystem, the dirty pages are first
  // written back slice by slice, each waited for (sync_file_range), so that
  // at most one slice of this file's write-back is queued on the device at
  // a time: a small fsync elsewhere (a version record, a journal) waits
  // behind one slice, not behind the whole file. The msync then finds
  // little left to write and flushes the device cache.
  Status Sync(size_t slice_bytes = 0);
  // Hints that the mapping will be read sequentially once.
  void AdviseSequential();

 private:
  MappedFile() = default;
  std::string path_;
  Mode mode_ = Mode::kReadOnly;
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool write_through_map_ = true;  // not a local disk filesystem
};

// Reads a whole (small) regular file; refuses any other (OpenRegularFile).
Result<std::string> ReadFileToString(const std::string& path);
// Writes `data` to "<path>.tmp", fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old or the new file, never a mix.
Status WriteFileAtomic(const std::string& path,
                       std::span<const std::byte> data);

}  // namespace dcr

#endif  // DCR_COMMON_FILE_H_
