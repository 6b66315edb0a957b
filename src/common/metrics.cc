#include "common/metrics.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>

namespace dcr {

// ---- MetricsText ----

namespace {

// Label values escape backslash, double quote and newline; HELP texts
// escape backslash and newline only (format 0.0.4).
void AppendEscaped(std::string& out, std::string_view s, bool label_value) {
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '"':
        out += label_value ? "\\\"" : "\"";
        break;
      default:
        out += c;
    }
  }
}

}  // namespace

void MetricsText::Family(std::string_view name, std::string_view type,
                         std::string_view help) {
  if (!families_.emplace(name).second) return;
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  AppendEscaped(text_, help, /*label_value=*/false);
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += type;
  text_ += '\n';
}

void MetricsText::AppendNameAndLabels(std::string_view name, Labels labels) {
  text_ += name;
  if (labels.size() == 0) return;
  text_ += '{';
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) text_ += ',';
    first = false;
    text_ += key;
    text_ += "=\"";
    AppendEscaped(text_, value, /*label_value=*/true);
    text_ += '"';
  }
  text_ += '}';
}

void MetricsText::Sample(std::string_view name, double value, Labels labels) {
  AppendNameAndLabels(name, labels);
  text_ += ' ';
  if (std::isnan(value)) {
    text_ += "NaN";
  } else if (std::isinf(value)) {
    text_ += value > 0 ? "+Inf" : "-Inf";
  } else {
    text_ += fmt::format("{}", value);  // shortest round-trip form
  }
  text_ += '\n';
}

void MetricsText::Sample(std::string_view name, uint64_t value, Labels labels) {
  AppendNameAndLabels(name, labels);
  text_ += ' ';
  text_ += fmt::format("{}", value);
  text_ += '\n';
}

void MetricsText::SampleSigned(std::string_view name, int64_t value,
                               Labels labels) {
  AppendNameAndLabels(name, labels);
  text_ += ' ';
  text_ += fmt::format("{}", value);
  text_ += '\n';
}

// ---- MetricsServer ----

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestBytes = 8u << 10;
constexpr std::chrono::seconds kReadTimeout{2};
// A client that stops reading the answer is dropped after this.
constexpr std::chrono::seconds kWriteTimeout{5};
// After an error answer, unread request bytes are discarded for at most
// this long (or this many bytes) so that closing the socket does not reset
// the connection before the client has read the answer.
constexpr std::chrono::milliseconds kLingerTime{200};
constexpr size_t kLingerBytes = 64u << 10;

std::string HostPort(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) {  // IPv6 literal
    return fmt::format("[{}]:{}", host, port);
  }
  return fmt::format("{}:{}", host, port);
}

enum class WaitResult { kReady, kTimeout, kWoken };

// Waits until `fd` has `events` (or an error to report), the deadline
// passes, or `wake_fd` becomes readable.
WaitResult WaitFd(int fd, short events, int wake_fd,
                  Clock::time_point deadline) {
  for (;;) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return WaitResult::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return WaitResult::kTimeout;
    }
    if (fds[1].revents != 0) return WaitResult::kWoken;
    if (n > 0) return WaitResult::kReady;
  }
}

// What a request head asks for.
struct RequestHead {
  std::string_view method;
  std::string_view path;  // without the query string
};

// Parses the request line "METHOD SP target SP HTTP/1.x" of `line` (without
// its line end). Header fields are not needed and not parsed.
std::optional<RequestHead> ParseRequestLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return std::nullopt;
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return std::nullopt;
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." ||
      version[7] < '0' || version[7] > '9') {
    return std::nullopt;
  }
  for (char c : method) {
    if (c < 'A' || c > 'Z') return std::nullopt;
  }
  for (char c : target) {
    if (c <= ' ' || c == 0x7f) return std::nullopt;
  }
  // The absolute form "http://host/path" names the same resource.
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.substr(0, scheme.size()) == scheme) {
      size_t slash = target.find('/', scheme.size());
      target = slash == std::string_view::npos ? std::string_view("/")
                                               : target.substr(slash);
    }
  }
  if (target.empty() || target[0] != '/') return std::nullopt;
  target = target.substr(0, target.find('?'));
  return RequestHead{method, target};
}

std::string Response(std::string_view status, std::string_view content_type,
                     std::string_view body, bool with_body,
                     std::string_view extra_headers = {}) {
  std::string r = fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}"
      "Connection: close\r\n\r\n",
      status, content_type, body.size(), extra_headers);
  if (with_body) r += body;
  return r;
}

std::string ErrorResponse(std::string_view status,
                          std::string_view extra_headers = {}) {
  return Response(status, "text/plain; charset=utf-8",
                  std::string(status) + "\n", true, extra_headers);
}

// Writes all of `data`; false if the peer went away, the deadline passed
// or Stop woke us (`*woken` then set).
bool WriteAll(int fd, std::string_view data, int wake_fd,
              Clock::time_point deadline, bool* woken) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitResult w = WaitFd(fd, POLLOUT, wake_fd, deadline);
      if (w == WaitResult::kWoken) *woken = true;
      if (w != WaitResult::kReady) return false;
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

MetricsServer::MetricsServer(UniqueFd listen_fd, UniqueFd wake_fd,
                             uint16_t port, std::function<std::string()> render)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      render_(std::move(render)) {}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    std::string_view host, uint16_t port, std::function<std::string()> render) {
  const std::string where = "metrics: cannot listen on " + HostPort(host, port);
  if (!render) return Status::InvalidArgument(where + ": no render function");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string node(host);
  const std::string service = std::to_string(port);
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(node.empty() ? nullptr : node.c_str(), service.c_str(),
                         &hints, &found);
  if (rc != 0) {
    return Status::IOError(where +
                           ": cannot resolve host: " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addrs(found,
                                                             ::freeaddrinfo);
  // The first address that binds ("localhost" may name ::1 and 127.0.0.1).
  Status first_error;
  UniqueFd fd;
  for (addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd s(::socket(ai->ai_family,
                        ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol));
    int one = 1;
    if (s.valid() &&
        ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ==
            0 &&
        ::bind(s.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::listen(s.get(), 16) == 0) {
      fd = std::move(s);
      break;
    }
    if (first_error.ok()) first_error = Status::FromErrno(where, errno);
  }
  if (!fd.valid()) {
    if (first_error.ok()) return Status::IOError(where + ": no address");
    return first_error;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return Status::FromErrno(where + ": getsockname", errno);
  }
  uint16_t bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Status::FromErrno(where + ": eventfd", errno);
  std::unique_ptr<MetricsServer> server(new MetricsServer(
      std::move(fd), std::move(wake), bound_port, std::move(render)));
  MetricsServer* s = server.get();
  MutexLock lock(&s->stop_mu_);
  s->thread_ = std::thread([s] { s->Run(); });
  return server;
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  MutexLock lock(&stop_mu_);
  if (!thread_.joinable()) return;
  // The eventfd stays readable from here on: every wait below sees it.
  uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(wake_fd_.get(), &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
  thread_.join();
  listen_fd_.Reset();
}

void MetricsServer::Run() {
  pthread_setname_np(pthread_self(), "dcr-metrics");
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("dcr: metrics server: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr,
                            SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR ||
          err == ECONNABORTED) {
        continue;
      }
      // Out of descriptors and the like: back off instead of spinning.
      spdlog::warn("dcr: metrics server: accept: {}", std::strerror(err));
      if (WaitFd(wake_fd_.get(), POLLIN, wake_fd_.get(),
                 Clock::now() + std::chrono::milliseconds(100)) ==
          WaitResult::kWoken) {
        return;
      }
      continue;
    }
    if (!Serve(conn.get())) return;
  }
}

bool MetricsServer::Serve(int fd) {
  const int wake = wake_fd_.get();
  const Clock::time_point read_deadline = Clock::now() + kReadTimeout;
  std::string request;
  request.reserve(1024);
  char buf[4096];

  // Reads the request head; the answer is decided as soon as the request
  // line is known to be bad, or once the head is complete.
  std::optional<std::string> answer;
  bool head_only = false;
  bool unread_bytes = false;  // the client may have sent more than we read
  while (!answer) {
    size_t line_end = request.find('\n');
    std::optional<RequestHead> head;
    if (line_end != std::string::npos) {
      head = ParseRequestLine(std::string_view(request).substr(0, line_end));
      if (!head) {
        answer = ErrorResponse("400 Bad Request");
        unread_bytes = true;
        break;
      }
      size_t head_size = request.find("\r\n\r\n");
      if (head_size != std::string::npos) {
        head_size += 4;
      } else if ((head_size = request.find("\n\n")) != std::string::npos) {
        head_size += 2;
      }
      if (head_size != std::string::npos) {
        unread_bytes = request.size() > head_size;
        if (head->method != "GET" && head->method != "HEAD") {
          answer =
              ErrorResponse("405 Method Not Allowed", "Allow: GET, HEAD\r\n");
          unread_bytes = true;  // a request body may follow
        } else if (head->path != "/metrics") {
          answer = ErrorResponse("404 Not Found");
        } else {
          head_only = head->method == "HEAD";
          std::string body;
          try {
            body = render_();
          } catch (const std::exception& e) {
            spdlog::error("dcr: metrics server: render failed: {}", e.what());
            answer = ErrorResponse("500 Internal Server Error");
            break;
          }
          answer =
              Response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                       body, !head_only);
        }
        break;
      }
    }
    if (request.size() >= kMaxRequestBytes) {
      answer = ErrorResponse("400 Bad Request");
      unread_bytes = true;
      break;
    }
    ssize_t n = ::recv(
        fd, buf, std::min(sizeof(buf), kMaxRequestBytes - request.size()), 0);
    if (n > 0) {
      request.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return true;  // the client gave up
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return true;
    WaitResult w = WaitFd(fd, POLLIN, wake, read_deadline);
    if (w == WaitResult::kWoken) return false;
    if (w == WaitResult::kTimeout) return true;  // silent or slow: drop it
  }

  bool woken = false;
  if (!WriteAll(fd, *answer, wake, Clock::now() + kWriteTimeout, &woken)) {
    return !woken;
  }
  ::shutdown(fd, SHUT_WR);
  if (unread_bytes) {
    // Discard what the client still sends until it closes, so that our
    // close does not reset the connection under the answer.
    const Clock::time_point linger_end = Clock::now() + kLingerTime;
    size_t discarded = 0;
    while (discarded < kLingerBytes) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        discarded += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) break;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) break;
      WaitResult w = WaitFd(fd, POLLIN, wake, linger_end);
      if (w == WaitResult::kWoken) return false;
      if (w == WaitResult::kTimeout) break;
    }
  }
  return true;
}

}  // namespace dcr
