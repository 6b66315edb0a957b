#include "session/journal.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/bytes.h"
#include "dcr/digest.h"

// Layout (docs/FORMAT.md §6), little-endian:
//   header, 128 bytes:
//     0   8  magic "DCRJRNL1"
//     8   4  u32 format (1)
//     12  4  u32 header bytes (128)
//     16  16 refit id
//     32  8  u64 base step,    40  16 base digest (high u64, low u64)
//     56  8  u64 target step,  64  16 target digest
//     80  40 boot id (36 ASCII characters, zero-padded)
//     120 8  u64 XXH3-64 of bytes [0, 120)
//   record:
//     0   4  u32 type (1 apply, 2 voted yes)
//     4   4  u32 payload bytes L
//     8   L  payload
//     8+L 8  u64 XXH3-64 of bytes [0, 8 + L) of the record
//   apply payload:
//     0 u32 tensor, 4 u32 span, 8 u64 byte offset of the span in the tensor,
//     16 u32 count (positions, or the span's elements when dense),
//     20 u8 elem size, 21 u8 flags (bit 0: dense), 22 u16 zero,
//     24 positions (sparse only): count LEB128 gaps, each position minus
//        the previous one minus 1 (the first: the position itself),
//     then count * elem size old bytes (the payload's last bytes)
//   voted-yes payload: the target digest (high u64, low u64)
namespace dcr {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'R', 'J', 'R', 'N', 'L', '1'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderBytes = 128;
constexpr size_t kOffRefit = 16;
constexpr size_t kOffBaseStep = 32;
constexpr size_t kOffBaseDigest = 40;
constexpr size_t kOffTargetStep = 56;
constexpr size_t kOffTargetDigest = 64;
constexpr size_t kOffBootId = 80;
constexpr size_t kBootIdBytes = 36;
constexpr size_t kHeaderChecksum = 120;

constexpr uint32_t kTypeApply = 1;
constexpr uint32_t kTypeVotedYes = 2;
constexpr size_t kRecordHead = 8;
constexpr size_t kRecordTail = 8;
constexpr size_t kApplyFixed = 24;
// A record is at most one span: positions and 8-byte values of
// kMaxSpanElems elements, with room to spare.
constexpr uint64_t kMaxPayload = kMaxSpanElems * 16 + 64;
// Appends between early write-back kicks (see AppendRecord). Small, so
// that the yes vote's fdatasync finds at most this much whose write-back
// had not started (the kicks are asynchronous): a
// journal is a few MB at a few percent change (0.045 bytes per canonical
// byte at 3%), and at 32 MiB nothing was written back before the vote,
// whose fdatasync then waited for all of it (57 ms per relay on the
// testbed, where the relays share one disk).
constexpr uint64_t kWriteBackEvery = 1ull << 20;

void PutDigest(std::byte* p, const Digest128& d) {
  StoreLE<uint64_t>(p, d.high);
  StoreLE<uint64_t>(p + 8, d.low);
}
Digest128 GetDigest(const std::byte* p) {
  return Digest128{LoadLE<uint64_t>(p), LoadLE<uint64_t>(p + 8)};
}

std::vector<std::byte> EncodeHeader(const JournalHeader& h) {
  std::vector<std::byte> b(kHeaderBytes);
  std::memcpy(b.data(), kMagic, sizeof(kMagic));
  StoreLE<uint32_t>(b.data() + 8, kFormat);
  StoreLE<uint32_t>(b.data() + 12, kHeaderBytes);
  std::memcpy(b.data() + kOffRefit, h.refit.bytes.data(), 16);
  StoreLE<uint64_t>(b.data() + kOffBaseStep, h.base.step);
  PutDigest(b.data() + kOffBaseDigest, h.base.digest);
  StoreLE<uint64_t>(b.data() + kOffTargetStep, h.target.step);
  PutDigest(b.data() + kOffTargetDigest, h.target.digest);
  std::memcpy(b.data() + kOffBootId, h.boot_id.data(),
              std::min(h.boot_id.size(), kBootIdBytes));
  StoreLE<uint64_t>(b.data() + kHeaderChecksum,
                    Hash64(std::span(b).first(kHeaderChecksum)));
  return b;
}

Result<JournalHeader> DecodeHeader(std::span<const std::byte> b,
                                   const std::string& path) {
  auto bad = [&](const char* what) {
    return Status::Corruption("journal " + path + ": " + what);
  };
  if (b.size() < kHeaderBytes) return bad("torn header");
  if (std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a dcr journal (bad magic)");
  }
  if (LoadLE<uint64_t>(b.data() + kHeaderChecksum) !=
      Hash64(b.first(kHeaderChecksum))) {
    return bad("header checksum mismatch (torn header)");
  }
  if (LoadLE<uint32_t>(b.data() + 8) != kFormat ||
      LoadLE<uint32_t>(b.data() + 12) != kHeaderBytes) {
    return bad("unknown format");
  }
  JournalHeader h;
  std::memcpy(h.refit.bytes.data(), b.data() + kOffRefit, 16);
  h.base.step = LoadLE<uint64_t>(b.data() + kOffBaseStep);
  h.base.digest = GetDigest(b.data() + kOffBaseDigest);
  h.target.step = LoadLE<uint64_t>(b.data() + kOffTargetStep);
  h.target.digest = GetDigest(b.data() + kOffTargetDigest);
  const char* id = reinterpret_cast<const char*>(b.data() + kOffBootId);
  h.boot_id.assign(id, strnlen(id, kBootIdBytes));
  return h;
}

Status PwriteAll(int fd, std::span<const std::byte> bytes, uint64_t at,
                 const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n =
        ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::FromErrno("cannot write the journal " + path,
                               n < 0 ? errno : ENOSPC);
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

// Reads up to bytes.size() bytes at `at`; returns how many (short at EOF).
Result<size_t> PreadUpTo(int fd, std::span<std::byte> bytes, uint64_t at,
                         const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done,
                        static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::FromErrno("cannot read the journal " + path, errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// Checks a whole record (head, payload, checksum) and returns its payload.
Result<std::span<const std::byte>> CheckRecord(
    std::span<const std::byte> record, uint32_t* type) {
  if (record.size() < kRecordHead + kRecordTail) {
    return Status::Corruption("torn journal record");
  }
  *type = LoadLE<uint32_t>(record.data());
  const uint32_t len = LoadLE<uint32_t>(record.data() + 4);
  if (record.size() != kRecordHead + len + kRecordTail ||
      LoadLE<uint64_t>(record.data() + kRecordHead + len) !=
          Hash64(record.first(kRecordHead + len))) {
    return Status::Corruption("journal record checksum mismatch");
  }
  return record.subspan(kRecordHead, len);
}

Status ParseApply(std::span<const std::byte> p, JournalApply* out) {
  if (p.size() < kApplyFixed) {
    return Status::Corruption("journal apply record too short");
  }
  out->id.tensor = LoadLE<uint32_t>(p.data());
  out->id.span = LoadLE<uint32_t>(p.data() + 4);
  out->id.part = LoadLE<uint16_t>(p.data() + 22);
  out->offset = LoadLE<uint64_t>(p.data() + 8);
  const uint32_t count = LoadLE<uint32_t>(p.data() + 16);
  out->elem_size = static_cast<uint8_t>(p[20]);
  out->dense = (static_cast<uint8_t>(p[21]) & 1) != 0;
  const uint64_t w = out->elem_size;
  const uint64_t values = count * w;
  if (w == 0 || w > 8 || p.size() < kApplyFixed + values ||
      (out->dense && p.size() != kApplyFixed + values)) {
    return Status::Corruption("journal apply record of the wrong size");
  }
  const size_t at = p.size() - values;
  out->positions.clear();
  if (!out->dense) {
    out->positions.reserve(count);
    ByteReader r(p.subspan(kApplyFixed, at - kApplyFixed));
    uint64_t next = 0;  // the smallest value the next position may take
    for (uint32_t i = 0; i < count; ++i) {
      uint64_t gap = 0;
      if (!r.GetVarint(&gap) || gap >= kMaxSpanElems ||
          next + gap >= kMaxSpanElems) {
        return Status::Corruption("journal apply record: bad positions");
      }
      out->positions.push_back(static_cast<uint32_t>(next + gap));
      next += gap + 1;
    }
    if (r.remaining() != 0) {
      return Status::Corruption("journal apply record: bad positions");
    }
  }
  out->old_values.assign(p.begin() + static_cast<ptrdiff_t>(at), p.end());
  return Status::OK();
}

// Appends `v` as LEB128 at `p`; returns the byte after it.
std::byte* PutVarint(std::byte* p, uint32_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<std::byte>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<std::byte>(v);
  return p;
}

// A thread's record buffer, grown without zero-filling.
struct Scratch {
  std::unique_ptr<std::byte[]> data;
  size_t capacity = 0;
  std::byte* Get(size_t n) {
    if (n > capacity) {
      capacity = std::max(n, capacity * 2);
      data.reset(new std::byte[capacity]);
    }
    return data.get();
  }
};

template <size_t W>
void Gather(std::span<const uint32_t> positions, const std::byte* span,
            std::byte* out) {
  for (uint32_t p : positions) {
    std::memcpy(out, span + size_t{p} * W, W);
    out += W;
  }
}

}  // namespace

Status RestoreApply(const JournalApply& a, std::span<std::byte> tensor) {
  const uint64_t w = a.elem_size;
  uint64_t extent =
      a.dense
          ? a.old_values.size()
          : (a.positions.empty() ? 0 : (uint64_t{a.positions.back()} + 1) * w);
  if (a.offset > tensor.size() || extent > tensor.size() - a.offset) {
    return Status::Corruption("journal record past the end of its tensor");
  }
  std::byte* span = tensor.data() + a.offset;
  if (a.dense) {
    std::memcpy(span, a.old_values.data(), a.old_values.size());
    return Status::OK();
  }
  const std::byte* v = a.old_values.data();
  for (uint32_t p : a.positions) {
    if (uint64_t{p} * w + w > extent) {
      return Status::Corruption("journal record position past its span");
    }
    std::memcpy(span + uint64_t{p} * w, v, w);
    v += w;
  }
  return Status::OK();
}

std::string JournalPath(const std::string& record_path,
                        const std::string& dir) {
  if (record_path.empty()) return "";
  std::string stem = record_path;
  constexpr std::string_view kSuffix = ".dcr-version";
  if (stem.size() > kSuffix.size() && stem.ends_with(kSuffix)) {
    stem.resize(stem.size() - kSuffix.size());
  }
  if (dir.empty()) return stem + ".dcr-journal";
  // Stores of one name in different directories may share `dir`: the
  // name carries a hash of the whole record path.
  const uint64_t h = Hash64(std::as_bytes(std::span(record_path)));
  return (std::filesystem::path(dir) /
          (std::filesystem::path(stem).filename().string() +
           fmt::format(".{:016x}.dcr-journal", h)))
      .string();
}

Result<std::unique_ptr<Journal>> Journal::Create(const std::string& path,
                                                 const JournalHeader& header) {
  std::unique_ptr<Journal> j(new Journal());
  std::vector<std::byte> head = EncodeHeader(header);
  if (path.empty()) {
    MutexLock lock(&j->mu_);
    j->heap_ = std::move(head);
    j->end_ = kHeaderBytes;
    return j;
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::FromErrno("cannot create the journal " + path, errno);
  }
  j->fd_ = UniqueFd(fd);
  j->path_ = path;
  DCR_RETURN_IF_ERROR(PwriteAll(fd, head, 0, path));
  j->end_ = kHeaderBytes;
  return j;
}

Status Journal::ProbeDir(const std::string& dir) {
  std::string tmpl = dir + "/.dcr-journal-probe-XXXXXX";
  int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno("cannot create a journal in " + dir, errno);
  }
  ::close(fd);
  ::unlink(tmpl.c_str());
  return Status::OK();
}

Result<Journal::Ref> Journal::AppendRecord(std::span<const std::byte> record) {
  Ref r;
  r.size = record.size();
  uint64_t kick_from = 0, kick_to = 0;
  {
    MutexLock lock(&mu_);
    if (removed_) return Status::Internal("journal appended after removal");
    r.offset = end_.load();
    if (!fd_.valid()) {
      heap_.insert(heap_.end(), record.begin(), record.end());
    } else {
      // Under the lock: records reach the file in order, so a crash leaves
      // at most the last one torn.
      DCR_RETURN_IF_ERROR(PwriteAll(fd_.get(), record, r.offset, path_));
    }
    end_ = r.offset + r.size;
    if (fd_.valid() &&
        r.offset / kWriteBackEvery != end_.load() / kWriteBackEvery) {
      kick_from = r.offset / kWriteBackEvery * kWriteBackEvery;
      kick_to = end_.load() / kWriteBackEvery * kWriteBackEvery;
    }
  }
  if (kick_to > kick_from) {
    // Start writing back what is complete, so that the fdatasync before a
    // yes vote has little left to do (asynchronous; a hint, errors are
    // seen by that fdatasync).
    (void)::sync_file_range(fd_.get(), static_cast<off_t>(kick_from),
                            static_cast<off_t>(kick_to - kick_from),
                            SYNC_FILE_RANGE_WRITE);
  }
  return r;
}

Result<Journal::Ref> Journal::AppendApply(const DecodedChunk& chunk,
                                          uint64_t offset,
                                          std::span<const std::byte> span) {
  return AppendApplyRecord(chunk, offset, span, false);
}

Result<Journal::Ref> Journal::AppendApplyValues(
    const DecodedChunk& chunk, uint64_t offset,
    std::span<const std::byte> old) {
  return AppendApplyRecord(chunk, offset, old, true);
}

Result<Journal::Ref> Journal::AppendApplyRecord(const DecodedChunk& chunk,
                                                uint64_t offset,
                                                std::span<const std::byte> span,
                                                bool gathered) {
  const ChunkHeader& h = chunk.header;
  const size_t w = h.elem_size;
  const bool dense = h.encoding == ChunkEncoding::kDense;
  const uint64_t count = dense ? h.span_elems : chunk.positions.size();
  if (span.size() != (gathered ? count : uint64_t{h.span_elems}) * w ||
      (!dense && !chunk.positions.empty() &&
       chunk.positions.back() >= h.span_elems)) {
    return Status::InvalidArgument("journal: the chunk does not fit its span");
  }
  thread_local Scratch scratch;
  // At most 5 bytes per position gap.
  std::byte* const rec =
      scratch.Get(kRecordHead + kApplyFixed + (dense ? 0 : 5 * count) +
                  count * w + kRecordTail);
  std::byte* p = rec + kRecordHead;
  StoreLE<uint32_t>(p, h.id.tensor);
  StoreLE<uint32_t>(p + 4, h.id.span);
  StoreLE<uint64_t>(p + 8, offset);
  StoreLE<uint32_t>(p + 16, static_cast<uint32_t>(count));
  p[20] = static_cast<std::byte>(w);
  p[21] = static_cast<std::byte>(dense ? 1 : 0);
  StoreLE<uint16_t>(p + 22, h.id.part);
  p += kApplyFixed;
  if (dense) {
    std::memcpy(p, span.data(), span.size());
    p += span.size();
  } else {
    uint32_t next = 0;  // positions are strictly ascending (decoded chunk)
    for (uint32_t pos : chunk.positions) {
      if (pos < next) {
        return Status::InvalidArgument("journal: positions not ascending");
      }
      p = PutVarint(p, pos - next);
      next = pos + 1;
    }
    if (gathered) {
      std::memcpy(p, span.data(), span.size());
      p += span.size();
    } else {
      switch (w) {
        case 1:
          Gather<1>(chunk.positions, span.data(), p);
          break;
        case 2:
          Gather<2>(chunk.positions, span.data(), p);
          break;
        case 4:
          Gather<4>(chunk.positions, span.data(), p);
          break;
        case 8:
          Gather<8>(chunk.positions, span.data(), p);
          break;
        default:
          return Status::InvalidArgument("journal: unsupported element size");
      }
      p += count * w;
    }
  }
  const uint64_t payload = static_cast<uint64_t>(p - rec) - kRecordHead;
  StoreLE<uint32_t>(rec, kTypeApply);
  StoreLE<uint32_t>(rec + 4, static_cast<uint32_t>(payload));
  StoreLE<uint64_t>(p, Hash64({rec, kRecordHead + payload}));
  return AppendRecord({rec, kRecordHead + payload + kRecordTail});
}

Status Journal::AppendVotedYes(const Digest128& digest) {
  std::byte rec[kRecordHead + 16 + kRecordTail];
  StoreLE<uint32_t>(rec, kTypeVotedYes);
  StoreLE<uint32_t>(rec + 4, 16);
  PutDigest(rec + kRecordHead, digest);
  StoreLE<uint64_t>(rec + kRecordHead + 16,
                    Hash64(std::span(rec).first(kRecordHead + 16)));
  DCR_RETURN_IF_ERROR(AppendRecord(rec).status());
  if (!fd_.valid()) return Status::OK();
  if (::fdatasync(fd_.get()) != 0) {
    return Status::FromErrno("cannot sync the journal " + path_, errno);
  }
  MutexLock lock(&mu_);
  if (!dir_synced_) {
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!d.valid() || ::fsync(d.get()) != 0) {
      return Status::FromErrno("cannot sync the directory " + dir, errno);
    }
    dir_synced_ = true;
  }
  return Status::OK();
}

Status Journal::Read(const Ref& ref, JournalApply* out) const {
  std::vector<std::byte> rec(ref.size);
  if (!fd_.valid()) {
    MutexLock lock(&mu_);
    if (ref.offset + ref.size > heap_.size()) {
      return Status::Internal("journal record past the end of the journal");
    }
    std::memcpy(rec.data(), heap_.data() + ref.offset, ref.size);
  } else {
    DCR_ASSIGN_OR_RETURN(size_t n,
                         PreadUpTo(fd_.get(), rec, ref.offset, path_));
    if (n != ref.size) {
      return Status::IOError("journal " + path_ + " is shorter than written");
    }
  }
  uint32_t type = 0;
  DCR_ASSIGN_OR_RETURN(std::span<const std::byte> payload,
                       CheckRecord(rec, &type));
  if (type != kTypeApply) return Status::Internal("not an apply record");
  return ParseApply(payload, out);
}

Status Journal::Remove() {
  removed_ = true;
  if (path_.empty()) return Status::OK();
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("cannot remove the journal " + path_, errno);
  }
  return Status::OK();
}

Result<std::unique_ptr<JournalReader>> JournalReader::Open(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("no journal " + path);
    return Status::FromErrno("cannot open the journal " + path, errno);
  }
  std::unique_ptr<JournalReader> r(new JournalReader());
  r->fd_ = UniqueFd(fd);
  r->path_ = path;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Status::FromErrno("cannot stat the journal " + path, errno);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::vector<std::byte> buf(kHeaderBytes);
  DCR_ASSIGN_OR_RETURN(size_t n, PreadUpTo(fd, buf, 0, path));
  buf.resize(n);
  DCR_ASSIGN_OR_RETURN(r->header_, DecodeHeader(buf, path));
  uint64_t at = kHeaderBytes;
  while (at < size) {
    std::byte head[kRecordHead];
    if (size - at < kRecordHead + kRecordTail) break;
    DCR_ASSIGN_OR_RETURN(n, PreadUpTo(fd, head, at, path));
    const uint32_t len = LoadLE<uint32_t>(head + 4);
    const uint64_t total = kRecordHead + uint64_t{len} + kRecordTail;
    if (n != kRecordHead || len > kMaxPayload || total > size - at) break;
    buf.resize(total);
    DCR_ASSIGN_OR_RETURN(n, PreadUpTo(fd, buf, at, path));
    if (n != total) break;
    uint32_t type = 0;
    auto payload = CheckRecord(buf, &type);
    if (!payload.ok()) break;
    if (type == kTypeApply) {
      r->applies_.push_back(Journal::Ref{at, total});
    } else if (type == kTypeVotedYes && payload->size() == 16) {
      r->voted_yes_ = GetDigest(payload->data());
    } else {
      break;  // not a record this build wrote
    }
    at += total;
  }
  r->torn_bytes_ = size - at;
  return r;
}

Status JournalReader::Read(const Journal::Ref& ref, JournalApply* out) const {
  std::vector<std::byte> rec(ref.size);
  DCR_ASSIGN_OR_RETURN(size_t n, PreadUpTo(fd_.get(), rec, ref.offset, path_));
  if (n != ref.size) {
    return Status::IOError("journal " + path_ + " is shorter than scanned");
  }
  uint32_t type = 0;
  DCR_ASSIGN_OR_RETURN(std::span<const std::byte> payload,
                       CheckRecord(rec, &type));
  if (type != kTypeApply) return Status::Internal("not an apply record");
  return ParseApply(payload, out);
}

}  // namespace dcr
