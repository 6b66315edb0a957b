// RAII owners for file descriptors and memory mappings, and whole-file
// helpers. Every error names the path and the failing call.
#ifndef DCR_COMMON_FILE_H_
#define DCR_COMMON_FILE_H_

#include <cstddef>
#include <cstdint>
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

// A whole file mapped into memory. Read-only mappings are private;
// writable mappings are shared, so stores reach the file.
class MappedFile {
 public:
  enum class Mode { kReadOnly, kReadWrite };
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
  // msync(MS_SYNC) of the whole mapping (kReadWrite only).
  Status Sync();
  // Hints that the mapping will be read sequentially once.
  void AdviseSequential();

 private:
  MappedFile() = default;
  std::string path_;
  Mode mode_ = Mode::kReadOnly;
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file.
Result<std::string> ReadFileToString(const std::string& path);
// Writes `data` to "<path>.tmp", fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old or the new file, never a mix.
Status WriteFileAtomic(const std::string& path,
                       std::span<const std::byte> data);

}  // namespace dcr

#endif  // DCR_COMMON_FILE_H_
