// Parsing and validation of a safetensors header (safetensors_header.h):
// the JSON, each tensor's entry, and the data region's coverage.
#include "format/safetensors_header.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/bytes.h"
#include "common/printable.h"

namespace dcr {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

// Legitimate headers and indexes nest three levels deep; anything much
// deeper is rejected before it costs memory or stack.
constexpr int kMaxJsonDepth = 16;

}  // namespace

Result<nlohmann::json> ParseSafetensorsJson(std::string_view text,
                                            const std::string& what,
                                            int tensor_depth) {
  StrictJsonOptions options;
  options.max_depth = kMaxJsonDepth;
  options.named_depth = tensor_depth;
  return ParseStrictJson(text, what, options);
}

namespace {

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
  DCR_ASSIGN_OR_RETURN(Json j,
                       ParseSafetensorsJson(text, err.prefix() + ": header",
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

}  // namespace dcr
