#include "common/file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace dcr {

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

const char* FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a file of unknown type";
}

Result<UniqueFd> OpenRegularFile(const std::string& path, int flags,
                                 struct stat* st) {
  const bool rw = (flags & O_ACCMODE) != O_RDONLY;
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer
  // (forever); a device may block too. Neither gets past the fstat below.
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    // Opening a FIFO for writing without a reader fails with ENXIO.
    const int err = errno;
    struct stat lst;
    if (::stat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) {
      return Status::InvalidArgument("'" + path + "' is " +
                                     FileTypeName(lst.st_mode) +
                                     ", not a regular file");
    }
    return Status::FromErrno(
        "cannot open '" + path + "'" + (rw ? " for writing" : ""), err);
  }
  struct stat own;
  if (st == nullptr) st = &own;
  if (::fstat(fd.get(), st) != 0) {
    return Status::FromErrno("cannot stat '" + path + "'", errno);
  }
  if (!S_ISREG(st->st_mode)) {
    return Status::InvalidArgument("'" + path + "' is " +
                                   FileTypeName(st->st_mode) +
                                   ", not a regular file");
  }
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return Status::FromErrno("cannot set '" + path + "' blocking", errno);
  }
  return fd;
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                     Mode mode) {
  bool rw = mode == Mode::kReadWrite;
  struct stat st;
  DCR_ASSIGN_OR_RETURN(UniqueFd fd,
                       OpenRegularFile(path, rw ? O_RDWR : O_RDONLY, &st));
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->mode_ = mode;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, rw ? PROT_READ | PROT_WRITE : PROT_READ,
                     rw ? MAP_SHARED : MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno("cannot mmap '" + path + "'", errno);
    }
    f->data_ = static_cast<std::byte*>(p);
  }
  // write(2) only where it shares the page cache with the mapping (local
  // disk filesystems); elsewhere (tmpfs and ramfs, where the mapping is
  // cheaper, and network or FUSE filesystems, where they may not be
  // coherent) through the mapping.
  if (struct statfs fs; rw && ::fstatfs(fd.get(), &fs) == 0) {
    f->write_through_map_ = fs.f_type != EXT4_SUPER_MAGIC &&
                            fs.f_type != XFS_SUPER_MAGIC &&
                            fs.f_type != BTRFS_SUPER_MAGIC;
  } else {
    f->write_through_map_ = true;
  }
  f->fd_ = std::move(fd);
  return f;
}

Status MappedFile::Write(uint64_t offset, std::span<const std::byte> bytes) {
  if (mode_ != Mode::kReadWrite) {
    return Status::InvalidArgument("'" + path_ + "' is open read-only");
  }
  if (offset > size_ || bytes.size() > size_ - offset) {
    return Status::InvalidArgument(
        "write of " + std::to_string(bytes.size()) + " bytes at offset " +
        std::to_string(offset) + " is past the end of '" + path_ + "'");
  }
  if (bytes.empty()) return Status::OK();
  if (write_through_map_) {
    std::memcpy(data_ + offset, bytes.data(), bytes.size());
    return Status::OK();
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(
          "cannot write " + std::to_string(bytes.size() - done) +
              " bytes at offset " + std::to_string(offset + done) + " of '" +
              path_ + "'",
          errno);
    }
    if (n == 0) {
      return Status::IOError("write to '" + path_ + "' made no progress");
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status MappedFile::Modify(
    uint64_t offset, size_t size, size_t from, size_t to,
    const std::function<Status(std::span<std::byte>)>& fn) {
  if (mode_ != Mode::kReadWrite) {
    return Status::InvalidArgument("'" + path_ + "' is open read-only");
  }
  if (offset > size_ || size > size_ - offset) {
    return Status::InvalidArgument(
        "change of " + std::to_string(size) + " bytes at offset " +
        std::to_string(offset) + " is past the end of '" + path_ + "'");
  }
  if (from > to || to > size) {
    return Status::InvalidArgument(
        "window [" + std::to_string(from) + ", " + std::to_string(to) +
        ") is not inside a change of " + std::to_string(size) + " bytes");
  }
  if (!ModifiesByCopy(size)) return fn({data_ + offset, size});
  // Kept by the thread: a refit's applies run on a pool's workers, and a
  // fresh allocation of a span's size would fault on its pages as the
  // mapping does.
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < size) buffer.resize(size);
  const std::span<std::byte> bytes(buffer.data(), size);
  for (size_t done = from; done < to;) {
    ssize_t n = ::pread(fd_.get(), bytes.data() + done, to - done,
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(
          "cannot read " + std::to_string(to - done) + " bytes at offset " +
              std::to_string(offset + done) + " of '" + path_ + "'",
          errno);
    }
    if (n == 0) {
      return Status::IOError("'" + path_ + "' ended at byte " +
                             std::to_string(offset + done) +
                             ", inside its mapping");
    }
    done += static_cast<size_t>(n);
  }
  DCR_RETURN_IF_ERROR(fn(bytes));
  return Write(offset + from, bytes.subspan(from, to - from));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

Status MappedFile::Sync(size_t slice_bytes) {
  if (mode_ != Mode::kReadWrite || data_ == nullptr) return Status::OK();
  // Only where write(2) and the mapping share the page cache. Waiting
  // consumes the file's write-back error (the msync after it would not see
  // it again): an error is returned, but for "not supported here", which
  // leaves the whole write-back to the msync.
  if (slice_bytes > 0 && !write_through_map_) {
    constexpr unsigned kFlags = SYNC_FILE_RANGE_WAIT_BEFORE |
                                SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER;
    for (size_t off = 0; off < size_;) {
      const size_t len = std::min(slice_bytes, size_ - off);
      if (::sync_file_range(fd_.get(), static_cast<off_t>(off),
                            static_cast<off_t>(len), kFlags) == 0) {
        off += len;
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EINVAL || errno == ENOSYS || errno == ESPIPE ||
          errno == EOPNOTSUPP) {
        break;
      }
      return Status::FromErrno("write-back of '" + path_ + "' failed", errno);
    }
  }
  if (::msync(data_, size_, MS_SYNC) != 0) {
    return Status::FromErrno("msync of '" + path_ + "' failed", errno);
  }
  return Status::OK();
}

void MappedFile::AdviseSequential() {
  if (data_ != nullptr) ::madvise(data_, size_, MADV_SEQUENTIAL);
}

Result<std::string> ReadFileToString(const std::string& path) {
  DCR_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFile(path, O_RDONLY));
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot read '" + path + "'", errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteFileAtomic(const std::string& path,
                       std::span<const std::byte> data) {
  std::string tmp = path + ".tmp";
  UniqueFd fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid())
    return Status::FromErrno("cannot create '" + tmp + "'", errno);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::FromErrno("cannot write '" + tmp + "'", errno);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    Status s = Status::FromErrno("cannot fsync '" + tmp + "'", errno);
    ::unlink(tmp.c_str());
    return s;
  }
  fd.Reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::FromErrno(
        "cannot rename '" + tmp + "' to '" + path + "'", errno);
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.valid()) ::fsync(dfd.get());
  return Status::OK();
}

}  // namespace dcr
