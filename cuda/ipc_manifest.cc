// dcr/cuda.h: the CUDA IPC manifest, its encoding and the Unix socket that
// carries it. No CUDA here: builds without it parse and serve manifests
// too (and fuzz the parser).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/strict_json.h"
#include "dcr/cuda.h"

namespace dcr::cuda {

namespace {

constexpr const char* kWhat = "CUDA IPC manifest";

Status Bad(const std::string& why) {
  return Status::Corruption(std::string(kWhat) + ": " + why);
}

bool IsHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status ExactKeys(const nlohmann::json& o,
                 std::initializer_list<const char*> keys,
                 const std::string& where) {
  if (!o.is_object()) return Bad(where + " is not an object");
  for (const char* k : keys) {
    if (!o.contains(k)) return Bad(where + " lacks \"" + k + "\"");
  }
  if (o.size() != keys.size()) {
    for (auto it = o.begin(); it != o.end(); ++it) {
      bool known = false;
      for (const char* k : keys) known = known || it.key() == k;
      if (!known)
        return Bad(where + " has an unknown key \"" + it.key() + "\"");
    }
  }
  return Status::OK();
}

Result<uint64_t> U64(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_unsigned()) return Bad(where + " is not a whole number");
  return v.get<uint64_t>();
}

sockaddr_un Address(const std::string& path, Status* st) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    *st = Status::InvalidArgument(
        "socket path '" + path + "' is empty or longer than " +
        std::to_string(sizeof(a.sun_path) - 1) + " bytes");
    return a;
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

}  // namespace

std::string EncodeIpcManifest(const IpcManifest& m) {
  nlohmann::ordered_json j;
  j["format"] = 1;
  j["device"] = m.device;
  j["tensors"] = nlohmann::ordered_json::array();
  for (const IpcTensor& t : m.tensors) {
    j["tensors"].push_back({{"name", t.name},
                            {"dtype", std::string(DTypeName(t.dtype))},
                            {"shape", t.shape},
                            {"handle", t.handle},
                            {"offset", t.offset},
                            {"bytes", t.bytes}});
  }
  return j.dump() + "\n";
}

Result<IpcManifest> ParseIpcManifest(std::string_view text) {
  if (text.size() > kMaxIpcManifestBytes) {
    return Bad("larger than " + std::to_string(kMaxIpcManifestBytes) +
               " bytes");
  }
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  DCR_ASSIGN_OR_RETURN(nlohmann::json j, ParseStrictJson(text, kWhat));
  DCR_RETURN_IF_ERROR(ExactKeys(j, {"format", "device", "tensors"}, "the top"));
  DCR_ASSIGN_OR_RETURN(uint64_t format, U64(j["format"], "\"format\""));
  if (format != 1) {
    return Status::Unsupported(std::string(kWhat) + ": format " +
                               std::to_string(format) +
                               " (this build reads format 1)");
  }
  if (!j["device"].is_string()) return Bad("\"device\" is not a string");
  if (!j["tensors"].is_array()) return Bad("\"tensors\" is not an array");
  IpcManifest m;
  m.device = j["device"].get<std::string>();
  std::set<std::string> names;
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    const nlohmann::json& e = j["tensors"][i];
    const std::string where = "tensor " + std::to_string(i);
    DCR_RETURN_IF_ERROR(ExactKeys(
        e, {"name", "dtype", "shape", "handle", "offset", "bytes"}, where));
    IpcTensor t;
    if (!e["name"].is_string() || e["name"].get<std::string>().empty()) {
      return Bad(where + ": \"name\" is not a non-empty string");
    }
    t.name = e["name"].get<std::string>();
    if (!names.insert(t.name).second) {
      return Bad("tensor '" + t.name + "' appears twice");
    }
    const std::string at = "tensor '" + t.name + "'";
    if (!e["dtype"].is_string()) return Bad(at + ": \"dtype\" is not a string");
    auto dtype = ParseDType(e["dtype"].get<std::string>());
    if (!dtype.ok()) return Bad(at + ": " + dtype.status().ToString());
    t.dtype = dtype.value();
    if (!e["shape"].is_array()) return Bad(at + ": \"shape\" is not an array");
    uint64_t elems = 1;
    for (const auto& d : e["shape"]) {
      DCR_ASSIGN_OR_RETURN(uint64_t dim, U64(d, at + ": a dimension"));
      if (dim != 0 && elems > std::numeric_limits<uint64_t>::max() / dim) {
        return Bad(at + ": the shape's element count overflows");
      }
      elems *= dim;
      t.shape.push_back(dim);
    }
    if (!e["handle"].is_string())
      return Bad(at + ": \"handle\" is not a string");
    t.handle = e["handle"].get<std::string>();
    if (t.handle.size() != 128 || !IsHex(t.handle)) {
      return Bad(at + ": \"handle\" is not 128 lower-case hex digits");
    }
    DCR_ASSIGN_OR_RETURN(t.offset, U64(e["offset"], at + ": \"offset\""));
    DCR_ASSIGN_OR_RETURN(t.bytes, U64(e["bytes"], at + ": \"bytes\""));
    const uint64_t w = DTypeSize(t.dtype);
    if (elems > std::numeric_limits<uint64_t>::max() / w ||
        elems * w != t.bytes) {
      return Bad(at + ": \"bytes\" is not the shape's elements times " +
                 std::to_string(w));
    }
    if (t.offset > std::numeric_limits<uint64_t>::max() - t.bytes) {
      return Bad(at + ": offset + bytes overflows");
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

// ------------------------------------------------------------------ server

struct IpcServer::Impl {
  std::string path;
  std::string text;
  dev_t dev = 0;  // the socket file this server bound
  ino_t ino = 0;
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  std::thread thread;

  void Run() {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
    while (true) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        // Out of descriptors: wait rather than spin.
        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
          ::poll(&fds[1], 1, 50);
        }
        continue;
      }
      // A reader that stalls is dropped after 1 s rather than holding the
      // server (the manifest is small; one write usually takes it all).
      timeval tv{1, 0};
      ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      size_t sent = 0;
      while (sent < text.size()) {
        const ssize_t n =
            ::send(c, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }

  ~Impl() {
    if (thread.joinable()) {
      const char b = 1;
      (void)!::write(stop_pipe[1], &b, 1);
      thread.join();
    }
    if (listen_fd >= 0) {
      ::close(listen_fd);
      // Only our socket: another server may have bound the path since.
      struct stat sb;
      if (::lstat(path.c_str(), &sb) == 0 && sb.st_dev == dev &&
          sb.st_ino == ino) {
        ::unlink(path.c_str());
      }
    }
    for (int fd : stop_pipe) {
      if (fd >= 0) ::close(fd);
    }
  }
};

IpcServer::IpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IpcServer::~IpcServer() = default;

Result<std::unique_ptr<IpcServer>> IpcServer::Start(const std::string& path,
                                                    IpcManifest manifest) {
  Status st;
  const sockaddr_un addr = Address(path, &st);
  DCR_RETURN_IF_ERROR(st);
  // A socket left by a server that died is replaced; one a live server
  // answers on, or anything else at the path, is not ours to remove.
  struct stat sb;
  if (::lstat(path.c_str(), &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode)) {
      return Status::InvalidArgument(path +
                                     " exists and is not a socket; choose "
                                     "another path for the IPC manifest");
    }
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::FromErrno("socket", errno);
    const bool live = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr),
                                sizeof(addr)) == 0;
    ::close(probe);
    if (live) {
      return Status::InvalidArgument(
          "a server already answers on " + path +
          "; stop it or choose another path for the IPC manifest");
    }
    ::unlink(path.c_str());
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->text = EncodeIpcManifest(manifest);
  if (::pipe2(impl->stop_pipe, O_CLOEXEC) != 0) {
    return Status::FromErrno("pipe2", errno);
  }
  impl->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) return Status::FromErrno("socket", errno);
  if (::bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&addr),
             sizeof(addr)) != 0) {
    const int e = errno;
    ::close(impl->listen_fd);
    impl->listen_fd = -1;
    return Status::FromErrno("bind " + path, e);
  }
  if (::lstat(path.c_str(), &sb) != 0) {
    return Status::FromErrno("stat " + path, errno);
  }
  impl->dev = sb.st_dev;
  impl->ino = sb.st_ino;
  if (::listen(impl->listen_fd, 16) != 0) {
    return Status::FromErrno("listen " + path, errno);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<IpcServer>(new IpcServer(std::move(impl)));
}

Result<IpcManifest> FetchIpcManifest(const std::string& path, int timeout_ms) {
  Status st;
  const sockaddr_un addr = Address(path, &st);
  DCR_RETURN_IF_ERROR(st);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now())
               .count()));
  };
  int fd = -1;
  int last_errno = 0;
  // The server may not be listening yet: retry until the deadline.
  while (true) {
    // Non-blocking: a full backlog is EAGAIN, retried until the
    // deadline, not a connect that blocks past it.
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Status::FromErrno("socket", errno);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) ==
        0) {
      break;
    }
    last_errno = errno;
    ::close(fd);
    fd = -1;
    if (left_ms() == 0) {
      return Status::FromErrno(
          "no CUDA IPC manifest at " + path + " within " +
              std::to_string(timeout_ms) +
              " ms (is the serving process exporting its weights?)",
          last_errno);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string text;
  char buf[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, left_ms());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      return Status::IOError("reading the CUDA IPC manifest at " + path +
                             ": timed out after " + std::to_string(timeout_ms) +
                             " ms");
    }
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Status::FromErrno("reading the CUDA IPC manifest at " + path, e);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxIpcManifestBytes) {
      ::close(fd);
      return Bad("larger than " + std::to_string(kMaxIpcManifestBytes) +
                 " bytes");
    }
  }
  ::close(fd);
  return ParseIpcManifest(text);
}

}  // namespace dcr::cuda
