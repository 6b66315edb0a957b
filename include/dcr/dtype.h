// Element types of canonical tensors. dcr never does arithmetic on these:
// all bit-exact work happens per element width, so a dtype is a name and a
// width in bytes.
#ifndef DCR_DTYPE_H_
#define DCR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

// Values are part of the delta file format (docs/FORMAT.md): append only.
enum class DType : uint8_t {
  kBF16 = 1,
  kF16 = 2,
  kF32 = 3,
  kF64 = 4,
  kF8E4M3 = 5,
  kF8E5M2 = 6,
  kI8 = 7,
  kI16 = 8,
  kI32 = 9,
  kI64 = 10,
  kU8 = 11,
  kBool = 12,
};

// Element width in bytes: 1, 2, 4 or 8.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "BF16", "F8_E4M3", "BOOL", ...
std::string_view DTypeName(DType dtype);
// Parses the safetensors spelling. Unknown names (including dtypes that
// safetensors knows but dcr does not, e.g. "U16") are InvalidArgument.
Result<DType> ParseDType(std::string_view name);
// True iff `value` is one of the enumerators above.
bool IsValidDType(uint8_t value);

// Where a floating dtype keeps its exponent: bits [shift, shift + bits) of
// the element read as a little-endian unsigned integer. The codec codes a
// change in the context of the base element's exponent (docs/FORMAT.md
// §context). bits == 0: no usable field (integers, bool, and F64, whose
// 11-bit field is wider than the codec's 8-bit contexts).
struct ExponentField {
  uint8_t shift = 0;
  uint8_t bits = 0;
  bool empty() const { return bits == 0; }
  friend bool operator==(const ExponentField&, const ExponentField&) = default;
};
// BF16 {7, 8}, F16 {10, 5}, F32 {23, 8}, F8_E4M3 {3, 4}, F8_E5M2 {2, 5};
// every other dtype {0, 0}.
ExponentField ExponentFieldOf(DType dtype);

}  // namespace dcr

#endif  // DCR_DTYPE_H_
