#include "common/file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dcr {

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                     Mode mode) {
  bool rw = mode == Mode::kReadWrite;
  UniqueFd fd(::open(path.c_str(), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC));
  if (!fd.valid()) {
    return Status::FromErrno(
        "cannot open '" + path + "'" + (rw ? " for writing" : ""), errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return Status::FromErrno("cannot stat '" + path + "'", errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("'" + path + "' is not a regular file");
  }
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

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

Status MappedFile::Sync() {
  if (mode_ != Mode::kReadWrite || data_ == nullptr) return Status::OK();
  if (::msync(data_, size_, MS_SYNC) != 0) {
    return Status::FromErrno("msync of '" + path_ + "' failed", errno);
  }
  return Status::OK();
}

void MappedFile::AdviseSequential() {
  if (data_ != nullptr) ::madvise(data_, size_, MADV_SEQUENTIAL);
}

Result<std::string> ReadFileToString(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    return Status::FromErrno("cannot open '" + path + "'", errno);
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
