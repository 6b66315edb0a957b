// The shm store: a POSIX shared-memory object holding a complete safetensors
// image, so that a serving process can shm_open it, mmap it and parse it as
// it would parse a .safetensors file:
//
//   u64 LE   N, the header length
//   N bytes  JSON header padded with spaces to a multiple of 8
//   ...      tensor data, back to back in canonical order
//
// The relay maps the object shared and read-write and applies chunks in
// place; readers that map it see the writes as they happen (the version
// record says when they form a committed version).
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/cleanup.h"
#include "common/file.h"
#include "dcr/store.h"
#include "format/safetensors_header.h"
#include "store/store_internal.h"

namespace dcr::store_internal {
namespace {

// A shared read-write mapping, unmapped on destruction.
class SharedMapping {
 public:
  SharedMapping() = default;
  SharedMapping(std::byte* data, size_t size) : data_(data), size_(size) {}
  SharedMapping(SharedMapping&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  SharedMapping& operator=(SharedMapping&&) = delete;
  ~SharedMapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class ShmStore final : public WeightStore {
 public:
  struct Location {
    uint64_t offset;  // from the start of the image
    uint64_t size;
  };

  ShmStore(std::string describe, std::string record_path, VersionRecord record,
           UniqueFd fd, SharedMapping map, Manifest manifest,
           std::vector<Location> locations)
      : WeightStore(std::move(describe), std::move(record_path),
                    std::move(record)),
        fd_(std::move(fd)),
        map_(std::move(map)),
        manifest_(std::move(manifest)),
        locations_(std::move(locations)) {}

  // At open: a record of an earlier build's digests is upgraded first.
  Status Start() { return UpgradeLegacyDigests(); }

  const Manifest& manifest() const override { return manifest_; }
  std::span<const std::byte> Tensor(size_t i) const override {
    return {map_.data() + locations_[i].offset, locations_[i].size};
  }
  std::span<std::byte> MutableTensor(size_t i) override {
    return {map_.data() + locations_[i].offset, locations_[i].size};
  }

 protected:
  // Shared memory has no backing store to flush: once written, the bits are
  // visible to every process mapping the object, and they last until the
  // object is unlinked or the host reboots.
  Status SyncData(size_t) override { return Status::OK(); }

 private:
  UniqueFd fd_;  // holds the flock for the store's lifetime
  SharedMapping map_;
  Manifest manifest_;
  std::vector<Location> locations_;
};

struct ParsedImage {
  Manifest manifest;
  std::vector<ShmStore::Location> locations;
};

// Parses the safetensors image in `map` with the format module's validator.
Result<ParsedImage> ParseImage(const SharedMapping& map,
                               const std::string& describe) {
  DCR_ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      ParseSafetensorsHeader({map.data(), map.size()}, map.size(), describe));
  std::vector<TensorInfo> infos;
  infos.reserve(header.tensors.size());
  for (const SafetensorsEntry& e : header.tensors) infos.push_back(e.info);
  Result<Manifest> manifest = Manifest::Create(std::move(infos));
  if (!manifest.ok()) {
    return Status::Corruption(describe + ": " +
                              std::string(manifest.status().message()));
  }
  ParsedImage image;
  image.manifest = std::move(manifest).value();
  // Header entries come out bytewise by name, the manifest's order.
  image.locations.reserve(header.tensors.size());
  for (const SafetensorsEntry& e : header.tensors) {
    image.locations.push_back({header.data_offset + e.begin, e.end - e.begin});
  }
  return image;
}

Result<SharedMapping> MapShared(int fd, size_t size,
                                const std::string& describe) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno("cannot mmap '" + describe + "'", errno);
  }
  return SharedMapping(static_cast<std::byte*>(p), size);
}

Result<std::unique_ptr<WeightStore>> FinishOpen(const std::string& name,
                                                const std::string& record_path,
                                                UniqueFd fd, SharedMapping map,
                                                const Manifest* expected) {
  const std::string describe = "shm:" + name;
  DCR_ASSIGN_OR_RETURN(ParsedImage image, ParseImage(map, describe));
  if (expected != nullptr && image.manifest.digest() != expected->digest()) {
    return Status::Internal(describe +
                            ": the image written does not parse back to its "
                            "manifest: " +
                            Manifest::Difference(*expected, image.manifest));
  }
  DCR_ASSIGN_OR_RETURN(VersionRecord record,
                       LoadRecord(record_path, image.manifest));
  std::unique_ptr<ShmStore> store(new ShmStore(
      describe, record_path, std::move(record), std::move(fd), std::move(map),
      std::move(image.manifest), std::move(image.locations)));
  DCR_RETURN_IF_ERROR(store->Start());
  return std::unique_ptr<WeightStore>(std::move(store));
}

}  // namespace

Status ValidateShmName(std::string_view name) {
  const std::string shown(name);
  if (name.size() < 2 || name.front() != '/') {
    return Status::InvalidArgument("shm name '" + shown +
                                   "' must be '/' followed by a name");
  }
  const std::string_view rest = name.substr(1);
  if (rest.size() > NAME_MAX) {
    return Status::InvalidArgument("shm name '" + shown + "' is longer than " +
                                   std::to_string(NAME_MAX) + " characters");
  }
  if (rest == "." || rest == "..") {
    return Status::InvalidArgument("shm name '" + shown + "' is not a name");
  }
  for (const char c : rest) {
    if (c == '/' || c == '\0') {
      return Status::InvalidArgument("shm name '" + shown +
                                     "' may hold no '/' after the leading one");
    }
  }
  return Status::OK();
}

Result<std::string> SafetensorsPrefix(
    const Manifest& manifest,
    const std::map<std::string, std::string>& metadata) {
  DCR_ASSIGN_OR_RETURN(
      std::string h, BuildSafetensorsHeaderJson(manifest.tensors(), metadata));
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.size() > kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument("safetensors header would be " +
                                   std::to_string(h.size()) +
                                   " bytes, more than the limit " +
                                   std::to_string(kMaxSafetensorsHeaderBytes));
  }
  std::string prefix(8, '\0');
  StoreLE<uint64_t>(prefix.data(), h.size());
  return prefix + h;
}

Result<std::unique_ptr<WeightStore>> OpenShmStore(
    const std::string& name, const std::string& record_path) {
  const std::string describe = "shm:" + name;
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return Status::NotFound("store '" + describe + "' does not exist");
    }
    return Status::FromErrno("cannot open store '" + describe + "'", errno);
  }
  DCR_RETURN_IF_ERROR(LockExclusive(fd.get(), "store '" + describe + "'"));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return Status::FromErrno("cannot stat '" + describe + "'", errno);
  }
  if (st.st_size < 8) {
    return Status::Corruption("safetensors image '" + describe + "' is " +
                              std::to_string(st.st_size) +
                              " bytes long, too short for a header");
  }
  DCR_RETURN_IF_ERROR(CheckRecordDirWritable(record_path));
  DCR_ASSIGN_OR_RETURN(
      SharedMapping map,
      MapShared(fd.get(), static_cast<size_t>(st.st_size), describe));
  return FinishOpen(name, record_path, std::move(fd), std::move(map), nullptr);
}

Result<std::unique_ptr<WeightStore>> CreateShmStore(
    const std::string& name, const std::string& record_path,
    const Manifest& manifest,
    const std::map<std::string, std::string>& metadata) {
  const std::string describe = "shm:" + name;
  DCR_ASSIGN_OR_RETURN(std::string prefix,
                       SafetensorsPrefix(manifest, metadata));
  const uint64_t total = prefix.size() + manifest.TotalBytes();
  DCR_RETURN_IF_ERROR(CheckRecordDirWritable(record_path));
  DCR_RETURN_IF_ERROR(RemoveRecord(record_path));

  UniqueFd fd(
      ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return Status::InvalidArgument("cannot create store '" + describe +
                                     "': it already exists");
    }
    return Status::FromErrno("cannot create store '" + describe + "'", errno);
  }
  Cleanup guard([&name] { ::shm_unlink(name.c_str()); });
  DCR_RETURN_IF_ERROR(LockExclusive(fd.get(), "store '" + describe + "'"));
  // Reserve the memory now: a full tmpfs then fails here with ENOSPC
  // instead of raising SIGBUS on some later write through the mapping.
  const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(total));
  if (err != 0) {
    return Status::FromErrno("cannot reserve " + std::to_string(total) +
                                 " bytes for '" + describe + "'",
                             err);
  }
  DCR_ASSIGN_OR_RETURN(
      SharedMapping map,
      MapShared(fd.get(), static_cast<size_t>(total), describe));
  std::memcpy(map.data(), prefix.data(), prefix.size());
  DCR_ASSIGN_OR_RETURN(
      std::unique_ptr<WeightStore> store,
      FinishOpen(name, record_path, std::move(fd), std::move(map), &manifest));
  guard.Cancel();
  return store;
}

Status UnlinkShm(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("cannot unlink shm object '" + name + "'", errno);
  }
  return Status::OK();
}

}  // namespace dcr::store_internal
