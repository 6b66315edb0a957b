// Reading safetensors checkpoints: header validation (ParseSafetensorsHeader)
// and Checkpoint, which maps one or several files and exposes their tensors
// in canonical order.
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

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
// Legitimate headers and indexes nest three levels deep; anything much
// deeper is rejected before it costs memory or stack.
constexpr int kMaxJsonDepth = 16;

// Strict JSON (common/strict_json.h); keys at `tensor_depth` are tensor
// names and are reported as such.
Result<Json> ParseJson(std::string_view text, const std::string& what,
                       int tensor_depth) {
  StrictJsonOptions options;
  options.max_depth = kMaxJsonDepth;
  options.named_depth = tensor_depth;
  return ParseStrictJson(text, what, options);
}

std::string ShapeString(std::span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string RangeString(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Builds messages that name the file and, optionally, the tensor.
class HeaderErrors {
 public:
  explicit HeaderErrors(std::string_view file)
      : prefix_("safetensors file '" + std::string(file) + "'") {}
  const std::string& prefix() const { return prefix_; }
  Status File(const std::string& msg) const {
    return Status::Corruption(prefix_ + ": " + msg);
  }
  // `name` is shown escaped (common/printable.h).
  Status Tensor(const std::string& name, const std::string& msg) const {
    return Status::Corruption(prefix_ + ": tensor '" + Printable(name) +
                              "': " + msg);
  }

 private:
  std::string prefix_;
};

// Reads a JSON array of non-negative integers that fit in u64.
// On failure returns false and describes the offending element in *why.
bool ReadU64Array(const Json& j, std::vector<uint64_t>* out, std::string* why) {
  out->clear();
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& v = j[i];
    if (!v.is_number_unsigned()) {
      *why = "element " + std::to_string(i) + " is " + v.dump() +
             ", not a non-negative integer";
      return false;
    }
    out->push_back(v.get<uint64_t>());
  }
  return true;
}

Result<SafetensorsEntry> ParseEntry(const std::string& name, const Json& j,
                                    uint64_t data_size,
                                    const HeaderErrors& err) {
  // A JSON string may hold any character; a name with a control character
  // would break every line that prints it, and no framework writes one.
  if (std::optional<size_t> at = FindControlByte(name)) {
    return err.Tensor(name, "the name holds a control character (" +
                                Printable(name.substr(*at, 1)) + " at byte " +
                                std::to_string(*at) +
                                "); tensor names must be printable");
  }
  if (!j.is_object()) {
    return err.Tensor(
        name, "entry is " + std::string(j.type_name()) + ", not an object");
  }
  for (const auto& [key, unused] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return err.Tensor(name, "unexpected field '" + key +
                                  "' (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field)) {
      return err.Tensor(name, "missing field '" + std::string(field) + "'");
    }
  }
  SafetensorsEntry e;
  e.info.name = name;

  const Json& dtype = j["dtype"];
  if (!dtype.is_string()) {
    return err.Tensor(name, "dtype is " + dtype.dump() + ", not a string");
  }
  Result<DType> parsed = ParseDType(dtype.get_ref<const std::string&>());
  if (!parsed.ok()) {
    return err.Tensor(name, std::string(parsed.status().message()));
  }
  e.info.dtype = *parsed;

  const Json& shape = j["shape"];
  if (!shape.is_array()) {
    return err.Tensor(name, "shape is " + shape.dump() + ", not an array");
  }
  if (shape.size() > kMaxTensorRank) {
    return err.Tensor(name, "shape has rank " + std::to_string(shape.size()) +
                                ", more than the limit " +
                                std::to_string(kMaxTensorRank));
  }
  std::string why;
  if (!ReadU64Array(shape, &e.info.shape, &why)) {
    return err.Tensor(name, "shape " + shape.dump() + ": " + why);
  }
  uint64_t num_bytes;
  if (!CheckedNumBytes(e.info.dtype, e.info.shape, nullptr, &num_bytes)) {
    return err.Tensor(name, "shape " + ShapeString(e.info.shape) +
                                " overflows a 64-bit element or byte count");
  }

  const Json& offsets = j["data_offsets"];
  std::vector<uint64_t> range;
  if (!offsets.is_array() || offsets.size() != 2) {
    return err.Tensor(name, "data_offsets is " + offsets.dump() +
                                ", not an array [begin, end]");
  }
  if (!ReadU64Array(offsets, &range, &why)) {
    return err.Tensor(name, "data_offsets " + offsets.dump() + ": " + why);
  }
  e.begin = range[0];
  e.end = range[1];
  if (e.begin > e.end) {
    return err.Tensor(name, "data_offsets " + RangeString(e.begin, e.end) +
                                " end before they begin");
  }
  if (e.end - e.begin != num_bytes) {
    return err.Tensor(name, "data_offsets " + RangeString(e.begin, e.end) +
                                " hold " + std::to_string(e.end - e.begin) +
                                " bytes but dtype " +
                                std::string(DTypeName(e.info.dtype)) +
                                " and shape " + ShapeString(e.info.shape) +
                                " need " + std::to_string(num_bytes));
  }
  if (e.end > data_size) {
    return err.Tensor(name, "data_offsets " + RangeString(e.begin, e.end) +
                                " run past the end of the data region (" +
                                std::to_string(data_size) + " bytes)");
  }
  return e;
}

// Requires every entry to lie inside the data region. Checks that the
// ranges, sorted by offset, tile [0, data_size) exactly: no overlap, no
// hole, no trailing bytes (the reference implementation's rule).
Status CheckCoverage(const std::vector<SafetensorsEntry>& tensors,
                     uint64_t data_size, const HeaderErrors& err) {
  std::vector<const SafetensorsEntry*> order;
  order.reserve(tensors.size());
  for (const SafetensorsEntry& e : tensors) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
            });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : order) {
    // Sorted by begin, so an overlap is always with `prev`, the entry that
    // reached `covered`, which is non-empty.
    if (e->begin < covered) {
      return err.Tensor(e->info.name,
                        "data_offsets " + RangeString(e->begin, e->end) +
                            " overlap tensor '" + Printable(prev->info.name) +
                            "' at " + RangeString(prev->begin, prev->end));
    }
    if (e->begin > covered) {
      return err.File("hole in the data region: bytes [" +
                      std::to_string(covered) + ", " +
                      std::to_string(e->begin) +
                      ") belong to no tensor (the next tensor is '" +
                      Printable(e->info.name) + "')");
    }
    covered = e->end;
    prev = e;
  }
  if (covered != data_size) {
    return err.File(std::to_string(data_size - covered) +
                    " trailing bytes in the data region after offset " +
                    std::to_string(covered) + " belong to no tensor");
  }
  return Status::OK();
}

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
  DCR_ASSIGN_OR_RETURN(Json j, ParseJson(text, what, /*tensor_depth=*/2));
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

Result<SafetensorsHeader> ParseSafetensorsHeader(
    std::span<const std::byte> bytes, uint64_t file_size,
    std::string_view file_name) {
  const HeaderErrors err(file_name);
  if (file_size < 8) {
    return err.File("is " + std::to_string(file_size) +
                    " bytes long, too short for the 8-byte header length");
  }
  if (bytes.size() < 8) {
    return Status::InvalidArgument(err.prefix() +
                                   ": fewer than 8 bytes given to parse");
  }
  const uint64_t n = LoadLE<uint64_t>(bytes.data());
  if (n > kMaxSafetensorsHeaderBytes) {
    return err.File("header length " + std::to_string(n) +
                    " exceeds the limit of " +
                    std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (8 + n > file_size) {
    return err.File("header length " + std::to_string(n) +
                    " runs past the end of the file (" +
                    std::to_string(file_size) + " bytes)");
  }
  if (bytes.size() < 8 + n) {
    return Status::InvalidArgument(
        err.prefix() + ": only " + std::to_string(bytes.size()) +
        " bytes given, header needs " + std::to_string(8 + n));
  }
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = file_size - h.data_offset;
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  DCR_ASSIGN_OR_RETURN(Json j, ParseJson(text, err.prefix() + ": header",
                                         /*tensor_depth=*/1));
  if (!j.is_object()) {
    return err.File("header is " + std::string(j.type_name()) +
                    ", not a JSON object");
  }
  const size_t count = j.size() - (j.contains(kMetadataKey) ? 1 : 0);
  if (count > kMaxTensorsPerCheckpoint) {
    return err.File("header lists " + std::to_string(count) +
                    " tensors, more than the limit " +
                    std::to_string(kMaxTensorsPerCheckpoint));
  }
  h.tensors.reserve(count);
  // Object iteration is bytewise by key, so tensors come out in canonical
  // order.
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return err.File("\"__metadata__\" is " +
                        std::string(value.type_name()) +
                        ", not an object of strings");
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return err.File("\"__metadata__\" entry '" + mk + "' is " +
                          mv.dump() + ", not a string");
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    DCR_ASSIGN_OR_RETURN(SafetensorsEntry e,
                         ParseEntry(key, value, data_size, err));
    h.tensors.push_back(std::move(e));
  }
  DCR_RETURN_IF_ERROR(CheckCoverage(h.tensors, data_size, err));
  return h;
}

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
