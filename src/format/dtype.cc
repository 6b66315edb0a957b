#include "dcr/dtype.h"

#include <array>
#include <string>

namespace dcr {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

// Every dtype dcr knows, in enum order.
constexpr std::array<DTypeEntry, 12> kDTypes = {{
    {DType::kBF16, "BF16", 2},
    {DType::kF16, "F16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

const DTypeEntry* Lookup(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return &e;
  }
  return nullptr;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeEntry* e = Lookup(dtype);
  return e != nullptr ? e->size : 0;
}

ExponentField ExponentFieldOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {7, 8};
    case DType::kF16:
      return {10, 5};
    case DType::kF32:
      return {23, 8};
    case DType::kF8E4M3:
      return {3, 4};
    case DType::kF8E5M2:
      return {2, 5};
    default:
      return {};
  }
}

std::string_view DTypeName(DType dtype) {
  const DTypeEntry* e = Lookup(dtype);
  return e != nullptr ? e->name : std::string_view("INVALID");
}

Result<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  std::string msg =
      "unsupported dtype '" + std::string(name) + "'; dcr supports";
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    msg += i == 0 ? " " : ", ";
    msg += kDTypes[i].name;
  }
  return Status::InvalidArgument(msg);
}

bool IsValidDType(uint8_t value) {
  return value >= static_cast<uint8_t>(DType::kBF16) &&
         value <= static_cast<uint8_t>(DType::kBool);
}

}  // namespace dcr
