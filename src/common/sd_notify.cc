#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/file.h"

namespace dcr {
namespace {

// A positive decimal, all of `text`.
std::optional<uint64_t> ParsePositive(std::string_view text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v == 0) {
    return std::nullopt;
  }
  return v;
}

}  // namespace

Status SdNotify(std::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || *env == '\0') return Status::OK();
  const std::string_view address(env);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if ((address[0] != '/' && address[0] != '@') ||
      address.size() > sizeof(sa.sun_path) - 1) {
    return Status::InvalidArgument(
        "NOTIFY_SOCKET=" + std::string(address) +
        ": not a socket path or an '@' abstract name this build can use");
  }
  std::memcpy(sa.sun_path, address.data(), address.size());
  if (address[0] == '@') sa.sun_path[0] = '\0';  // abstract namespace
  const socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() +
                             (address[0] == '/' ? 1 : 0));
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return Status::IOError(std::string("NOTIFY_SOCKET: socket: ") +
                           std::strerror(errno));
  }
  ssize_t n;
  do {
    n = ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&sa), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return Status::IOError("NOTIFY_SOCKET=" + std::string(address) + ": " +
                           std::strerror(errno));
  }
  return Status::OK();
}

Result<std::optional<std::chrono::microseconds>> SdWatchdogInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::optional<std::chrono::microseconds>();
  auto interval = ParsePositive(usec);
  if (!interval) {
    return Status::InvalidArgument(std::string("WATCHDOG_USEC=") + usec +
                                   ": not a positive number of microseconds");
  }
  if (const char* pid = std::getenv("WATCHDOG_PID")) {
    auto p = ParsePositive(pid);
    if (!p) {
      return Status::InvalidArgument(std::string("WATCHDOG_PID=") + pid +
                                     ": not a process id");
    }
    if (*p != static_cast<uint64_t>(::getpid())) {
      return std::optional<std::chrono::microseconds>();  // another's
    }
  }
  return std::optional<std::chrono::microseconds>(
      std::chrono::microseconds(*interval));
}

}  // namespace dcr
