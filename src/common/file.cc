#include "common/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
  f->fd_ = std::move(fd);
  return f;
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
