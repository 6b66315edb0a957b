#include "coord/history.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

namespace dcr {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSuffix = ".dcr";
constexpr std::string_view kQuarantine = "quarantine";
constexpr std::string_view kAborted = "aborted";

// Reads every chunk's framing to the end (payloads are not decoded): a
// file torn after its header fails here, not halfway through a catch-up.
Status CheckChunks(const std::string& path) {
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(path));
  std::span<const std::byte> chunk;
  for (;;) {
    DCR_ASSIGN_OR_RETURN(bool more, reader->Next(&chunk));
    if (!more) return Status::OK();
  }
}

}  // namespace

std::string DeltaHistory::QuarantineDir() const {
  return dir_ + "/" + std::string(kQuarantine);
}

void DeltaHistory::Quarantine(const std::string& path,
                              const std::string& why) const {
  std::error_code ec;
  fs::create_directories(QuarantineDir(), ec);
  const std::string to =
      QuarantineDir() + "/" + fs::path(path).filename().string();
  if (!ec) fs::rename(path, to, ec);
  if (ec) {
    spdlog::warn("{}: {}; cannot move it to {} ({}), ignoring it", path, why,
                 QuarantineDir(), ec.message());
    return;
  }
  spdlog::warn("{}: {}; moved to {} and treated as absent", path, why, to);
}

std::vector<DeltaHistory::Entry> DeltaHistory::Entries() const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return out;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const fs::path& p = e.path();
    if (p.extension() == ".tmp") continue;  // a refit in progress, or Prune's
    if ((p.filename() == kQuarantine || p.filename() == kAborted) &&
        e.is_directory(ec)) {
      continue;
    }
    if (p.extension() == kSuffix && e.is_regular_file(ec)) {
      files.push_back(p);
    } else {
      spdlog::warn(
          "{}: not a delta file of the history (<step>-<digest>{}); "
          "ignoring it",
          p.string(), kSuffix);
    }
  }
  for (const fs::path& p : files) {
    auto reader = DeltaReader::Open(p.string());
    if (!reader.ok()) {
      Quarantine(p.string(), reader.status().ToString());
      continue;
    }
    const DeltaHeader& h = (*reader)->header();
    // The name is the index: it must be the one PathFor gives its target.
    if (fs::path(PathFor(h.target)).filename() != p.filename()) {
      Quarantine(p.string(),
                 fmt::format("its header's target (step {}, {}) is not the "
                             "one its name says",
                             h.target.step, h.target.digest.ShortHex()));
      continue;
    }
    out.push_back(Entry{p.string(), h});
  }
  return out;
}

std::string DeltaHistory::AbortedDir() const {
  return dir_ + "/" + std::string(kAborted);
}

std::string DeltaHistory::AbortedPathFor(const RefitId& refit) const {
  return fmt::format("{}/{}{}", AbortedDir(), refit.ToHex(), kSuffix);
}

Result<std::string> DeltaHistory::Aborted(const RefitId& refit,
                                          const Version& target,
                                          Version* base) const {
  const std::string path = AbortedPathFor(refit);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return Status::NotFound(
        fmt::format("{} keeps no delta of the aborted refit {}", AbortedDir(),
                    refit.ToHex()));
  }
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(path));
  const Version& t = reader->header().target;
  if (t.step != target.step ||
      (target.digest != Digest128{} && t.digest != target.digest)) {
    return Status::NotFound(
        fmt::format("{} is not the delta of refit {} to step {} ({})", path,
                    refit.ToHex(), target.step,
                    target.digest == Digest128{} ? "digest unknown"
                                                 : target.digest.ShortHex()));
  }
  *base = reader->header().base;
  reader.reset();
  if (Status s = CheckChunks(path); !s.ok()) {
    return Status::Corruption(s.ToString());
  }
  return path;
}

std::string DeltaHistory::PathFor(const Version& target) const {
  return fmt::format("{}/{:012}-{}{}", dir_, target.step,
                     target.digest.ShortHex(), kSuffix);
}

namespace {

// Where refit `refit`'s record is created; DeltaWriter writes to this path
// + ".tmp" until it is finished under its real name.
std::string RecordingPath(const DeltaHistory& history, const RefitId& refit) {
  return fmt::format("{}/{}{}", history.dir(), refit.ToHex(), kSuffix);
}

Result<std::unique_ptr<DeltaWriter>> CreateWriter(const DeltaHistory& history,
                                                  const std::string& path) {
  if (history.keep() == 0) return std::unique_ptr<DeltaWriter>();
  std::error_code ec;
  fs::create_directories(history.dir(), ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", history.dir(), ec.message()));
  }
  return DeltaWriter::Create(path);
}

}  // namespace

Result<std::unique_ptr<DeltaWriter>> DeltaHistory::Record(
    const Version& target) const {
  return CreateWriter(*this, PathFor(target));
}

std::string DeltaHistory::TmpPathFor(const RefitId& refit) const {
  return RecordingPath(*this, refit) + ".tmp";
}

Status DeltaHistory::Prune() {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return Status::OK();
  std::vector<Entry> files = Entries();  // quarantines unreadable files
  std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) {
    return a.header.target.step > b.header.target.step;
  });
  Status first_error;
  auto remove = [&](const fs::path& p) {
    std::error_code e;
    fs::remove(p, e);
    if (e && first_error.ok()) {
      first_error = Status::IOError(
          fmt::format("cannot remove {}: {}", p.string(), e.message()));
    }
  };
  for (size_t i = keep_; i < files.size(); ++i) remove(files[i].path);
  // Temporary files of refits that did not commit (a crashed coordinator).
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() == ".tmp") remove(e.path());
  }
  // The quarantine keeps the newest kQuarantineKept files, for a look;
  // aborted deltas, the newest `keep`.
  auto keep_newest = [&](const std::string& dir, size_t kept) {
    std::vector<std::pair<fs::file_time_type, fs::path>> dated;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      dated.emplace_back(e.last_write_time(ec), e.path());
    }
    std::sort(dated.begin(), dated.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = kept; i < dated.size(); ++i) remove(dated[i].second);
  };
  keep_newest(QuarantineDir(), kQuarantineKept);
  keep_newest(AbortedDir(), keep_);
  return first_error;
}

HistoryRecording::HistoryRecording(const DeltaHistory& history,
                                   const RefitId& refit)
    : history_(history) {
  auto record = CreateWriter(history, RecordingPath(history, refit));
  if (!record.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}",
                 record.status().ToString());
    return;
  }
  writer_ = *std::move(record);
  if (writer_) tmp_path_ = writer_->tmp_path();
  aborted_path_ = history.AbortedDir();
}

void HistoryRecording::Drop() {
  if (writer_ && pinned_) writer_->Keep();
  writer_.reset();
}

bool HistoryRecording::Sync() {
  if (!writer_) return false;
  if (Status s = writer_->Sync(); !s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    Drop();
    return false;
  }
  return true;
}

void HistoryRecording::FinishAborted(const DeltaHeader& header,
                                     const RefitId& refit) {
  if (!writer_) return;
  std::error_code ec;
  fs::create_directories(aborted_path_, ec);
  if (ec) {
    spdlog::warn("not keeping the aborted delta: cannot create {}: {}",
                 aborted_path_, ec.message());
    Drop();
    return;
  }
  const std::string path =
      fmt::format("{}/{}{}", aborted_path_, refit.ToHex(), kSuffix);
  writer_->set_path(path);
  Status s = writer_->Finish(header);
  Drop();
  if (!s.ok()) {
    spdlog::warn("not keeping the aborted delta: {}", s.ToString());
  }
}

void HistoryRecording::Append(std::span<const std::byte> chunk) {
  if (!writer_) return;
  if (Status s = writer_->Append(chunk); !s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    Drop();
  }
}

std::optional<std::string> HistoryRecording::Finish(const DeltaHeader& header) {
  if (!writer_) return std::nullopt;
  const std::string path = history_.PathFor(header.target);
  writer_->set_path(path);
  Status s = writer_->Finish(header);
  Drop();
  if (!s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    return std::nullopt;
  }
  return path;
}

Result<std::vector<std::string>> DeltaHistory::Chain(const Version& from,
                                                     const Version& to) const {
  if (from == to) {
    return Status::InvalidArgument("catch-up from a version to itself");
  }
  for (;;) {
    auto chain = ChainOf(Entries(), from, to);
    if (!chain.ok()) return chain;
    // A file torn after its header leaves the history, and the chain is
    // looked for again without it.
    bool whole = true;
    for (const std::string& path : *chain) {
      if (Status s = CheckChunks(path); !s.ok()) {
        Quarantine(path, s.ToString());
        whole = false;
      }
    }
    if (whole) return chain;
  }
}

Result<std::vector<std::string>> DeltaHistory::ChainOf(
    const std::vector<Entry>& entries, const Version& from,
    const Version& to) const {
  // base version -> (target version, path).
  std::map<std::pair<uint64_t, std::string>, std::pair<Version, std::string>>
      by_base;
  for (const Entry& e : entries) {
    by_base[{e.header.base.step, e.header.base.digest.ToHex()}] = {
        e.header.target, e.path};
  }
  std::vector<std::string> chain;
  Version at = from;
  while (at != to) {
    auto it = by_base.find({at.step, at.digest.ToHex()});
    if (it == by_base.end() || chain.size() > by_base.size()) {
      return Status::NotFound(fmt::format(
          "{} holds no delta from step {} ({}) towards step {} ({}); the "
          "history keeps the last {}",
          dir_, at.step, at.digest.ShortHex(), to.step, to.digest.ShortHex(),
          keep_));
    }
    chain.push_back(it->second.second);
    at = it->second.first;
  }
  return chain;
}

// ---------------------------------------------------------------- compose

ComposedDelta::~ComposedDelta() = default;

Result<std::unique_ptr<ComposedDelta>> ComposedDelta::Open(
    const std::vector<std::string>& chain, const Digest128& manifest,
    uint64_t span_elems, Kind kind) {
  if (chain.empty()) return Status::InvalidArgument("an empty delta chain");
  std::unique_ptr<ComposedDelta> c(new ComposedDelta());
  std::map<ChunkId, std::vector<std::span<const std::byte>>> index;
  for (const std::string& path : chain) {
    DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(path));
    const DeltaHeader& h = reader->header();
    if (h.manifest != manifest || h.span_elems != span_elems) {
      return Status::InvalidArgument(fmt::format(
          "{}: another manifest or span length than the tree's", path));
    }
    if (c->readers_.empty()) {
      c->base_ = h.base;
    } else if (kind == Kind::kChain && h.base != c->target_) {
      return Status::InvalidArgument(fmt::format(
          "{}: its base (step {}) is not the previous delta's target (step {})",
          path, h.base.step, c->target_.step));
    }
    c->target_ = h.target;
    c->file_bytes_ += reader->file_bytes();
    std::span<const std::byte> chunk;
    for (;;) {
      DCR_ASSIGN_OR_RETURN(bool more, reader->Next(&chunk));
      if (!more) break;
      auto header = PeekChunkHeader(chunk);
      if (!header.ok()) return header.status().WithContext(path);
      // The parts of a span compose into one whole-span chunk.
      index[ChunkId{header->id.tensor, header->id.span, 0}].push_back(chunk);
    }
    c->readers_.push_back(std::move(reader));
  }
  c->ids_.reserve(index.size());
  c->offsets_.reserve(index.size() + 1);
  for (auto& [id, parts] : index) {
    c->ids_.push_back(id);
    c->offsets_.push_back(c->parts_.size());
    c->parts_.insert(c->parts_.end(), parts.begin(), parts.end());
  }
  c->offsets_.push_back(c->parts_.size());
  return c;
}

Result<bool> ComposedDelta::Encode(size_t i, size_t elem_size,
                                   std::span<const std::byte> target,
                                   ChunkEncoder* encoder, ChunkDecoder* decoder,
                                   std::vector<std::byte>* scratch,
                                   std::vector<std::byte>* out,
                                   ChunkSizes* sizes) const {
  const ChunkId id = ids_[i];
  const size_t n = target.size();
  // scratch = [mask | zeros]
  scratch->assign(2 * n, std::byte{0});
  std::span<std::byte> mask(scratch->data(), n);
  std::span<const std::byte> zeros(scratch->data() + n, n);
  DecodedChunk chunk;
  for (size_t k = offsets_[i]; k < offsets_[i + 1]; ++k) {
    DCR_RETURN_IF_ERROR(DecodePart(k, id, elem_size, n, decoder, &chunk));
    if (chunk.header.kind == ChunkKind::kOverwrite) {
      // The last overwrite wins: the span's bits now are what it ends as.
      DCR_RETURN_IF_ERROR(
          encoder->EncodeFull(id, elem_size, target, out, sizes));
      return true;
    }
    DCR_RETURN_IF_ERROR(ApplyChunk(chunk, mask));
  }
  return encoder->EncodeDiff(ChunkKind::kXor, id, elem_size, zeros, mask, out,
                             sizes);
}

Status ComposedDelta::DecodePart(size_t k, const ChunkId& id, size_t elem_size,
                                 size_t span_bytes, ChunkDecoder* decoder,
                                 DecodedChunk* chunk) const {
  DCR_RETURN_IF_ERROR(decoder->Decode(parts_[k], chunk));
  if (chunk->header.elem_size != elem_size ||
      uint64_t{chunk->header.span_elems} * elem_size != span_bytes) {
    return Status::Corruption(fmt::format(
        "history chunk ({}) does not fit its tensor", ChunkIdText(id)));
  }
  return Status::OK();
}

Result<bool> ComposedDelta::EncodeUnion(size_t i, size_t elem_size,
                                        std::span<const std::byte> target,
                                        ChunkEncoder* encoder,
                                        ChunkDecoder* decoder,
                                        std::vector<std::byte>* scratch,
                                        std::vector<std::byte>* out,
                                        ChunkSizes* sizes) const {
  const ChunkId id = ids_[i];
  const size_t n = target.size();
  const size_t elems = n / elem_size;
  // scratch = [one byte per element: changed by some delta | values]
  scratch->assign(elems, std::byte{0});
  DecodedChunk chunk;
  for (size_t k = offsets_[i]; k < offsets_[i + 1]; ++k) {
    DCR_RETURN_IF_ERROR(DecodePart(k, id, elem_size, n, decoder, &chunk));
    const bool xor_chunk = chunk.header.kind == ChunkKind::kXor;
    for (size_t p = 0; p < chunk.positions.size(); ++p) {
      const uint32_t at = chunk.positions[p];
      if (xor_chunk) {
        const std::byte* v = chunk.values.data() + p * elem_size;
        bool nonzero = false;
        for (size_t b = 0; b < elem_size; ++b) nonzero |= v[b] != std::byte{0};
        if (!nonzero) continue;
      }
      (*scratch)[at] = std::byte{1};
    }
  }
  std::vector<uint32_t> positions;
  for (size_t e = 0; e < elems; ++e) {
    if ((*scratch)[e] != std::byte{0}) positions.push_back(uint32_t(e));
  }
  if (positions.empty()) return false;
  std::vector<std::byte> values(positions.size() * elem_size);
  for (size_t p = 0; p < positions.size(); ++p) {
    std::memcpy(values.data() + p * elem_size,
                target.data() + size_t{positions[p]} * elem_size, elem_size);
  }
  DCR_RETURN_IF_ERROR(encoder->EncodeChanges(
      ChunkKind::kOverwrite, id, elem_size, static_cast<uint32_t>(elems),
      positions, values, out, sizes));
  return true;
}

}  // namespace dcr
