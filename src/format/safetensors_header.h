// Parsing and validation of a safetensors header, separate from file I/O so
// that tests and fuzz targets can feed it arbitrary bytes.
//
// Layout of a safetensors file:
//
//   u64 LE   N, the header length in bytes
//   N bytes  header: a JSON object (UTF-8), possibly padded with spaces
//   ...      data region: the raw bytes of every tensor
//
// The header maps each tensor name to
//   {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// with offsets relative to the start of the data region, and may hold
// "__metadata__": an object of string values.
#ifndef DCR_FORMAT_SAFETENSORS_HEADER_H_
#define DCR_FORMAT_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/strict_json.h"
#include "dcr/checkpoint.h"
#include "dcr/status.h"

namespace dcr {

struct SafetensorsEntry {
  TensorInfo info;
  uint64_t begin = 0;  // offset in the data region
  uint64_t end = 0;    // one past the last byte; end - begin = NumBytes()
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + N: where the data region starts
  std::map<std::string, std::string> metadata;
  // Bytewise ascending by name.
  std::vector<SafetensorsEntry> tensors;
};

// Parses and fully validates the header of a safetensors file of
// `file_size` bytes whose first bytes are `bytes` (the whole file, or at
// least its first 8 + N bytes). `file_name` is used only in messages.
// Every failure is Corruption, with a message naming the file and, where
// there is one, the tensor. See docs/FORMAT.md for the rules.
Result<SafetensorsHeader> ParseSafetensorsHeader(
    std::span<const std::byte> bytes, uint64_t file_size,
    std::string_view file_name);

// Strict JSON (common/strict_json.h) as headers and indexes take it,
// nested at most a few levels; keys at `tensor_depth` are tensor names and
// are reported as such.
Result<nlohmann::json> ParseSafetensorsJson(std::string_view text,
                                            const std::string& what,
                                            int tensor_depth);

// The header JSON (unpadded) of a safetensors file holding `tensors` in
// this order, packed from offset 0, with `metadata` ("__metadata__" when
// not empty). Written by hand rather than through an ordered JSON object,
// whose key lookups are linear. InvalidArgument when a name or metadata is
// not valid UTF-8.
Result<std::string> BuildSafetensorsHeaderJson(
    std::span<const TensorInfo> tensors,
    const std::map<std::string, std::string>& metadata);

// Sets *elements to the product of `shape` and *bytes to that times the
// dtype's width (each output may be null). Returns false, leaving both
// untouched, if either overflows 64 bits.
bool CheckedNumBytes(DType dtype, std::span<const uint64_t> shape,
                     uint64_t* elements, uint64_t* bytes);

}  // namespace dcr

#endif  // DCR_FORMAT_SAFETENSORS_HEADER_H_
