#include "wire/key_files.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/file.h"

namespace dcr::wire_internal {

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

std::string ModeText(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Result<size_t> ReadKeyFile(const std::string& path, const std::string& what,
                           std::string_view kind, bool secret,
                           std::span<std::byte> buf) {
  // O_NONBLOCK: a FIFO at the path must not hang the open; the file-type
  // check below refuses it.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::NotFound(what + " does not exist");
    return Status::FromErrno("cannot open " + what, errno);
  }
  // fstat of the opened file: the checks apply to the bytes read.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return Status::FromErrno("cannot stat " + what, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(what + " is not a regular file");
  }
  if (secret && (st.st_mode & 077) != 0) {
    return Status::InvalidArgument(
        what + " has mode " + ModeText(st.st_mode) + ": " + std::string(kind) +
        " must not be accessible by group or others; run chmod 600 " + path);
  }
  size_t have = 0;
  while (have < buf.size()) {
    ssize_t n = ::read(fd.get(), buf.data() + have, buf.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot read " + what, errno);
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  return have;
}

}  // namespace dcr::wire_internal
