#include "relay/undo_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dcr {

Result<std::unique_ptr<UndoLog>> UndoLog::Create(const std::string& dir) {
  std::unique_ptr<UndoLog> log(new UndoLog());
  if (dir.empty()) return log;
  std::string tmpl = dir + "/.dcr-undo-XXXXXX";
  int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno("cannot create an undo file in " + dir, errno);
  }
  ::unlink(tmpl.c_str());  // lives while open; nothing to clean after a crash
  log->fd_ = UniqueFd(fd);
  log->where_ = tmpl;
  return log;
}

Result<UndoLog::Ref> UndoLog::Append(std::span<const std::byte> a,
                                     std::span<const std::byte> b) {
  Ref r;
  r.size = a.size() + b.size();
  if (!fd_.valid()) {
    MutexLock lock(&mu_);
    r.offset = heap_.size();
    heap_.insert(heap_.end(), a.begin(), a.end());
    heap_.insert(heap_.end(), b.begin(), b.end());
    end_ = heap_.size();
    return r;
  }
  r.offset = end_.fetch_add(r.size);
  uint64_t at = r.offset;
  for (std::span<const std::byte> part : {a, b}) {
    while (!part.empty()) {
      ssize_t n =
          ::pwrite(fd_.get(), part.data(), part.size(), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return Status::FromErrno("cannot write the undo file " + where_ +
                                     " (the base bits could not be restored)",
                                 n < 0 ? errno : ENOSPC);
      }
      part = part.subspan(static_cast<size_t>(n));
      at += static_cast<uint64_t>(n);
    }
  }
  return r;
}

Status UndoLog::Read(const Ref& r, std::vector<std::byte>* out) const {
  out->resize(r.size);
  if (!fd_.valid()) {
    MutexLock lock(&mu_);
    if (r.offset + r.size > heap_.size()) {
      return Status::Internal("undo record past the end of the log");
    }
    std::memcpy(out->data(), heap_.data() + r.offset, r.size);
    return Status::OK();
  }
  uint64_t done = 0;
  while (done < r.size) {
    ssize_t n = ::pread(fd_.get(), out->data() + done, r.size - done,
                        static_cast<off_t>(r.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::FromErrno("cannot read the undo file " + where_,
                               n < 0 ? errno : EIO);
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace dcr
