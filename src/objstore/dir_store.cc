// The directory backend of ObjectStore (dcr/objstore.h).
//
// An object "<root>/<key>" is the object's bytes followed by a 32-byte
// trailer (docs/FORMAT.md §"Objects"):
//   magic "DCROBJ1\n" (8 bytes), payload length (u64 LE),
//   XXH3-128 of the payload: high word (u64 LE), low word (u64 LE).
// It is written as "<root>/<key>.dcr-tmp-<random>-<n>" (created
// exclusively: writers on other hosts of a shared filesystem never share
// one), fsynced, renamed into place and its directory fsynced; folders
// the write created are fsynced into their parents first.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#include "common/bytes.h"
#include "common/file.h"
#include "dcr/digest.h"
#include "dcr/objstore.h"
#include "fmt/format.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'D', 'C', 'R', 'O', 'B', 'J', '1', '\n'};
constexpr size_t kTrailer = 32;
constexpr std::string_view kTmpMarker = ".dcr-tmp-";

Status WriteAll(int fd, const std::byte* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(fmt::format("writing '{}'", path), errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(fmt::format("opening '{}'", dir), errno);
  UniqueFd owner(fd);
  if (::fsync(fd) != 0) {
    return Status::FromErrno(fmt::format("fsync of '{}'", dir), errno);
  }
  return Status::OK();
}

// Creates the folders of `dir` below `root` that are missing, each made
// durable in its parent, so that a Put that returned survives a crash.
// A folder another thread creates (or removes) meanwhile is not an error
// here; the caller's open retries.
Status MakeDirs(const std::string& root, const std::string& dir) {
  std::string path = root;
  std::string_view rest = std::string_view(dir).substr(root.size());
  while (!rest.empty()) {
    while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
    if (rest.empty()) break;
    size_t slash = rest.find('/');
    std::string_view seg = rest.substr(0, slash);
    rest.remove_prefix(slash == std::string_view::npos ? rest.size() : slash);
    const std::string parent = path;
    path += "/";
    path += seg;
    if (::mkdir(path.c_str(), 0755) == 0) {
      DCR_RETURN_IF_ERROR(SyncDir(parent));
    } else if (errno != EEXIST) {
      return Status::FromErrno(fmt::format("creating '{}'", path), errno);
    }
  }
  return Status::OK();
}

class DirObjectStore final : public ObjectStore {
 public:
  explicit DirObjectStore(std::string root)
      : root_(std::move(root)), tag_(std::random_device{}()) {}

  Status Put(std::string_view key, std::span<const std::byte> data) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string path = Path(key);
    const std::string dir = fs::path(path).parent_path().string();
    const std::string tmp =
        fmt::format("{}{}{:016x}-{}", path, kTmpMarker, tag_,
                    counter_.fetch_add(1, std::memory_order_relaxed));
    // A concurrent Delete may remove an emptied folder between its
    // creation and the open: create it again.
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 8; ++attempt) {
      DCR_RETURN_IF_ERROR(MakeDirs(root_, dir));
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0 && errno != ENOENT) break;
    }
    if (fd < 0) {
      return Status::FromErrno(fmt::format("creating '{}'", tmp), errno);
    }
    UniqueFd owner(fd);
    Digest128 h = Hash128(data);
    std::byte trailer[kTrailer];
    std::memcpy(trailer, kMagic, 8);
    StoreLE<uint64_t>(trailer + 8, data.size());
    StoreLE<uint64_t>(trailer + 16, h.high);
    StoreLE<uint64_t>(trailer + 24, h.low);
    Status s = WriteAll(fd, data.data(), data.size(), tmp);
    if (s.ok()) s = WriteAll(fd, trailer, kTrailer, tmp);
    if (s.ok() && ::fsync(fd) != 0) {
      s = Status::FromErrno(fmt::format("fsync of '{}'", tmp), errno);
    }
    owner.Reset();
    if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      s = Status::FromErrno(fmt::format("renaming '{}' to '{}'", tmp, path),
                            errno);
    }
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    DCR_RETURN_IF_ERROR(SyncDir(dir));
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_up_.fetch_add(data.size(), std::memory_order_relaxed);
    return Status::OK();
  }

  Result<std::vector<std::byte>> Get(std::string_view key) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string path = Path(key);
    requests_.fetch_add(1, std::memory_order_relaxed);
    struct stat st;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        return Status::NotFound(
            fmt::format("no object '{}' in {}", key, describe()));
      }
      return Status::FromErrno(fmt::format("opening '{}'", path), errno);
    }
    UniqueFd owner(fd);
    if (::fstat(fd, &st) != 0) {
      return Status::FromErrno(fmt::format("fstat of '{}'", path), errno);
    }
    if (S_ISDIR(st.st_mode)) {  // a folder of other objects, as in S3
      return Status::NotFound(
          fmt::format("no object '{}' in {} (a folder)", key, describe()));
    }
    if (!S_ISREG(st.st_mode)) {
      return Status::Corruption(fmt::format("'{}' is {}, not an object", path,
                                            FileTypeName(st.st_mode)));
    }
    std::vector<std::byte> data(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      ssize_t r = ::read(fd, data.data() + got, data.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return Status::FromErrno(fmt::format("reading '{}'", path), errno);
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    data.resize(got);
    auto corrupt = [&](std::string_view why) {
      return Status::Corruption(
          fmt::format("object '{}' ({}): {}", key, path, why));
    };
    if (data.size() < kTrailer ||
        std::memcmp(data.data() + data.size() - kTrailer, kMagic, 8) != 0) {
      return corrupt("no dcr trailer: truncated, or not written by dcr");
    }
    const std::byte* t = data.data() + data.size() - kTrailer;
    uint64_t length = LoadLE<uint64_t>(t + 8);
    Digest128 want{LoadLE<uint64_t>(t + 16), LoadLE<uint64_t>(t + 24)};
    if (length != data.size() - kTrailer) {
      return corrupt(fmt::format("{} bytes where the trailer says {}",
                                 data.size() - kTrailer, length));
    }
    data.resize(length);
    if (Hash128(data) != want) {
      return corrupt(
          "its bytes do not match its checksum (changed after "
          "upload)");
    }
    bytes_down_.fetch_add(data.size(), std::memory_order_relaxed);
    return data;
  }

  Status Delete(std::string_view key) override {
    DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
    const std::string path = Path(key);
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
      return Status::FromErrno(fmt::format("removing '{}'", path), errno);
    }
    // Empty folders left behind (a refit's "refits/<id>/c") go too; one
    // that another writer has just filled stays (rmdir fails).
    fs::path dir = fs::path(path).parent_path();
    while (dir.string().size() > root_.size() && ::rmdir(dir.c_str()) == 0) {
      dir = dir.parent_path();
    }
    return Status::OK();
  }

  Result<std::vector<std::string>> List(std::string_view prefix) override {
    requests_.fetch_add(1, std::memory_order_relaxed);
    // A folder removed by a concurrent Delete while the walk is in it ends
    // the walk with ENOENT: walk again.
    for (int attempt = 1;; ++attempt) {
      bool vanished = false;
      Result<std::vector<std::string>> keys = Walk(prefix, &vanished);
      if (keys.ok() || !vanished || attempt == 4) return keys;
    }
  }

  Result<uint64_t> RemoveUnfinished(std::string_view prefix) override {
    requests_.fetch_add(1, std::memory_order_relaxed);
    uint64_t removed = 0;
    std::vector<fs::path> dirs;
    std::error_code ec;
    const fs::path start = WalkStart(prefix);
    fs::recursive_directory_iterator it(
        start, fs::directory_options::skip_permission_denied, ec);
    if (ec) {
      if (ec == std::errc::no_such_file_or_directory) return removed;
      return Status::IOError(
          fmt::format("listing '{}': {}", start.string(), ec.message()));
    }
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      std::string rel = fs::relative(it->path(), root_, ec).generic_string();
      if (ec) break;
      // Folders under the prefix (their keys would begin with it).
      if (it->is_directory(ec) &&
          (rel + "/").compare(0, prefix.size(), prefix) == 0) {
        dirs.push_back(it->path());
      }
      if (rel.compare(0, prefix.size(), prefix) != 0 ||
          rel.find(kTmpMarker) == std::string::npos ||
          !it->is_regular_file(ec)) {
        continue;
      }
      if (::unlink(it->path().c_str()) != 0 && errno != ENOENT) {
        return Status::FromErrno(
            fmt::format("removing '{}'", it->path().string()), errno);
      }
      ++removed;
    }
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return Status::IOError(
          fmt::format("listing '{}': {}", start.string(), ec.message()));
    }
    // Folders under the prefix left empty, deepest first; then, when the
    // prefix names a folder, that folder and the parents it empties (as
    // Delete does).
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) {
      return a.string().size() > b.string().size();
    });
    for (const fs::path& d : dirs) ::rmdir(d.c_str());
    if (!prefix.empty() && prefix.back() == '/') {
      fs::path dir = start;
      while (dir.string().size() > root_.size() && ::rmdir(dir.c_str()) == 0) {
        dir = dir.parent_path();
      }
    }
    return removed;
  }

  std::string describe() const override { return "dir:" + root_; }

  ObjectStoreStats stats() const override {
    ObjectStoreStats s;
    s.requests = requests_.load(std::memory_order_relaxed);
    s.bytes_up = bytes_up_.load(std::memory_order_relaxed);
    s.bytes_down = bytes_down_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // The folder under which every key beginning with `prefix` lies:
  // "refits/ab/f/00" -> <root>/refits/ab/f.
  fs::path WalkStart(std::string_view prefix) const {
    const size_t slash = prefix.rfind('/');
    // A prefix whose folders are not a key's ("..") is matched from the
    // root, never walked into.
    if (slash == std::string_view::npos ||
        !ValidateObjectKey(prefix.substr(0, slash)).ok()) {
      return root_;
    }
    return fs::path(root_) / std::string(prefix.substr(0, slash));
  }

  // One walk of the tree for List(); `vanished` tells a failure because a
  // folder disappeared during the walk.
  Result<std::vector<std::string>> Walk(std::string_view prefix,
                                        bool* vanished) {
    std::vector<std::string> keys;
    std::error_code ec;
    // From the deepest folder the prefix names whole, not the whole store.
    const fs::path start = WalkStart(prefix);
    fs::recursive_directory_iterator it(
        start, fs::directory_options::skip_permission_denied, ec);
    if (ec) {
      if (ec == std::errc::no_such_file_or_directory && start != root_) {
        return keys;
      }
      return Status::IOError(
          fmt::format("listing '{}': {}", root_, ec.message()));
    }
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (!it->is_regular_file(ec)) continue;
      std::string rel = fs::relative(it->path(), root_, ec).generic_string();
      if (ec) break;
      if (rel.find(kTmpMarker) != std::string::npos) continue;
      if (rel.compare(0, prefix.size(), prefix) != 0) continue;
      if (!ValidateObjectKey(rel).ok()) continue;  // not ours
      keys.push_back(std::move(rel));
    }
    if (ec) {
      *vanished = ec == std::errc::no_such_file_or_directory;
      return Status::IOError(
          fmt::format("listing '{}': {}", root_, ec.message()));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  std::string Path(std::string_view key) const {
    return fmt::format("{}/{}", root_, key);
  }

  const std::string root_;
  const uint64_t tag_;  // random per store: temporary names never collide
  std::atomic<uint64_t> counter_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> bytes_up_{0};
  std::atomic<uint64_t> bytes_down_{0};
};

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenDirObjectStore(
    const std::string& root) {
  if (root.empty()) {
    return Status::InvalidArgument("an object directory needs a path");
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    return Status::IOError(fmt::format("creating the object directory '{}': {}",
                                       root, ec.message()));
  }
  if (!fs::is_directory(root, ec)) {
    return Status::InvalidArgument(
        fmt::format("the object directory '{}' is not a directory", root));
  }
  if (::access(root.c_str(), W_OK) != 0) {
    return Status::FromErrno(
        fmt::format("the object directory '{}' is not writable", root), errno);
  }
  std::string canonical = fs::absolute(root, ec).lexically_normal().string();
  while (canonical.size() > 1 && canonical.back() == '/') canonical.pop_back();
  return std::unique_ptr<ObjectStore>(new DirObjectStore(canonical));
}

}  // namespace dcr
