// Writing safetensors checkpoints, single-file and sharded (Hugging Face
// layout with model.safetensors.index.json).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "common/bytes.h"
#include "common/cleanup.h"
#include "common/file.h"
#include "common/printable.h"
#include "dcr/checkpoint.h"
#include "format/safetensors_header.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// One write() never asks for more than this (Linux caps a write at just
// under 2 GiB anyway).
constexpr size_t kMaxWriteBytes = size_t{1} << 30;

// Validates `tensors` and returns pointers to them in canonical order.
Result<std::vector<const TensorToWrite*>> SortAndValidate(
    std::span<const TensorToWrite> tensors) {
  std::vector<const TensorToWrite*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) {
              return a->info.name < b->info.name;
            });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorInfo& info = sorted[i]->info;
    if (i > 0 && sorted[i - 1]->info.name == info.name) {
      return Status::InvalidArgument("duplicate tensor name '" + info.name +
                                     "'");
    }
    if (info.name.empty() || info.name == "__metadata__" ||
        FindControlByte(info.name)) {
      return Status::InvalidArgument("invalid tensor name '" +
                                     Printable(info.name) + "'");
    }
    if (!IsValidDType(static_cast<uint8_t>(info.dtype))) {
      return Status::InvalidArgument("tensor '" + info.name +
                                     "' has an invalid dtype");
    }
    if (info.shape.size() > kMaxTensorRank) {
      return Status::InvalidArgument("tensor '" + info.name + "' has rank " +
                                     std::to_string(info.shape.size()) +
                                     ", more than the limit " +
                                     std::to_string(kMaxTensorRank));
    }
    uint64_t bytes;
    if (!CheckedNumBytes(info.dtype, info.shape, nullptr, &bytes)) {
      return Status::InvalidArgument("tensor '" + info.name +
                                     "': shape overflows a 64-bit byte count");
    }
    if (sorted[i]->data.size() != bytes) {
      return Status::InvalidArgument(
          "tensor '" + info.name + "' has " +
          std::to_string(sorted[i]->data.size()) + " bytes of data but its " +
          "dtype and shape need " + std::to_string(bytes));
    }
  }
  return sorted;
}

Result<std::string> BuildHeader(
    const std::vector<const TensorToWrite*>& sorted,
    const std::map<std::string, std::string>& metadata) {
  std::vector<TensorInfo> infos;
  infos.reserve(sorted.size());
  for (const TensorToWrite* t : sorted) infos.push_back(t->info);
  return BuildSafetensorsHeaderJson(infos, metadata);
}

Status WriteAll(int fd, std::span<const std::byte> data,
                const std::string& path) {
  while (!data.empty()) {
    const size_t want = std::min(data.size(), kMaxWriteBytes);
    const ssize_t n = ::write(fd, data.data(), want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("cannot write '" + path + "'", errno);
    }
    data = data.subspan(static_cast<size_t>(n));
  }
  return Status::OK();
}

Status WriteSorted(const std::string& path,
                   const std::vector<const TensorToWrite*>& sorted,
                   const std::map<std::string, std::string>& metadata) {
  DCR_ASSIGN_OR_RETURN(std::string header, BuildHeader(sorted, metadata));
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument("header of '" + path + "' would be " +
                                   std::to_string(header.size()) +
                                   " bytes, more than the limit " +
                                   std::to_string(kMaxSafetensorsHeaderBytes));
  }
  std::string prefix(8, '\0');
  StoreLE<uint64_t>(prefix.data(), header.size());
  prefix += header;

  const std::string tmp = path + ".tmp";
  UniqueFd fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return Status::FromErrno("cannot create '" + tmp + "'", errno);
  }
  Cleanup guard([&tmp] { ::unlink(tmp.c_str()); });
  DCR_RETURN_IF_ERROR(
      WriteAll(fd.get(), std::as_bytes(std::span<const char>(prefix)), tmp));
  for (const TensorToWrite* t : sorted) {
    DCR_RETURN_IF_ERROR(WriteAll(fd.get(), t->data, tmp));
  }
  if (::fsync(fd.get()) != 0) {
    return Status::FromErrno("cannot fsync '" + tmp + "'", errno);
  }
  if (::close(fd.Release()) != 0) {
    return Status::FromErrno("cannot close '" + tmp + "'", errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::FromErrno("cannot rename '" + tmp + "' to '" + path + "'",
                             errno);
  }
  guard.Cancel();
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.valid()) ::fsync(dfd.get());
  return Status::OK();
}

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

}  // namespace

Result<std::string> BuildSafetensorsHeaderJson(
    std::span<const TensorInfo> tensors,
    const std::map<std::string, std::string>& metadata) {
  try {
    std::string h = "{";
    bool first = true;
    if (!metadata.empty()) {
      h += "\"__metadata__\":";
      h += Json(metadata).dump();
      first = false;
    }
    uint64_t offset = 0;
    for (const TensorInfo& t : tensors) {
      if (!first) h += ",";
      first = false;
      h += Json(t.name).dump();
      h += ":{\"dtype\":\"";
      h += DTypeName(t.dtype);
      h += "\",\"shape\":[";
      for (size_t i = 0; i < t.shape.size(); ++i) {
        if (i > 0) h += ",";
        h += std::to_string(t.shape[i]);
      }
      h += "],\"data_offsets\":[";
      h += std::to_string(offset);
      h += ",";
      offset += t.NumBytes();
      h += std::to_string(offset);
      h += "]}";
    }
    h += "}";
    return h;
  } catch (const Json::exception& e) {
    // dump() throws on strings that are not valid UTF-8.
    return Status::InvalidArgument(
        std::string("tensor name or metadata is not valid UTF-8: ") + e.what());
  }
}

Status WriteSafetensors(const std::string& path,
                        std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  DCR_ASSIGN_OR_RETURN(std::vector<const TensorToWrite*> sorted,
                       SortAndValidate(tensors));
  return WriteSorted(path, sorted, metadata);
}

Status WriteShardedSafetensors(
    const std::string& dir, std::span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata,
    uint64_t max_file_bytes) {
  DCR_ASSIGN_OR_RETURN(std::vector<const TensorToWrite*> sorted,
                       SortAndValidate(tensors));
  // Pack in canonical order; a tensor that does not fit starts a new
  // shard, and one larger than max_file_bytes gets a shard of its own.
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const TensorToWrite* t : sorted) {
    const uint64_t size = t->data.size();
    if (!shards.back().empty() && shard_bytes + size > max_file_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += size;
    total_bytes += size;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Status::IOError("cannot create directory '" + dir +
                           "': " + ec.message());
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = ShardName(i + 1, shards.size());
    DCR_RETURN_IF_ERROR(
        WriteSorted((fs::path(dir) / name).string(), shards[i], metadata));
    for (const TensorToWrite* t : shards[i]) weight_map[t->info.name] = name;
  }
  Json index = {{"metadata", {{"total_size", total_bytes}}},
                {"weight_map", std::move(weight_map)}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(std::string("cannot write index: ") +
                                   e.what());
  }
  return WriteFileAtomic(
      (fs::path(dir) / "model.safetensors.index.json").string(),
      std::as_bytes(std::span<const char>(text)));
}

}  // namespace dcr
