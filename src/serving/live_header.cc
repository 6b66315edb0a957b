// The live header (include/dcr/serving.h): a 64-byte shm object under a
// sequence lock. Its one writer (the relay) makes the sequence odd, writes
// the fields, makes it even; a reader retries until it reads the same even
// sequence before and after the fields. Every field is a lock-free 64-bit
// atomic, so a reader in another process never reads a torn word.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "common/file.h"
#include "dcr/serving.h"

namespace dcr {

struct LiveHeader::Raw {
  char magic[8];
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> image;
  std::atomic<uint64_t> step;
  std::atomic<uint64_t> digest_high;
  std::atomic<uint64_t> digest_low;
  std::atomic<uint64_t> flips;
  std::atomic<uint64_t> reserved;
};
static_assert(sizeof(LiveHeader::Raw) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace {

constexpr size_t kRawBytes = 64;
constexpr char kMagic[8] = {'D', 'C', 'R', 'L', 'I', 'V', 'E', '1'};

std::string Base(const StoreSpec& spec) { return spec.path; }

Result<void*> MapHeader(const std::string& name, int flags) {
  UniqueFd fd(::shm_open(name.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return Status::NotFound("no live header shm:" + name +
                              " (the relay has not committed an image yet)");
    }
    return Status::FromErrno("cannot open shm:" + name, errno);
  }
  if (flags & O_CREAT) {
    if (::ftruncate(fd.get(), kRawBytes) != 0) {
      return Status::FromErrno("cannot size shm:" + name, errno);
    }
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return Status::FromErrno("cannot stat shm:" + name, errno);
  }
  if (static_cast<size_t>(st.st_size) != kRawBytes) {
    return Status::Corruption("shm:" + name + " is not a live header (" +
                              std::to_string(st.st_size) +
                              " bytes, not 64); remove it");
  }
  const int prot =
      (flags & O_ACCMODE) == O_RDONLY ? PROT_READ : PROT_READ | PROT_WRITE;
  void* p = ::mmap(nullptr, kRawBytes, prot, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return Status::FromErrno("cannot map shm:" + name, errno);
  return p;
}

}  // namespace

StoreSpec ServingImageSpec(const StoreSpec& spec, uint32_t image) {
  StoreSpec out = spec;
  const std::string suffix = "." + std::to_string(image);
  out.path = Base(spec) + suffix;
  if (!spec.record_path.empty()) {
    constexpr std::string_view kRecord = ".dcr-version";
    std::string r = spec.record_path;
    if (r.ends_with(kRecord)) {
      r.insert(r.size() - kRecord.size(), suffix);
    } else {
      r += suffix;
    }
    out.record_path = r;
  }
  return out;
}

std::string LiveHeaderName(const StoreSpec& spec) {
  return Base(spec) + ".live";
}

Result<UniqueFd> LockImage(const StoreSpec& spec, uint32_t image,
                           bool exclusive) {
  const std::string name =
      Base(spec) + "." + std::to_string(image) + ".readers";
  // Read-only is enough for flock, and lets a server of another user
  // lock what the relay created (and the other way round).
  UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666));
  if (!fd.valid()) {
    return Status::FromErrno("cannot open the reader lock shm:" + name, errno);
  }
  (void)::fchmod(fd.get(), 0666);  // past the umask; fails unless ours
  while (::flock(fd.get(), (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return Status::Aborted(
          exclusive
              ? "a serving process computes on image " + std::to_string(image)
              : "the relay writes image " + std::to_string(image));
    }
    return Status::FromErrno("cannot lock shm:" + name, errno);
  }
  return fd;
}

Result<LiveHeader> LiveHeader::Open(const std::string& name, bool writable) {
  DCR_ASSIGN_OR_RETURN(void* p, MapHeader(name, writable ? O_RDWR : O_RDONLY));
  LiveHeader h(static_cast<Raw*>(p));
  if (std::memcmp(h.raw_->magic, kMagic, sizeof kMagic) != 0) {
    return Status::Corruption("shm:" + name +
                              " is not a live header (bad magic); remove it");
  }
  return h;
}

Result<LiveHeader> LiveHeader::Create(const std::string& name,
                                      const LiveState& state) {
  DCR_ASSIGN_OR_RETURN(void* p, MapHeader(name, O_RDWR | O_CREAT));
  LiveHeader h(static_cast<Raw*>(p));
  if (std::memcmp(h.raw_->magic, kMagic, sizeof kMagic) != 0) {
    // Fresh (zeroed): the fields first, the magic last, so a reader that
    // sees the magic sees a state.
    h.raw_->seq.store(0, std::memory_order_relaxed);
    h.Write(state);
    std::atomic_thread_fence(std::memory_order_release);
    std::memcpy(h.raw_->magic, kMagic, sizeof kMagic);
  } else {
    h.Write(state);
  }
  return h;
}

Status LiveHeader::Remove(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("cannot remove shm:" + name, errno);
  }
  return Status::OK();
}

LiveHeader::LiveHeader(LiveHeader&& o) noexcept
    : raw_(std::exchange(o.raw_, nullptr)) {}

LiveHeader& LiveHeader::operator=(LiveHeader&& o) noexcept {
  if (this != &o) {
    if (raw_ != nullptr) ::munmap(raw_, kRawBytes);
    raw_ = std::exchange(o.raw_, nullptr);
  }
  return *this;
}

LiveHeader::~LiveHeader() {
  if (raw_ != nullptr) ::munmap(raw_, kRawBytes);
}

Result<LiveState> LiveHeader::Read() const {
  for (int attempt = 0;; ++attempt) {
    const uint64_t before = raw_->seq.load(std::memory_order_acquire);
    LiveState s;
    s.image =
        static_cast<uint32_t>(raw_->image.load(std::memory_order_relaxed));
    s.version.step = raw_->step.load(std::memory_order_relaxed);
    s.version.digest.high = raw_->digest_high.load(std::memory_order_relaxed);
    s.version.digest.low = raw_->digest_low.load(std::memory_order_relaxed);
    s.flips = raw_->flips.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t after = raw_->seq.load(std::memory_order_relaxed);
    if (before == after && before % 2 == 0) {
      if (s.image > 1) {
        return Status::Corruption("the live header names image " +
                                  std::to_string(s.image) + " (0 or 1)");
      }
      return s;
    }
    // A writer is under way (or died mid-write: an odd sequence forever).
    if (attempt > 100000) {
      return Status::Corruption(
          "the live header stays mid-write (its relay died writing it?)");
    }
    std::this_thread::yield();
  }
}

void LiveHeader::Write(const LiveState& state) {
  const uint64_t seq = raw_->seq.load(std::memory_order_relaxed);
  // A relay that died mid-write left it odd: make it even again after.
  const uint64_t odd = seq | 1;
  raw_->seq.store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  raw_->image.store(state.image, std::memory_order_relaxed);
  raw_->step.store(state.version.step, std::memory_order_relaxed);
  raw_->digest_high.store(state.version.digest.high, std::memory_order_relaxed);
  raw_->digest_low.store(state.version.digest.low, std::memory_order_relaxed);
  raw_->flips.store(state.flips, std::memory_order_relaxed);
  raw_->seq.store(odd + 1, std::memory_order_release);
}

}  // namespace dcr
