// Delta file header layout (docs/FORMAT.md §delta), little-endian:
//   0   8  magic "DCRDELTA"        8  u16 format version   10 u16 flags
//   12  u32 header bytes (136)      16 u64 base step        24 16 base digest
//   40  u64 target step             48 16 target digest     64 16 manifest
//   80  u64 span_elems              88 u64 chunk count      96 u64 tensors
//   104 u64 total elements          112 u64 total bytes     120 u64 changed
//   128 u64 XXH3-64 of bytes [0, 128)
// Digests are stored high word first. Chunks follow back to back.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/bytes.h"
#include "common/file.h"
#include "dcr/delta.h"

namespace dcr {
namespace {

constexpr char kDeltaMagic[8] = {'D', 'C', 'R', 'D', 'E', 'L', 'T', 'A'};
// Version 2: the version digests are of linear tensor digests (dcr/digest.h
// TensorDigest); version 1 had the XXH3 digests of earlier builds, in the
// same layout.
constexpr uint16_t kDeltaVersion = 2;
constexpr uint16_t kFlagAllOverwrite = 1;
constexpr size_t kWriteBufferBytes = 4 << 20;

void PutDigest(ByteWriter* w, const Digest128& d) {
  w->Put<uint64_t>(d.high);
  w->Put<uint64_t>(d.low);
}
Digest128 GetDigest(const std::byte* p) {
  return Digest128{LoadLE<uint64_t>(p), LoadLE<uint64_t>(p + 8)};
}

}  // namespace

std::vector<std::byte> EncodeDeltaHeader(const DeltaHeader& h) {
  std::vector<std::byte> out;
  out.reserve(kDeltaHeaderBytes);
  ByteWriter w(&out);
  w.PutBytes(std::as_bytes(std::span<const char>(kDeltaMagic, 8)));
  w.Put<uint16_t>(kDeltaVersion);
  w.Put<uint16_t>(h.all_overwrite ? kFlagAllOverwrite : 0);
  w.Put<uint32_t>(kDeltaHeaderBytes);
  w.Put<uint64_t>(h.base.step);
  PutDigest(&w, h.base.digest);
  w.Put<uint64_t>(h.target.step);
  PutDigest(&w, h.target.digest);
  PutDigest(&w, h.manifest);
  w.Put<uint64_t>(h.span_elems);
  w.Put<uint64_t>(h.chunk_count);
  w.Put<uint64_t>(h.tensor_count);
  w.Put<uint64_t>(h.total_elements);
  w.Put<uint64_t>(h.total_bytes);
  w.Put<uint64_t>(h.changed_elements);
  w.Put<uint64_t>(Hash64(out));
  return out;
}

Result<DeltaHeader> DecodeDeltaHeader(std::span<const std::byte> b) {
  if (b.size() < kDeltaHeaderBytes) {
    return Status::Corruption("delta header truncated (" +
                              std::to_string(b.size()) + " of " +
                              std::to_string(kDeltaHeaderBytes) + " bytes)");
  }
  const std::byte* p = b.data();
  if (std::memcmp(p, kDeltaMagic, 8) != 0) {
    return Status::Corruption("not a dcr delta (bad magic)");
  }
  uint16_t version = LoadLE<uint16_t>(p + 8);
  if (version == 1) {
    return Status::Unsupported(
        "delta format version 1, whose digests are the XXH3 digests of an "
        "earlier dcr (this build reads version 2): make the delta again "
        "with this dcr's `dcr diff`");
  }
  if (version != kDeltaVersion) {
    return Status::Unsupported("delta format version " +
                               std::to_string(version) +
                               " (this build reads version 2)");
  }
  // The version decides the layout, so it is read first; a version 2
  // header ends with its checksum at 128, checked before any other field.
  if (LoadLE<uint64_t>(p + 128) != Hash64(b.first(128))) {
    return Status::Corruption("delta header checksum mismatch");
  }
  uint16_t flags = LoadLE<uint16_t>(p + 10);
  if ((flags & ~kFlagAllOverwrite) != 0 ||
      LoadLE<uint32_t>(p + 12) != kDeltaHeaderBytes) {
    return Status::Corruption("delta header has unknown flags or size");
  }
  DeltaHeader h;
  h.all_overwrite = (flags & kFlagAllOverwrite) != 0;
  h.base.step = LoadLE<uint64_t>(p + 16);
  h.base.digest = GetDigest(p + 24);
  h.target.step = LoadLE<uint64_t>(p + 40);
  h.target.digest = GetDigest(p + 48);
  h.manifest = GetDigest(p + 64);
  h.span_elems = LoadLE<uint64_t>(p + 80);
  h.chunk_count = LoadLE<uint64_t>(p + 88);
  h.tensor_count = LoadLE<uint64_t>(p + 96);
  h.total_elements = LoadLE<uint64_t>(p + 104);
  h.total_bytes = LoadLE<uint64_t>(p + 112);
  h.changed_elements = LoadLE<uint64_t>(p + 120);
  if (h.span_elems == 0 || h.span_elems > kMaxSpanElems) {
    return Status::Corruption("delta span length out of range");
  }
  if (h.changed_elements > h.total_elements ||
      h.total_bytes < h.total_elements ||
      h.total_bytes > 8 * h.total_elements ||
      h.tensor_count > kMaxTensorsPerCheckpoint) {
    return Status::Corruption("delta header counts out of range");
  }
  return h;
}

// ---------------------------------------------------------------- reader

struct DeltaReader::Mapping {
  std::unique_ptr<MappedFile> file;
};

DeltaReader::~DeltaReader() = default;

Result<std::unique_ptr<DeltaReader>> DeltaReader::Open(
    const std::string& path) {
  DCR_ASSIGN_OR_RETURN(auto file,
                       MappedFile::Open(path, MappedFile::Mode::kReadOnly));
  std::unique_ptr<DeltaReader> r(new DeltaReader());
  r->path_ = path;
  auto header = DecodeDeltaHeader(file->data());
  if (!header.ok()) return header.status().WithContext(path);
  r->header_ = *header;
  uint64_t max_chunks =
      (file->size() - kDeltaHeaderBytes) / (kChunkPrefixBytes + 8);
  if (r->header_.chunk_count > max_chunks) {
    return Status::Corruption(path + ": header claims " +
                              std::to_string(r->header_.chunk_count) +
                              " chunks, more than the file can hold "
                              "(truncated?)");
  }
  file->AdviseSequential();
  r->map_ = std::make_unique<Mapping>();
  r->map_->file = std::move(file);
  return r;
}

uint64_t DeltaReader::file_bytes() const { return map_->file->size(); }

void DeltaReader::Rewind() {
  offset_ = kDeltaHeaderBytes;
  index_ = 0;
}

Result<bool> DeltaReader::Next(std::span<const std::byte>* chunk) {
  std::span<const std::byte> data = map_->file->data();
  if (index_ == header_.chunk_count) {
    if (offset_ != data.size()) {
      return Status::Corruption(path_ + ": " +
                                std::to_string(data.size() - offset_) +
                                " unexpected bytes after the last chunk");
    }
    return false;
  }
  if (offset_ >= data.size()) {
    return Status::Corruption(path_ + ": truncated after " +
                              std::to_string(index_) + " of " +
                              std::to_string(header_.chunk_count) + " chunks");
  }
  auto h = PeekChunkHeader(data.subspan(offset_));
  if (!h.ok()) {
    return h.status().WithContext(path_ + ": chunk " + std::to_string(index_) +
                                  " at byte " + std::to_string(offset_));
  }
  if (h->total_bytes > data.size() - offset_) {
    return Status::Corruption(path_ + ": chunk " + std::to_string(index_) +
                              " runs past the end of the file (truncated?)");
  }
  *chunk = data.subspan(offset_, h->total_bytes);
  offset_ += h->total_bytes;
  ++index_;
  return true;
}

// ---------------------------------------------------------------- writer

Result<std::unique_ptr<DeltaWriter>> DeltaWriter::Create(
    const std::string& path) {
  std::unique_ptr<DeltaWriter> w(new DeltaWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp";
  w->fd_ = ::open(w->tmp_path_.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) {
    return Status::FromErrno("cannot create '" + w->tmp_path_ + "'", errno);
  }
  // Room for the header, written by Finish().
  w->buffer_.assign(kDeltaHeaderBytes, std::byte{0});
  return w;
}

DeltaWriter::~DeltaWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

Status DeltaWriter::FlushBuffer() {
  // A failed write leaves the file in an unknown state: every later call
  // reports the same error instead of writing more.
  if (!error_.ok()) return error_;
  size_t done = 0;
  while (done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      error_ = Status::FromErrno("cannot write '" + tmp_path_ + "'", errno);
      return error_;
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return Status::OK();
}

Status DeltaWriter::Append(std::span<const std::byte> chunk) {
  if (!error_.ok()) return error_;
  buffer_.insert(buffer_.end(), chunk.begin(), chunk.end());
  bytes_ += chunk.size();
  ++chunks_;
  if (buffer_.size() >= kWriteBufferBytes) return FlushBuffer();
  return Status::OK();
}

Status DeltaWriter::Sync() {
  if (fd_ < 0) return Status::InvalidArgument("delta writer already finished");
  DCR_RETURN_IF_ERROR(FlushBuffer());
  if (::fdatasync(fd_) != 0) {
    error_ = Status::FromErrno("cannot sync '" + tmp_path_ + "'", errno);
    return error_;
  }
  return Status::OK();
}

void DeltaWriter::Keep() {
  if (fd_ < 0) return;
  (void)FlushBuffer();  // what it cannot write was never promised by Sync
  ::close(fd_);
  fd_ = -1;
}

Status DeltaWriter::Finish(DeltaHeader header) {
  if (fd_ < 0) return Status::InvalidArgument("delta writer already finished");
  DCR_RETURN_IF_ERROR(FlushBuffer());
  header.chunk_count = chunks_;
  std::vector<std::byte> h = EncodeDeltaHeader(header);
  ssize_t n = ::pwrite(fd_, h.data(), h.size(), 0);
  if (n != static_cast<ssize_t>(h.size())) {
    return Status::FromErrno("cannot write header of '" + tmp_path_ + "'",
                             n < 0 ? errno : EIO);
  }
  if (::fsync(fd_) != 0) {
    return Status::FromErrno("cannot fsync '" + tmp_path_ + "'", errno);
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    Status s = Status::FromErrno(
        "cannot rename '" + tmp_path_ + "' to '" + path_ + "'", errno);
    ::unlink(tmp_path_.c_str());
    return s;
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  UniqueFd dfd(::open(dir.empty() ? "." : dir.c_str(),
                      O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.valid()) ::fsync(dfd.get());
  return Status::OK();
}

}  // namespace dcr
