#include "relay/serving_port.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dcr {
namespace {

void Signal(int fd) {
  uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

}  // namespace

Result<std::unique_ptr<ServingPort>> ServingPort::Listen(
    const std::string& path, Handler handler) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return Status::InvalidArgument(
        "serving socket '" + path + "': a path of 1 to " +
        std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const std::string lock_path = path + ".lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) {
    return Status::FromErrno("cannot open '" + lock_path + "'", errno);
  }
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status::InvalidArgument(
        "serving socket '" + path +
        "': another relay listens there (it holds '" + lock_path + "')");
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::InvalidArgument("serving socket '" + path +
                                     "': something else is there; move it");
    }
    // Ours now (the lock): a dead relay's.
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::FromErrno("socket", errno);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno("cannot bind serving socket '" + path + "'",
                             errno);
  }
  if (::listen(fd.get(), 4) != 0) {
    return Status::FromErrno("cannot listen on '" + path + "'", errno);
  }
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Status::FromErrno("eventfd", errno);
  std::unique_ptr<ServingPort> port(
      new ServingPort(path, std::move(lock), std::move(fd), std::move(wake),
                      std::move(handler)));
  port->thread_ = std::thread([p = port.get()] { p->Run(); });
  return port;
}

ServingPort::ServingPort(std::string path, UniqueFd lock, UniqueFd listener,
                         UniqueFd wake, Handler handler)
    : path_(std::move(path)),
      lock_(std::move(lock)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      handler_(std::move(handler)) {}

ServingPort::~ServingPort() {
  stopping_ = true;
  Signal(wake_.get());
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
}

void ServingPort::Send(uint64_t connection, const PauseMsg& msg) {
  const std::string line = EncodePauseMsg(msg);
  MutexLock lock(&mu_);
  if (!client_.valid() || connection != connection_) return;
  size_t done = 0;
  while (done < line.size()) {
    // A line fits the socket's buffer unless the server stopped reading
    // thousands of lines ago: then it is detached, never waited for.
    ssize_t n = ::send(client_.get(), line.data() + done, line.size() - done,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (detach_why_.empty()) {
        detach_why_ = n < 0 && errno == EAGAIN
                          ? "it does not read its socket"
                          : std::string("send: ") + std::strerror(errno);
      }
      Signal(wake_.get());
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void ServingPort::Detach(uint64_t connection, const std::string& why) {
  MutexLock lock(&mu_);
  if (!client_.valid() || connection != connection_) return;
  if (detach_why_.empty()) detach_why_ = why;
  Signal(wake_.get());
}

void ServingPort::CloseClient(std::string why) {
  client_.Reset();
  detach_why_.clear();
  in_.clear();
  Event e;
  e.kind = Event::Kind::kDetached;
  e.connection = connection_;
  e.detail = std::move(why);
  handler_(std::move(e));
}

void ServingPort::Run() {
  while (!stopping_) {
    pollfd fds[3] = {{listener_.get(), POLLIN, 0},
                     {wake_.get(), POLLIN, 0},
                     {-1, POLLIN, 0}};
    {
      MutexLock lock(&mu_);
      fds[2].fd = client_.get();
    }
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) {
      uint64_t n;
      (void)!::read(wake_.get(), &n, sizeof n);
      MutexLock lock(&mu_);
      if (client_.valid() && !detach_why_.empty()) CloseClient(detach_why_);
    }
    if (stopping_) break;
    if (fds[0].revents != 0) Accept();
    if (fds[2].fd >= 0 && fds[2].revents != 0) Read();
  }
  MutexLock lock(&mu_);
  client_.Reset();
}

void ServingPort::Accept() {
  UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr,
                        SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) return;
  MutexLock lock(&mu_);
  if (client_.valid()) {
    PauseMsg no;
    no.op = PauseMsg::Op::kError;
    no.detail = "another serving process is attached to this relay";
    const std::string line = EncodePauseMsg(no);
    (void)!::send(fd.get(), line.data(), line.size(),
                  MSG_NOSIGNAL | MSG_DONTWAIT);
    return;  // closes it
  }
  client_ = std::move(fd);
  ++connection_;
  in_.clear();
  Event e;
  e.kind = Event::Kind::kAttached;
  e.connection = connection_;
  handler_(std::move(e));
}

void ServingPort::Read() {
  MutexLock lock(&mu_);
  if (!client_.valid()) return;
  for (;;) {
    char buf[4096];
    ssize_t n = ::recv(client_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      if (in_.size() > 4 * kMaxPauseLine) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    CloseClient(n == 0 ? "it closed its socket"
                       : std::string("recv: ") + std::strerror(errno));
    return;
  }
  size_t start = 0;
  for (size_t nl; (nl = in_.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    Result<PauseMsg> msg =
        DecodePauseMsg(std::string_view(in_).substr(start, nl - start));
    if (!msg.ok()) {
      CloseClient(std::string(msg.status().message()));
      return;
    }
    Event e;
    e.kind = Event::Kind::kMessage;
    e.connection = connection_;
    e.msg = *std::move(msg);
    handler_(std::move(e));
  }
  in_.erase(0, start);
  if (in_.size() >= kMaxPauseLine) {
    CloseClient("a line longer than " + std::to_string(kMaxPauseLine) +
                " bytes");
  }
}

}  // namespace dcr
