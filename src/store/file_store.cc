// The file store: a safetensors checkpoint (one file, a sharded directory or
// an index) opened read-write and mapped shared, so applied chunks change
// the files in place.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "store/store_internal.h"

namespace dcr::store_internal {
namespace {

class FileStore final : public WeightStore {
 public:
  FileStore(std::string describe, std::string record_path, VersionRecord record,
            UniqueFd lock, std::unique_ptr<Checkpoint> checkpoint)
      : WeightStore(std::move(describe), std::move(record_path),
                    std::move(record)),
        lock_(std::move(lock)),
        checkpoint_(std::move(checkpoint)) {}
  ~FileStore() override { StopDataSync(); }

  // Settles a record left unsynced, then starts the write-back thread for
  // kBackground (or keeps syncing at commit where the boot id is unknown).
  Status Start(const StoreSpec& spec) {
    DCR_RETURN_IF_ERROR(UpgradeLegacyDigests());
    Result<std::string> boot = CurrentBootId();
    DCR_RETURN_IF_ERROR(RecoverUnsynced(boot.ok() ? *boot : std::string()));
    if (spec.data_sync != StoreSpec::DataSync::kBackground) {
      return Status::OK();
    }
    if (!boot.ok()) {
      spdlog::warn("{}: syncing data at each commit: {}", describe(),
                   boot.status().ToString());
      return Status::OK();
    }
    return EnableBackgroundSync(spec.write_back_delay);
  }

  const Manifest& manifest() const override { return checkpoint_->manifest(); }
  std::span<const std::byte> Tensor(size_t i) const override {
    return checkpoint_->TensorData(i);
  }
  std::span<std::byte> MutableTensor(size_t i) override {
    return checkpoint_->MutableTensorData(i);
  }
  Status WriteTensor(size_t i, uint64_t offset,
                     std::span<const std::byte> bytes) override {
    return checkpoint_->WriteTensorData(i, offset, bytes);
  }
  Status ModifyTensor(
      size_t i, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
      const std::function<Status(std::span<std::byte>)>& fn) override {
    return checkpoint_->ModifyTensorData(i, offset, size, from, to, fn);
  }
  bool ModifiesByCopy(size_t i, uint64_t size) const override {
    return checkpoint_->ModifiesByCopy(i, size);
  }

 protected:
  Status SyncData(size_t slice_bytes) override {
    return checkpoint_->Flush(slice_bytes);
  }

 private:
  UniqueFd lock_;  // holds the flock for the store's lifetime
  std::unique_ptr<Checkpoint> checkpoint_;
};

// A read-only anonymous mapping of `size` zero bytes. The kernel backs it
// with the shared zero page, so it costs address space, not memory.
class ZeroPages {
 public:
  static Result<ZeroPages> Map(size_t size) {
    ZeroPages z;
    if (size == 0) return z;
    void* p = ::mmap(nullptr, size, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Status::FromErrno(
          "cannot map " + std::to_string(size) + " bytes of zeros", errno);
    }
    z.data_ = static_cast<const std::byte*>(p);
    z.size_ = size;
    return z;
  }
  ZeroPages() = default;
  ZeroPages(ZeroPages&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  ZeroPages& operator=(ZeroPages&&) = delete;
  ~ZeroPages() {
    if (data_ != nullptr) {
      ::munmap(const_cast<std::byte*>(data_), size_);
    }
  }
  std::span<const std::byte> data(size_t n) const { return {data_, n}; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

Status LockExclusive(int fd, const std::string& what) {
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return Status::IOError(what +
                             " is already open in another dcr process (or "
                             "another store in this one)");
    }
    return Status::FromErrno("cannot lock " + what, errno);
  }
  return Status::OK();
}

Result<std::unique_ptr<WeightStore>> OpenFileStore(
    const std::string& path, const std::string& record_path,
    const StoreSpec& spec) {
  const std::string describe = "file:" + path;
  // O_RDONLY opens directories as well as files; the lock is advisory.
  // O_NONBLOCK: a FIFO must not hang the open (Checkpoint::Open refuses it).
  UniqueFd lock(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!lock.valid()) {
    if (errno == ENOENT) {
      return Status::NotFound("store '" + describe + "' does not exist");
    }
    return Status::FromErrno("cannot open store '" + describe + "'", errno);
  }
  DCR_RETURN_IF_ERROR(LockExclusive(lock.get(), "store '" + describe + "'"));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> cp,
                       Checkpoint::Open(path, Checkpoint::Mode::kReadWrite));
  DCR_RETURN_IF_ERROR(CheckRecordDirWritable(record_path));
  DCR_ASSIGN_OR_RETURN(VersionRecord record,
                       LoadRecord(record_path, cp->manifest()));
  std::unique_ptr<FileStore> store(
      new FileStore(describe, record_path, std::move(record), std::move(lock),
                    std::move(cp)));
  DCR_RETURN_IF_ERROR(store->Start(spec));
  return std::unique_ptr<WeightStore>(std::move(store));
}

Result<std::unique_ptr<WeightStore>> CreateFileStore(
    const std::string& path, const std::string& record_path,
    const StoreSpec& spec, const Manifest& manifest,
    const std::map<std::string, std::string>& metadata) {
  const std::string describe = "file:" + path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    return Status::InvalidArgument("cannot create store '" + describe +
                                   "': it already exists");
  }
  if (errno != ENOENT) {
    return Status::FromErrno("cannot create store '" + describe + "'", errno);
  }
  DCR_RETURN_IF_ERROR(CheckRecordDirWritable(record_path));
  DCR_RETURN_IF_ERROR(RemoveRecord(record_path));

  uint64_t largest = 0;
  for (const TensorInfo& t : manifest.tensors()) {
    largest = std::max(largest, t.NumBytes());
  }
  DCR_ASSIGN_OR_RETURN(ZeroPages zeros, ZeroPages::Map(largest));
  std::vector<TensorToWrite> tensors;
  tensors.reserve(manifest.size());
  for (const TensorInfo& t : manifest.tensors()) {
    tensors.push_back(TensorToWrite{t, zeros.data(t.NumBytes())});
  }
  DCR_RETURN_IF_ERROR(
      WriteSafetensors(path, tensors, metadata)
          .WithContext("cannot create store '" + describe + "'"));
  return OpenFileStore(path, record_path, spec);
}

}  // namespace dcr::store_internal
