// serving/pause_link.h: lines in, lines out, never blocking the serving
// loop for longer than a send of one small line (or a Wait it asked for).
#include "serving/pause_link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace dcr {

bool PauseLink::MaybeConnect() {
  if (fd_.valid()) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_try_) return false;
  next_try_ = now + std::chrono::milliseconds(200);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
      0) {
    return false;
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  fd_ = std::move(fd);
  in_.clear();
  return true;
}

void PauseLink::Send(const PauseMsg& msg) {
  if (!fd_.valid()) return;
  const std::string line = EncodePauseMsg(msg);
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n =
        ::send(fd_.get(), line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      fd_.Reset();
      return;
    }
  }
}

std::vector<PauseMsg> PauseLink::Receive() {
  std::vector<PauseMsg> out;
  while (fd_.valid()) {
    char buf[4096];
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fd_.Reset();  // EOF: the relay stopped or dropped us
  }
  size_t start = 0;
  for (size_t nl; (nl = in_.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    auto msg = DecodePauseMsg(std::string_view(in_).substr(start, nl - start));
    if (msg.ok()) out.push_back(*std::move(msg));
  }
  in_.erase(0, start);
  if (in_.size() >= kMaxPauseLine) fd_.Reset();
  return out;
}

void PauseLink::Close(std::chrono::milliseconds wait) {
  fd_.Reset();
  in_.clear();
  next_try_ = std::chrono::steady_clock::now() + wait;
}

bool PauseLink::Wait(std::chrono::milliseconds wait) const {
  if (!fd_.valid()) return false;
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) > 0;
}

}  // namespace dcr
