// WeightStore's version-record logic and its background write-back. The
// specs and the backend factory are in store_spec.cc, the backends in
// memory_store.cc, file_store.cc and shm_store.cc.
#include "dcr/store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "common/failpoint.h"
#include "common/file.h"
#include "common/mutex.h"
#include "dcr/thread_pool.h"
#include "store/store_internal.h"

namespace dcr {
namespace {

using store_internal::NowIso8601;

// The background write-back's slice. An fsync waits behind the slices in
// flight, one per store: on the testbed's shared disk (8 relay stores of
// 100 MB and the root's baseline, tools: 4 refits at 3%) the commit phase
// took 0.43 s with 16 MiB slices, 0.12-0.2 s with 4 MiB, 0.04-0.06 s with
// 1 MiB and 0.03 s with 256 KiB, as fast as with no write-back at all. A
// store's own write-back runs as fast in 256 KiB slices as in one msync
// (1.6-2.0 GB/s for 400 MB on the same disk).
constexpr size_t kBackgroundSliceBytes = size_t{256} << 10;

std::string VersionString(const Version& v) {
  return "step " + std::to_string(v.step) + " (" + v.digest.ShortHex() + ")";
}

}  // namespace

// ------------------------------------------------------------- WeightStore

// The version record and its locks. persist_mu is taken before mu, never
// after.
struct WeightStore::Records {
  explicit Records(VersionRecord found) : record(std::move(found)) {}

  // A copy of the record.
  VersionRecord Get() const DCR_EXCLUDES(mu) {
    MutexLock lock(&mu);
    return record;
  }

  // Writes `next` to the store's record file (if any), then makes it
  // current.
  Status Persist(const WeightStore& store, const VersionRecord& next)
      DCR_REQUIRES(persist_mu) DCR_EXCLUDES(mu);
  // Commit and EndRefit: sync the store's data now, or mark the record and
  // queue a write-back; `next` is the record to write.
  Status SyncThenPersist(WeightStore& store, VersionRecord next,
                         const char* what) DCR_REQUIRES(persist_mu)
      DCR_EXCLUDES(mu);

  // Serializes Commit, BeginRefit, EndRefit, RecoverUnsynced and the
  // write-back's record update, each a read-modify-write of the record
  // (held across I/O).
  Mutex persist_mu;
  // Never held across I/O.
  mutable Mutex mu DCR_ACQUIRED_AFTER(persist_mu);
  VersionRecord record DCR_GUARDED_BY(mu);
  // Counts record writes; a write-back clears the mark only if no record
  // was written since it started.
  uint64_t generation DCR_GUARDED_BY(mu) = 0;
};

WeightStore::WeightStore(std::string describe, std::string record_path,
                         VersionRecord record)
    : describe_(std::move(describe)),
      record_path_(std::move(record_path)),
      records_(std::make_unique<Records>(std::move(record))) {}

// The background write-back: one thread per store, started by
// EnableBackgroundSync. `requested` counts write-backs asked for, `done`
// those finished; a request that arrives during one is served by the next
// (which covers every write before it). Each request names the record
// generation it follows: its write-back may drop the record's mark only if
// no record was written since, since every data write follows a record
// write (BeginRefit) and may have been missed.
struct WeightStore::Syncer {
  using Clock = std::chrono::steady_clock;
  std::string boot_id;
  std::chrono::milliseconds delay{0};  // StoreSpec::write_back_delay
  Mutex mu;
  CondVar cv;  // signalled when requested, done, stop or detached changes
  uint64_t requested DCR_GUARDED_BY(mu) = 0;
  uint64_t done DCR_GUARDED_BY(mu) = 0;
  uint64_t generation DCR_GUARDED_BY(mu) = 0;  // of the latest request
  // The requests a write-back took (done while none runs), and when the
  // first request after them came: the next write-back starts `delay`
  // after it.
  uint64_t taken DCR_GUARDED_BY(mu) = 0;
  Clock::time_point first_untaken DCR_GUARDED_BY(mu);
  // Callers of WaitDataSync: while any waits, the delay is not waited out.
  int waiters DCR_GUARDED_BY(mu) = 0;
  // The last write-back could not drop the mark (a record was written
  // during it, as a refit's BeginRefit): the next starts without the
  // delay, or refits closer together than it would keep the mark forever.
  bool overdue DCR_GUARDED_BY(mu) = false;
  bool stop DCR_GUARDED_BY(mu) = false;
  // DetachDataSync: stopping skips queued requests.
  bool detached DCR_GUARDED_BY(mu) = false;
  // A write-back failed: Linux reports a write-back error once and may mark
  // the failed pages clean, so a later msync that succeeds does not prove
  // they reached the disk. The mark stays for the rest of the process.
  bool poisoned DCR_GUARDED_BY(mu) = false;
  // The last failure not yet returned by WaitDataSync.
  Status failed DCR_GUARDED_BY(mu);
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

Status WeightStore::EnableBackgroundSync(std::chrono::milliseconds delay) {
  DCR_ASSIGN_OR_RETURN(std::string boot, CurrentBootId());
  syncer_ = std::make_unique<Syncer>();
  syncer_->boot_id = std::move(boot);
  syncer_->delay = std::max(delay, std::chrono::milliseconds{0});
  syncer_->thread = std::thread([this] { SyncLoop(); });
  return Status::OK();
}

void WeightStore::StopDataSync() {
  if (!syncer_ || !syncer_->thread.joinable()) return;
  {
    MutexLock lock(&syncer_->mu);
    syncer_->stop = true;
  }
  syncer_->cv.SignalAll();
  syncer_->thread.join();
}

Status WeightStore::WaitDataSync() {
  if (!syncer_) return Status::OK();
  Syncer& s = *syncer_;
  MutexLock lock(&s.mu);
  ++s.waiters;
  s.cv.SignalAll();  // a write-back waiting out its delay starts now
  while (s.done != s.requested && !s.detached) s.cv.Wait(&s.mu);
  --s.waiters;
  return std::exchange(s.failed, Status::OK());
}

void WeightStore::DetachDataSync() {
  if (!syncer_) return;
  MutexLock lock(&syncer_->mu);
  syncer_->detached = true;
  syncer_->cv.SignalAll();
}

void WeightStore::SyncLoop() {
  Syncer& s = *syncer_;
  Records& r = *records_;
  MutexLock lock(&s.mu);
  for (;;) {
    // Stopping still finishes a queued write-back: a clean shutdown leaves
    // the data on disk and the record unmarked (unless detached: the next
    // open settles the mark).
    while (!s.stop && s.requested <= s.done) s.cv.Wait(&s.mu);
    if (s.requested == s.done || (s.stop && s.detached)) return;
    // Lets commits close together share this write-back, unless the store
    // closes or someone waits for the data.
    const Syncer::Clock::time_point due = s.first_untaken + s.delay;
    while (!s.stop && s.waiters == 0 && !s.overdue &&
           Syncer::Clock::now() < due) {
      s.cv.WaitUntil(&s.mu, due);
    }
    if (s.stop && s.detached) return;
    const uint64_t serving = s.requested;
    s.taken = serving;
    const uint64_t generation = s.generation;
    lock.Unlock();
    Status st;
    if (DCR_FAILPOINT("store.data_sync").drop()) {
      st = Status::IOError("write-back skipped (failpoint store.data_sync)");
    } else {
      st = SyncData(kBackgroundSliceBytes);
    }
    bool kept_mark = false;
    if (st.ok()) {
      MutexLock persist(&r.persist_mu);
      VersionRecord next = r.Get();
      bool current;
      {
        MutexLock g(&r.mu);
        current = r.generation == generation;
      }
      bool poisoned;
      {
        MutexLock g(&s.mu);
        poisoned = s.poisoned;
      }
      if (current && next.unsynced && !poisoned && RecordIsOurs(next)) {
        next.unsynced.reset();
        st = r.Persist(*this, next);
      }
      kept_mark = !current && next.unsynced.has_value();
    }
    if (!st.ok()) {
      spdlog::error(
          "{}: background write-back failed: {}; the record keeps its "
          "\"unsynced\" mark from now on, so a restart after a reboot "
          "re-checks the bits",
          describe_, st.ToString());
    }
    lock.Lock();
    s.done = serving;
    s.overdue = kept_mark;
    if (!st.ok()) {
      s.failed = st;
      s.poisoned = true;
    }
    s.cv.SignalAll();
  }
}

bool WeightStore::RecordIsOurs(const VersionRecord& ours) const {
  if (record_path_.empty()) return true;
  auto found = ReadVersionRecord(record_path_);
  if (found.ok() && *found && **found == ours) return true;
  // Someone else wrote or removed it since (an operator, or a file and
  // record put back while a process that keeps the store waited for its
  // next refit): the write-back must not put this store's back.
  spdlog::warn(
      "{}: the version record at {} is not the one this store wrote; the "
      "background write-back leaves it as it is",
      describe_, record_path_);
  return false;
}

Status WeightStore::ModifyTensor(
    size_t i, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
    const std::function<Status(std::span<std::byte>)>& fn) {
  std::span<std::byte> t = MutableTensor(i);
  if (offset > t.size() || size > t.size() - offset) {
    return Status::InvalidArgument(
        "change of " + std::to_string(size) + " bytes at offset " +
        std::to_string(offset) + " is past the end of tensor '" +
        manifest()[i].name + "' (" + std::to_string(t.size()) + " bytes)");
  }
  if (from > to || to > size) {
    return Status::InvalidArgument(
        "window [" + std::to_string(from) + ", " + std::to_string(to) +
        ") is not inside a change of " + std::to_string(size) + " bytes");
  }
  return fn(t.subspan(offset, size));
}

bool WeightStore::ModifiesByCopy(size_t /*i*/, uint64_t /*size*/) const {
  return false;
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
    d.tensors[i] = TensorDigest(Tensor(i));
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
  MutexLock lock(&records_->mu);
  if (!records_->record.committed) return std::nullopt;
  return records_->record.committed->version;
}

std::optional<RefitInProgress> WeightStore::InProgress() const {
  MutexLock lock(&records_->mu);
  return records_->record.in_progress;
}

VersionRecord WeightStore::record() const { return records_->Get(); }

Status WeightStore::Records::Persist(const WeightStore& store,
                                     const VersionRecord& next) {
  if (!store.record_path_.empty()) {
    DCR_RETURN_IF_ERROR(WriteVersionRecord(store.record_path_, next)
                            .WithContext(store.describe_));
  }
  MutexLock lock(&mu);
  record = next;
  ++generation;
  return Status::OK();
}

Status WeightStore::Records::SyncThenPersist(WeightStore& store,
                                             VersionRecord next,
                                             const char* what) {
  Syncer* syncer = store.syncer_.get();
  if (syncer == nullptr) {
    DCR_RETURN_IF_ERROR(
        store.SyncData(0).WithContext(store.describe_ + ": " + what));
    next.unsynced.reset();
    return Persist(store, next);
  }
  // Mark the record, keeping the earliest unsynced time of this boot: the
  // data has been unsynced since then.
  if (!next.unsynced || next.unsynced->boot_id != syncer->boot_id) {
    // Without a mark the data on disk holds the record's committed version
    // (every commit since was written back); with one from another boot,
    // nobody knows.
    const VersionRecord now = store.record();
    std::optional<Version> synced;
    if (!now.unsynced && now.committed) synced = now.committed->version;
    next.unsynced = DataUnsynced{syncer->boot_id, NowIso8601(), synced};
  }
  DCR_RETURN_IF_ERROR(Persist(store, next));
  uint64_t written;
  {
    MutexLock lock(&mu);
    written = generation;
  }
  {
    MutexLock lock(&syncer->mu);
    if (syncer->requested == syncer->taken) {
      syncer->first_untaken = Syncer::Clock::now();
    }
    ++syncer->requested;
    syncer->generation = written;
  }
  syncer->cv.SignalAll();
  return Status::OK();
}

Status WeightStore::UpgradeLegacyDigests() {
  MutexLock persist(&records_->persist_mu);
  const VersionRecord found = record();
  if (!found.legacy_digests) return Status::OK();
  const std::string where =
      describe_ + ": its version record '" + record_path() +
      "' was written by an earlier dcr, which named versions by XXH3 digests";
  const std::string reseed =
      "remove the record and seed the store again (a relay's store: dcr "
      "refit --full --node NAME)";
  VersionRecord next = found;
  if (found.in_progress) {
    // The bits are a mix of the refit's base and target under digests this
    // build does not compute, and no coordinator of this build can finish
    // that refit: the store counts as never committed, to be seeded.
    spdlog::warn(
        "{}, and names refit {} in progress, which this dcr cannot finish or "
        "restore: the store now counts as never committed; seed it (a "
        "relay's store: dcr refit --full --node NAME)",
        where, found.in_progress->refit.ToHex());
    next = VersionRecord();
    next.manifest = found.manifest;
    return records_->Persist(*this, next);
  }
  next.legacy_digests = false;
  // The synced version's bits are gone: it cannot be re-hashed, and an
  // unknown one is what records older than the field say.
  if (next.unsynced) next.unsynced->synced.reset();
  if (found.committed) {
    const Manifest& m = manifest();
    std::vector<Digest128> old_digests(m.size()), digests(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      old_digests[i] = Hash128(Tensor(i));
      digests[i] = TensorDigest(Tensor(i));
    }
    const Version& v = found.committed->version;
    if (VersionDigest(m.digest(), old_digests) == v.digest) {
      next.committed->version.digest = VersionDigest(m.digest(), digests);
      spdlog::info("{}: re-hashed step {} with linear digests: {} (was {})",
                   describe_, v.step, next.committed->version.digest.ShortHex(),
                   v.digest.ShortHex());
    } else if (found.unsynced) {
      // A write-back that did not finish (RecoverUnsynced's case, without
      // the synced version it would need): the store counts as never
      // committed, and a dense copy repairs it.
      spdlog::warn(
          "{}: the bits on disk do not hold step {} ({}) that the record of "
          "an earlier dcr names, whose write-back had not finished; the "
          "store counts as never committed (seed it; a relay's store: dcr "
          "refit --full --node NAME)",
          describe_, v.step, v.digest.ShortHex());
      next.committed.reset();
      next.unsynced.reset();
    } else {
      return Status::Corruption(
          where + "; its bits do not hold the version it names (step " +
          std::to_string(v.step) + ", " + v.digest.ShortHex() + "): " + reseed);
    }
  }
  return records_->Persist(*this, next);
}

Status WeightStore::RecoverUnsynced(const std::string& boot_id) {
  // At open, before the store is shared; locked all the same, since
  // Persist requires it.
  MutexLock persist(&records_->persist_mu);
  const VersionRecord found = record();
  if (!found.unsynced) return Status::OK();
  VersionRecord next = found;
  next.unsynced.reset();
  if (found.unsynced->boot_id == boot_id) {
    // Only the process stopped: the page cache holds every write. Write
    // it back now, then drop the mark.
    DCR_RETURN_IF_ERROR(SyncData(0).WithContext(
        describe_ + ": writing back the data of the last commit"));
    return records_->Persist(*this, next);
  }
  // The host restarted before the write-back finished: the disk may hold
  // older bits than the record says, down to the version the mark names as
  // synced. A refit in progress already says the bits are a mix (of its
  // base and target): with a synced version below its base, the mix now
  // reaches down to it. Otherwise the bits must prove the committed
  // version.
  const std::optional<Version>& synced = found.unsynced->synced;
  if (found.in_progress && synced && *synced != found.in_progress->base) {
    spdlog::warn(
        "{}: the host restarted during refit {} before the data was written "
        "back (since {}): the bits are a mix of {} and later versions up "
        "to {}; the coordinator repairs it",
        describe_, found.in_progress->refit.ToHex(), found.unsynced->since,
        VersionString(*synced), VersionString(found.in_progress->target));
    next.in_progress->base = *synced;
  }
  if (found.committed && !found.in_progress) {
    ThreadPool pool(std::max(1u, std::thread::hardware_concurrency()));
    const Digest128 digest = Digests(&pool).version;
    if (digest == found.committed->version.digest) {
      spdlog::info(
          "{}: the host restarted before the data of {} was written back "
          "(since {}); the bits were checked and hold it",
          describe_, VersionString(found.committed->version),
          found.unsynced->since);
    } else if (synced) {
      // Every element holds `synced` or a later version up to the one
      // committed: recorded as that refit left unfinished from `synced`,
      // which the coordinator repairs with the change sets between them.
      spdlog::warn(
          "{}: the host restarted before the data of {} was written back "
          "(since {}), and the bits on disk do not hold it (digest {}): they "
          "are a mix of {} and later versions up to it; the coordinator "
          "repairs it",
          describe_, VersionString(found.committed->version),
          found.unsynced->since, digest.ShortHex(), VersionString(*synced));
      next.in_progress =
          RefitInProgress{found.committed->refit, *synced,
                          found.committed->version, found.unsynced->since};
      next.committed.reset();
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
  return records_->Persist(*this, next);
}

Status WeightStore::Commit(const Version& version, const RefitId& refit) {
  MutexLock persist(&records_->persist_mu);
  VersionRecord next = record();
  if (next.in_progress) {
    const RefitInProgress& p = *next.in_progress;
    // A zero target digest: the refit began before its target's digest
    // was known (it comes at END); the step still has to match.
    if (p.refit != refit || !SameTarget(p.target, version)) {
      return Status::InvalidArgument(
          describe_ + ": commit of refit " + refit.ToHex() + " to " +
          VersionString(version) + " while refit " + p.refit.ToHex() + " to " +
          VersionString(p.target) + " is in progress");
    }
  }
  next.committed = CommitInfo{version, refit, NowIso8601()};
  next.in_progress.reset();
  return records_->SyncThenPersist(*this, std::move(next), "commit");
}

Status WeightStore::BeginRefit(const RefitId& refit, const Version& base,
                               const Version& target) {
  MutexLock persist(&records_->persist_mu);
  VersionRecord next = record();
  next.in_progress = RefitInProgress{refit, base, target, NowIso8601()};
  return records_->Persist(*this, next);
}

Status WeightStore::EndRefit() {
  MutexLock persist(&records_->persist_mu);
  VersionRecord next = record();
  if (!next.in_progress) return Status::OK();
  next.in_progress.reset();
  return records_->SyncThenPersist(*this, std::move(next), "end refit");
}

}  // namespace dcr
