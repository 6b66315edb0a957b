// Reading safetensors checkpoints: Checkpoint, which maps one or several
// files (their headers validated by safetensors_header.cc) and exposes
// their tensors in canonical order.
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/file.h"
#include "common/printable.h"
#include "common/strict_json.h"
#include "dcr/checkpoint.h"
#include "dcr/thread_pool.h"
#include "format/safetensors_header.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

struct LoadedFile {
  std::string path;
  std::unique_ptr<MappedFile> map;
  SafetensorsHeader header;
};

Result<LoadedFile> LoadFile(const std::string& path, Checkpoint::Mode mode) {
  LoadedFile f;
  f.path = path;
  DCR_ASSIGN_OR_RETURN(
      f.map, MappedFile::Open(path, mode == Checkpoint::Mode::kReadWrite
                                        ? MappedFile::Mode::kReadWrite
                                        : MappedFile::Mode::kReadOnly));
  DCR_ASSIGN_OR_RETURN(
      f.header, ParseSafetensorsHeader(f.map->data(), f.map->size(), path));
  return f;
}

// The weight_map of a Hugging Face index: tensor name -> file name.
Result<std::map<std::string, std::string>> ReadIndex(
    const std::string& index_path) {
  const std::string what = "index '" + index_path + "'";
  std::error_code ec;
  uint64_t size = fs::file_size(index_path, ec);
  if (ec) {
    return Status::IOError("cannot read " + what + ": " + ec.message());
  }
  if (size > kMaxSafetensorsHeaderBytes) {
    return Status::Corruption(what + " is " + std::to_string(size) +
                              " bytes, more than the limit " +
                              std::to_string(kMaxSafetensorsHeaderBytes));
  }
  DCR_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  DCR_ASSIGN_OR_RETURN(Json j,
                       ParseSafetensorsJson(text, what, /*tensor_depth=*/2));
  if (!j.is_object()) {
    return Status::Corruption(what + ": top level is " +
                              std::string(j.type_name()) + ", not an object");
  }
  auto it = j.find("weight_map");
  if (it == j.end() || !it->is_object()) {
    return Status::Corruption(what + ": missing \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, file] : it->items()) {
    if (!file.is_string()) {
      return Status::Corruption(what + ": weight_map entry for tensor '" +
                                Printable(tensor) + "' is " + file.dump() +
                                ", not a file name");
    }
    const std::string& name = file.get_ref<const std::string&>();
    if (name.empty() || name == "." || name == ".." ||
        name.find('/') != std::string::npos) {
      return Status::Corruption(what + ": weight_map maps tensor '" +
                                Printable(tensor) + "' to '" + Printable(name) +
                                "', which is not a plain file name");
    }
    weight_map.emplace(tensor, name);
  }
  return weight_map;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

struct Checkpoint::File {
  std::string path;
  std::unique_ptr<MappedFile> map;
};

Checkpoint::~Checkpoint() = default;

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path,
                                                     Mode mode) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) {
    return Status::NotFound("checkpoint '" + path + "' does not exist");
  }
  if (ec) {
    return Status::IOError("cannot stat checkpoint '" + path +
                           "': " + ec.message());
  }

  // Decide which files make up the checkpoint.
  std::string index_path;
  std::vector<std::string> file_paths;
  if (fs::is_directory(st)) {
    const fs::path index = fs::path(path) / kIndexFileName;
    if (fs::exists(index, ec)) {
      index_path = index.string();
    } else {
      std::vector<std::string> found;
      for (fs::directory_iterator it(path, ec), end; !ec && it != end;
           it.increment(ec)) {
        const fs::path& p = it->path();
        std::error_code type_ec;
        if (p.extension() == ".safetensors" && it->is_regular_file(type_ec)) {
          found.push_back(p.string());
        }
      }
      if (ec) {
        return Status::IOError("cannot list directory '" + path +
                               "': " + ec.message());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        return Status::NotFound(
            "directory '" + path + "' holds neither " +
            std::string(kIndexFileName) +
            " nor a .safetensors file; pass a .safetensors file, an "
            "index.json, or a directory holding one of them");
      }
      if (found.size() > 1) {
        std::string names;
        for (size_t i = 0; i < found.size() && i < 4; ++i) {
          names += (i > 0 ? ", '" : "'") +
                   fs::path(found[i]).filename().string() + "'";
        }
        if (found.size() > 4) names += ", ...";
        return Status::InvalidArgument(
            "directory '" + path + "' holds " + std::to_string(found.size()) +
            " .safetensors files (" + names + ") but no " +
            std::string(kIndexFileName) +
            "; pass one of the files, or add an index");
      }
      file_paths = std::move(found);
    }
  } else if (EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    file_paths.push_back(path);
  }

  std::map<std::string, std::string> weight_map;
  if (!index_path.empty()) {
    DCR_ASSIGN_OR_RETURN(weight_map, ReadIndex(index_path));
    const fs::path dir = fs::path(index_path).parent_path();
    std::set<std::string> names;
    for (const auto& [tensor, file] : weight_map) names.insert(file);
    for (const std::string& name : names) {
      const std::string p = (dir / name).string();
      if (!fs::exists(p, ec)) {
        return Status::NotFound("index '" + index_path + "' names file '" +
                                name + "', which does not exist ('" + p + "')");
      }
      file_paths.push_back(p);
    }
  }

  // Open and validate every file up front.
  std::vector<LoadedFile> loaded;
  loaded.reserve(file_paths.size());
  for (const std::string& p : file_paths) {
    DCR_ASSIGN_OR_RETURN(LoadedFile f, LoadFile(p, mode));
    loaded.push_back(std::move(f));
  }

  // Tensor name -> index of the file holding it.
  std::map<std::string_view, size_t> holder;
  size_t total = 0;
  for (size_t fi = 0; fi < loaded.size(); ++fi) {
    total += loaded[fi].header.tensors.size();
    if (total > kMaxTensorsPerCheckpoint) {
      return Status::Corruption("checkpoint '" + path + "' holds more than " +
                                std::to_string(kMaxTensorsPerCheckpoint) +
                                " tensors");
    }
    const std::string file_name = fs::path(loaded[fi].path).filename();
    for (const SafetensorsEntry& e : loaded[fi].header.tensors) {
      auto [it, inserted] = holder.emplace(e.info.name, fi);
      if (!inserted) {
        return Status::Corruption(
            "tensor '" + Printable(e.info.name) + "' appears in both '" +
            loaded[it->second].path + "' and '" + loaded[fi].path + "'");
      }
      if (index_path.empty()) continue;
      auto wm = weight_map.find(e.info.name);
      if (wm == weight_map.end()) {
        return Status::Corruption("tensor '" + Printable(e.info.name) +
                                  "' is in '" + loaded[fi].path +
                                  "' but not in index '" + index_path + "'");
      }
      if (wm->second != file_name) {
        return Status::Corruption(
            "index '" + index_path + "' maps tensor '" +
            Printable(e.info.name) + "' to '" + Printable(wm->second) +
            "' but it is stored in '" + loaded[fi].path + "'");
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    if (holder.find(tensor) == holder.end()) {
      return Status::Corruption("index '" + index_path + "' maps tensor '" +
                                Printable(tensor) + "' to '" + Printable(file) +
                                "', which does not contain it");
    }
  }

  std::vector<TensorInfo> infos;
  infos.reserve(total);
  for (const LoadedFile& f : loaded) {
    for (const SafetensorsEntry& e : f.header.tensors) {
      infos.push_back(e.info);
    }
  }
  Result<Manifest> manifest = Manifest::Create(std::move(infos));
  if (!manifest.ok()) {
    return Status::Corruption("checkpoint '" + path +
                              "': " + std::string(manifest.status().message()));
  }

  std::unique_ptr<Checkpoint> cp(new Checkpoint());
  cp->path_ = path;
  cp->mode_ = mode;
  cp->manifest_ = std::move(manifest).value();
  cp->locations_.resize(cp->manifest_.size());
  for (size_t fi = 0; fi < loaded.size(); ++fi) {
    const SafetensorsHeader& h = loaded[fi].header;
    for (const SafetensorsEntry& e : h.tensors) {
      const int64_t index = cp->manifest_.Find(e.info.name);
      cp->locations_[static_cast<size_t>(index)] =
          Location{fi, h.data_offset + e.begin, e.end - e.begin};
    }
  }
  if (!loaded.empty()) cp->metadata_ = std::move(loaded[0].header.metadata);
  for (LoadedFile& f : loaded) {
    auto file = std::make_unique<File>();
    file->path = std::move(f.path);
    file->map = std::move(f.map);
    cp->files_.push_back(std::move(file));
  }
  return cp;
}

const std::string& Checkpoint::FileOf(size_t index) const {
  return files_[locations_[index].file]->path;
}

std::span<const std::byte> Checkpoint::TensorData(size_t index) const {
  const Location& loc = locations_[index];
  if (loc.size == 0) return {};
  return files_[loc.file]->map->data().subspan(loc.offset, loc.size);
}

std::span<std::byte> Checkpoint::MutableTensorData(size_t index) {
  const Location& loc = locations_[index];
  if (mode_ != Mode::kReadWrite || loc.size == 0) return {};
  return files_[loc.file]->map->mutable_data().subspan(loc.offset, loc.size);
}

Status Checkpoint::WriteTensorData(size_t index, uint64_t offset,
                                   std::span<const std::byte> bytes) {
  if (mode_ != Mode::kReadWrite) {
    return Status::InvalidArgument("checkpoint '" + path_ +
                                   "' is open read-only");
  }
  const Location& loc = locations_.at(index);
  if (offset > loc.size || bytes.size() > loc.size - offset) {
    return Status::InvalidArgument(
        "write of " + std::to_string(bytes.size()) + " bytes at offset " +
        std::to_string(offset) + " is past the end of tensor '" +
        manifest_[index].name + "' (" + std::to_string(loc.size) + " bytes)");
  }
  return files_[loc.file]->map->Write(loc.offset + offset, bytes);
}

Status Checkpoint::ModifyTensorData(
    size_t index, uint64_t offset, uint64_t size, uint64_t from, uint64_t to,
    const std::function<Status(std::span<std::byte>)>& fn) {
  if (mode_ != Mode::kReadWrite) {
    return Status::InvalidArgument("checkpoint '" + path_ +
                                   "' is open read-only");
  }
  const Location& loc = locations_.at(index);
  if (offset > loc.size || size > loc.size - offset) {
    return Status::InvalidArgument(
        "change of " + std::to_string(size) + " bytes at offset " +
        std::to_string(offset) + " is past the end of tensor '" +
        manifest_[index].name + "' (" + std::to_string(loc.size) + " bytes)");
  }
  return files_[loc.file]->map->Modify(loc.offset + offset, size, from, to, fn);
}

bool Checkpoint::ModifiesByCopy(size_t index, uint64_t size) const {
  return mode_ == Mode::kReadWrite &&
         files_[locations_.at(index).file]->map->ModifiesByCopy(size);
}

CheckpointDigests Checkpoint::ComputeDigests(ThreadPool* pool) const {
  CheckpointDigests d;
  d.tensors.resize(manifest_.size());
  auto body = [this, &d](size_t i, size_t /*worker*/) {
    d.tensors[i] = TensorDigest(TensorData(i));
  };
  if (pool != nullptr) {
    pool->ParallelFor(manifest_.size(), body);
  } else {
    for (size_t i = 0; i < manifest_.size(); ++i) body(i, 0);
  }
  d.manifest = manifest_.digest();
  d.version = VersionDigest(d.manifest, d.tensors);
  return d;
}

Status Checkpoint::Flush(size_t slice_bytes) {
  if (mode_ != Mode::kReadWrite) return Status::OK();
  for (const std::unique_ptr<File>& f : files_) {
    DCR_RETURN_IF_ERROR(f->map->Sync(slice_bytes));
  }
  return Status::OK();
}

}  // namespace dcr
