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

// Every finished delta file of `dir` (temporary files excluded).
std::vector<fs::path> DeltaFiles(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec) && e.path().extension() == kSuffix) {
      out.push_back(e.path());
    }
  }
  return out;
}

}  // namespace

std::string DeltaHistory::PathFor(const Version& target) const {
  return fmt::format("{}/{:012}-{}{}", dir_, target.step,
                     target.digest.ShortHex(), kSuffix);
}

Result<std::unique_ptr<DeltaWriter>> DeltaHistory::Record(
    const Version& target) const {
  if (keep_ == 0) return std::unique_ptr<DeltaWriter>();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("cannot create {}: {}", dir_, ec.message()));
  }
  return DeltaWriter::Create(PathFor(target));
}

Status DeltaHistory::Prune() {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return Status::OK();
  std::vector<std::pair<uint64_t, fs::path>> files;
  for (const fs::path& p : DeltaFiles(dir_)) {
    auto reader = DeltaReader::Open(p.string());
    // An unreadable file is of no use to a chain: it goes first.
    files.emplace_back(reader.ok() ? (*reader)->header().target.step : 0, p);
  }
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  Status first_error;
  auto remove = [&](const fs::path& p) {
    std::error_code e;
    fs::remove(p, e);
    if (e && first_error.ok()) {
      first_error = Status::IOError(
          fmt::format("cannot remove {}: {}", p.string(), e.message()));
    }
  };
  for (size_t i = keep_; i < files.size(); ++i) remove(files[i].second);
  // Temporary files of refits that did not commit (a crashed coordinator).
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() == ".tmp") remove(e.path());
  }
  return first_error;
}

HistoryRecording::HistoryRecording(const DeltaHistory& history,
                                   const Version& target) {
  auto record = history.Record(target);
  if (!record.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}",
                 record.status().ToString());
    return;
  }
  writer_ = *std::move(record);
  if (writer_) path_ = history.PathFor(target);
}

void HistoryRecording::Append(std::span<const std::byte> chunk) {
  if (!writer_) return;
  if (Status s = writer_->Append(chunk); !s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    writer_.reset();
  }
}

std::optional<std::string> HistoryRecording::Finish(const DeltaHeader& header) {
  if (!writer_) return std::nullopt;
  Status s = writer_->Finish(header);
  writer_.reset();
  if (!s.ok()) {
    spdlog::warn("not recording this delta for catch-up: {}", s.ToString());
    return std::nullopt;
  }
  return path_;
}

Result<std::vector<std::string>> DeltaHistory::Chain(const Version& from,
                                                     const Version& to) const {
  if (from == to) {
    return Status::InvalidArgument("catch-up from a version to itself");
  }
  // base version -> (target version, path) of every readable file.
  std::map<std::pair<uint64_t, std::string>, std::pair<Version, std::string>>
      by_base;
  std::error_code ec;
  if (fs::exists(dir_, ec)) {
    for (const fs::path& p : DeltaFiles(dir_)) {
      auto reader = DeltaReader::Open(p.string());
      if (!reader.ok()) continue;
      const DeltaHeader& h = (*reader)->header();
      by_base[{h.base.step, h.base.digest.ToHex()}] = {h.target, p.string()};
    }
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
    uint64_t span_elems) {
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
    } else if (h.base != c->target_) {
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
      index[header->id].push_back(chunk);
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
    DCR_RETURN_IF_ERROR(decoder->Decode(parts_[k], &chunk));
    if (chunk.header.elem_size != elem_size ||
        uint64_t{chunk.header.span_elems} * elem_size != n) {
      return Status::Corruption(
          fmt::format("history chunk ({}, {}) does not fit its tensor",
                      id.tensor, id.span));
    }
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

}  // namespace dcr
