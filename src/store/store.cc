// WeightStore's version-record logic, store specs, the backend factory and
// the memory store.
#include "dcr/store.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "common/failpoint.h"
#include "common/file.h"
#include "dcr/thread_pool.h"
#include "store/store_internal.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using store_internal::NowIso8601;

constexpr std::string_view kRecordSuffix = ".dcr-version";
constexpr std::string_view kDirRecordName = "store.dcr-version";
constexpr std::string_view kShmDir = "/dev/shm/";
// Memory stores align every tensor to a cache line.
constexpr uint64_t kMemoryAlign = 64;

std::string VersionString(const Version& v) {
  return "step " + std::to_string(v.step) + " (" + v.digest.ShortHex() + ")";
}

// Heap memory for tests: all tensors in one zero-initialized buffer.
class MemoryStore final : public WeightStore {
 public:
  explicit MemoryStore(Manifest manifest)
      : WeightStore("memory:", "",
                    VersionRecord{manifest.digest(), {}, {}, {}}),
        manifest_(std::move(manifest)) {
    offsets_.reserve(manifest_.size());
    uint64_t total = 0;
    for (const TensorInfo& t : manifest_.tensors()) {
      offsets_.push_back(total);
      total += (t.NumBytes() + kMemoryAlign - 1) / kMemoryAlign * kMemoryAlign;
    }
    // make_unique value-initializes, so the store starts as zeros.
    buffer_ = std::make_unique<std::byte[]>(total + kMemoryAlign);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buffer_.get());
    base_ = buffer_.get() + (kMemoryAlign - p % kMemoryAlign) % kMemoryAlign;
  }

  const Manifest& manifest() const override { return manifest_; }
  std::span<const std::byte> Tensor(size_t i) const override {
    return {base_ + offsets_[i], manifest_[i].NumBytes()};
  }
  std::span<std::byte> MutableTensor(size_t i) override {
    return {base_ + offsets_[i], manifest_[i].NumBytes()};
  }

 protected:
  Status SyncData() override { return Status::OK(); }

 private:
  Manifest manifest_;
  std::vector<uint64_t> offsets_;
  std::unique_ptr<std::byte[]> buffer_;
  std::byte* base_ = nullptr;
};

std::string ResolvedRecordPath(const StoreSpec& spec) {
  return spec.record_path.empty() ? DefaultRecordPath(spec) : spec.record_path;
}

}  // namespace

// ------------------------------------------------------------- WeightStore

WeightStore::WeightStore(std::string describe, std::string record_path,
                         VersionRecord record)
    : describe_(std::move(describe)),
      record_path_(std::move(record_path)),
      record_(std::move(record)) {}

// The background write-back: one thread per store, started by
// EnableBackgroundSync. `requested` counts write-backs asked for, `done`
// those finished; a request that arrives during one is served by the next
// (which covers every write before it). Each request names the record
// generation it follows: its write-back may drop the record's mark only if
// no record was written since, since every data write follows a record
// write (BeginRefit) and may have been missed.
struct WeightStore::Syncer {
  std::string boot_id;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t requested = 0;
  uint64_t done = 0;
  uint64_t generation = 0;  // of the latest request
  bool stop = false;
  bool detached = false;  // DetachDataSync: stopping skips queued requests
  // A write-back failed: Linux reports a write-back error once and may mark
  // the failed pages clean, so a later msync that succeeds does not prove
  // they reached the disk. The mark stays for the rest of the process.
  bool poisoned = false;
  Status failed;  // the last failure not yet returned by WaitDataSync
  std::thread thread;
};

WeightStore::~WeightStore() {
  // A backend with a syncer must have stopped it (SyncData is gone by now).
  if (syncer_ && syncer_->thread.joinable()) std::terminate();
}

Result<std::string> CurrentBootId() {
  static constexpr const char* kPath = "/proc/sys/kernel/random/boot_id";
  Result<std::string> text = ReadFileToString(kPath);
  if (!text.ok()) return text.status();
  std::string id = *std::move(text);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.size() != 36) {
    return Status::Unsupported(std::string(kPath) + " holds '" + id +
                               "', not a boot id");
  }
  return id;
}

Status WeightStore::EnableBackgroundSync() {
  DCR_ASSIGN_OR_RETURN(std::string boot, CurrentBootId());
  syncer_ = std::make_unique<Syncer>();
  syncer_->boot_id = std::move(boot);
  syncer_->thread = std::thread([this] { SyncLoop(); });
  return Status::OK();
}

void WeightStore::StopDataSync() {
  if (!syncer_ || !syncer_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(syncer_->mu);
    syncer_->stop = true;
  }
  syncer_->cv.notify_all();
  syncer_->thread.join();
}

Status WeightStore::WaitDataSync() {
  if (!syncer_) return Status::OK();
  std::unique_lock<std::mutex> lock(syncer_->mu);
  syncer_->cv.wait(lock, [this] {
    return syncer_->done == syncer_->requested || syncer_->detached;
  });
  return std::exchange(syncer_->failed, Status::OK());
}

void WeightStore::DetachDataSync() {
  if (!syncer_) return;
  std::lock_guard<std::mutex> lock(syncer_->mu);
  syncer_->detached = true;
  syncer_->cv.notify_all();
}

void WeightStore::SyncLoop() {
  Syncer& s = *syncer_;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    // Stopping still finishes a queued write-back: a clean shutdown leaves
    // the data on disk and the record unmarked (unless detached: the next
    // open settles the mark).
    s.cv.wait(lock, [&s] { return s.stop || s.requested > s.done; });
    if (s.requested == s.done || (s.stop && s.detached)) return;
    const uint64_t serving = s.requested;
    const uint64_t generation = s.generation;
    lock.unlock();
    Status st;
    if (DCR_FAILPOINT("store.data_sync").drop()) {
      st = Status::IOError("write-back skipped (failpoint store.data_sync)");
    } else {
      st = SyncData();
    }
    if (st.ok()) {
      std::lock_guard<std::mutex> persist(persist_mu_);
      VersionRecord next = record();
      bool current;
      {
        std::lock_guard<std::mutex> g(mu_);
        current = generation_ == generation;
      }
      bool poisoned;
      {
        std::lock_guard<std::mutex> g(s.mu);
        poisoned = s.poisoned;
      }
      if (current && next.unsynced && !poisoned) {
        next.unsynced.reset();
        st = Persist(next);
      }
    }
    if (!st.ok()) {
      spdlog::error(
          "{}: background write-back failed: {}; the record keeps its "
          "\"unsynced\" mark from now on, so a restart after a reboot "
          "re-checks the bits",
          describe_, st.ToString());
    }
    lock.lock();
    s.done = serving;
    if (!st.ok()) {
      s.failed = st;
      s.poisoned = true;
    }
    s.cv.notify_all();
  }
}

Status WeightStore::WriteTensor(size_t i, uint64_t offset,
                                std::span<const std::byte> bytes) {
  std::span<std::byte> t = MutableTensor(i);
  if (offset > t.size() || bytes.size() > t.size() - offset) {
    return Status::InvalidArgument(
        "write of " + std::to_string(bytes.size()) + " bytes at offset " +
        std::to_string(offset) + " is past the end of tensor '" +
        manifest()[i].name + "' (" + std::to_string(t.size()) + " bytes)");
  }
  if (!bytes.empty())
    std::memcpy(t.data() + offset, bytes.data(), bytes.size());
  return Status::OK();
}

CheckpointDigests WeightStore::Digests(ThreadPool* pool) const {
  const Manifest& m = manifest();
  CheckpointDigests d;
  d.tensors.resize(m.size());
  auto body = [this, &d](size_t i, size_t /*worker*/) {
    d.tensors[i] = Hash128(Tensor(i));
  };
  if (pool != nullptr) {
    pool->ParallelFor(m.size(), body);
  } else {
    for (size_t i = 0; i < m.size(); ++i) body(i, 0);
  }
  d.manifest = m.digest();
  d.version = VersionDigest(d.manifest, d.tensors);
  return d;
}

std::optional<Version> WeightStore::committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!record_.committed) return std::nullopt;
  return record_.committed->version;
}

std::optional<RefitInProgress> WeightStore::InProgress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return record_.in_progress;
}

VersionRecord WeightStore::record() const {
  std::lock_guard<std::mutex> lock(mu_);
  return record_;
}

Status WeightStore::Persist(const VersionRecord& next) {
  if (!record_path_.empty()) {
    DCR_RETURN_IF_ERROR(
        WriteVersionRecord(record_path_, next).WithContext(describe_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  record_ = next;
  ++generation_;
  return Status::OK();
}

Status WeightStore::SyncThenPersist(VersionRecord next, const char* what) {
  if (!syncer_) {
    DCR_RETURN_IF_ERROR(SyncData().WithContext(describe_ + ": " + what));
    next.unsynced.reset();
    return Persist(next);
  }
  // Mark the record, keeping the earliest unsynced time of this boot: the
  // data has been unsynced since then.
  if (!next.unsynced || next.unsynced->boot_id != syncer_->boot_id) {
    next.unsynced = DataUnsynced{syncer_->boot_id, NowIso8601()};
  }
  DCR_RETURN_IF_ERROR(Persist(next));
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = generation_;
  }
  {
    std::lock_guard<std::mutex> lock(syncer_->mu);
    ++syncer_->requested;
    syncer_->generation = generation;
  }
  syncer_->cv.notify_all();
  return Status::OK();
}

Status WeightStore::RecoverUnsynced(const std::string& boot_id) {
  const VersionRecord found = record();
  if (!found.unsynced) return Status::OK();
  VersionRecord next = found;
  next.unsynced.reset();
  if (found.unsynced->boot_id == boot_id) {
    // Only the process stopped: the page cache holds every write. Write
    // it back now, then drop the mark.
    DCR_RETURN_IF_ERROR(SyncData().WithContext(
        describe_ + ": writing back the data of the last commit"));
    return Persist(next);
  }
  // The host restarted before the write-back finished: the disk may hold
  // older bits than the record says. A refit in progress already says the
  // bits are a mix; otherwise the bits must prove the committed version.
  if (found.committed && !found.in_progress) {
    ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
    const Digest128 digest = Digests(&pool).version;
    if (digest == found.committed->version.digest) {
      spdlog::info(
          "{}: the host restarted before the data of {} was written back "
          "(since {}); the bits were checked and hold it",
          describe_, VersionString(found.committed->version),
          found.unsynced->since);
    } else {
      spdlog::warn(
          "{}: the host restarted before the data of {} was written back "
          "(since {}), and the bits on disk do not hold it (digest {}): the "
          "store counts as never committed; a full refit (dcr refit --full) "
          "repairs it",
          describe_, VersionString(found.committed->version),
          found.unsynced->since, digest.ShortHex());
      next.committed.reset();
    }
  }
  return Persist(next);
}

Status WeightStore::Commit(const Version& version, const RefitId& refit) {
  std::lock_guard<std::mutex> persist(persist_mu_);
  VersionRecord next = record();
  if (next.in_progress) {
    const RefitInProgress& p = *next.in_progress;
    if (p.refit != refit || p.target != version) {
      return Status::InvalidArgument(
          describe_ + ": commit of refit " + refit.ToHex() + " to " +
          VersionString(version) + " while refit " + p.refit.ToHex() + " to " +
          VersionString(p.target) + " is in progress");
    }
  }
  next.committed = CommitInfo{version, refit, NowIso8601()};
  next.in_progress.reset();
  return SyncThenPersist(std::move(next), "commit");
}

Status WeightStore::BeginRefit(const RefitId& refit, const Version& base,
                               const Version& target) {
  std::lock_guard<std::mutex> persist(persist_mu_);
  VersionRecord next = record();
  next.in_progress = RefitInProgress{refit, base, target, NowIso8601()};
  return Persist(next);
}

Status WeightStore::EndRefit() {
  std::lock_guard<std::mutex> persist(persist_mu_);
  VersionRecord next = record();
  if (!next.in_progress) return Status::OK();
  next.in_progress.reset();
  return SyncThenPersist(std::move(next), "end refit");
}

// ------------------------------------------------------------------- specs

std::string StoreSpec::ToString() const {
  switch (kind) {
    case Kind::kMemory:
      return "memory:";
    case Kind::kFile:
      return "file:" + path;
    case Kind::kShm:
      return "shm:" + path;
  }
  return "?";
}

Result<StoreSpec> ParseStoreSpec(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view rest =
      colon == std::string_view::npos ? "" : text.substr(colon + 1);
  StoreSpec spec;
  if (kind == "memory") {
    if (!rest.empty()) {
      return Status::InvalidArgument("store '" + std::string(text) +
                                     "': a memory store takes no path");
    }
    spec.kind = StoreSpec::Kind::kMemory;
    return spec;
  }
  if (colon == std::string_view::npos || (kind != "file" && kind != "shm")) {
    return Status::InvalidArgument(
        "store '" + std::string(text) +
        "' is not one of memory:, file:PATH, shm:NAME");
  }
  if (rest.empty()) {
    return Status::InvalidArgument("store '" + std::string(text) +
                                   "' names no path");
  }
  if (kind == "file") {
    spec.kind = StoreSpec::Kind::kFile;
    spec.path = std::string(rest);
    return spec;
  }
  spec.kind = StoreSpec::Kind::kShm;
  spec.path = rest.front() == '/' ? std::string(rest) : "/" + std::string(rest);
  DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
  return spec;
}

std::string DefaultRecordPath(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return "";
    case StoreSpec::Kind::kFile: {
      std::error_code ec;
      if (fs::is_directory(spec.path, ec)) {
        return (fs::path(spec.path) / kDirRecordName).string();
      }
      return spec.path + std::string(kRecordSuffix);
    }
    case StoreSpec::Kind::kShm:
      // spec.path is "/name"; the record sits beside the object.
      return std::string(kShmDir) + spec.path.substr(1) +
             std::string(kRecordSuffix);
  }
  return "";
}

// ----------------------------------------------------------------- factory

Result<std::unique_ptr<WeightStore>> OpenStore(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return Status::InvalidArgument(
          "a memory store cannot be reopened; create it with CreateStore");
    case StoreSpec::Kind::kFile:
      if (spec.path.empty()) {
        return Status::InvalidArgument("file store spec names no path");
      }
      return store_internal::OpenFileStore(spec.path, ResolvedRecordPath(spec),
                                           spec.data_sync);
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      return store_internal::OpenShmStore(spec.path, ResolvedRecordPath(spec));
  }
  return Status::Internal("unknown store kind");
}

Result<std::unique_ptr<WeightStore>> CreateStore(
    const StoreSpec& spec, const Manifest& manifest,
    const std::map<std::string, std::string>& metadata) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return std::unique_ptr<WeightStore>(new MemoryStore(manifest));
    case StoreSpec::Kind::kFile:
      if (spec.path.empty()) {
        return Status::InvalidArgument("file store spec names no path");
      }
      return store_internal::CreateFileStore(
          spec.path, ResolvedRecordPath(spec), spec.data_sync, manifest,
          metadata);
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      return store_internal::CreateShmStore(spec.path, ResolvedRecordPath(spec),
                                            manifest, metadata);
  }
  return Status::Internal("unknown store kind");
}

Result<std::unique_ptr<WeightStore>> CreateMemoryStoreFrom(
    const Checkpoint& checkpoint) {
  auto store = std::make_unique<MemoryStore>(checkpoint.manifest());
  for (size_t i = 0; i < checkpoint.manifest().size(); ++i) {
    const std::span<const std::byte> src = checkpoint.TensorData(i);
    if (!src.empty()) {
      std::memcpy(store->MutableTensor(i).data(), src.data(), src.size());
    }
  }
  return std::unique_ptr<WeightStore>(std::move(store));
}

Status RemoveStore(const StoreSpec& spec) {
  switch (spec.kind) {
    case StoreSpec::Kind::kMemory:
      return Status::OK();
    case StoreSpec::Kind::kFile: {
      const std::string record_path = ResolvedRecordPath(spec);
      std::error_code ec;
      if (fs::is_directory(spec.path, ec)) {
        return Status::InvalidArgument("RemoveStore refuses directory '" +
                                       spec.path + "'");
      }
      DCR_RETURN_IF_ERROR(store_internal::RemoveRecord(record_path));
      if (::unlink(spec.path.c_str()) != 0 && errno != ENOENT) {
        return Status::FromErrno("cannot remove '" + spec.path + "'", errno);
      }
      return Status::OK();
    }
    case StoreSpec::Kind::kShm:
      DCR_RETURN_IF_ERROR(store_internal::ValidateShmName(spec.path));
      DCR_RETURN_IF_ERROR(
          store_internal::RemoveRecord(ResolvedRecordPath(spec)));
      return store_internal::UnlinkShm(spec.path);
  }
  return Status::Internal("unknown store kind");
}

}  // namespace dcr
